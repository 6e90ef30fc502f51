"""Checkpoints on a real small filesystem (a tmpfs mounted for the test) that fills up mid-run: the
run ends at once, FAILED with one message (the full path, the space free there, the resume
command), no restart, no partial checkpoint left; freed, the printed command finishes the run.

Mounting needs CAP_SYS_ADMIN (root here); without it the test is skipped: the classification and
the cleanup are also pinned by unit tests that inject ENOSPC at the write (tests/unit/test_storage_full.py)."""

import errno
import glob
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml

from tests.helpers import make_config, metric_series

pytestmark = pytest.mark.integration

EPOCHS = 20
STEPS = EPOCHS * 29


@pytest.fixture
def small_disk(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)], capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({made.stderr.decode().strip()[:100]})")
    yield disk
    subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def _fill(disk):
    """Write a file until the filesystem is full; returns it."""
    filler = disk / "filler"
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError as e:
            assert e.errno == errno.ENOSPC
    return filler


def test_a_full_checkpoint_disk_ends_the_run_once_with_free_then_resume(ray_cluster, small_disk, tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cfg = make_config(
        tmp_path,
        uri,
        train={"epochs": EPOCHS, "log_every": 5},
        scaling={"max_failures": 3},
        checkpoint={"every_steps": 10, "keep": 2, "storage_path": str(small_disk / "runs")},
    )
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    env = dict(os.environ, RAY_ADDRESS=ray_cluster.get_runtime_context().gcs_address)
    env.pop("ELASTIC_KEEP_RAY", None)

    def cli(*args):
        return subprocess.run(
            [sys.executable, "-m", "orchestrator", *args, "--no-progress"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=400,
            start_new_session=True,
        )

    driver = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "train", str(path), "--no-progress"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    deadline, filler = time.time() + 240, None
    while filler is None and time.time() < deadline and driver.poll() is None:
        if glob.glob(f"{small_disk}/runs/elastic-*/checkpoint_step*"):
            filler = _fill(small_disk)  # the disk fills up while the run trains
        time.sleep(0.02)
    assert filler is not None, "the run wrote no checkpoint"
    try:
        out, err = driver.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(driver.pid, signal.SIGKILL)
        pytest.fail("the run did not end on a full disk")
    text = out + err
    (tmp_path / "train.txt").write_text(text)  # what the person saw, kept with the test's files
    assert driver.returncode == 1, text
    assert "Traceback" not in text, text
    lines = [line for line in text.splitlines() if "the checkpoint storage is full (No space left on device)" in line]
    assert len(lines) == 1, text
    folder = glob.glob(f"{small_disk}/runs/elastic-*")[0]
    run_id = os.path.basename(folder)[len("elastic-") :]
    resume = f"python -m orchestrator resume {run_id} --tracking-uri {uri}"
    line = lines[0]
    assert f"writing {folder}/checkpoint_step" in line and "free there" in line and "without restarting" in line
    # the printed interpreter is as the person would type it from their folder (a path, or python)
    assert "free space there, then: " in line and line.rstrip().endswith(resume), line
    assert not glob.glob(f"{small_disk}/runs/**/.*tmp*", recursive=True), "a partial checkpoint was left"

    from mlflow.tracking import MlflowClient

    run = MlflowClient(uri).get_run(run_id)
    assert run.info.status == "FAILED"
    assert run.data.tags["elastic.failure"] in line
    assert "elastic.restarts" not in run.data.tags and not metric_series(uri, run_id, "restarts")

    filler.unlink()  # free space, then the printed command
    done = cli(*resume.split()[3:])
    assert done.returncode == 0, done.stdout + done.stderr
    assert MlflowClient(uri).get_run(run_id).info.status == "FINISHED"
    assert [s for s, _ in metric_series(uri, run_id, "train/loss")] == list(range(1, STEPS + 1))
