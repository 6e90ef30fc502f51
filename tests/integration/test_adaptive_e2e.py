"""On a real local Ray: the batch grows mid-run and the worker group follows it (1 -> 2 -> 4
workers with fractional CPUs); ``plan`` against what a run logs: tests/integration/test_plan_matches_run.py."""

import numpy as np
import pytest

from orchestrator.run.runner import run_training
from tests.helpers import dense_series, make_config, metric_series, read_sample_log

pytestmark = pytest.mark.integration

GROW = dict(
    optimizer={"base_batch_size": 32, "lr": 0.05},
    batch={"size": 32, "max_local_batch": 32, "policy": "schedule", "schedule": [[1, 64], [2, 128]]},
    train={"epochs": 3, "log_every": 5},
)
N = 1438


@pytest.fixture(scope="module")
def grown(ray_cluster, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("adaptive")
    uri = f"sqlite:///{tmp}/mlflow.db"
    runs = {}
    # Break-before-make resizes, so that each resize lands exactly at its batch change (the
    # overlapping mode is tested below: there the old group trains on for a while).
    for name, scaling in (
        ("elastic", {"min_workers": 1, "max_workers": 4, "resize_mode": "restart"}),
        ("fixed4", {"min_workers": 4, "max_workers": 4}),
    ):
        cfg = make_config(
            tmp,
            uri,
            scaling={**scaling, "cpus_per_worker": 0.5},
            train={**GROW["train"], "sample_log_dir": str(tmp / f"samples-{name}")},
            optimizer=GROW["optimizer"],
            batch=GROW["batch"],
        )
        runs[name] = run_training(cfg, progress=False)
        assert runs[name].status == "FINISHED"
    return tmp, uri, runs


def _changes(series):
    out, prev = [], None
    for s, v in series:
        if v != prev:
            out.append((s, v))
            prev = v
    return out


def test_batch_grows_and_workers_follow(grown):
    _, uri, runs = grown
    rid = runs["elastic"].run_id
    steps1 = -(-N // 32)  # 45 steps in epoch 0 at B=32
    steps2 = steps1 + -(-N // 64)  # epoch 1 at B=64
    assert _changes(metric_series(uri, rid, "workers")) == [(1, 1.0), (steps1 + 1, 2.0), (steps2 + 1, 4.0)]
    # batch/global is the policy's B at every step, the epochs' short last batches included
    assert _changes(metric_series(uri, rid, "batch/global")) == [(1, 32.0), (steps1 + 1, 64.0), (steps2 + 1, 128.0)]
    # each resize at its step and again where the stretch it opened ends: a step line, not a dot
    last = metric_series(uri, rid, "train/loss")[-1][0]
    assert metric_series(uri, rid, "resize/from") == [(steps1, 1.0), (steps2 - 1, 1.0), (steps2, 2.0), (last, 2.0)]
    assert metric_series(uri, rid, "resize/to") == [(steps1, 2.0), (steps2 - 1, 2.0), (steps2, 4.0), (last, 4.0)]
    latency = metric_series(uri, rid, "resize/latency_s")
    assert len(latency) == 4 and all(0 < v < 300 for _, v in latency)
    # the LR followed the linear scaling rule at each batch change
    assert _changes(metric_series(uri, rid, "lr")) == [(1, 0.05), (steps1 + 1, 0.1), (steps2 + 1, 0.2)]
    assert [r["mode"] for r in runs["elastic"].resizes] == ["restart", "restart"]


def test_each_sample_once_per_epoch_across_resizes(grown):
    tmp, _, _ = grown
    rows = read_sample_log(str(tmp / "samples-elastic"))
    assert {r["rank"] for r in rows} == {0, 1, 2, 3}
    for epoch in range(3):
        ids = [i for r in rows if r["epoch"] == epoch for i in r["ids"]]
        assert sorted(ids) == list(range(N)), f"epoch {epoch}: a sample was skipped or repeated"
    steps = sorted({r["step"] for r in rows})
    assert steps == list(range(1, steps[-1] + 1))


def test_losses_equal_a_run_with_the_final_worker_count_from_the_start(grown):
    _, uri, runs = grown
    a = metric_series(uri, runs["elastic"].run_id, "train/loss")
    b = metric_series(uri, runs["fixed4"].run_id, "train/loss")
    assert [s for s, _ in a] == [s for s, _ in b]
    np.testing.assert_allclose([v for _, v in a], [v for _, v in b], rtol=1e-4)
    assert {v for _, v in metric_series(uri, runs["fixed4"].run_id, "workers")} == {4.0}


def _stopped_run(cfg, when):
    """Train ``cfg`` until ``when(records)`` says stop (the stop lands a few steps later)."""
    box = {}

    def on_records(records):
        if when(records):
            box["runner"].request_stop()

    return run_training(cfg, progress=False, on_start=lambda r: box.update(runner=r), on_records=on_records)


def test_overlapping_resize_hands_over_at_a_checkpoint(ray_cluster, tmp_path):
    """Make before break: at the batch change the old group (1 worker) trains on at B=64 with
    two micro-batches while the 2-worker group starts beside it; the new group takes over at
    the old group's last checkpoint.  Nothing is skipped or repeated, and the new group goes on
    from exactly the old group's state."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    common = dict(
        optimizer={"base_batch_size": 32, "lr": 0.05},
        batch={"size": 32, "max_local_batch": 32, "policy": "schedule", "schedule": [[1, 64]]},
        model={"name": "cnn", "norm": "none", "hidden": 16},
    )
    cfg = make_config(
        tmp_path / "e",
        uri,
        **common,
        scaling={"min_workers": 1, "max_workers": 2, "cpus_per_worker": 0.5},
        train={"epochs": 500, "log_every": 20, "eval_every": 0, "sample_log_dir": str(tmp_path / "samples")},
    )
    taken = {}

    def after_takeover(records):  # stop 30 steps after the first step of the 2-worker group
        for s, m, *_ in records:
            if m.get("workers") == 2.0:
                taken.setdefault("step", s)
        return "step" in taken and records[-1][0] >= taken["step"] + 30

    run = _stopped_run(cfg, after_takeover)
    assert run.status == "FINISHED"
    (r,) = run.resizes
    steps1 = -(-N // 32)
    assert (r["mode"], r["from"], r["to"]) == ("overlap", 1, 2)
    assert r["step"] >= steps1 and r["step"] + 1 == taken["step"]
    assert r["latency_s"] < r["overlap_s"], r  # training stood still for less than the new group's start
    workers = dict(dense_series(uri, run.run_id, "workers"))
    accum = dict(dense_series(uri, run.run_id, "batch/accum_steps"))
    # between the batch change and the takeover, one worker ran B=64 as two micro-batches
    assert workers[steps1 + 1] == 1.0 and accum[steps1 + 1] == 2.0
    assert workers[r["step"]] == 1.0 and workers[r["step"] + 1] == 2.0 and accum[r["step"] + 1] == 1.0
    # at the resize's step, and again where the stretch it opened ends (the chart draws a line)
    last_step = metric_series(uri, run.run_id, "train/loss")[-1][0]
    assert metric_series(uri, run.run_id, "resize/from") == [(r["step"], 1.0), (last_step, 1.0)]

    rows = read_sample_log(str(tmp_path / "samples"))
    last = max(row["step"] for row in rows)
    assert sorted({row["step"] for row in rows}) == list(range(1, last + 1))
    last_epoch = max(row["epoch"] for row in rows)
    for epoch in range(last_epoch):  # every complete epoch, across the handover
        ids = [i for row in rows if row["epoch"] == epoch for i in row["ids"]]
        assert sorted(ids) == list(range(N)), f"epoch {epoch}: a sample was skipped or repeated"

    # The same schedule on one worker throughout: identical up to the handover (same code), and
    # the new group's first steps continue from exactly that state (a different state or batch
    # would show at once; a different summation order only drifts slowly).
    ref_cfg = make_config(
        tmp_path / "f",
        uri,
        **common,
        scaling={"min_workers": 1, "max_workers": 1, "cpus_per_worker": 0.5},
        train={"epochs": 500, "log_every": 20, "eval_every": 0},
    )
    ref = _stopped_run(ref_cfg, lambda records: records[-1][0] >= last)
    a = metric_series(uri, run.run_id, "train/loss")
    b = metric_series(uri, ref.run_id, "train/loss")[: len(a)]
    assert [s for s, _ in a] == [s for s, _ in b]
    h = r["step"]
    np.testing.assert_allclose([v for _, v in a[:h]], [v for _, v in b[:h]], rtol=1e-6)
    np.testing.assert_allclose([v for _, v in a[h : h + 3]], [v for _, v in b[h : h + 3]], rtol=1e-4)
    assert {v for _, v in metric_series(uri, ref.run_id, "workers")} == {1.0}


def test_overlapping_resize_called_off_when_training_ends_first(ray_cluster, tmp_path):
    """The batch grows a few seconds of training before the end: the old group finishes the run
    at B=64 before the new group is up, so the new group is told to stand down and never trains.

    Each micro-batch takes >= 30 ms (a sleeping MLP): the 3 epochs after the growth (68 steps of
    2 micro-batches) last ~4 s on any machine, longer than the driver takes to start the new group
    (a poll or two) and shorter than that group's start.  Without it a fast machine finished them
    before the driver saw the request, and no group was started to call off."""
    import time

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cfg = make_config(
        tmp_path,
        uri,
        optimizer={"base_batch_size": 32, "lr": 0.05},
        batch={"size": 32, "max_local_batch": 32, "policy": "schedule", "schedule": [[1, 64]]},
        model={"name": None, "factory": "tests.byo_workloads:slow_mlp", "params": {"hidden": 16, "sleep_s": 0.03}},
        scaling={"min_workers": 1, "max_workers": 2, "cpus_per_worker": 0.5},
        train={"epochs": 4, "eval_every": 0},
    )
    run = run_training(cfg, progress=False)
    assert run.status == "FINISHED" and run.resizes == [] and run.resizes_called_off == 1
    assert {v for _, v in metric_series(uri, run.run_id, "workers")} == {1.0}
    assert metric_series(uri, run.run_id, "batch/global")[-1][1] == 64.0
    assert run.final["epoch"] == pytest.approx(4.0)
    deadline = time.time() + 30  # both groups are gone: the cluster's CPUs are free again
    while ray_cluster.available_resources().get("CPU", 0) < 2 and time.time() < deadline:
        time.sleep(0.5)
    assert ray_cluster.available_resources().get("CPU", 0) == 2
