"""``python -m orchestrator ui``: the MLflow UI over the run's tracking store, and links that open
straight on a run in MLflow's model-training view.

MLflow 3 opens an experiment in its GenAI view (trace dashboards) unless the experiment says it is
a model-training one: the tag ``mlflow.experimentKind = custom_model_development`` does that, and a
link carrying ``?workflowType=machine_learning`` does it for the page it opens (MLflow 3.17).  The
orchestrator tags every experiment it creates or uses (:func:`mark_experiment`) and prints links
with the parameter (:func:`run_url`).

For a local store (a SQLite file or a folder) the command starts ``mlflow server`` on 127.0.0.1
with one worker (a free port, or ``--port``), its artifacts where the store keeps them
(orchestrator/config/uris.py ``artifacts_destination``); for a tracking server it only prints links to it,
without the user and password a tracking URI may carry.
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Any

from orchestrator.config import command
from orchestrator.config.uris import (
    artifacts_destination,
    experiment_artifact_location,
    mlflow_uri,
    public_url,
    redact_uri,
)

ML_VIEW = "workflowType=machine_learning"
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
MODEL_TRAINING_KIND = "custom_model_development"
DEFAULT_PORT = 5000


def is_server_uri(uri: str) -> bool:
    """A tracking server answers HTTP itself; anything else (sqlite:, file:, a folder) is a local store."""
    return uri.startswith(("http://", "https://"))


def run_url(base: str, experiment_id: str, run_id: str) -> str:
    """The run's page in the model-training view (metrics, params, artifacts, logged model)."""
    return f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}?{ML_VIEW}"


def ui_base(tracking_uri: str, port: int = DEFAULT_PORT) -> str:
    """Where the UI for ``tracking_uri`` answers: the server itself (without the user and password
    its URI may carry: the browser asks for them), or ``orchestrator ui``'s address."""
    return public_url(tracking_uri).rstrip("/") if is_server_uri(tracking_uri) else f"http://127.0.0.1:{port}"


def open_hint(tracking_uri: str, experiment_id: str, run_id: str) -> str:
    """The line an end-of-run summary prints: the direct link, and how to serve it for a local store."""
    url = run_url(ui_base(tracking_uri), experiment_id, run_id)
    if is_server_uri(tracking_uri):
        return f"open the run:    {url}"
    return (
        f"open the run:    {url}\n"
        f"                 (serve it first: {command.cli()} ui --tracking-uri {shlex.quote(redact_uri(tracking_uri))})"
    )


def mark_experiment(client: Any, experiment_id: str) -> None:
    """Tag the experiment as a model-training one so MLflow's UI opens it in that view."""
    try:
        exp = client.get_experiment(experiment_id)
        if exp.tags.get(EXPERIMENT_KIND_TAG) != MODEL_TRAINING_KIND:
            client.set_experiment_tag(experiment_id, EXPERIMENT_KIND_TAG, MODEL_TRAINING_KIND)
    except Exception:  # a view preference must never fail a run
        pass


def experiment_id(client: Any, tracking_uri: str, name: str) -> str:
    """The id of experiment ``name``, created if it does not exist yet with its artifacts where the
    store keeps them (beside a SQLite file, not in ``./mlruns`` of the current folder), and marked
    as a model-training one (:func:`mark_experiment`)."""
    return open_experiment(client, name, experiment_artifact_location(tracking_uri, name))


def open_experiment(client: Any, name: str, artifact_location: str | None) -> str:
    """The id of experiment ``name``, created if it does not exist yet with its artifacts at
    ``artifact_location`` (None: MLflow's choice; ``config.uris.experiment_artifact_location``), and
    marked as a model-training one (:func:`mark_experiment`)."""
    from mlflow.exceptions import MlflowException

    exp = client.get_experiment_by_name(name)
    if exp is None:
        try:
            exp_id = client.create_experiment(name, artifact_location=artifact_location)
        except MlflowException:  # created by another process (a search's trials) since the lookup
            exp = client.get_experiment_by_name(name)
            if exp is None:
                raise
            exp_id = exp.experiment_id
    else:
        exp_id = exp.experiment_id
    mark_experiment(client, exp_id)
    return exp_id


def free_port(preferred: int = DEFAULT_PORT) -> int:
    """``preferred`` if nothing listens there on 127.0.0.1, else a port the OS picks."""
    for port in (preferred, 0):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return s.getsockname()[1]
    raise OSError("no free port on 127.0.0.1")


def wait_until_answering(url: str, proc: subprocess.Popen | None = None, timeout_s: float = 120.0) -> float:
    """Poll ``url`` until it answers 200; the seconds it took.  Raises if the server died or timed out."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the MLflow server exited with status {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return time.monotonic() - t0
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{url} did not answer within {timeout_s:.0f} s")


def start_server(tracking_uri: str, port: int, verbose: bool = False) -> subprocess.Popen:
    """``mlflow server`` over a local store on 127.0.0.1:``port``, one worker.  Its artifacts are
    the runs' own artifact locations (served through the server), so nothing is copied; what is
    logged through it (an experiment created in the UI) goes where the store keeps its artifacts
    (``--artifacts-destination``), not into ``./mlartifacts`` of the current folder."""
    cmd = [
        sys.executable,
        "-m",
        "mlflow",
        "server",
        "--backend-store-uri",
        tracking_uri,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
    ]
    destination = artifacts_destination(tracking_uri)
    if destination is not None:
        cmd += ["--artifacts-destination", destination]
    out = None if verbose else subprocess.DEVNULL
    # no background job runner (it serves GenAI features, and starts ten worker processes)
    env = {**os.environ, "MLFLOW_TRACKING_URI": tracking_uri, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    return subprocess.Popen(cmd, stdout=out, stderr=out, env=env, start_new_session=True)


def stop_server(proc: subprocess.Popen, timeout_s: float = 10.0) -> None:
    """Stop the server and the web workers it started (its own process group)."""

    for sig, wait in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def recent_runs(tracking_uri: str, experiment: str | None, run_id: str | None, limit: int = 5) -> list[Any]:
    """The runs to link: ``run_id`` alone, else the newest top-level runs of ``experiment`` (all if None)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(mlflow_uri(tracking_uri))
    if run_id:
        return [client.get_run(run_id)]
    if experiment:
        exp = client.get_experiment_by_name(experiment)
        ids = [exp.experiment_id] if exp else []
    else:
        ids = [e.experiment_id for e in client.search_experiments()]
    if not ids:
        return []
    for exp_id in ids:
        mark_experiment(client, exp_id)
    runs = client.search_runs(ids, max_results=limit * 4, order_by=["attributes.start_time DESC"])
    top = [r for r in runs if "mlflow.parentRunId" not in r.data.tags] or runs
    return top[:limit]
