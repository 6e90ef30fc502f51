"""On a real local Ray: the global batch B is the math, the world size W only a resource.

Same config and seed at W = 1, 2, 3 (fractional CPUs), a batch that W=3 cannot divide
evenly (50) and a max_local_batch (16) that forces gradient accumulation: the same
train/loss series and the same final parameters, up to floating-point reduction order.
"""

import numpy as np
import pytest
import torch

from orchestrator.run.runner import run_training
from tests.helpers import final_model, make_config, metric_series, read_sample_log

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def runs(ray_cluster, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("invariance")
    uri = f"sqlite:///{tmp}/mlflow.db"
    out = {}
    for w in (1, 2, 3):
        cfg = make_config(
            tmp,
            uri,
            scaling={"max_workers": w, "min_workers": w},
            train={"epochs": 1, "sample_log_dir": str(tmp / f"samples-w{w}")},
        )
        summary = run_training(cfg, progress=False)
        assert summary.status == "FINISHED"
        out[w] = (summary, tmp / f"samples-w{w}")
    return uri, tmp, out


def test_loss_series_identical_across_world_sizes(runs):
    uri, _, out = runs
    series = {w: metric_series(uri, s.run_id, "train/loss") for w, (s, _) in out.items()}
    steps = [st for st, _ in series[1]]
    assert steps == list(range(1, len(steps) + 1)) and len(steps) == 29  # ceil(1438 / 50)
    ref = np.array([v for _, v in series[1]])
    for w in (2, 3):
        assert [st for st, _ in series[w]] == steps
        got = np.array([v for _, v in series[w]])
        rel = np.max(np.abs(got - ref) / np.abs(ref))
        assert rel < 1e-4, f"W={w}: max relative loss difference {rel:.2e}"
    assert ref[-1] < ref[0]  # and it learns


def test_final_parameters_identical_across_world_sizes(runs):
    uri, tmp, out = runs
    models = {w: final_model(uri, s.run_id, tmp / f"model-w{w}") for w, (s, _) in out.items()}
    for w in (2, 3):
        for name, p in models[1].items():
            torch.testing.assert_close(models[w][name], p, rtol=1e-4, atol=1e-5)


def test_metrics_contract_and_workers(runs):
    uri, _, out = runs
    for w, (s, _) in out.items():
        for key in (
            "train/loss",
            "val/loss",
            "val/accuracy",
            "lr",
            "mf",
            "batch/global",
            "batch/local",
            "batch/accum_steps",
            "workers",
            "samples_seen",
            "epoch",
            "throughput/samples_per_s",
        ):
            assert metric_series(uri, s.run_id, key), f"W={w}: no {key}"
        assert {v for _, v in metric_series(uri, s.run_id, "workers")} == {float(w)}
        local = metric_series(uri, s.run_id, "batch/local")[0][1]
        assert local == -(-50 // w)  # rank 0 takes the larger share of an uneven batch
        accum = metric_series(uri, s.run_id, "batch/accum_steps")[0][1]
        assert accum == -(-local // 16)
        assert metric_series(uri, s.run_id, "samples_seen")[-1][1] == 1438


def test_each_sample_seen_once_and_same_global_batches(runs):
    _, _, out = runs
    batches = {}
    for w, (_, folder) in out.items():
        rows = read_sample_log(str(folder))
        by_step: dict[int, list[int]] = {}
        for r in sorted(rows, key=lambda r: (r["step"], r["rank"])):
            by_step.setdefault(r["step"], []).extend(r["ids"])
        ids = [i for step in sorted(by_step) for i in by_step[step]]
        assert sorted(ids) == list(range(1438)), f"W={w}: a sample was skipped or repeated"
        assert {r["rank"] for r in rows} == set(range(w))
        batches[w] = by_step
    assert batches[1] == batches[2] == batches[3]
