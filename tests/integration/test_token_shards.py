"""Token shards in a real S3-compatible server (moto's, tests/s3_server.py): the bounded cache that
fetches ahead, verifies and re-fetches; the one-line refusals before anything starts; and one short
run on the shared Ray that grows B and W mid-epoch, is killed, loses its shards in the store while
resumed (one line, a resumable failure), and trains every window once, in the epoch's order."""

from __future__ import annotations

import glob
import hashlib
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
import uuid

import numpy as np
import pytest
import yaml

from orchestrator.config.prepare import load_config
from orchestrator.config.schema import ConfigError
from tests.helpers import migrated_store, read_sample_log
from tests.s3_server import S3Server
from trainers.data.sampler import fetch
from trainers.data.shards.cache import ShardCache, default_cache_root
from trainers.data.shards.dataset import load_tokens
from trainers.data.shards.manifest import ShardError, read_manifest
from trainers.data.shards.order import epoch_order, shard_of
from trainers.data.shards.prepare import prepare

pytestmark = pytest.mark.integration


def _upload(s3_server, folder, n_bytes: int = 1500 * 7, shard_tokens: int = 1500) -> tuple[str, object]:
    """A byte-level corpus of 7 shards prepared in ``folder`` and copied to a fresh bucket."""
    src = folder / "src.txt"
    rng = np.random.default_rng(0)
    src.write_bytes(bytes(rng.integers(32, 127, n_bytes, dtype=np.uint8)))
    m, _ = prepare([str(src)], str(folder / "shards"), shard_tokens=shard_tokens, progress=False)
    bucket = s3_server.create_bucket(f"tok-{uuid.uuid4().hex[:10]}")
    fs = s3_server.filesystem()
    for name in [*(s.name for s in m.shards), "manifest.json"]:
        with fs.open_output_stream(f"{bucket}/corpus/{name}") as f:
            f.write((folder / "shards" / name).read_bytes())
    return f"s3://{bucket}/corpus", m


def _local(folder, name) -> np.ndarray:
    return np.fromfile(folder / "shards" / name, dtype="<u2")


def _held_bytes(folder) -> int:
    """The verified shards on disk now (the prefetch thread may evict one while this looks)."""
    total = 0
    for e in os.scandir(folder):
        try:
            total += e.stat().st_size if e.name.endswith(".bin") else 0
        except FileNotFoundError:
            pass
    return total


def test_the_cache_fetches_ahead_within_its_bound_and_reads_what_the_files_hold(s3_server, tmp_path):
    root, m = _upload(s3_server, tmp_path)
    bound = 5 * m.shards[0].bytes  # two blocks of 2 shards and a validation shard
    train, val = load_tokens(
        root, context=16, val_fraction=0.15, block=2, cache_bytes=bound, cache_dir=str(tmp_path / "c")
    )
    cache = train.cache
    order = train.epoch_order(1, 0, len(train))
    for cursor in range(0, len(order), 24):
        train.reading_at(0, cursor)
        ids = order[cursor : cursor + 24]
        x, y = fetch(train, ids.tolist())
        shard = shard_of(train.offsets, ids)
        start = (ids - train.offsets[shard]) * 16
        want = np.stack([_local(tmp_path, train.shards[s].name)[a : a + 17] for s, a in zip(shard, start)])
        assert np.array_equal(x.numpy(), want[:, :-1]) and np.array_equal(y.numpy(), want[:, 1:])
        assert _held_bytes(tmp_path / "c") <= bound
    vx, _ = fetch(val, list(range(len(val))))
    assert np.array_equal(vx[0].numpy(), _local(tmp_path, val.shards[0].name)[:16])
    assert 0 < cache.peak <= bound and cache.fetches >= len(train.shards)
    assert not [e.name for e in os.scandir(tmp_path / "c") if e.name.endswith(".tmp")]


def test_a_corrupt_shard_in_the_store_is_fetched_again_then_refused(s3_server, tmp_path):
    root, m = _upload(s3_server, tmp_path)
    bucket_key = root[len("s3://") :]
    with s3_server.filesystem().open_output_stream(f"{bucket_key}/{m.shards[0].name}") as f:
        f.write(b"\1" * m.shards[0].bytes)  # same size, other bytes
    cache = ShardCache(read_manifest(root), 1 << 20, str(tmp_path / "c"))
    with pytest.raises(ShardError, match=r"^data\.root: shard 'shard-00000\.bin' fetched twice .* sha256"):
        cache.array(m.shards[0])
    assert cache.fetches == 0 and not os.listdir(tmp_path / "c")  # nothing unverified is kept
    assert np.array_equal(cache.array(m.shards[1]), _local(tmp_path, m.shards[1].name))


def _cfg(root: str, tmp_path, **data) -> dict:
    return {
        "data": {"name": "token_shards", "root": root, "context": 16, **data},
        "model": {"name": "gpt", "params": {"n_layer": 1, "n_head": 2, "d_model": 16}},
        "optimizer": {"name": "adamw", "lr": 0.001},
        "batch": {"size": 8, "max_local_batch": 8},
        "checkpoint": {"storage_path": str(tmp_path / "runs")},
        "tracking": {"uri": f"sqlite:///{tmp_path}/mlflow.db"},
    }


def test_bad_corpora_are_one_line_before_anything_starts(s3_server, tmp_path):
    root, m = _upload(s3_server, tmp_path)

    def refused(match: str, root: str = root, **data) -> None:
        with pytest.raises(ConfigError, match=match) as e:
            load_config(_cfg(root, tmp_path, **data))
        assert "\n" not in str(e.value) and s3_server.env["AWS_SECRET_ACCESS_KEY"] not in str(e.value)

    load_config(_cfg(root, tmp_path))  # the good one passes
    refused(r"^data\.root: no manifest\.json at s3://.*/elsewhere/manifest\.json", root + "/../elsewhere")
    refused(r"^data\.context: 1600 \+ 1 tokens do not fit in shard", context=1600)
    refused(r"^data\.cache_bytes: 4096 cannot hold the block read now and the next", cache_bytes=4096)
    with pytest.raises(ConfigError, match=r"^model\.params\.vocab_size: 100 is below the 256 token ids"):
        load_config({**_cfg(root, tmp_path), "model": {"name": "gpt", "params": {"vocab_size": 100, "n_head": 2}}})
    with pytest.raises(ConfigError, match=r"^data\.name: the training set has \d+ samples, fewer than the global"):
        load_config({**_cfg(root, tmp_path), "batch": {"size": 4096, "max_local_batch": 64}})
    s3_server.filesystem().delete_file(f"{root[len('s3://') :]}/{m.shards[2].name}")
    refused(r"^data\.root: shard 'shard-00002\.bin' listed in manifest\.json is missing from s3://")
    refused(
        r"^data\.root: (cannot read|no manifest\.json at) s3://no-such-bucket-",
        f"s3://no-such-bucket-{uuid.uuid4().hex[:6]}/c",
    )


def test_an_unauthorised_bucket_is_one_line_and_exit_2(tmp_path):
    server = S3Server(auth=True).start()  # checks keys: the test keys are unknown to it
    try:
        path = tmp_path / "cfg.yaml"
        path.write_text(yaml.safe_dump(_cfg("s3://some-bucket/corpus", tmp_path)))
        out = subprocess.run(
            [sys.executable, "-m", "orchestrator", "train", str(path), "--no-progress"],
            cwd=tmp_path,
            env={**os.environ, **server.env},
            capture_output=True,
            text=True,
            timeout=120,
        )
        err = out.stderr.strip()
        assert out.returncode == 2 and len(err.splitlines()) == 1, err
        assert err.startswith("error: data.root: cannot read s3://some-bucket/corpus/manifest.json (")
        assert "credentials" in err
        assert server.env["AWS_SECRET_ACCESS_KEY"] not in err
        assert sorted(os.listdir(tmp_path)) == ["cfg.yaml"]  # no run, no store, no Ray
    finally:
        server.stop()


def _newest_step(pattern: str) -> int:
    steps = [int(re.search(r"checkpoint_step(\d+)", p).group(1)) for p in glob.glob(f"{pattern}/checkpoint_step*")]
    return max(steps, default=-1)


def _tag(db: str, run_id: str, key: str) -> str | None:
    """A tag of the run, read from its sqlite store while a driver writes it."""
    try:
        with sqlite3.connect(db) as c:
            row = c.execute("select value from tags where run_uuid = ? and key = ?", (run_id, key)).fetchone()
    except sqlite3.Error:
        return None
    return row[0] if row else None


def test_a_run_that_grows_b_and_w_killed_and_resumed_trains_every_window_once_in_order(
    ray_cluster, s3_server, tmp_path
):
    """B 8 on one worker, then 16 on two (a resize) half-way through the first of two epochs; shards in
    the bucket, each worker's cache smaller than the corpus; the driver SIGKILLed after a checkpoint
    past the resize and resumed.  While the resumed driver runs, the shards vanish from the bucket
    (its checks passed, its cache empty): its workers retry, then the run ends in one line as a
    resumable failure (FAILED, exit 1, no restart spent); the shards put back, a second ``resume``
    finishes it.  The sample log, each step as its last attempt trained it, is the epochs' order:
    no window skipped, none twice."""
    from mlflow.tracking import MlflowClient

    root, m = _upload(s3_server, tmp_path)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    migrated_store(uri)
    raw = {
        "data": {"name": "token_shards", "root": root, "context": 16, "shard_block": 2, "cache_bytes": 5 * 3000},
        "model": {"name": "gpt", "params": {"n_layer": 1, "n_head": 2, "d_model": 16}},
        "optimizer": {"name": "adamw", "lr": 0.001, "base_batch_size": 8},
        "batch": {"size": 8, "max_local_batch": 8, "policy": "schedule", "schedule": [[0.5, 16]]},
        "scaling": {
            "min_workers": 1,
            "max_workers": 2,
            "resize_mode": "restart",
            "cpus_per_worker": 0.5,
            "resize_when": "always",  # a short run: resize although it cannot pay for itself
        },
        "train": {"epochs": 2, "seed": 3, "sample_log_dir": str(tmp_path / "samples")},
        "checkpoint": {"every_steps": 4, "storage_path": str(tmp_path / "ray_runs")},
        "tracking": {"uri": uri, "experiment": "tests"},
    }
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(raw))
    env = dict(os.environ, RAY_ADDRESS=ray_cluster.get_runtime_context().gcs_address)
    env.pop("ELASTIC_KEEP_RAY", None)
    cache = os.path.join(default_cache_root(), hashlib.sha256(root.encode()).hexdigest()[:16])
    try:
        driver = subprocess.Popen(
            [sys.executable, "-m", "orchestrator", "train", str(path), "--no-progress"],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        run_id, deadline = None, time.time() + 240
        while time.time() < deadline:  # a checkpoint of the grown group (the resize is at step 35)
            if driver.poll() is not None:
                pytest.fail(f"the driver ended early ({driver.returncode}): {driver.communicate()}")
            folders = glob.glob(f"{tmp_path}/ray_runs/elastic-*")
            run_id = run_id or (os.path.basename(min(folders, key=len))[len("elastic-") :] if folders else None)
            if run_id and _newest_step(f"{tmp_path}/ray_runs/elastic-{run_id}*") > 40:
                break
            time.sleep(0.2)
        else:
            pytest.fail("the run never checkpointed past its resize")
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()
        resume = [sys.executable, "-m", "orchestrator", "resume", run_id, "--tracking-uri", uri, "--no-progress"]
        shutil.rmtree(cache, True)  # the resumed workers must fetch from the store
        first = subprocess.Popen(
            resume, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        db, deadline = f"{tmp_path}/mlflow.db", time.time() + 120
        while _tag(db, run_id, "elastic.resumes") != "1":  # its checks passed (they list the shards)
            assert first.poll() is None and time.time() < deadline, first.communicate()
            time.sleep(0.1)
        bucket_key = root[len("s3://") :]
        store = s3_server.filesystem()
        for shard in m.shards:  # the store loses the corpus's shards (its manifest stays)
            store.delete_file(f"{bucket_key}/{shard.name}")
        said, err = first.communicate(timeout=300)
        failed = MlflowClient(uri).get_run(run_id)  # before the next driver
        for shard in m.shards:  # the shards are back
            with store.open_output_stream(f"{bucket_key}/{shard.name}") as f:
                f.write((tmp_path / "shards" / shard.name).read_bytes())
        out = subprocess.run(resume, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    finally:
        shutil.rmtree(cache, True)
    assert first.returncode == 1, said[-3000:] + err[-3000:]
    lines = [line for line in err.splitlines() if line.startswith("error: ")]  # written once, whichever ranks met it
    assert len(lines) == 1 and "Traceback" not in said + err, said[-3000:] + err[-3000:]
    assert re.match(
        rf"error: data\.root: could not fetch shard 'shard-\d+\.bin' from {re.escape(root)} after 4 tries in "
        r"[\d.]+ s \(gone from the store: .*\); the run stopped at its newest checkpoint: put the shard back "
        r"\(or prepare the corpus again\), then resume it$",
        lines[0],
    ), lines[0]
    assert "the group restarts" not in err, err[-3000:]
    summary = re.search(r"^  error +(.*)$", said, re.M).group(1)  # the run's line, with the rank and the traceback
    assert summary.startswith(lines[0][len("error: ") :] + " (rank ") and "not retried" in summary, summary
    assert f"python -m orchestrator resume {run_id}" in summary, summary  # the command that goes on
    assert failed.info.status == "FAILED" and failed.data.tags["elastic.failure"] == summary
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    tags = MlflowClient(uri).get_run(run_id).data.tags
    assert tags["elastic.resumes"] == "2" and "elastic.restarts" not in tags  # no restart spent on the store
    rows = read_sample_log(str(tmp_path / "samples"))
    last = {}
    for r in rows:  # a step trained again after the kill: its last attempt counts
        last[r["step"]] = max(last.get(r["step"], r["attempt"]), r["attempt"])
    by_step: dict[int, list[int]] = {}
    for r in sorted(rows, key=lambda r: (r["step"], r["rank"])):
        if r["attempt"] == last[r["step"]]:
            by_step.setdefault(r["step"], []).extend(r["ids"])
    train, _ = load_tokens(root, context=16, val_fraction=0.2, block=2, cache_dir=str(tmp_path / "c"))
    expected = np.concatenate([epoch_order(3, e, train.offsets, 2) for e in (0, 1)])
    assert [i for s in sorted(by_step) for i in by_step[s]] == expected.tolist()
    assert sorted(by_step) == list(range(1, len(by_step) + 1))
    assert {r["rank"] for r in rows} == {0, 1} and {len(ids) for ids in by_step.values()} >= {8, 16}
    assert len({r["attempt"] for r in rows}) >= 3  # the first group, the grown one, the resumed one(s)
