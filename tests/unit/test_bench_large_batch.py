"""Tier 1: bench/large_batch.py's in-process simulation of W workers on a few steps (no processes):
local SGD with H = 1 and averaged momentum is per-step averaging exactly, Adasum of one worker is
plain SGD, and the byte counts follow the docstring.  (Without BatchNorm: with it, local SGD
averages the workers' running statistics where DDP keeps rank 0's, so only the weights agree.)"""

import pytest

from bench.large_batch import config, decentral_run, train

STEPS = 0.05  # epochs: 1438 * 0.05 / 64 -> 2 steps at B = 64


@pytest.fixture(scope="module")
def runs():
    cfg = config(hidden=4, epochs=STEPS, seed=0, batch={"size": 64}, model={"norm": "none"})
    return {
        "mean": train(cfg, workers=2),
        "local1": train(cfg, workers=2, method="local_sgd", local_steps=1),
        "mean1": train(
            config(
                hidden=4,
                epochs=STEPS,
                seed=0,
                batch={"size": 64},
                model={"norm": "none"},
                schedule={"scaling_rule": "none"},
            ),
            workers=1,
        ),
        "ada1": train(
            config(
                hidden=4,
                epochs=STEPS,
                seed=0,
                batch={"size": 64},
                model={"norm": "none"},
                schedule={"scaling_rule": "none"},
                combine={"method": "adasum"},
            ),
            workers=1,
            method="adasum",
        ),
    }


def test_local_sgd_h1_is_per_step_averaging(runs):
    a, b = runs["mean"], runs["local1"]
    assert a.steps == b.steps == 2 and a.samples == b.samples
    assert b.val_acc == pytest.approx(a.val_acc, abs=1e-9)
    assert b.train_loss == pytest.approx(a.train_loss, rel=1e-5)
    assert b.syncs == 2 and b.bytes_sent > a.bytes_sent  # parameters + buffers + momentum vs a gradient


def test_adasum_of_one_worker_is_sgd(runs):
    assert runs["ada1"].train_loss == pytest.approx(runs["mean1"].train_loss, rel=1e-5)
    assert runs["ada1"].bytes_sent == runs["mean1"].bytes_sent


def test_decentral_table_runs_each_method_on_simulated_workers():
    """Table 4's run (a quarter epoch at B = 1024 over 4 workers): finite, the bytes of each method."""
    rs = {m: decentral_run(m, 1024, 4, "shards", 0.25, 0.05, seed=0) for m in ("mean", "dmsgd", "decentlam")}
    P = 32 * 64 + 64 + 64 * 10 + 10
    assert rs["mean"]["bytes"] == 2 * 3 * P * 4 // 4 and rs["mean"]["consensus"] == 0.0
    assert rs["dmsgd"]["bytes"] == rs["decentlam"]["bytes"] == 2 * P * 4  # ring: two neighbours
    for r in rs.values():
        assert r["steps"] == 2 and 0.0 <= r["acc"] <= 1.0
