"""On a real local Ray: a worker killed mid-epoch, a driver killed after a checkpoint,
and a truncated newest checkpoint.  Each run must end exactly like the uninterrupted one."""

import glob
import os
import re
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import yaml

from orchestrator.config.schema import validate
from orchestrator.run.runner import run_training
from tests.helpers import braked_mlp, dense_series, make_config, metric_series, printed_command, read_sample_log

pytestmark = pytest.mark.integration

SECTIONS = dict(
    scaling={"min_workers": 1, "max_workers": 2, "cpus_per_worker": 0.5, "max_failures": 3},
    # two epochs at least (the sample accounting below); the kills land mid-run on any machine's
    # speed because each run is braked until its kill (_cfg)
    train={"epochs": 4, "log_every": 5},
    checkpoint={"every_steps": 10, "keep": 2},
)
STEPS = 4 * 29  # 4 epochs of ceil(1438 / 50)


def _cfg(tmp, uri, **extra):
    """The built-in mlp's math as ``tests.byo_workloads:slow_mlp``: every training micro-batch
    (two a step on each of the 2 workers) sleeps 50 ms while ``tmp/brake`` exists, so a run is
    still training ~10 s after the event a test waits for (step 15, a checkpoint at step 20) and
    no longer than that: the test lifts the brake once it has acted (:func:`_lift`).  The reference
    run has no brake file (same math, no sleep)."""
    sections = {k: dict(v) for k, v in SECTIONS.items()}
    for k, v in extra.items():
        sections.setdefault(k, {}).update(v)
    raw = make_config(tmp, uri, **sections).model_dump(mode="json")
    raw["model"] = braked_mlp(os.path.join(str(tmp), "brake"), 0.05)
    return validate(raw)


def _brake(tmp):
    open(os.path.join(str(tmp), "brake"), "w").close()


def _lift(tmp):
    os.remove(os.path.join(str(tmp), "brake"))


def _losses(uri, run_id):
    return metric_series(uri, run_id, "train/loss")


def _assert_same_run(uri, ref_id, run_id):
    _assert_same_run_as(uri, ref_id, uri, run_id)


def _assert_same_run_as(ref_uri, ref_id, uri, run_id):
    ref, got = _losses(ref_uri, ref_id), _losses(uri, run_id)
    assert [s for s, _ in got] == list(range(1, STEPS + 1)), "steps must be unique and monotonic"
    a, b = np.array([v for _, v in ref]), np.array([v for _, v in got])
    assert np.max(np.abs(a - b) / np.abs(a)) < 1e-4
    for key in ("val/loss", "val/accuracy"):
        assert metric_series(uri, run_id, key)[-1][1] == pytest.approx(
            metric_series(ref_uri, ref_id, key)[-1][1], rel=1e-4
        )


@pytest.fixture(scope="module")
def reference(ray_cluster, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("reference")
    uri = f"sqlite:///{tmp}/mlflow.db"
    s = run_training(_cfg(tmp, uri), progress=False)
    assert s.status == "FINISHED" and s.steps == STEPS
    return tmp, uri, s


def _ckpt_steps(folder):
    return sorted(int(os.path.basename(p)[len("checkpoint_step") :]) for p in glob.glob(f"{folder}/checkpoint_step*"))


def test_worker_killed_mid_epoch_restarts_and_loses_nothing(reference, tmp_path):
    _, ref_uri, ref = reference
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    samples = tmp_path / "samples"
    cfg = _cfg(tmp_path, uri, train={"sample_log_dir": str(samples)})
    _brake(tmp_path)
    box = {}
    th = threading.Thread(
        target=lambda: box.update(s=run_training(cfg, progress=False, on_start=lambda r: box.update(runner=r)))
    )
    th.start()
    victim = None
    deadline = time.time() + 180
    while victim is None and time.time() < deadline:  # wait for rank 1 to pass step 15 (mid epoch 0)
        for row in read_sample_log(str(samples)):
            if row["rank"] == 1 and row["step"] >= 15:
                victim = [p for p in glob.glob(f"{samples}/phase0-rank1-*.jsonl")][0]
        time.sleep(0.2)
    assert victim, "the run never reached step 15"
    os.kill(int(victim.rsplit("-", 1)[1].split(".")[0]), signal.SIGKILL)
    _lift(tmp_path)  # the restarted group trains the rest at full speed
    th.join(300)
    s = box["s"]
    assert s.status == "FINISHED"
    restarts = metric_series(uri, s.run_id, "restarts")
    assert restarts and restarts[-1][1] >= 1
    from mlflow.tracking import MlflowClient

    assert int(MlflowClient(uri).get_run(s.run_id).data.tags["elastic.restarts"]) >= 1
    # Ray Train's controller told the driver of the failure before the new group started (the bar
    # says "restarting" from then on, not "training" at a stale rate)
    from orchestrator.record.events import GroupFailed
    from trainers.link.messages import PhaseStart

    events = box["runner"].book.events
    failed = next(i for i, e in enumerate(events) if isinstance(e, GroupFailed))
    restarted = [i for i, e in enumerate(events) if isinstance(e, PhaseStart)][1]
    assert failed < restarted, [type(e).__name__ for e in events]
    # Sample accounting: for each step keep the attempt that finally counted.
    rows = read_sample_log(str(samples))
    latest = {}
    for r in rows:
        latest[r["step"]] = max(latest.get(r["step"], 0), r["attempt"])
    for epoch in (0, 1):
        ids = [i for r in rows if r["epoch"] == epoch and r["attempt"] == latest[r["step"]] for i in r["ids"]]
        assert sorted(ids) == list(range(1438)), f"epoch {epoch}: a sample was lost or seen twice"
    assert len({r["attempt"] for r in rows}) >= 2  # there really was a second attempt
    # The math did not change: same curve as the uninterrupted run (different stores, same values).
    ref_losses, got = _losses(ref_uri, ref.run_id), _losses(uri, s.run_id)
    assert [st for st, _ in got] == list(range(1, STEPS + 1))
    np.testing.assert_allclose([v for _, v in got], [v for _, v in ref_losses], rtol=1e-4)


def _driver_past_a_checkpoint(ray_cluster, tmp_path, uri):
    """A ``train`` CLI driver on the shared Ray, once its run has a checkpoint at step >= 20:
    (process, its env, the run's checkpoint folder)."""
    cfg = _cfg(tmp_path, uri)
    _brake(tmp_path)  # lifted by the test once it has stopped or killed the driver
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    env = dict(os.environ, RAY_ADDRESS=ray_cluster.get_runtime_context().gcs_address)
    env.pop("ELASTIC_KEEP_RAY", None)
    driver = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "train", str(path), "--no-progress"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    deadline = time.time() + 180
    run_dirs = []
    while time.time() < deadline:
        run_dirs = glob.glob(f"{tmp_path}/ray_runs/elastic-*")
        if run_dirs and any(s >= 20 for s in _ckpt_steps(run_dirs[0])):
            break
        if driver.poll() is not None:
            out, err = driver.communicate()
            pytest.fail(f"the driver ended early ({driver.returncode}): {out}{err}")
        time.sleep(0.2)
    return driver, env, run_dirs[0]


def test_sigterm_stops_cleanly_and_resume_trains_to_the_planned_end(reference, ray_cluster, tmp_path):
    """``ray job stop`` or ``kill``: SIGTERM ends the run KILLED with a message naming the resume
    command, exit 130, no traceback; that command then trains to the planned last step, exactly
    as the uninterrupted run (the stop's checkpoint is not a finished one), and a second resume of
    the FINISHED run is refused."""
    _, ref_uri, ref = reference
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    driver, env, folder = _driver_past_a_checkpoint(ray_cluster, tmp_path, uri)
    driver.send_signal(signal.SIGTERM)  # the driver only, as ray job stop does
    out, err = driver.communicate(timeout=120)
    _lift(tmp_path)
    run_id = os.path.basename(folder)[len("elastic-") :]
    assert driver.returncode == 130, out + err
    assert "Traceback" not in err and "run killed:" in err, err
    assert f" resume {run_id}" in err, err
    printed_command(err, "with: ", f" resume {run_id}")  # this interpreter, not a bare python
    from mlflow.tracking import MlflowClient

    run = MlflowClient(uri).get_run(run_id)
    assert run.info.status == "KILLED"
    # what it trained is kept for the resume (in the newest phase's folder, after a resize)
    steps = [
        int(os.path.basename(p)[len("checkpoint_step") :].split("_")[0])
        for p in glob.glob(f"{folder}*/checkpoint_step*")
    ]
    assert max(steps) >= 20
    assert run.data.tags["elastic.failure"].startswith("stopped by Ctrl-C or SIGTERM after step ")
    named = re.search(r"from its checkpoint at step (\d+) with: ", run.data.tags["elastic.failure"])
    assert named and 20 <= int(named.group(1)) <= max(steps), run.data.tags["elastic.failure"]
    assert run.data.tags["elastic.failure"].endswith(f" -m orchestrator resume {run_id}")
    logged = [st for st, _ in _losses(uri, run_id)]
    assert logged and logged[-1] >= 20, "the steps trained before the signal reach MLflow"
    assert logged[-1] < STEPS, "the run finished before the signal: nothing was stopped"

    resume = [sys.executable, "-m", "orchestrator", "resume", run_id, "--tracking-uri", uri, "--no-progress"]
    out = subprocess.run(resume, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    run = MlflowClient(uri).get_run(run_id)
    assert run.info.status == "FINISHED" and "elastic.failure" not in run.data.tags
    _assert_same_run_as(ref_uri, ref.run_id, uri, run_id)

    again = subprocess.run(resume, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 2, again.stdout + again.stderr
    assert f"run: {run_id} is FINISHED" in again.stderr and "Traceback" not in again.stderr
    assert len(_losses(uri, run_id)) == STEPS, "the refused resume trained nothing"


def _reserved(ray, group: str) -> dict:
    """What Ray's AutoscalingCoordinator reserves to Ray Train group ``group`` (its run id)."""
    coordinator = ray.get_actor("AutoscalingCoordinator", namespace="AutoscalingCoordinator")
    return ray.get(coordinator.get_reserved_resources.remote(f"train-{group}"), timeout=30)


def test_driver_killed_after_checkpoint_resumes_same_run(reference, ray_cluster, tmp_path):
    _, ref_uri, ref = reference
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    driver, env, folder = _driver_past_a_checkpoint(ray_cluster, tmp_path, uri)
    run_dirs = [folder]
    os.killpg(driver.pid, signal.SIGKILL)
    driver.wait()
    _lift(tmp_path)
    assert max(_ckpt_steps(run_dirs[0])) < STEPS, "the run finished before it could be killed"
    run_id = os.path.basename(run_dirs[0])[len("elastic-") :]
    # The killed driver's group still holds its reservation in Ray (for Ray's 180 s expiry): the
    # resume drops it by the group's recorded id instead of waiting it out.
    from mlflow.tracking import MlflowClient

    from trainers.link.tags import RAY_TRAIN_RUNS as TAG

    groups = MlflowClient(uri).get_run(run_id).data.tags[TAG].split()
    assert _reserved(ray_cluster, groups[-1]), "the killed driver's group holds no reservation"
    out = subprocess.run(
        [sys.executable, "-m", "orchestrator", "resume", run_dirs[0], "--no-progress"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert not _reserved(ray_cluster, groups[-1]), "the dead group's reservation outlived the resume"
    assert run_id in out.stdout
    run = MlflowClient(uri).get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.tags["elastic.resumes"] == "1"
    ref_losses, got = _losses(ref_uri, ref.run_id), _losses(uri, run_id)
    assert [st for st, _ in got] == list(range(1, STEPS + 1)), "steps must be unique and monotonic"
    np.testing.assert_allclose([v for _, v in got], [v for _, v in ref_losses], rtol=1e-4)
    for key in ("val/loss", "val/accuracy"):
        assert metric_series(uri, run_id, key)[-1][1] == pytest.approx(
            metric_series(ref_uri, ref.run_id, key)[-1][1], rel=1e-4
        )
    # samples_seen and epoch are logged where they bend; the killed driver's unlogged tail of a
    # segment must not bend the resumed series: every step's value is the uninterrupted run's.
    assert dense_series(uri, run_id, "samples_seen") == dense_series(ref_uri, ref.run_id, "samples_seen")
    got, want = dense_series(uri, run_id, "epoch"), dense_series(ref_uri, ref.run_id, "epoch")
    assert [st for st, _ in got] == [st for st, _ in want] == list(range(1, STEPS + 1))
    np.testing.assert_allclose([v for _, v in got], [v for _, v in want], rtol=1e-9)


def test_truncated_newest_checkpoint_falls_back_to_previous(reference):
    tmp, uri, ref = reference
    folder = os.path.join(ref.storage_path, ref.train_run_name)
    steps = _ckpt_steps(folder)
    assert steps[-1] == STEPS and len(steps) == 2  # checkpoint.keep = 2
    state = os.path.join(folder, f"checkpoint_step{steps[-1]:08d}", "state.pt")
    with open(state, "r+b") as f:
        f.truncate(os.path.getsize(state) // 2)
    before = _losses(uri, ref.run_id)
    s = run_training(_cfg(tmp, uri), progress=False, resume_run_id=ref.run_id)
    assert s.status == "FINISHED"
    from mlflow.tracking import MlflowClient

    tags = MlflowClient(uri).get_run(ref.run_id).data.tags
    warnings = tags["elastic.warnings"].splitlines()
    assert "skipping corrupt checkpoint" in warnings[0] and f"checkpoint_step{steps[-1]:08d}" in warnings[0]
    assert "resumed from older checkpoint" in warnings[1] and f"checkpoint_step{steps[-2]:08d}" in warnings[1]
    # the damaged one was moved aside, said so, and is kept for a look (not counted, not tried again)
    moved = os.path.join(folder, "quarantine", f"checkpoint_step{steps[-1]:08d}")
    assert warnings[0].endswith(f"; moved to {moved}") and os.path.isfile(os.path.join(moved, "state.pt"))
    assert tags["elastic.checkpoints_quarantined"].startswith(
        f"{os.path.join(folder, f'checkpoint_step{steps[-1]:08d}')} moved to {moved}: "
    )
    # It trained again from the previous checkpoint to the end: a new, intact newest checkpoint.
    assert _ckpt_steps(folder)[-1] == STEPS
    from trainers.loop.checkpoint import verify_checkpoint

    verify_checkpoint(os.path.join(folder, f"checkpoint_step{STEPS:08d}"))
    assert _losses(uri, ref.run_id) == before  # no (metric, step) logged twice
