"""On a real local Ray: the batch grows mid-run and the worker group follows it (1 -> 2 -> 4
workers with fractional CPUs), and the policies log exactly what ``plan`` previews."""

import csv
import io
import subprocess
import sys

import numpy as np
import pytest
import yaml

from orchestrator.runner import run_training
from tests.helpers import make_config, metric_series, read_sample_log

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
    for name, scaling in (("elastic", {"min_workers": 1, "max_workers": 4}),
                          ("fixed4", {"min_workers": 4, "max_workers": 4})):
        cfg = make_config(tmp, uri, scaling={**scaling, "cpus_per_worker": 0.5},
                          train={**GROW["train"], "sample_log_dir": str(tmp / f"samples-{name}")},
                          optimizer=GROW["optimizer"], batch=GROW["batch"])
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
    steps1 = -(-N // 32)           # 45 steps in epoch 0 at B=32
    steps2 = steps1 + -(-N // 64)  # epoch 1 at B=64
    assert _changes(metric_series(uri, rid, "workers")) == [(1, 1.0), (steps1 + 1, 2.0), (steps2 + 1, 4.0)]
    full = [(s, v) for s, v in metric_series(uri, rid, "batch/global") if v not in (N % 32, N % 64, N % 128)]
    assert _changes(full) == [(1, 32.0), (steps1 + 1, 64.0), (steps2 + 1, 128.0)]
    assert metric_series(uri, rid, "resize/from") == [(steps1, 1.0), (steps2, 2.0)]
    assert metric_series(uri, rid, "resize/to") == [(steps1, 2.0), (steps2, 4.0)]
    latency = metric_series(uri, rid, "resize/latency_s")
    assert len(latency) == 2 and all(0 < v < 300 for _, v in latency)
    # the LR followed the linear scaling rule at each batch change
    assert _changes(metric_series(uri, rid, "lr")) == [(1, 0.05), (steps1 + 1, 0.1), (steps2 + 1, 0.2)]
    assert len(runs["elastic"].resizes) == 2


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


def test_logged_lr_and_mf_match_plan_csv(ray_cluster, tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cfg = make_config(tmp_path, uri,
                      optimizer={"base_batch_size": 32, "lr": 0.05, "mf": 0.9, "mf_rule": "per_worker_batch",
                                 "mf_ref_batch": 16},
                      batch={"size": 64, "max_local_batch": 32},
                      schedule={"scaling_rule": "sqrt", "warmup": "legw", "warmup_epochs": 0.5,
                                "decay": "cosine"},
                      scaling={"min_workers": 1, "max_workers": 2, "cpus_per_worker": 0.5},
                      train={"epochs": 2})
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    out = subprocess.run([sys.executable, "-m", "orchestrator", "plan", str(path), "--format", "csv",
                          "--every", "1"], capture_output=True, text=True, timeout=120, check=True)
    plan = list(csv.DictReader(io.StringIO(out.stdout)))
    assert list(plan[0]) == ["step", "epoch", "lr", "mf", "batch_global", "workers", "batch_local", "accum_steps"]
    s = run_training(cfg, progress=False)
    lr, mf = metric_series(uri, s.run_id, "lr"), metric_series(uri, s.run_id, "mf")
    assert [int(r["step"]) for r in plan] == [st for st, _ in lr] == list(range(1, len(plan) + 1))
    np.testing.assert_allclose([v for _, v in lr], [float(r["lr"]) for r in plan], rtol=1e-9)
    np.testing.assert_allclose([v for _, v in mf], [float(r["mf"]) for r in plan], rtol=1e-9)
    assert float(plan[0]["mf"]) == pytest.approx(0.9 ** 2)  # b = 64/2 = 32 = 2 x mf_ref_batch
    lrs = [float(r["lr"]) for r in plan]
    peak = 0.05 * 2 ** 0.5  # sqrt scaling at k = 2
    assert max(lrs) == pytest.approx(peak, rel=1e-3) and lrs[0] < lrs[10] < peak  # warmup, then decay
    for key in ("batch/global", "workers", "batch/local", "batch/accum_steps"):
        col = {"batch/global": "batch_global", "workers": "workers", "batch/local": "batch_local",
               "batch/accum_steps": "accum_steps"}[key]
        assert [v for _, v in metric_series(uri, s.run_id, key)] == [float(r[col]) for r in plan]
