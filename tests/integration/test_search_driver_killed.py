"""A search driver killed with SIGKILL while its trials train: running the same
command again fails the dead driver's trials, closes their MLflow runs KILLED, deletes their
checkpoints, queues their grid points again and evaluates exactly what the command asked.

The drivers are real ``python -m search run`` processes on the shared local Ray (``RAY_ADDRESS``);
the kill takes the driver's Ray job, its trial actors and their worker groups with it."""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import time

import optuna
import pytest
from mlflow.tracking import MlflowClient

from search.space import load_space
from search.study import grid_remaining
from search.study_storage import open_storage
from tests.helpers import migrated_store
from tests.search_helpers import base_config, write_space

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _study(storage: str) -> optuna.Study | None:
    try:
        return optuna.load_study(study_name="killed", storage=open_storage(storage))
    except KeyError:
        return None


@pytest.mark.timeout(300)
def test_rerun_after_sigkill_finishes_the_dead_drivers_trials(ray_cluster, tmp_path):
    uri, storage = migrated_store(f"sqlite:///{tmp_path}/mlflow.db"), str(tmp_path / "optuna.journal")
    space = write_space(
        tmp_path,
        "killed",
        base=base_config(
            tmp_path, train={"epochs": 1, "seed": 0, "log_every": 5, "eval_every": 20}, checkpoint={"every_steps": 5}
        ),
        objective={"metric": "val/accuracy", "direction": "maximize"},
        sampler={"name": "grid", "seed": 0},
        pruner="none",
        params={"optimizer.lr": {"choices": [0.05, 0.1, 0.2]}},
    )
    cmd = [
        sys.executable,
        "-m",
        "search",
        "run",
        space,
        "--storage",
        storage,
        "--tracking-uri",
        uri,
        "--trials",
        "2",
        "--parallel",
        "2",
        "--heartbeat",
        "1",
        "--no-progress",
    ]
    env = dict(os.environ, RAY_ADDRESS=ray_cluster.get_runtime_context().gcs_address, PYTHONPATH=ROOT)
    env.pop("ELASTIC_KEEP_RAY", None)
    first = subprocess.Popen(
        cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    deadline, lost_runs = time.time() + 150, {}
    while time.time() < deadline:  # both trials train and one has written a checkpoint
        study = _study(storage)
        running = [t for t in study.trials if t.state.name == "RUNNING"] if study else []
        lost_runs = {t.number: t.user_attrs.get("mlflow_run_id") for t in running}
        if (
            len(running) == 2
            and all(lost_runs.values())
            and any(glob.glob(f"{tmp_path}/ray_runs/elastic-{r}*/checkpoint_*") for r in lost_runs.values())
        ):
            break
        assert first.poll() is None, first.stdout.read().decode()
        time.sleep(0.3)
    else:
        pytest.fail("the trials never reached a checkpoint")
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    lost_params = {n: _study(storage).trials[n].params for n in lost_runs}

    out = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stdout + out.stderr
    said = out.stdout + out.stderr
    assert "queued again" in said and "continuing the same command" in said, said

    study = _study(storage)
    states = {t.number: t.state.name for t in study.trials}
    assert states == {0: "FAIL", 1: "FAIL", 2: "COMPLETE", 3: "COMPLETE"}, states
    retried = {t.user_attrs["retry_of"]: t for t in study.trials if "retry_of" in t.user_attrs}
    assert sorted(retried) == sorted(lost_runs)
    for n, t in retried.items():  # the same grid points, evaluated now
        assert t.params == lost_params[n] and 0.0 < t.value <= 1.0
    assert grid_remaining(study, load_space(space)) == 1  # --trials 2: the third point is still to do

    client = MlflowClient(uri)
    for n, run_id in lost_runs.items():
        run = client.get_run(run_id)
        assert run.info.status == "KILLED" and run.data.tags["search.state"] == "FAIL", (n, run.info.status)
        assert glob.glob(f"{tmp_path}/ray_runs/elastic-{run_id}*") == []  # its checkpoints are gone
    for t in retried.values():
        assert client.get_run(t.user_attrs["mlflow_run_id"]).info.status == "FINISHED"
    parent = client.get_run(study.user_attrs["mlflow_parent_run_id"])
    assert parent.info.status == "FINISHED"
