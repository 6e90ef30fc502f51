"""A run whose checkpoints live in a bucket of a real S3-compatible server (moto's, on 127.0.0.1:
the ``s3_server`` fixture, started before the shared Ray so that Ray's processes reach it too),
on the shared local Ray: its driver SIGKILLed after a checkpoint, ``orchestrator resume`` finishes
it from the bucket, exactly as an uninterrupted run, with no checkpoint folder on the local disk."""

import glob
import os
import re
import signal
import subprocess
import sys
import time
import uuid

import numpy as np
import pytest
import yaml

from orchestrator.runner import run_training
from tests.helpers import make_config, metric_series

pytestmark = pytest.mark.integration

SECTIONS = dict(
    scaling={"min_workers": 1, "max_workers": 1, "cpus_per_worker": 0.5},
    # long enough that the kill below lands mid-run: a step takes milliseconds here
    train={"epochs": 12, "log_every": 5},
    checkpoint={"every_steps": 10, "keep": 2},
)
STEPS = 12 * 29  # 12 epochs of ceil(1438 / 50)
_STEP = re.compile(r"/(elastic-[^/]+)/checkpoint_step(\d+)[^/]*/manifest\.json$")


def _cfg(tmp_path, uri, storage):
    sections = {k: dict(v) for k, v in SECTIONS.items()}
    sections["checkpoint"]["storage_path"] = storage
    return make_config(tmp_path, uri, **sections)


def _complete(s3_server, storage):
    """``[(run folder, step)]`` of the complete checkpoints (manifest there) under ``storage``."""
    out = []
    for key in s3_server.keys(storage[len("s3://"):]):
        m = _STEP.search(key)
        if m:
            out.append((m.group(1), int(m.group(2))))
    return out


def _local_checkpoints(*roots):
    return [p for root in roots for p in glob.glob(f"{root}/**/checkpoint_step*", recursive=True)]


@pytest.fixture(scope="module")
def reference(ray_cluster, s3_server, tmp_path_factory):
    """The uninterrupted run, its checkpoints in the bucket too (a driver in this process)."""
    tmp = tmp_path_factory.mktemp("s3-reference")
    bucket = s3_server.create_bucket(f"ref-{uuid.uuid4().hex[:12]}")
    uri = f"sqlite:///{tmp}/mlflow.db"
    s = run_training(_cfg(tmp, uri, f"s3://{bucket}/runs"), progress=False)
    assert s.status == "FINISHED" and s.steps == STEPS
    assert s.storage_path == f"s3://{bucket}/runs"
    assert not _local_checkpoints(tmp, os.getcwd())
    return uri, s


def test_a_killed_driver_resumes_from_the_bucket(reference, ray_cluster, s3_server, tmp_path):
    ref_uri, ref = reference
    bucket = s3_server.create_bucket(f"run-{uuid.uuid4().hex[:12]}")
    storage = f"s3://{bucket}/runs"
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(_cfg(tmp_path, uri, storage).model_dump(mode="json")))
    env = dict(os.environ, RAY_ADDRESS=ray_cluster.get_runtime_context().gcs_address)
    env.pop("ELASTIC_KEEP_RAY", None)
    driver = subprocess.Popen([sys.executable, "-m", "orchestrator", "train", str(path), "--no-progress"],
                              cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, start_new_session=True)
    deadline = time.time() + 240
    while time.time() < deadline:
        found = _complete(s3_server, storage)
        if any(step >= 20 for _, step in found):
            break
        if driver.poll() is not None:
            out, err = driver.communicate()
            pytest.fail(f"the driver ended early ({driver.returncode}): {out}{err}")
        time.sleep(0.2)
    os.killpg(driver.pid, signal.SIGKILL)
    driver.communicate()
    found = _complete(s3_server, storage)
    assert found and max(step for _, step in found) < STEPS, "the run finished before it could be killed"
    run_folder = found[0][0]
    run_id = run_folder[len("elastic-"):]
    assert f"{bucket}/runs/{run_folder}/elastic_run.json" in s3_server.keys(bucket)

    # A writer that died mid-upload, at a step past the newest complete checkpoint: not a checkpoint.
    half = f"{bucket}/runs/{run_folder}/checkpoint_step{STEPS - 1:08d}/state.pt"
    with s3_server.filesystem().open_output_stream(half) as f:
        f.write(b"the first part of a state file")

    out = subprocess.run([sys.executable, "-m", "orchestrator", "resume", run_id, "--tracking-uri", uri, "--no-progress"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"checkpoints    {storage}/{run_folder}" in out.stdout
    assert "skipping corrupt checkpoint" not in out.stdout + out.stderr
    from mlflow.tracking import MlflowClient

    run = MlflowClient(uri).get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.tags["elastic.resumes"] == "1"
    assert run.data.tags["elastic.storage_path"] == storage
    got, want = metric_series(uri, run_id, "train/loss"), metric_series(ref_uri, ref.run_id, "train/loss")
    assert [s for s, _ in got] == list(range(1, STEPS + 1)), "steps must be unique and monotonic"
    np.testing.assert_allclose([v for _, v in got], [v for _, v in want], rtol=1e-4)
    for key in ("val/loss", "val/accuracy"):
        assert metric_series(uri, run_id, key)[-1][1] == pytest.approx(metric_series(ref_uri, ref.run_id, key)[-1][1],
                                                                      rel=1e-4)

    keys = s3_server.keys(bucket)
    assert half not in keys, "the half-written checkpoint was cleaned up"
    assert not [k for k in keys if k.endswith("/driver.lock")], "the resumed driver released its lease"
    steps = sorted(step for _, step in _complete(s3_server, storage))
    assert steps[-1] == STEPS and len(steps) == SECTIONS["checkpoint"]["keep"]
    # nothing of the checkpoints on the local disk: not in the run's folder, not in Ray's default
    assert not _local_checkpoints(tmp_path, os.path.expanduser("~/ray_results"))
    assert not (tmp_path / "ray_runs").exists()
    assert not glob.glob(os.path.expanduser(f"~/ray_results/elastic-{run_id}*"))
