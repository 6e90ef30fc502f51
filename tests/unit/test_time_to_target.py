"""bench/time_to_target.py's reading of a run (no processes): the crossing interpolated in
log-perplexity between two validations, the schedules' horizons placed at the cap, the projection
counting the crossing's last step in part; and ``train.eval_every_samples``, which validates every
schedule at the same resolution in samples whatever its batch."""

import argparse
import math
import os

import pytest

from bench.time_to_target import Hit, Outcome, base_values, cluster_sync, crossing, project, schedules
from orchestrator.config.prepare import load_config
from trainers.loop.config import TrainConfig, eval_due

CONFIGS = os.path.join(os.path.dirname(__file__), "..", "..", "configs")


def test_crossing_is_interpolated_in_log_perplexity():
    # (step, ppl, samples, wall s): 20 -> 5 between steps 100 and 200; 10 is halfway in log
    points = [(50, 40.0, 100.0, 1.0), (100, 20.0, 200.0, 2.0), (200, 5.0, 600.0, 6.0), (300, 4.0, 1000.0, 9.0)]
    step, samples, wall = crossing(points, 10.0)
    assert step == pytest.approx(150) and samples == pytest.approx(400) and wall == pytest.approx(4)
    assert crossing(points, 5.0) == (200, 600.0, 6.0)  # a validation exactly at the target is the crossing
    assert crossing(points, 50.0) == (50, 100.0, 1.0)  # the first validation already under it
    assert crossing(points, 3.0) is None
    step, _, _ = crossing(points, 5.0 * math.exp(0.25 * math.log(4)))  # a quarter of the way down in log
    assert step == pytest.approx(175)


def test_horizon_schedules_take_the_cap():
    base = base_values(os.path.join(CONFIGS, "lm_adaptive.yaml"))
    plans = dict(schedules(base, 0.04, 8))
    assert plans["ramp"]["batch"]["ramp_epochs"] == pytest.approx(0.02)
    assert plans["seesaw"]["schedule"]["milestones"] == pytest.approx([0.01, 0.02, 0.03])
    assert plans["fixed 8*B0"]["batch"]["size"] == 8 * base["b0"] == 16
    assert plans["noise_scale"]["batch"]["max_size"] == 16
    assert base["eval_samples"] == 20  # eval_every 10 x B0 2


def test_lm_growing_starts_below_the_critical_batch_and_grows():
    cfg = load_config(os.path.join(CONFIGS, "lm_growing.yaml"), [])
    assert cfg.optimizer.base_batch_size == cfg.batch.size == 4 and cfg.batch.max_size == 256
    assert cfg.batch.policy == "noise_scale" and cfg.model.params == {"n_layer": 4, "n_head": 6, "d_model": 192}
    assert cfg.train.eval_every_samples > 0 and cfg.schedule.decay == "none"


def test_projection_counts_the_last_step_in_part():
    class Fit:  # T = 1 s a step whatever b and W
        def step_time(self, b, w):
            return 1.0

    o = Outcome("x", batch=[(1, 2), (3, 8)], hit=Hit(step=3.5, samples=0, wall_s=0))
    seconds, worker_s = project(o, Fit(), local=2)
    assert seconds == pytest.approx(3.5)  # steps 1, 2 (B 2: W 1), 3 and half of 4 (B 8: W 4)
    assert worker_s == pytest.approx(1 + 1 + 4 + 2)
    assert project(Outcome("y"), Fit(), local=2) is None


def test_projection_adds_each_steps_synchronisation_of_its_workers():
    class Fit:
        def step_time(self, b, w):
            return 1.0

    o = Outcome("x", batch=[(1, 2), (3, 8)], hit=Hit(step=4, samples=0, wall_s=0))
    seconds, worker_s = project(o, Fit(), local=2, sync=lambda w: 0.5 * (w - 1))
    assert seconds == pytest.approx(1 + 1 + 2.5 + 2.5)  # W = 4 on steps 3 and 4: 1.5 s of sync each
    assert worker_s == pytest.approx(1 + 1 + 4 * 2.5 * 2)


def test_cluster_sync_is_a_ring_all_reduce_of_the_gradient_or_the_stated_gamma():
    a = argparse.Namespace(sync_s=None, bandwidth_gbps=100.0, latency_us=5.0)
    sync, note = cluster_sync(a, 10_000_000)
    # W = 2: half the 80 Mbit each way (0.8 ms at 100 Gb/s) + 2 hops of 5 us; W = 1: nothing
    assert sync(1) == 0.0 and sync(2) == pytest.approx(0.8e-3 + 10e-6)
    assert sync(64) == pytest.approx(2 * 63 / 64 * 0.8e-3 + 2 * 63 * 5e-6)
    assert "10.00 MB" in note and "100 Gb/s" in note
    sync, note = cluster_sync(argparse.Namespace(sync_s=0.002, bandwidth_gbps=100.0, latency_us=5.0), 10)
    assert sync is None and "0.002" in note


def test_base_values_count_the_gradient_bytes_of_the_configs_model():
    base = base_values(os.path.join(CONFIGS, "lm_growing.yaml"))
    assert 1.8e6 * 4 < base["grad_bytes"] < 2.1e6 * 4  # the 1.9M-parameter GPT in fp32


@pytest.mark.parametrize(
    ("every", "every_samples", "step", "seen", "trained", "ended", "due"),
    [
        (0, 0, 7, 70, 10, True, True),  # neither: the epoch's end
        (0, 0, 7, 70, 10, False, False),
        (5, 0, 10, 100, 10, False, True),
        (0, 40, 4, 40, 10, False, True),  # samples seen reach 40
        (0, 40, 5, 50, 10, False, False),
        (0, 40, 6, 130, 80, False, True),  # a large batch passes 80 and 120: one validation
        (0, 40, 6, 130, 0, False, False),  # a skipped step trained nothing
        (0, 40, 9, 70, 10, True, False),  # samples set: no extra pass at the epoch's end
    ],
)
def test_eval_every_samples(every, every_samples, step, seen, trained, ended, due):
    train = TrainConfig(eval_every=every, eval_every_samples=every_samples)
    assert eval_due(train, step, seen, trained, ended) is due


def test_break_even_is_the_fixed_step_time_at_which_the_cost_aim_is_met():
    from bench.time_to_target import break_even

    fixed = Outcome("f", hit=Hit(step=2590, samples=10359, wall_s=0))
    ns = Outcome("n", hit=Hit(step=886, samples=10897, wall_s=0))
    r = break_even(ns, fixed, 0.8)
    # (886 r + 10897) = 0.8 (2590 r + 10359) at the break-even: the cost ratio there is 0.8
    assert (886 * r + 10897) / (2590 * r + 10359) == pytest.approx(0.8)
    assert break_even(Outcome("n", hit=Hit(step=100, samples=5000, wall_s=0)), fixed, 0.8) == 0.0
    assert break_even(Outcome("n", hit=Hit(step=2590, samples=10897, wall_s=0)), fixed, 0.8) == math.inf
    assert break_even(Outcome("n"), fixed, 0.8) is None


def test_a_stated_step_time_replaces_the_fit_and_bad_ones_exit_2(capsys):
    from bench.time_to_target import stated_step_time

    fit = stated_step_time("0.05,0.001", 0.0)
    assert fit.step_time(10, 1) == pytest.approx(0.06)
    for bad in ("0.05", "a,b", "nan,1", "-1,0.1", "0,0"):
        with pytest.raises(SystemExit) as e:
            stated_step_time(bad, 0.0)
        assert e.value.code == 2
        assert "--step-time" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        ["--bandwidth-gbps", "0"],
        ["--latency-us", "-1"],
        ["--sync-s", "nan"],
        ["--horizon-factor", "inf"],
        ["--target", "0"],
        ["--step-time", "x"],
    ],
)
def test_bad_numbers_exit_2_before_any_run(argv, capsys, monkeypatch):
    import bench.time_to_target as ttt

    monkeypatch.setattr(ttt, "train_one", lambda *a, **k: pytest.fail("trained before the check"))
    with pytest.raises(SystemExit) as e:
        ttt.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(argv[0])
