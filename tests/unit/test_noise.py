"""The gradient-noise estimators against closed forms: no Ray, a second or two."""

from __future__ import annotations

import io
import math

import pytest
import torch

from trainers.policies.noise import (
    AdaScaleSignal,
    GradientNoiseScale,
    MicroBatchGradNorms,
    NoiseProbe,
    norm_test,
    sq_norm_tensor,
)
from trainers.policies.schedules import SCALING_RULES

# --------------------------------------------------------------------------- the test problem
#
# Linear regression x ~ N(0, I_d), y = w*.x + eps, eps ~ N(0, s^2), loss 0.5 (w.x - y)^2.
# At w = w* + a the per-example gradient is (x.a - eps) x, so G = E[x x^T] a = a and,
# since E[(x.a)^2 x x^T] = |a|^2 I + 2 a a^T for Gaussian x,
#   E[g g^T] = |a|^2 I + 2 a a^T + s^2 I,   tr(Sigma) = tr E[g g^T] - |G|^2 = (d+1)|a|^2 + d s^2.

D, NOISE = 10, 2.0


def _problem(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Generator]:
    g = torch.Generator().manual_seed(seed)
    w_star = torch.randn(D, generator=g, dtype=torch.float64)
    a = torch.randn(D, generator=g, dtype=torch.float64)
    return w_star, a / a.norm(), g  # |a| = 1


def _true(a: torch.Tensor) -> tuple[float, float]:
    g_sq = float(a.square().sum())
    return g_sq, (D + 1) * g_sq + D * NOISE**2


def _sample(w_star: torch.Tensor, n: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(n, D, generator=g, dtype=torch.float64)
    return x, x @ w_star + NOISE * torch.randn(n, generator=g, dtype=torch.float64)


def _measure_b_simple(
    seed: int, batch: int, micro: int, steps: int = 400, ema: float = 0.998
) -> tuple[GradientNoiseScale, float]:
    """Feed the estimator through the loop's probe at W = 1: micro-batch gradients by accumulation,
    the big one at the end, the statistics "reduced" over one worker.

    The loss is the sum over the micro-batch divided by the global ``batch``, so the
    accumulated ``.grad`` is the mean gradient of the batch, and micro-batch ``j``'s
    own mean gradient is its contribution times ``batch / len(j)``.
    """
    w_star, a, g = _problem(seed)
    w = torch.nn.Parameter(w_star + a)
    probe = NoiseProbe(ema, [w], world=1, device=torch.device("cpu"))
    for _ in range(steps):
        x, y = _sample(w_star, batch, g)
        w.grad = None
        probe.begin_step()
        for mb in torch.split(torch.arange(batch), micro):
            (0.5 * (x[mb] @ w - y[mb]).square().sum() / batch).backward()
            probe.after_micro_batch(batch, len(mb))
        probe.update(probe.finish(batch, batch).tolist(), batch)
    g_sq, trace = _true(a)
    return probe.gns, trace / g_sq


def test_b_simple_matches_closed_form() -> None:
    gns, truth = _measure_b_simple(seed=0, batch=128, micro=32)
    assert gns.b_simple is not None
    assert gns.b_simple == pytest.approx(truth, rel=0.15)
    w_star, a, _ = _problem(0)
    g_sq, trace = _true(a)
    assert gns.g_sq == pytest.approx(g_sq, rel=0.15)
    assert gns.trace_sigma == pytest.approx(trace, rel=0.15)


def test_b_simple_does_not_depend_on_the_batch_it_is_measured_at() -> None:
    small, _ = _measure_b_simple(seed=1, batch=32, micro=8)
    big, _ = _measure_b_simple(seed=2, batch=128, micro=32)
    assert small.b_simple is not None and big.b_simple is not None
    assert small.b_simple == pytest.approx(big.b_simple, rel=0.30)


def test_uneven_micro_batches_pool_at_the_harmonic_mean() -> None:
    # 100 = 40 + 40 + 20: the pooled small size is 1/mean(1/b_i), and the estimate stays unbiased.
    gns, truth = _measure_b_simple(seed=3, batch=100, micro=40)
    assert gns.b_simple == pytest.approx(truth, rel=0.15)
    # the probe's sums pool the small norms as their mean at the harmonic mean size
    w = torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))
    probe = NoiseProbe(0.0, [w], world=1, device=torch.device("cpu"))
    probe.begin_step()
    for value, b in ((1.0, 40), (2.0, 30), (3.0, 30)):  # micro-batch gradients of squared norm 1, 2, 3
        w.grad = (w.grad if w.grad is not None else torch.zeros_like(w)) + torch.tensor(
            [value**0.5, 0.0], dtype=torch.float64
        ) * (b / 100)
        probe.after_micro_batch(100, b)
    small = probe.finish(100, 100).tolist()
    assert small[0] / small[3] == pytest.approx(2.0)
    assert small[3] / small[1] == pytest.approx(3 / (1 / 40 + 2 / 30))


def test_one_step_estimate_solves_the_two_equations() -> None:
    g_sq, trace = 2.0, 50.0
    small = g_sq + trace / 8  # E|g_b|^2 = |G|^2 + tr(Sigma)/b, exactly
    big = g_sq + trace / 64
    assert GradientNoiseScale.estimate(small, 8, big, 64) == pytest.approx((g_sq, trace))
    gns = GradientNoiseScale(ema=0.9)
    assert gns.b_simple is None and gns.g_sq is None
    for _ in range(3):
        gns.update(small, 8, big, 64)
    # bias correction: constant inputs read back exactly after any number of updates
    assert gns.g_sq == pytest.approx(g_sq) and gns.trace_sigma == pytest.approx(trace)
    assert gns.b_simple == pytest.approx(25.0)
    assert gns.big_sq == pytest.approx(big)


def test_not_estimable_and_bad_inputs() -> None:
    gns = GradientNoiseScale(ema=0.0)
    gns.update(1.0, 8, 1.5, 64)  # big > small: negative trace estimate
    assert gns.b_simple is None
    gns.update(float("nan"), 8, 1.0, 64)  # ignored
    assert gns.count == 1
    with pytest.raises(ValueError, match="b_small < b_big"):
        gns.update(1.0, 64, 1.0, 64)
    with pytest.raises(ValueError, match="ema"):
        GradientNoiseScale(ema=1.0)


def test_state_round_trips_through_a_weights_only_checkpoint() -> None:
    gns = GradientNoiseScale(ema=0.9)
    for i in range(5):
        gns.update(3.0 + i, 8, 1.0, 64)
    buf = io.BytesIO()
    torch.save({"gns": gns.state_dict()}, buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)["gns"]
    fresh = GradientNoiseScale(ema=0.9)
    fresh.load_state_dict(state)
    assert (fresh.g_sq, fresh.trace_sigma, fresh.b_simple, fresh.count) == (
        gns.g_sq,
        gns.trace_sigma,
        gns.b_simple,
        gns.count,
    )
    gns.update(4.0, 8, 1.5, 64)
    fresh.update(4.0, 8, 1.5, 64)
    assert fresh.state_dict() == gns.state_dict()
    with pytest.raises(ValueError, match="ema"):
        GradientNoiseScale(ema=0.5).load_state_dict(state)


# --------------------------------------------------------------------------- squared norms


def test_sq_norm_and_micro_batch_probe() -> None:
    ts = [torch.tensor([3.0, 4.0]), None, torch.tensor([[1.0, 2.0]])]
    assert float(sq_norm_tensor(ts)) == pytest.approx(30.0)
    assert float(sq_norm_tensor(ts, scale=2.0)) == pytest.approx(120.0)
    assert sq_norm_tensor(ts).dtype == torch.float64
    assert float(sq_norm_tensor([])) == 0.0

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    probe = MicroBatchGradNorms(model.parameters())
    xs = [torch.randn(5, 4), torch.randn(7, 4)]
    probe.reset()
    got = []
    for x in xs:
        model(x).square().sum().backward()
        got.append(float(probe.after_backward()))
    for x, value in zip(xs, got):  # each micro-batch's own gradient, computed alone
        own = torch.autograd.grad(model(x).square().sum(), list(model.parameters()))
        assert value == pytest.approx(float(sq_norm_tensor(own)), rel=1e-10)


# --------------------------------------------------------------------------- norm test


def _known_samples(c: float) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Four samples of 16 around g = e_1 with deviations +-c e_2, +-c e_3: Var = 16 * 4c^2 / 3."""
    g = torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=torch.float64)
    devs = [
        torch.tensor(v, dtype=torch.float64) * c for v in ([0, 1, 0, 0], [0, -1, 0, 0], [0, 0, 1, 0], [0, 0, -1, 0])
    ]
    return [g + dv for dv in devs], g


def _variance_from_samples(samples: list[torch.Tensor], sizes: list[int]) -> tuple[float, float]:
    """Reference for (3), left-hand form: ``sum_i b_i |g_i - g_B|^2 / (n - 1)`` with ``g_B`` the
    ``b_i``-weighted mean of the sample gradients; returns ``(Var, |g_B|^2)``."""
    w = torch.tensor([float(b) for b in sizes], dtype=torch.float64)
    stacked = torch.stack(samples)
    mean = (w[:, None] * stacked).sum(0) / w.sum()
    return float((w * (stacked - mean).square().sum(1)).sum()) / (len(samples) - 1), float(mean.square().sum())


def test_norm_test_asks_for_the_batch_of_the_formula() -> None:
    eta = 0.5
    samples, g = _known_samples(c=2.0)
    var = 16 * 4 * 2.0**2 / 3
    ref_var, grad_sq = _variance_from_samples(samples, [16] * 4)
    assert ref_var == pytest.approx(var) and grad_sq == pytest.approx(1.0)
    res = norm_test(ref_var, grad_sq, 64, eta)
    assert not res.ok  # 85.3/64 > 0.25
    assert res.required == pytest.approx(var / (eta**2 * 1.0))
    assert res.suggested == math.ceil(var / (eta**2 * 1.0)) == 342
    # the noise-scale estimate from squared norms only (one scalar per sample) is the same variance
    mean_sq = sum(float(s.square().sum()) for s in samples) / 4
    assert GradientNoiseScale.estimate(mean_sq, 16, grad_sq, 64)[1] == pytest.approx(var)
    gns = GradientNoiseScale(ema=0.0)
    gns.update(mean_sq, 16, grad_sq, 64)
    smoothed = gns.norm_test(64, eta)
    assert smoothed is not None and smoothed.suggested == 342
    # small deviations pass and keep the batch
    ok = norm_test(*_variance_from_samples(_known_samples(c=0.5)[0], [16] * 4), 64, eta)
    assert ok.ok and ok.suggested == 64


def test_noise_estimate_is_unbiased_with_uneven_samples() -> None:
    # Per-example gradients z ~ N(G, diag(sig^2)); samples of sizes 3, 5, 12, 20 are their means.
    gen = torch.Generator().manual_seed(0)
    G = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    sig = torch.tensor([3.0, 1.0, 2.0], dtype=torch.float64)
    sizes = [3, 5, 12, 20]
    trials = 4000
    z = G + sig * torch.randn(trials, sum(sizes), 3, generator=gen, dtype=torch.float64)
    parts = torch.split(z, sizes, dim=1)
    means = torch.stack([p.mean(1) for p in parts], dim=1)  # trials x n x d
    big = z.mean(1)
    w = torch.tensor(sizes, dtype=torch.float64)
    var = (w[None, :, None] * (means - big[:, None, :]).square()).sum((1, 2)) / (len(sizes) - 1)
    assert float(var.mean()) == pytest.approx(float(sig.square().sum()), rel=0.03)
    # what the loop measures (the probe's pooled small norm at the harmonic mean size) is unbiased too
    b_small = len(sizes) / sum(1.0 / b for b in sizes)
    small = means.square().sum(2).mean(1)
    traces = [
        GradientNoiseScale.estimate(float(small[t]), b_small, float(big[t].square().sum()), sum(sizes))[1]
        for t in range(trials)
    ]
    assert sum(traces) / trials == pytest.approx(float(sig.square().sum()), rel=0.05)


def test_norm_test_edge_cases_and_smoothed_form() -> None:
    assert norm_test(0.0, 1.0, 32, 0.5).ok
    zero_grad = norm_test(1.0, 0.0, 32, 0.5)
    assert not zero_grad.ok and zero_grad.suggested is None and math.isinf(zero_grad.required)
    gns = GradientNoiseScale(ema=0.0)
    assert gns.norm_test(64, 0.5) is None
    gns.update(2.0 + 50.0 / 8, 8, 2.0 + 50.0 / 64, 64)
    res = gns.norm_test(64, 0.5)
    assert res is not None and res.suggested == math.ceil(50.0 / (0.25 * (2.0 + 50.0 / 64)))


# --------------------------------------------------------------------------- AdaScale

_ADASCALE = SCALING_RULES["adascale"]  # the one AdaScale gain: the LR schedule's scaling rule


def test_adascale_gain() -> None:
    trace, g_sq, b0 = 640.0, 1.0, 64  # B_simple = 640, var at B0 = 10
    gns = GradientNoiseScale(ema=0.0)
    assert gns.adascale_signal(b0) is None and _ADASCALE(4.0, None) == 1.0  # no estimate yet: no scaling
    gns.update(g_sq + trace / 8, 8, g_sq + trace / 64, 64)
    sig = gns.adascale_signal(b0)
    assert _ADASCALE(1.0, sig) == pytest.approx(1.0)
    r4 = _ADASCALE(4.0, sig)
    assert r4 == pytest.approx((10 + 1) / (10 / 4 + 1))
    b_simple = trace / g_sq
    assert r4 == pytest.approx((1 + b_simple / b0) / (1 + b_simple / (4 * b0)))
    gains = [_ADASCALE(k, sig) for k in (1, 2, 4, 8, 16)]
    assert gains == sorted(gains) and all(1.0 <= r <= k for r, k in zip(gains, (1, 2, 4, 8, 16)))
    assert _ADASCALE(8.0, AdaScaleSignal(var=0.0, sqr=1.0)) == 1.0  # no noise: keep the base lr
    assert _ADASCALE(8.0, AdaScaleSignal(var=5.0 / b0, sqr=0.0)) == 8.0  # no signal: linear scaling
    assert _ADASCALE(8.0, AdaScaleSignal(var=-5.0 / b0, sqr=1.0)) == 1.0  # a negative early estimate is clipped


def test_adascale_signal_is_normalized_at_the_base_batch() -> None:
    trace, g_sq, b0 = 640.0, 1.0, 64
    gns = GradientNoiseScale(ema=0.0)
    assert gns.adascale_signal(b0) is None
    gns.update(g_sq + trace / 8, 8, g_sq + trace / 64, 64)
    sig = gns.adascale_signal(b0)
    assert sig is not None
    assert sig.var == pytest.approx(trace / b0) and sig.sqr == pytest.approx(g_sq)
    # r = (1 + B_simple/B0) / (1 + B_simple/B), B = k B0
    assert _ADASCALE(4.0, sig) == pytest.approx((1 + trace / g_sq / b0) / (1 + trace / g_sq / (4 * b0)))
