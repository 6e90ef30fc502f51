"""A real ``mlflow server`` killed (SIGKILL) mid-run: training goes on without it; a server that
never comes back ends the run with one message naming what was not recorded, the checkpoints and
the resume command (which, once the server is back, records everything); a server back within
``tracking.outage_timeout_s`` loses nothing."""

import glob
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml

from orchestrator.record import ui
from tests.helpers import braked_mlp, free_port, make_config, metric_series, migrated_store

pytestmark = pytest.mark.integration

EPOCHS = 20
STEPS = EPOCHS * 29  # ceil(1438 / 50) steps an epoch


class Server:
    """``mlflow server`` on 127.0.0.1 over a SQLite store that outlives it (restarted on the same
    port and store, as an operator would)."""

    def __init__(self, tmp_path):
        self.store = migrated_store(f"sqlite:///{tmp_path}/server.db")  # migrated once: the server answers sooner
        self.port = free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.proc = None

    def start(self):
        self.proc = ui.start_server(self.store, self.port)
        ui.wait_until_answering(self.uri + "/health", self.proc)
        return self

    def kill(self):
        """SIGKILL by process id: the server and its web worker (one process group)."""
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            ui.stop_server(self.proc)


@pytest.fixture
def server(tmp_path):
    s = Server(tmp_path).start()
    yield s
    s.stop()


def _driver(ray_cluster, tmp_path, uri, outage_s, *args, name="train"):
    # every step sleeps (same math as the mlp; one micro-batch a step) while the brake file exists:
    # training still runs ~20 s after the server is killed, whatever the machine's speed (unslowed,
    # its 580 steps end in ~4 s: before the outage is seen); the test lifts the brake once what it
    # waits for has happened, and the rest trains at full speed
    cfg = make_config(
        tmp_path,
        uri,
        train={"epochs": EPOCHS, "log_every": 5},
        batch={"max_local_batch": 50},
        checkpoint={"every_steps": 20},
        tracking={"outage_timeout_s": outage_s},
    ).model_dump(mode="json")
    brake = tmp_path / "brake"
    if name == "train":
        brake.touch()
    cfg["model"] = braked_mlp(brake, 0.04, hidden=32)
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = dict(os.environ, RAY_ADDRESS=ray_cluster.get_runtime_context().gcs_address)
    env.pop("ELASTIC_KEEP_RAY", None)
    out, err = open(tmp_path / f"{name}.out", "w"), open(tmp_path / f"{name}.err", "w")
    cmd = [sys.executable, "-m", "orchestrator", *(args or ("train", str(path))), "--no-progress"]
    return subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=out, stderr=err, start_new_session=True)


def _output(tmp_path, name="train"):
    return (tmp_path / f"{name}.out").read_text() + (tmp_path / f"{name}.err").read_text()


def _run_id(uri):
    from mlflow.tracking import MlflowClient

    runs = MlflowClient(uri).search_runs([e.experiment_id for e in MlflowClient(uri).search_experiments()])
    return runs[0].info.run_id if runs else None


def _kill_once_logging(server, driver, tmp_path):
    """Wait until the server holds training metrics of the run, then kill it: the run's id."""
    deadline = time.time() + 240
    while time.time() < deadline:
        assert driver.poll() is None, f"the driver ended early: {_output(tmp_path)}"
        run_id = _run_id(server.uri)
        if run_id and len(metric_series(server.uri, run_id, "train/loss")) >= 20:
            server.kill()
            return run_id
        time.sleep(0.5)
    pytest.fail("the run never logged 20 steps")


def test_a_server_that_never_comes_back_ends_the_run_with_the_resume_command(ray_cluster, server, tmp_path):
    # a window a few of the driver's writes long (each fails at once: nothing listens on the port)
    driver = _driver(ray_cluster, tmp_path, server.uri, 4)
    run_id = _kill_once_logging(server, driver, tmp_path)
    try:  # bounded: the outage window (4 s), a stop at a checkpoint; never MLflow's minutes of retries
        rc = driver.wait(180)
    except subprocess.TimeoutExpired:
        os.killpg(driver.pid, signal.SIGKILL)
        pytest.fail(f"the driver waited on the dead tracking server: {_output(tmp_path)}")
    text = _output(tmp_path)
    assert rc == 1, text
    assert "Traceback" not in text, text
    resume = f"python -m orchestrator resume {run_id} --tracking-uri {server.uri}"
    error = [line for line in text.splitlines() if "did not answer for 4 s" in line]
    assert len(error) == 1, text
    assert "were not recorded" in error[0] and "step records" in error[0], error[0]
    assert error[0].rstrip().endswith(resume), error[0]
    assert "does not answer" in text  # said once, when it went away
    folder = glob.glob(f"{tmp_path}/ray_runs/elastic-{run_id}")[0]
    assert folder in error[0]
    assert glob.glob(f"{folder}/checkpoint_step*"), "the checkpoints are kept"
    assert not glob.glob(f"{tmp_path}/ray_runs/**/.*tmp*", recursive=True)

    # The server is back: the printed command records what the outage missed and finishes the run
    # (at full speed: the brake is lifted).
    (tmp_path / "brake").unlink()
    server.start()
    again = _driver(ray_cluster, tmp_path, server.uri, 4, *resume.split()[3:], name="resume")
    assert again.wait(300) == 0, _output(tmp_path, "resume")
    from mlflow.tracking import MlflowClient

    assert MlflowClient(server.uri).get_run(run_id).info.status == "FINISHED"
    assert [s for s, _ in metric_series(server.uri, run_id, "train/loss")] == list(range(1, STEPS + 1))


def test_a_server_back_within_the_window_loses_nothing(ray_cluster, server, tmp_path):
    driver = _driver(ray_cluster, tmp_path, server.uri, 120)
    run_id = _kill_once_logging(server, driver, tmp_path)
    time.sleep(3)  # away for a while: several of the driver's writes fail meanwhile
    server.start()
    deadline = time.time() + 120
    while "answers again" not in _output(tmp_path) and driver.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    (tmp_path / "brake").unlink()  # the driver writes again: the rest of the run trains at full speed
    assert driver.wait(300) == 0, _output(tmp_path)
    text = _output(tmp_path)
    assert "Traceback" not in text, text
    assert "does not answer" in text and "answers again" in text, text
    from mlflow.tracking import MlflowClient

    run = MlflowClient(server.uri).get_run(run_id)
    assert run.info.status == "FINISHED"
    assert [s for s, _ in metric_series(server.uri, run_id, "train/loss")] == list(range(1, STEPS + 1))
    assert "elastic.failure" not in run.data.tags
