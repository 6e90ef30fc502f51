"""Pollux's goodput model (trainers/policies/goodput.py) and the goodput resize policy, against
hand-computed values: efficiency, the step-time fit, the (B, W) choice and when a resize pays.  No Ray."""

from __future__ import annotations

import math

import pytest

from trainers.policies.goodput import (
    StepTimeFit,
    StepTimeModel,
    batch_candidates,
    efficiency,
    evaluate,
    optimize,
    top_of_class,
)
from trainers.policies.resize import RESIZE_POLICIES, GoodputResize, build_resize_policy

# --------------------------------------------------------------------------- efficiency


def test_efficiency_by_hand() -> None:
    assert efficiency(64, b_noise=192, base_batch=64) == 1.0  # at B0: no loss
    assert efficiency(256, b_noise=192, base_batch=64) == pytest.approx(256 / 448)
    assert efficiency(32, b_noise=0, base_batch=64) == 2.0  # no noise: a sample at B counts B0/B
    # large noise: efficiency stays near 1 for batches well below B_noise
    assert efficiency(1024, b_noise=1e6, base_batch=64) == pytest.approx(1 - 960 / (1e6 + 1024))


@pytest.mark.parametrize("var, sqr, b0, b", [(3.0, 1.0, 64, 256), (0.5, 2.0, 32, 100), (10.0, 0.1, 16, 16)])
def test_efficiency_is_adaptdls_gain_over_scale(var: float, sqr: float, b0: int, b: int) -> None:
    """AdaptDL: gain = (var + sqr) / (var / k + sqr), efficiency = gain / k, k = B / B0, var the gradient
    variance at B0; that is E(B) with B_noise = var * B0 / sqr."""
    k = b / b0
    assert efficiency(b, b_noise=var * b0 / sqr, base_batch=b0) == pytest.approx((var + sqr) / (var / k + sqr) / k)


@pytest.mark.parametrize("args", [(0, 10, 64), (64, 10, 0), (64, -1, 64), (64, math.nan, 64)])
def test_efficiency_refuses_bad_input(args: tuple) -> None:
    with pytest.raises(ValueError, match="efficiency"):
        efficiency(*args)


# --------------------------------------------------------------------------- the step-time fit


def _model(points: list[tuple[int, int]], alpha: float, beta: float, gamma: float) -> StepTimeModel:
    m = StepTimeModel()
    for b, w in points:
        m.observe(b, w, alpha + beta * b + gamma * (w - 1))
    return m


def test_fit_recovers_the_parameters_of_data_that_follow_the_model() -> None:
    fit = _model([(64, 1), (32, 1), (16, 2), (64, 2), (32, 4)], 0.1, 0.01, 0.05).fit()
    assert fit is not None and fit.fixed == ()
    assert (fit.alpha, fit.beta, fit.gamma) == pytest.approx((0.1, 0.01, 0.05), rel=1e-9)
    assert fit.points == 5
    assert fit.step_time(48, 3) == pytest.approx(0.1 + 0.48 + 0.1)
    assert fit.throughput(96, 3) == pytest.approx(96 / (0.1 + 0.32 + 0.1))
    assert fit.throughput(97, 3) == pytest.approx(97 / (0.1 + 0.33 + 0.1))  # rank 0 takes ceil(B / W)


def test_fit_averages_repeated_steps_per_configuration() -> None:
    m = StepTimeModel()
    m.observe(64, 1, 1.0)
    m.observe(64, 1, 2.0, count=3)
    assert m.configurations == {(64, 1): (4, pytest.approx(1.75))}


def test_fit_without_data_is_none() -> None:
    assert StepTimeModel().fit() is None


def test_one_worker_count_fixes_the_sync_cost_to_the_prior() -> None:
    m = StepTimeModel(prior_sync_s=0.2)
    for b in (16, 64):
        m.observe(b, 2, 0.1 + 0.01 * b + 0.2)  # the prior is right: the rest is fitted exactly
    fit = m.fit()
    assert fit.gamma == 0.2 and (fit.alpha, fit.beta) == pytest.approx((0.1, 0.01))
    assert any("gamma = 0.2" in f for f in fit.fixed)


def test_one_configuration_splits_the_time_half_fixed_half_per_sample() -> None:
    """One (b, W): alpha = beta * b (AdaptDL's half split), gamma = the prior (0)."""
    m = StepTimeModel()
    m.observe(64, 1, 0.74)
    fit = m.fit()
    assert (fit.alpha, fit.beta, fit.gamma) == pytest.approx((0.37, 0.37 / 64, 0.0))
    assert len(fit.fixed) == 2


def test_batch_moving_only_with_w_ties_alpha_to_the_mean_local_batch() -> None:
    """B fixed at 64 on 1 and 2 workers: b moves with W, so alpha = beta * mean(b) = 48 beta and
    T = beta (48 + b) + gamma (W - 1): 0.74 = 112 beta, 0.92 = 80 beta + gamma."""
    m = StepTimeModel()
    m.observe(64, 1, 0.74)
    m.observe(32, 2, 0.92)
    fit = m.fit()
    beta = 0.74 / 112
    assert (fit.alpha, fit.beta, fit.gamma) == pytest.approx((48 * beta, beta, 0.92 - 80 * beta))
    assert fit.step_time(64, 1) == pytest.approx(0.74) and fit.step_time(32, 2) == pytest.approx(0.92)


def test_fit_parameters_are_never_negative() -> None:
    m = StepTimeModel()
    for b, w, t in ((16, 1, 0.5), (64, 1, 0.4), (16, 2, 0.3), (64, 2, 0.2)):  # faster with more work: noise
        m.observe(b, w, t)
    fit = m.fit()
    assert min(fit.alpha, fit.beta, fit.gamma) >= 0


def test_model_state_round_trip() -> None:
    m = _model([(64, 1), (32, 2)], 0.1, 0.01, 0.05)
    m2 = StepTimeModel(prior_sync_s=1.0)
    m2.load_state_dict(m.state_dict())
    assert m2.configurations == m.configurations and m2.fit() == m.fit() and m2.prior_sync_s == 0.0


@pytest.mark.parametrize("args", [(0, 1, 0.1), (64, 0, 0.1), (64, 1, 0.0), (64, 1, math.inf)])
def test_observe_refuses_bad_input(args: tuple) -> None:
    with pytest.raises(ValueError, match="observe"):
        StepTimeModel().observe(*args)


# --------------------------------------------------------------------------- the choice

SYNC_BOUND = StepTimeFit(alpha=0.1, beta=0.01, gamma=0.5, points=3)  # a 0.5 s all-reduce per extra worker
CHEAP_SYNC = StepTimeFit(alpha=0.1, beta=0.01, gamma=0.01, points=3)


def test_the_largest_batch_of_a_class_keeps_its_local_batch_within_the_bounds() -> None:
    assert top_of_class(100, 8, hi=1000) == 104  # ceil(100 / 8) = 13 = ceil(104 / 8)
    assert top_of_class(100, 8, hi=102) == 102  # capped by max_batch
    assert top_of_class(100, 8, hi=1000, round_to=8) == 104 and top_of_class(97, 8, hi=1000, round_to=32) == 97
    assert top_of_class(64, 1, hi=64) == 64


@pytest.mark.parametrize("seed", range(3))
def test_the_choice_is_never_a_batch_another_of_its_class_beats(seed: int) -> None:
    """At ``round_to`` 1 the geometric grid holds few batches of a class: scoring (1643, 16) left out
    (1648, 16), the same local batch 103 (the same step time) for 5 more samples a step."""
    import random

    rng = random.Random(seed)
    for _ in range(150):
        fit = StepTimeFit(rng.uniform(0.001, 0.2), rng.uniform(1e-4, 5e-3), rng.uniform(0, 0.05), points=3)
        cur, hi = rng.choice([16, 32, 48, 64, 100]), rng.choice([256, 512, 1000, 2048])
        d = optimize(
            fit,
            cur,
            rng.randint(1, 8),
            1,
            16,
            base_batch=16,
            b_noise=rng.uniform(10, 3000),
            min_batch=cur,
            max_batch=hi,
            round_to=1,
            remaining_samples=1e7,
        )
        c = d.chosen
        assert c.batch == top_of_class(c.batch, c.workers, hi), (fit, cur, hi, c)
        for w in range(1, 17):  # and each W's best is its class's largest batch
            best = next(a for a in d.alternatives if a.workers == w)
            assert best.batch == top_of_class(best.batch, w, hi)


def test_the_first_dominated_choice_found_is_fixed() -> None:
    fit = StepTimeFit(0.09497680347164722, 0.001960114594286266, 0.010497740318573857, points=3)
    d = optimize(fit, 64, 1, 1, 16, base_batch=16, b_noise=1303.97, min_batch=64, max_batch=2048, remaining_samples=1e7)
    assert (d.chosen.batch, d.chosen.workers) != (1643, 16)
    assert d.chosen.batch == top_of_class(d.chosen.batch, d.chosen.workers, 2048)


def test_goodput_is_throughput_times_efficiency() -> None:
    c = evaluate(CHEAP_SYNC, 128, 2, b_noise=192, base_batch=64)
    assert c.step_time_s == pytest.approx(0.1 + 0.64 + 0.01)
    assert c.throughput == pytest.approx(128 / 0.75)
    assert c.efficiency == pytest.approx(256 / 320)
    assert c.goodput == pytest.approx(128 / 0.75 * 256 / 320)


def test_sync_cost_dominating_chooses_a_smaller_group() -> None:
    """B = 64: T(W) = 0.1 + 0.01 ceil(64 / W) + 0.5 (W - 1): 0.74 s at W=1, 0.92 at 2, 1.32 at 3, 1.76 at 4."""
    d = optimize(SYNC_BOUND, 64, 4, 1, 4, base_batch=64, remaining_samples=64 * 1000, resize_cost_s=20.0)
    assert d.resize and (d.batch, d.workers) == (64, 1)
    assert [round(c.step_time_s, 4) for c in d.alternatives] == [0.74, 0.92, 1.32, 1.76]
    assert d.gain_s == pytest.approx(1000 * (1.76 - 0.74))  # 1000 steps left, each 1.02 s shorter
    assert d.reason.startswith("shrinking W 4 -> 1")
    for w, g in ((1, 64 / 0.74), (2, 64 / 0.92), (4, 64 / 1.76)):  # every alternative's goodput is logged
        assert f"W={w}: goodput {g:.4g}" in d.reason


def test_cheap_sync_chooses_the_biggest_group() -> None:
    d = optimize(CHEAP_SYNC, 64, 1, 1, 4, base_batch=64, remaining_samples=64 * 1000, resize_cost_s=20.0)
    assert d.resize and d.workers == 4 and d.reason.startswith("growing W 1 -> 4")


def test_a_resize_whose_gain_over_the_remaining_budget_does_not_pay_is_not_taken() -> None:
    """10 steps left: shrinking 4 -> 1 saves 10 x 1.02 s = 10.2 s, less than a 20 s restart."""
    d = optimize(SYNC_BOUND, 64, 4, 1, 4, base_batch=64, remaining_samples=64 * 10, resize_cost_s=20.0)
    assert not d.resize and d.workers == 4 and d.batch == 64
    assert d.gain_s == pytest.approx(10.2) and d.cost_s == 20.0
    assert "less than its ~20.0 s cost" in d.reason
    # the same gain with a cheaper resize (an overlap's 1 s pause) pays
    assert optimize(SYNC_BOUND, 64, 4, 1, 4, base_batch=64, remaining_samples=64 * 10, resize_cost_s=1.0).resize


def test_an_unknown_budget_never_resizes() -> None:
    d = optimize(SYNC_BOUND, 64, 4, 1, 4, base_batch=64, remaining_samples=None, resize_cost_s=0.0)
    assert not d.resize and "remaining budget is unknown" in d.reason


def test_best_batch_by_hand() -> None:
    """W=1, T = 1 + 0.01 B, B_noise = 100: goodput ~ B / ((1 + 0.01 B)(100 + B)) = 100 B / (100 + B)^2,
    highest at B = 100.  The batch changes without a resize (free)."""
    fit = StepTimeFit(alpha=1.0, beta=0.01, gamma=0.0, points=3)
    d = optimize(
        fit,
        10,
        1,
        1,
        1,
        base_batch=10,
        b_noise=100.0,
        max_batch=1000,
        batches=range(10, 1001, 10),
        remaining_samples=1e6,
    )
    assert (d.batch, d.workers, d.resize) == (100, 1, False) and d.batch_changes
    assert d.reason.startswith("B 10 -> 100 at W=1")
    assert d.chosen.goodput == pytest.approx(100 / 2.0 * 110 / 200)


def test_batch_and_workers_together() -> None:
    """Cheap sync, B_noise 500: the best of (B, W) grows both; each W's best batch is listed."""
    d = optimize(
        CHEAP_SYNC,
        64,
        1,
        1,
        4,
        base_batch=64,
        b_noise=500.0,
        max_batch=1024,
        round_to=8,
        remaining_samples=64 * 1000,
        resize_cost_s=20.0,
    )
    assert d.resize and d.workers == 4 and d.batch > 64 and d.batch % 8 == 0
    assert [c.workers for c in d.alternatives] == [1, 2, 3, 4]
    best = max(d.alternatives, key=lambda c: c.goodput)
    assert (best.batch, best.workers) == (d.batch, d.workers)


def test_without_a_noise_estimate_only_the_current_batch_is_scored() -> None:
    d = optimize(CHEAP_SYNC, 64, 1, 1, 4, base_batch=64, b_noise=None, max_batch=1024, remaining_samples=1e6)
    assert {c.batch for c in d.alternatives} == {64} and d.batch == 64


def test_a_tie_keeps_the_group() -> None:
    flat = StepTimeFit(alpha=1.0, beta=0.0, gamma=0.0, points=2)  # throughput does not depend on W
    d = optimize(flat, 64, 2, 1, 4, base_batch=64, remaining_samples=1e9)
    assert not d.resize and d.workers == 2
    assert d.alternatives[0].goodput == d.alternatives[1].goodput


def test_never_more_workers_than_samples() -> None:
    d = optimize(StepTimeFit(0.0, 1.0, 0.0, 1), 2, 1, 1, 8, base_batch=2, remaining_samples=1e6)
    assert max(c.workers for c in d.alternatives) == 2


def test_batch_candidates() -> None:
    grid = batch_candidates(64, 1024, round_to=8, count=16, include=(100,))
    assert grid[0] == 64 and grid[-1] == 1024 and 100 in grid
    assert all(b % 8 == 0 for b in grid if b != 100) and grid == sorted(set(grid))
    assert batch_candidates(64, 64) == [64]


# --------------------------------------------------------------------------- the resize policy


def test_goodput_is_a_registered_resize_policy() -> None:
    assert RESIZE_POLICIES["goodput"] is GoodputResize
    assert isinstance(build_resize_policy("goodput"), GoodputResize)


def test_goodput_policy_decides_as_workers_for_batch_until_it_has_measured() -> None:
    p = GoodputResize()
    d = p.decide(256, 64, 1, 1, 8)
    assert d and d.workers == 4 and "no step time measured yet" in d.reason
    assert not p.decide(64, 64, 1, 1, 8)


def test_goodput_policy_shrinks_when_measured_sync_dominates() -> None:
    p = GoodputResize()
    for b, w in ((64, 1), (32, 1), (16, 4), (32, 4)):
        p.observe(b, w, SYNC_BOUND.step_time(b, w))
    d = p.decide(64, 64, 4, 1, 4, remaining_samples=64 * 1000, resize_cost_s=20.0)
    assert d and d.workers == 1 and d.reason.startswith("shrinking W 4 -> 1")
    assert p.last is not None and p.last.batch == 64
    # with 10 steps left the same shrink does not pay: the group stays
    d = p.decide(64, 64, 4, 1, 4, remaining_samples=64 * 10, resize_cost_s=20.0)
    assert not d and "less than its" in d.reason
