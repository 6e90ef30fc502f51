"""No credential leaves the process: a real run tracked on a real MLflow server that asks for basic
auth, with the user and password in the tracking URI.  Nothing printed (the product's lines and
MLflow's own ``View run ... at`` lines), no log record, no param, tag, artifact or file the run
leaves holds the password, and ``orchestrator ui`` links to the server without it
(orchestrator/config/uris.py ``mlflow_uri``, ``public_url``, ``redact_uri``).

MLflow's own basic-auth app needs an extra package (``mlflow[auth]``); the server here is plain
``mlflow server`` behind a small proxy that refuses every request without the right
``Authorization`` header, so the run also shows that the credentials still reach the server."""

from __future__ import annotations

import base64
import http.client
import logging
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml

from orchestrator import cli
from orchestrator.record import ui
from tests.helpers import free_port

pytestmark = pytest.mark.integration

USER, PASSWORD = "alice", "Pw-q7Zx-not-for-logs"
HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "transfer-encoding",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "upgrade",
    "host",
    "content-length",
}


class AuthProxy(ThreadingHTTPServer):
    """A basic-auth gate in front of ``127.0.0.1:upstream``: counts the requests it let through and
    those it refused (401)."""

    daemon_threads = True

    def __init__(self, upstream: int):
        self.upstream, self.allowed, self.denied = upstream, 0, 0
        self.expected = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
        super().__init__(("127.0.0.1", 0), _Gate)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def port(self) -> int:
        return self.server_address[1]


class _Gate(BaseHTTPRequestHandler):
    server: AuthProxy

    def log_message(self, *args) -> None:  # quiet
        pass

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = b""
            while True:
                size = int(self.rfile.readline().strip().split(b";")[0], 16)
                if size == 0:
                    self.rfile.readline()
                    return out
                out += self.rfile.read(size)
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _forward(self) -> None:
        body = self._body()
        if self.headers.get("Authorization") != self.server.expected:
            self.server.denied += 1
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="mlflow"')
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.server.allowed += 1
        conn = http.client.HTTPConnection("127.0.0.1", self.server.upstream, timeout=120)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP | {"authorization"}}
        conn.request(self.command, self.path, body=body, headers=headers)
        resp = conn.getresponse()
        data = resp.read()
        self.send_response(resp.status)
        for k, v in resp.getheaders():
            if k.lower() not in HOP_BY_HOP:
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        conn.close()

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _forward


@pytest.fixture()
def guarded_server(tmp_path, monkeypatch):
    """``mlflow server`` over a SQLite store in ``tmp_path/store`` (started as ``orchestrator ui``
    starts it), behind :class:`AuthProxy`; the test's folder is another one (``tmp_path/cwd``)."""
    for var in (
        "MLFLOW_TRACKING_URI",
        "MLFLOW_TRACKING_USERNAME",
        "MLFLOW_TRACKING_PASSWORD",
        "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT",
    ):
        monkeypatch.delenv(var, raising=False)  # and whatever the run sets is undone afterwards
    store = tmp_path / "store"
    store.mkdir()
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    port = free_port()
    server = ui.start_server(f"sqlite:///{store}/mlflow.db", port)
    try:
        ui.wait_until_answering(f"http://127.0.0.1:{port}/health", server)
        proxy = AuthProxy(port)
        yield store, proxy
        proxy.shutdown()
    finally:
        ui.stop_server(server)


def _config(tmp_path) -> str:
    raw = {
        "data": {"name": "digits"},
        "model": {"name": "mlp", "norm": "none", "hidden": 16},
        "optimizer": {"name": "sgd", "lr": 0.05, "mf": 0.9, "base_batch_size": 64},
        "batch": {"size": 64, "max_local_batch": 64},
        "scaling": {"min_workers": 1, "max_workers": 1, "cpus_per_worker": 0.5},
        "train": {"epochs": 1, "seed": 0},
        "checkpoint": {"storage_path": str(tmp_path / "ray_runs")},
        "tracking": {"experiment": "credentials"},
    }
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


def _files_holding(folder, secret: bytes) -> list[str]:
    found = []
    for root, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(root, name)
            if not os.path.isfile(path):  # a Ray session's sockets
                continue
            with open(path, "rb") as f:
                if secret in f.read():
                    found.append(path)
    return found


def _assert_shown_nowhere(rc, capfd, caplog, proxy) -> str:
    """The command succeeded, the credentials reached the server with every request, and no printed
    or logged line shows them, though links to the server were printed.  Returns stdout."""
    out, err = capfd.readouterr()
    assert rc == 0, out + err
    assert proxy.allowed > 0 and proxy.denied == 0, (proxy.allowed, proxy.denied)
    assert PASSWORD not in out + err and PASSWORD not in caplog.text
    assert f"http://127.0.0.1:{proxy.port}/#/experiments/" in out, out
    return out


def _client(proxy, monkeypatch):
    """A client of the guarded server, its credentials in MLflow's variables for this test only."""
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", USER)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", PASSWORD)
    return MlflowClient(f"http://127.0.0.1:{proxy.port}")


def test_a_password_in_the_tracking_uri_reaches_no_output_log_param_tag_or_artifact(
    ray_cluster, tmp_path, guarded_server, capfd, caplog, monkeypatch
):

    store, proxy = guarded_server
    uri = f"http://{USER}:{PASSWORD}@127.0.0.1:{proxy.port}"
    caplog.set_level(logging.INFO)
    rc = cli.main(
        [
            "train",
            _config(tmp_path),
            "--tracking-uri",
            uri,
            "--no-progress",
            "--verbose",
            "--register",
            "credentials-model",
        ]
    )
    # the credentials reached the server with every request, and nothing printed or logged shows them
    out = _assert_shown_nowhere(rc, capfd, caplog, proxy)

    # nothing MLflow holds (params, tags, the run's and the model's artifacts, all in the store's
    # database and its artifacts folder) nor any file the run left has the password
    client = _client(proxy, monkeypatch)
    (run,) = client.search_runs([client.get_experiment_by_name("credentials").experiment_id])
    assert run.info.status == "FINISHED"
    assert not [k for k, v in {**run.data.params, **run.data.tags}.items() if PASSWORD in v]
    assert run.data.params["tracking.uri"] == f"http://{USER}:***@127.0.0.1:{proxy.port}"
    assert os.listdir(store / "mlartifacts"), "the server's artifacts are beside its store"
    assert _files_holding(tmp_path, PASSWORD.encode()) == []
    assert os.listdir(tmp_path / "cwd") == []  # nor a ./mlruns or ./mlartifacts where the command ran

    # `orchestrator ui` over the server: links without user and password
    capfd.readouterr()
    assert cli.main(["ui", "--tracking-uri", uri]) == 0
    out, err = capfd.readouterr()
    assert PASSWORD not in out + err and USER not in out + err
    assert f"http://127.0.0.1:{proxy.port}/#/experiments/{run.info.experiment_id}/runs/{run.info.run_id}" in out, out


def test_a_study_tracked_with_a_password_shows_it_nowhere(
    ray_cluster, tmp_path, guarded_server, capfd, caplog, monkeypatch
):
    """``python -m search run`` with the same URI: the driver's lines, the parent and the trial's
    runs, the files left and the shared Ray's logs (where a trial actor's own output goes)."""

    from search.commands import main as search_main
    from tests.search_helpers import base_config, write_space

    store, proxy = guarded_server
    uri = f"http://{USER}:{PASSWORD}@127.0.0.1:{proxy.port}"
    space = write_space(
        tmp_path,
        "creds",
        base=base_config(tmp_path),
        objective={"metric": "val/accuracy"},
        sampler={"name": "random", "seed": 0},
        pruner="none",
        params={"optimizer.lr": {"low": 0.02, "high": 0.2, "log": True}},
    )
    caplog.set_level(logging.INFO)
    rc = search_main(
        [
            "run",
            space,
            "--storage",
            str(tmp_path / "optuna.journal"),
            "--tracking-uri",
            uri,
            "--trials",
            "1",
            "--no-progress",
            "--verbose",
        ]
    )
    _assert_shown_nowhere(rc, capfd, caplog, proxy)
    client = _client(proxy, monkeypatch)
    runs = client.search_runs([client.get_experiment_by_name("search-tests").experiment_id])
    assert len(runs) == 2 and {r.info.status for r in runs} == {"FINISHED"}  # the parent and trial 0
    assert not [
        (r.info.run_name, k) for r in runs for k, v in {**r.data.params, **r.data.tags}.items() if PASSWORD in v
    ]
    assert _files_holding(tmp_path, PASSWORD.encode()) == []
    logs = ray_cluster._private.worker._global_node.get_session_dir_path()
    assert _files_holding(logs, PASSWORD.encode()) == []
