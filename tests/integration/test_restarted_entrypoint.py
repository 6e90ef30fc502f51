"""A job system that restarts its entrypoint (KubeRay's RayJob ``backoffLimit``, a retried ``ray job
submit``) runs ``train --run-key KEY`` again, on the shared local Ray, one run through it all:

- a second ``train`` with the key while the first driver lives is refused by the run's driver lock
  (one line, exit status 2), and the first trains on;
- the first driver killed (SIGKILL), ``train`` with the key resumes the same MLflow run;
- that driver stopped (SIGTERM) once its last step is trained and checkpointed, before it closed
  the run: ``train`` with the key again starts no worker group (no new phase folder) and closes
  the run FINISHED with its summary; no step is trained twice and no (metric, step) is logged twice;
- ``train`` with the key of the FINISHED run says so and exits 0."""

from __future__ import annotations

import glob
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time

import pytest
import yaml

from tests.helpers import braked_mlp, make_config, metric_series

pytestmark = pytest.mark.integration

EPOCHS = 20  # with the brake (>= 30 ms a step), the refused retry ends while the first driver trains
STEPS = EPOCHS * 29  # ceil(1438 / 50) steps an epoch
KEY = "rayjob-digits-7"


def _ckpt_steps(pattern: str) -> list[int]:
    return sorted(int(re.search(r"checkpoint_step(\d+)", p).group(1)) for p in glob.glob(f"{pattern}/checkpoint_step*"))


def _wait_for(driver: subprocess.Popen, done, what: str, poll_s: float = 0.2) -> None:
    deadline = time.time() + 240
    while time.time() < deadline:
        if done():
            return
        if driver.poll() is not None:
            out, err = driver.communicate()
            pytest.fail(f"the driver ended ({driver.returncode}) before {what}: {out[-2000:]}{err[-2000:]}")
        time.sleep(poll_s)
    pytest.fail(f"never: {what}")


def test_a_restarted_entrypoint_with_its_key_goes_on_with_its_own_run(ray_cluster, tmp_path):
    from mlflow.tracking import MlflowClient

    db = tmp_path / "mlflow.db"
    uri = f"sqlite:///{db}"
    cfg = make_config(
        tmp_path,
        uri,
        scaling={"min_workers": 1, "max_workers": 1, "cpus_per_worker": 0.5},
        train={"epochs": EPOCHS, "log_every": 5},
        checkpoint={"every_steps": 10, "keep": 2},
    )
    # every step takes >= 30 ms while the brake file exists (on any machine's speed the first driver
    # is still training when it is refused and killed); lifted once the second driver is paused
    brake = tmp_path / "brake"
    brake.touch()
    raw = cfg.model_dump(mode="json")
    raw["model"] = braked_mlp(brake, 0.03, hidden=32)
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(raw))
    env = dict(os.environ, RAY_ADDRESS=ray_cluster.get_runtime_context().gcs_address)
    env.pop("ELASTIC_KEEP_RAY", None)
    train = [sys.executable, "-m", "orchestrator", "train", str(path), "--no-progress", "--run-key", KEY]
    runs = f"{tmp_path}/ray_runs"

    def start() -> subprocess.Popen:
        return subprocess.Popen(
            train,
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )

    def again(timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run(train, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout)

    first = start()
    _wait_for(
        first,
        lambda: glob.glob(f"{runs}/elastic-*/elastic_run.json") and _ckpt_steps(f"{runs}/elastic-*"),
        "a checkpoint",
    )
    run_id = os.path.basename(min(glob.glob(f"{runs}/elastic-*"), key=len))[len("elastic-") :]

    # a retry while the first driver lives: refused by the run's lock, one line, nothing started
    twin = again(timeout=120)
    assert twin.returncode == 2, twin.stdout + twin.stderr
    errors = [line for line in twin.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and f"run: {run_id} is being trained by a live driver" in errors[0], twin.stderr
    assert "Traceback" not in twin.stderr
    assert first.poll() is None, "the first driver must still be training (the refusal was against a live driver)"

    os.killpg(first.pid, signal.SIGKILL)  # the driver and all it started: a pod gone
    first.wait()
    assert max(_ckpt_steps(f"{runs}/elastic-{run_id}*")) < STEPS, "the run finished before it could be killed"

    # the restarted entrypoint resumes its own run; stopped once its last step is checkpointed. The
    # driver is paused (SIGSTOP) near the end: its workers go on to the planned end and write the
    # finished checkpoint, and the SIGTERM then reaches the driver before it can close the run. Past a
    # paused driver the workers train on for only so long (about 190 steps seen once under load, when
    # this paused 200 steps before the end): 100 leaves room both ways. Until 150 steps before the end
    # the run trains without the brake (those steps are not the scenario: ~50 s under it); it is back
    # 50 steps before the pause (the test looks every 20 ms; a step at full speed takes milliseconds)
    second = start()
    brake.unlink()
    near = STEPS - 100
    _wait_for(second, lambda: max(_ckpt_steps(f"{runs}/elastic-{run_id}*")) >= near - 50, f"step {near - 50}", 0.02)
    brake.touch()
    _wait_for(second, lambda: max(_ckpt_steps(f"{runs}/elastic-{run_id}*")) >= near, f"step {near}", 0.02)
    os.kill(second.pid, signal.SIGSTOP)
    brake.unlink()  # the workers run on at full speed to the planned end
    try:
        deadline = time.time() + 120
        while STEPS not in _ckpt_steps(f"{runs}/elastic-{run_id}*") and time.time() < deadline:
            time.sleep(0.2)
        os.kill(second.pid, signal.SIGTERM)  # the driver only, as ray job stop does
    finally:
        os.kill(second.pid, signal.SIGCONT)
    out, err = second.communicate(timeout=120)
    assert STEPS in _ckpt_steps(f"{runs}/elastic-{run_id}*"), "the workers never reached the planned end"
    assert f"run key {KEY}: resuming run {run_id}" in err, err
    assert second.returncode == 130, f"{second.returncode}: {out[-2000:]}{err[-2000:]}"
    client = MlflowClient(uri)
    assert client.get_run(run_id).info.status == "KILLED"

    # nothing left to train: closed FINISHED without a worker group, with its summary
    folders = sorted(glob.glob(f"{runs}/elastic-{run_id}*"))
    groups = client.get_run(run_id).data.tags["elastic.ray_train_runs"]  # each group started adds its id
    third = again()
    assert third.returncode == 0, third.stdout[-3000:] + third.stderr[-3000:]
    assert sorted(glob.glob(f"{runs}/elastic-{run_id}*")) == folders, "a worker group was started"
    assert client.get_run(run_id).data.tags["elastic.ray_train_runs"] == groups, "a worker group was started"
    assert "first step after" not in third.stdout, third.stdout
    assert f"run finished: {STEPS} steps" in third.stdout and run_id in third.stdout, third.stdout
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and "elastic.failure" not in run.data.tags
    assert run.data.tags["elastic.run_key"] == KEY and run.data.tags["elastic.resumes"] == "2"
    assert [r.info.run_id for r in client.search_runs([run.info.experiment_id])] == [run_id], "one run for the key"
    assert [s for s, _ in metric_series(uri, run_id, "train/loss")] == list(range(1, STEPS + 1)), "a step twice"
    with sqlite3.connect(db) as con:
        twice = con.execute(
            "SELECT key, step, COUNT(*) FROM metrics WHERE run_uuid = ? GROUP BY key, step HAVING COUNT(*) > 1",
            (run_id,),
        ).fetchall()
    assert twice == [], f"(metric, step) logged twice: {twice[:10]}"
    cost = metric_series(uri, run_id, "cost/worker_seconds")
    assert run.data.metrics["cost/worker_seconds"] == max(v for _, v in cost) > 0, cost
    said = re.search(r"^  cost +([\d,]+) worker-seconds", third.stdout, re.M)
    assert said and int(said.group(1).replace(",", "")) == round(run.data.metrics["cost/worker_seconds"]), third.stdout
    assert re.search(r"^  model +\S+", third.stdout, re.M), "the final model is logged"

    done = again(timeout=120)
    assert done.returncode == 0 and f"run {run_id} (run key {KEY}) is FINISHED: nothing to train" in done.stdout
    assert [s for s, _ in metric_series(uri, run_id, "train/loss")] == list(range(1, STEPS + 1))
