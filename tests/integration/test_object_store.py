"""Checkpoints, run files and the driver lock in a real S3-compatible server (moto's, on
127.0.0.1: tests/s3_server.py), reached by pyarrow over HTTP through the standard environment
variables; and the one-line refusals of a bucket that is missing or refuses the credentials.
No Ray here: the run on Ray is tests/multinode/test_node_changes.py (a killed driver resumed from the bucket)."""

import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid

import pytest
import torch

from orchestrator.config.schema import ConfigError
from orchestrator.run.run_info import DriverLease, DriverLock, find_run, read_run_info, write_run_info
from tests.config_cases import GOOD
from tests.s3_server import S3Server
from trainers.loop.checkpoint import (
    CheckpointManager,
    CorruptCheckpoint,
    incomplete_checkpoints,
    read_checkpoint,
    run_checkpoints,
    verify_checkpoint,
    write_checkpoint,
)
from trainers.loop.storage import ObjectStore, reach_problem, store_for

pytestmark = pytest.mark.integration
RUN = "elastic-run"


@pytest.fixture()
def bucket(s3_server):
    """A fresh bucket of the session's server; the S3 location of a prefix in it."""
    name = s3_server.create_bucket(f"b-{uuid.uuid4().hex[:12]}")
    return f"s3://{name}/runs"


def _keys(s3_server, location):
    return [k.split("/", 1)[1] for k in s3_server.keys(location[len("s3://") :])]


class _Box:
    def __init__(self, **state):
        self.state = dict(state)

    def state_dict(self):
        return {"w": torch.arange(4.0) + self.state.get("step", 0), **self.state}

    def load_state_dict(self, s):
        self.state = {k: v for k, v in s.items() if k != "w"}


def _manager(storage, box, run_name=RUN, **kw):
    return CheckpointManager({"t": box}, storage=storage, run_prefix=RUN, run_name=run_name, **kw)


def test_the_object_store(s3_server, bucket):
    st = store_for(bucket)
    assert isinstance(st, ObjectStore) and not st.renames
    st.write_bytes(f"{bucket}/a/info.json", b'{"x": 1}')
    st.write_bytes(f"{bucket}/a/info.json", b'{"x": 2}')  # replaced whole (one PUT)
    assert st.read_bytes(f"{bucket}/a/info.json") == b'{"x": 2}' and st.size(f"{bucket}/a/info.json") == 8
    assert st.kind(f"{bucket}/a") == "dir" and st.kind(f"{bucket}/a/info.json") == "file"
    assert st.kind(f"{bucket}/none") is None and st.children(f"{bucket}/none") == []
    with st.stage(f"{bucket}/a/ckpt") as d:
        assert d == f"{bucket}/a/ckpt"  # no rename: written in place
        with st.open_write(f"{d}/f") as f:
            f.write(b"123")
    assert sorted(st.children(f"{bucket}/a")) == [("ckpt", "dir"), ("info.json", "file")]
    assert sorted(st.files_under(bucket)) == ["a/ckpt/f", "a/info.json"]
    st.remove(f"{bucket}/a/ckpt")
    st.remove(f"{bucket}/a/ckpt")  # nothing there: not an error
    assert _keys(s3_server, bucket) == ["runs/a/info.json"]


def test_a_checkpoint_round_trip_writes_the_manifest_last_and_nothing_locally(s3_server, bucket, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    opened = []
    real = ObjectStore.open_write

    def spy(self, location):
        opened.append(location.rsplit("/", 1)[1])
        return real(self, location)

    monkeypatch.setattr(ObjectStore, "open_write", spy)
    payload = {"model": {"w": torch.randn(50, 20)}, "train": {"step": 7}}
    d = write_checkpoint(f"{bucket}/{RUN}/checkpoint_step00000007", payload)
    assert opened == ["state.pt", "manifest.json"]  # the manifest, last, marks it complete
    assert _keys(s3_server, bucket) == [
        f"runs/{RUN}/checkpoint_step00000007/manifest.json",
        f"runs/{RUN}/checkpoint_step00000007/state.pt",
    ]
    assert verify_checkpoint(d) == 2
    back = read_checkpoint(d)
    assert back["train"] == {"step": 7}
    torch.testing.assert_close(back["model"]["w"], payload["model"]["w"])
    assert os.listdir(tmp_path) == []  # nothing of the checkpoint landed on the local disk


def test_a_flipped_byte_in_the_bucket_is_corrupt(s3_server, bucket):
    d = write_checkpoint(f"{bucket}/{RUN}/checkpoint_step00000001", {"x": torch.zeros(100)})
    st = store_for(d)
    data = bytearray(st.read_bytes(f"{d}/state.pt"))
    data[len(data) // 2] ^= 0xFF
    st.write_bytes(f"{d}/state.pt", bytes(data))
    with pytest.raises(CorruptCheckpoint, match="sha256"):
        read_checkpoint(d)
    with pytest.raises(CorruptCheckpoint, match="sha256"):
        verify_checkpoint(d)


def test_the_manager_saves_prunes_and_falls_back_in_a_bucket(s3_server, bucket):
    m = _manager(bucket, _Box(), keep=2)
    for step in (10, 20, 30):
        m.states["t"].state = {"step": step}
        assert m.save(step) == f"{bucket}/{RUN}/checkpoint_step{step:08d}"
    m2 = _manager(bucket, _Box(), run_name=f"{RUN}-r0p1", keep=2)  # a later phase's folder
    m2.states["t"].state = {"step": 40}
    m2.save(40, resize=True)
    assert [p.rsplit("/", 2)[1:] for p in m2.checkpoints()] == [
        [f"{RUN}-r0p1", "checkpoint_step00000040_resize"],
        [RUN, "checkpoint_step00000030"],
    ]
    st = store_for(bucket)
    st.write_bytes(f"{bucket}/{RUN}-r0p1/checkpoint_step00000040_resize/state.pt", b"truncated")
    warnings, box = [], _Box()
    assert _manager(bucket, box, warn=warnings.append).load()
    assert box.state == {"step": 30}
    assert "skipping corrupt checkpoint" in warnings[0] and "resumed from older checkpoint" in warnings[1]


def test_a_damaged_checkpoint_in_a_bucket_is_moved_aside_once(s3_server, bucket):
    """No rename on an object store: the damaged checkpoint's objects are copied under
    quarantine/ and deleted where they were; no listing sees it again."""
    m = _manager(bucket, _Box(), keep=2)
    for step in (10, 20):
        m.states["t"].state = {"step": step}
        m.save(step)
    damaged = f"{bucket}/{RUN}/checkpoint_step00000020"
    store_for(bucket).write_bytes(f"{damaged}/state.pt", b"truncated")
    warnings, told, box = [], [], _Box()
    assert _manager(bucket, box, warn=warnings.append, quarantined=lambda *a: told.append(a)).load()
    assert box.state == {"step": 10}
    moved = f"{bucket}/{RUN}/quarantine/checkpoint_step00000020"
    assert told and told[0][0] == damaged and told[0][2] == moved and warnings[0].endswith(f"moved to {moved}")
    assert _keys(s3_server, bucket) == [
        f"runs/{RUN}/checkpoint_step00000010/manifest.json",
        f"runs/{RUN}/checkpoint_step00000010/state.pt",
        f"runs/{RUN}/quarantine/checkpoint_step00000020/manifest.json",
        f"runs/{RUN}/quarantine/checkpoint_step00000020/state.pt",
    ]
    warnings = []
    assert _manager(bucket, _Box(), warn=warnings.append).load() and warnings == []  # not tried again


def test_a_half_written_checkpoint_is_ignored_and_cleaned_up_by_the_next_save(s3_server, bucket):
    """A writer that died mid-upload left a state file without a manifest (at a newer step than
    the last complete one): readers do not see it, with no warning; the run's writer deletes it
    when it next saves.  A writer that merely starts leaves it alone (it may be another group's
    upload still going on)."""
    m = _manager(bucket, _Box(), keep=3)
    m.states["t"].state = {"step": 20}
    m.save(20)
    st = store_for(bucket)
    half = f"{bucket}/{RUN}/checkpoint_step00000030"
    st.write_bytes(f"{half}/state.pt", b"the first part of a state file")
    assert run_checkpoints(bucket, RUN) == [f"{bucket}/{RUN}/checkpoint_step00000020"]
    assert incomplete_checkpoints(bucket, RUN) == [half]
    warnings, box = [], _Box()
    fresh = _manager(bucket, box, warn=warnings.append)
    assert fresh.load() and box.state == {"step": 20} and warnings == []
    assert st.kind(half) == "dir"  # starting did not delete it
    fresh.save(25)
    assert st.kind(half) is None and incomplete_checkpoints(bucket, RUN) == []
    assert [p.rsplit("/", 1)[1] for p in run_checkpoints(bucket, RUN)] == [
        "checkpoint_step00000025",
        "checkpoint_step00000020",
    ]


def test_run_info_in_a_bucket_is_found_by_its_folder(s3_server, bucket, tmp_path, monkeypatch):
    from orchestrator.config.schema import validate
    from orchestrator.record.params import public_config

    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cfg = validate({"checkpoint": {"storage_path": bucket + "/"}, "tracking": {"uri": uri}})
    write_run_info(f"{bucket}/elastic-abc", "abc", uri, public_config(cfg))
    info = read_run_info(f"{bucket}/elastic-abc")
    assert info["run_id"] == "abc" and info["config"]["checkpoint"]["storage_path"] == bucket
    run_id, found_uri, config = find_run(f"{bucket}/elastic-abc/")
    assert (run_id, found_uri) == ("abc", uri) and config["checkpoint"]["storage_path"] == bucket
    with pytest.raises(ConfigError, match="holds no elastic_run.json"):
        find_run(f"{bucket}/elastic-nothing")
    with pytest.raises(ConfigError, match="bucket 'no-such-bucket' does not exist"):
        find_run("s3://no-such-bucket/runs/elastic-abc")
    assert os.listdir(tmp_path) == []


# --------------------------------------------------------------------------- the driver lease


@pytest.fixture()
def short_lease(monkeypatch):
    monkeypatch.setattr(DriverLease, "lease_s", 2.0)
    monkeypatch.setattr(DriverLease, "renew_s", 0.3)


def _foreign_lease(path, renewed_at, beat=0):
    store_for(path).write_bytes(
        path,
        json.dumps(
            {
                "holder": "pid 1 on elsewhere",
                "host": "elsewhere",
                "pid": 1,
                "token": "theirs",
                "renewed_at": renewed_at,
                "beat": beat,
            }
        ).encode(),
    )


def test_a_second_driver_is_refused_and_a_released_lock_is_gone(s3_server, bucket, short_lease):
    folder = f"{bucket}/elastic-x"
    lock = DriverLock(folder).acquire("x")
    holder = json.loads(store_for(folder).read_bytes(f"{folder}/driver.lock"))
    assert holder["pid"] == os.getpid() and holder["host"] == socket.gethostname()
    time.sleep(0.8)  # renewed meanwhile
    assert json.loads(store_for(folder).read_bytes(f"{folder}/driver.lock"))["beat"] >= 1
    with pytest.raises(ConfigError, match=f"run: x is being trained by a live driver \\(pid {os.getpid()} on "):
        DriverLock(folder).acquire("x")
    lock.release()
    assert store_for(folder).kind(f"{folder}/driver.lock") is None
    DriverLock(folder).acquire("x").release()


def test_a_killed_drivers_lease_on_this_host_is_taken_over_at_once(s3_server, bucket):
    folder = f"{bucket}/elastic-x"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    store_for(folder).write_bytes(
        f"{folder}/driver.lock",
        json.dumps(
            {
                "holder": f"pid {dead.pid} on here",
                "host": socket.gethostname(),
                "pid": dead.pid,
                "token": "old",
                "renewed_at": time.time(),
                "beat": 3,
            }
        ).encode(),
    )
    t0 = time.monotonic()
    lock = DriverLock(folder).acquire("x")
    assert time.monotonic() - t0 < DriverLease.lease_s  # no waiting for it to expire
    assert json.loads(store_for(folder).read_bytes(f"{folder}/driver.lock"))["pid"] == os.getpid()
    lock.release()


def test_another_hosts_lease_is_refused_while_renewed_and_taken_once_it_lapses(s3_server, bucket, short_lease):
    folder = f"{bucket}/elastic-x"
    path = f"{folder}/driver.lock"
    _foreign_lease(path, time.time())
    stop = threading.Event()

    def renew():
        beat = 0
        while not stop.wait(0.3):
            beat += 1
            _foreign_lease(path, time.time(), beat)

    th = threading.Thread(target=renew)
    th.start()
    try:
        with pytest.raises(ConfigError, match="being trained by a live driver \\(pid 1 on elsewhere\\)"):
            DriverLock(folder).acquire("x")
    finally:
        stop.set()
        th.join()
    lock = DriverLock(folder).acquire("x")  # not renewed for lease_s: its driver is gone
    assert json.loads(store_for(folder).read_bytes(path))["pid"] == os.getpid()
    lock.release()
    _foreign_lease(path, time.time() - 3600)  # long stale: taken without waiting
    t0 = time.monotonic()
    DriverLock(folder).acquire("x").release()
    assert time.monotonic() - t0 < DriverLease.lease_s


# --------------------------------------------------------------------------- refusals before Ray


def test_reach_problems_are_one_line(s3_server, bucket):
    assert reach_problem(bucket) is None
    assert reach_problem(f"{bucket}/not/yet/there") is None  # a prefix is made by writing under it
    assert reach_problem("s3://no-such-bucket/runs") == (
        "bucket 'no-such-bucket' does not exist; create it or give an existing bucket"
    )
    store_for(bucket).write_bytes(f"{bucket}/file", b"x")
    assert "is an object, not a prefix" in reach_problem(f"{bucket}/file")


def _train_cli(tmp_path, storage, env):
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(
        GOOD + f"checkpoint: {{storage_path: '{storage}'}}\ntracking: {{uri: 'sqlite:///{tmp_path}/mlflow.db'}}\n"
    )
    env = dict(env)
    env.pop("RAY_ADDRESS", None)  # a Ray started by this driver would show in the folder (and take seconds)
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", "train", str(cfg), "--no-progress"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_missing_bucket_is_one_line_and_exit_2_before_ray(s3_server, tmp_path):
    out = _train_cli(tmp_path, "s3://no-such-bucket/runs", dict(os.environ))
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.strip() == (
        "error: checkpoint.storage_path: bucket 'no-such-bucket' does not exist; create it or give an existing bucket"
    )
    assert sorted(os.listdir(tmp_path)) == ["cfg.yaml"]  # no MLflow store, no checkpoint folder, no Ray


def test_bad_credentials_are_one_line_and_exit_2_before_ray(tmp_path):
    server = S3Server(auth=True).start()  # checks keys: the test keys are unknown to it
    try:
        env = {**os.environ, **server.env}
        out = _train_cli(tmp_path, "s3://some-bucket/runs", env)
        assert out.returncode == 2, out.stdout + out.stderr
        err = out.stderr.strip()
        assert len(err.splitlines()) == 1 and err.startswith(
            "error: checkpoint.storage_path: cannot reach s3://some-bucket/runs ("
        )
        assert "ACCESS_DENIED" in err and "check the credentials (AWS_ACCESS_KEY_ID" in err
        assert server.env["AWS_SECRET_ACCESS_KEY"] not in err
        assert sorted(os.listdir(tmp_path)) == ["cfg.yaml"]
        resume = subprocess.run(
            [sys.executable, "-m", "orchestrator", "resume", "s3://some-bucket/runs/elastic-x"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert resume.returncode == 2 and len(resume.stderr.strip().splitlines()) == 1, resume.stderr
        assert resume.stderr.startswith("error: run: cannot reach s3://some-bucket/runs/elastic-x (")
    finally:
        server.stop()


def test_checkpoints_in_a_bucket_are_logged_models_that_refer_to_it(s3_server, bucket, tmp_path):
    """Each checkpoint's MLflow LoggedModel names its place in the bucket (nothing copied into MLflow);
    the ones pruned by checkpoint.keep before the run ended are tagged so."""
    from mlflow.tracking import MlflowClient

    from orchestrator.config.schema import validate
    from orchestrator.record.listeners import TrackingListener
    from orchestrator.record.params import ConfigRecord
    from orchestrator.record.run_tracker import RunTracker
    from trainers.link.messages import CheckpointSaved
    from trainers.link.tags import CHECKPOINT_PRUNED, CHECKPOINT_URI

    tracker = RunTracker(
        ConfigRecord.from_config(validate({"tracking": {"uri": f"sqlite:///{tmp_path}/mlflow.db", "experiment": "s3"}}))
    )
    listener = TrackingListener(tracker)
    m = _manager(bucket, _Box(), keep=2)
    for step in (10, 20, 30):
        m.states["t"].state = {"step": step}
        listener.on_records([(step, {"train/loss": 1.0 / step, "val/loss": 2.0 / step}, 100.0 + step)])
        listener.on_event(CheckpointSaved(step=step, path=m.save(step)))
    listener.close()
    tracker.end()
    models = MlflowClient(tracker.client.tracking_uri).search_logged_models([tracker.experiment_id])
    where = {m.tags[CHECKPOINT_URI]: m.tags.get(CHECKPOINT_PRUNED) for m in models}
    assert where == {
        f"{bucket}/{RUN}/checkpoint_step00000010": "true",  # keep: 2
        f"{bucket}/{RUN}/checkpoint_step00000020": None,
        f"{bucket}/{RUN}/checkpoint_step00000030": None,
    }
    assert all(read_checkpoint(uri)["t"]["step"] for uri, pruned in where.items() if not pruned)
