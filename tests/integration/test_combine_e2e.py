"""On a real local Ray (W = 2 workers of 0.5 CPU): combine.method adasum, decentlam and local_sgd
train to the end and log what they did, and a local-SGD run resumed from its epoch-end checkpoint (taken
at a sync step) continues exactly: the same final weights, the same samples in the same steps, nothing
trained twice, as the uninterrupted run."""

import glob
import os

import numpy as np
import pytest
import torch

from orchestrator.run.runner import run_training
from tests.helpers import make_config, metric_series, read_sample_log

pytestmark = pytest.mark.integration

N = 1438  # digits training samples
W2 = {"min_workers": 2, "max_workers": 2, "cpus_per_worker": 0.5}


def _params(uri, run_id):
    from mlflow.tracking import MlflowClient

    return MlflowClient(uri).get_run(run_id).data.params


def _ckpts(folder):
    return sorted(glob.glob(os.path.join(folder, "checkpoint_step*")))


def _state(path):
    return torch.load(os.path.join(path, "state.pt"), weights_only=True)


def test_adasum_run_finishes_and_logs(ray_cluster, tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cfg = make_config(
        tmp_path,
        uri,
        scaling=W2,
        schedule={"scaling_rule": "none"},
        combine={"method": "adasum"},
        optimizer={"lr": 0.05, "base_batch_size": 25},
        train={"epochs": 1, "log_every": 5},
    )
    s = run_training(cfg, progress=False)
    assert s.status == "FINISHED" and s.steps == 29  # ceil(1438 / 50)
    assert _params(uri, s.run_id)["combine.method"] == "adasum"
    loss = [v for _, v in metric_series(uri, s.run_id, "train/loss")]
    assert len(loss) == 29 and np.mean(loss[-5:]) < np.mean(loss[:5])
    assert {v for _, v in metric_series(uri, s.run_id, "workers")} == {2.0}
    assert {v for _, v in metric_series(uri, s.run_id, "lr")} == {0.05}  # no scaling by W
    assert metric_series(uri, s.run_id, "val/accuracy")[-1][1] > 0.5


def test_decentlam_run_finishes_logs_its_graph_and_saves_every_rank(ray_cluster, tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cfg = make_config(
        tmp_path,
        uri,
        scaling=W2,
        combine={"method": "decentlam", "topology": "ring"},
        optimizer={"lr": 0.05, "base_batch_size": 50},
        train={"epochs": 1, "log_every": 5},
    )
    s = run_training(cfg, progress=False)
    assert s.status == "FINISHED" and s.steps == 29
    assert _params(uri, s.run_id)["combine.method"] == "decentlam"
    loss = [v for _, v in metric_series(uri, s.run_id, "train/loss")]
    assert np.mean(loss[-5:]) < np.mean(loss[:5])
    sent = metric_series(uri, s.run_id, "combine/bytes_per_step")
    assert sent[-1][1] == metric_series(uri, s.run_id, "combine/allreduce_bytes_per_step")[-1][1] > 0  # W = 2
    assert max(v for _, v in metric_series(uri, s.run_id, "combine/consensus_distance")) > 0
    final = _state(_ckpts(os.path.join(s.storage_path, s.train_run_name))[-1])["combine"]
    assert final["world"] == 2 and final["ranks"].shape[0] == 2
    torch.testing.assert_close(final["ranks"][0], final["ranks"][1])  # the run's end: both the average


@pytest.fixture(scope="module")
def local(ray_cluster, tmp_path_factory):
    """Local SGD, H = 4, with the local norm test growing the batch (checked every 8 steps), two
    epochs; checkpoints only at epoch ends, which local SGD defers to the next sync step."""
    tmp = tmp_path_factory.mktemp("local_sgd")
    uri = f"sqlite:///{tmp}/mlflow.db"
    cfg = make_config(
        tmp,
        uri,
        scaling=W2,
        combine={"method": "local_sgd", "local_steps": 4},
        optimizer={"lr": 0.05, "base_batch_size": 64},
        batch={
            "size": 64,
            "max_local_batch": 32,
            "policy": "norm_test",
            "check_every": 8,
            "norm_test_eta": 0.3,
            "max_size": 256,
            "round_to": 16,
        },
        train={"epochs": 2, "log_every": 5, "sample_log_dir": str(tmp / "samples")},
        checkpoint={"every_steps": 0, "keep": 2},
    )
    s = run_training(cfg, progress=False)
    assert s.status == "FINISHED"
    return tmp, uri, cfg, s


def test_local_sgd_run_logs_syncs_and_bytes(local):
    _, uri, _, s = local
    assert _params(uri, s.run_id)["combine.local_steps"] == "4"
    syncs = metric_series(uri, s.run_id, "combine/syncs")
    steps = s.steps
    assert syncs[-1] == (steps, float(steps // 4))  # every 4th step
    final = _state(_ckpts(os.path.join(s.storage_path, s.train_run_name))[-1])
    assert final["combine"]["syncs"] == -(-steps // 4)  # and the run's end is a sync: the saved model is the average
    saved = metric_series(uri, s.run_id, "combine/bytes_saved")
    assert saved[-1][1] > 0
    # the batch changes only at check steps (multiples of 8, each a sync step), and only grows
    B = metric_series(uri, s.run_id, "batch/global")
    sizes = [v for _, v in B]
    assert sizes == sorted(sizes)
    changes = [st for (st, v), (_, prev) in zip(B[1:], B[:-1]) if v != prev]
    assert all((st - 1) % 8 == 0 for st in changes), changes


def test_local_sgd_each_sample_once_per_epoch(local):
    tmp, _, _, _ = local
    rows = read_sample_log(str(tmp / "samples"))
    assert {r["rank"] for r in rows} == {0, 1}
    for epoch in (0, 1):
        ids = [i for r in rows if r["epoch"] == epoch for i in r["ids"]]
        assert sorted(ids) == list(range(N)), f"epoch {epoch}: a sample was skipped or repeated"


def test_local_sgd_resume_mid_epoch_continues_exactly(local):
    """The newest (final) checkpoint is destroyed; the run resumes from the one before, taken at
    the first sync step at or after the end of epoch 0, trains the rest again and must end with
    the uninterrupted run's weights, optimizer state, batch and counters."""
    tmp, uri, cfg, ref = local
    folder = os.path.join(ref.storage_path, ref.train_run_name)
    before = _ckpts(folder)
    assert len(before) == 2
    mid, final = before
    mid_step = int(os.path.basename(mid)[len("checkpoint_step") :])
    at = _state(mid)["train"]
    assert mid_step % 4 == 0 and at["epoch"] == 1, "the epoch-end checkpoint is taken at a sync step"
    want = _state(final)
    with open(os.path.join(final, "state.pt"), "r+b") as f:
        f.truncate(os.path.getsize(os.path.join(final, "state.pt")) // 2)
    losses = metric_series(uri, ref.run_id, "train/loss")
    s = run_training(cfg, progress=False, resume_run_id=ref.run_id)
    assert s.status == "FINISHED"
    got = _state(_ckpts(folder)[-1])
    for name, p in want["model"].items():
        torch.testing.assert_close(got["model"][name], p, rtol=1e-5, atol=1e-6)
    for a, b in zip(want["optimizer"]["state"].values(), got["optimizer"]["state"].values()):
        torch.testing.assert_close(b["momentum_buffer"], a["momentum_buffer"], rtol=1e-5, atol=1e-6)
    assert got["combine"] == want["combine"] and got["batch"] == want["batch"]
    assert (
        got["train"]["step"] == want["train"]["step"] and got["train"]["samples_seen"] == want["train"]["samples_seen"]
    )
    assert metric_series(uri, ref.run_id, "train/loss") == losses  # no (metric, step) logged twice
    # the steps after the checkpoint were trained again on the same samples by the same ranks
    rows = read_sample_log(str(tmp / "samples"))
    by_step: dict[int, list] = {}
    for r in rows:
        by_step.setdefault((r["step"], r["rank"]), []).append(r["ids"])
    for (step, rank), runs in by_step.items():
        assert len(runs) == (2 if step > mid_step else 1), (step, rank)
        assert all(ids == runs[0] for ids in runs), f"step {step} rank {rank} trained other samples on resume"
