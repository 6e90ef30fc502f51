"""The gradient-noise estimators against closed forms: no Ray, a second or two."""

from __future__ import annotations

import io
import math

import pytest
import torch

from trainers.noise import (GradientNoiseScale, MicroBatchGradNorms, adascale_gain, norm_test, norm_test_batch,
                            norm_test_from_sq_norms, per_example_variance, pooled_small_batch, sq_norm,
                            sq_norm_tensor)

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


def _measure_b_simple(seed: int, batch: int, micro: int, steps: int = 400, ema: float = 0.998) -> tuple[
        GradientNoiseScale, float]:
    """Feed the estimator the way the loop does: micro-batch gradients by accumulation, the big one at the end.

    The loss is the sum over the micro-batch divided by the global ``batch``, so the
    accumulated ``.grad`` is the mean gradient of the batch, and micro-batch ``j``'s
    own mean gradient is its contribution times ``batch / len(j)``.
    """
    w_star, a, g = _problem(seed)
    w = torch.nn.Parameter(w_star + a)
    gns = GradientNoiseScale(ema)
    probe = MicroBatchGradNorms([w])
    for _ in range(steps):
        x, y = _sample(w_star, batch, g)
        w.grad = None
        probe.reset()
        small, sizes = [], []
        for mb in torch.split(torch.arange(batch), micro):
            (0.5 * (x[mb] @ w - y[mb]).square().sum() / batch).backward()
            small.append(float(probe.after_backward(scale=batch / len(mb))))
            sizes.append(len(mb))
        gns.update_from_samples(small, sizes, sq_norm([w.grad]), batch)
    g_sq, trace = _true(a)
    return gns, trace / g_sq


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
    mean_sq, b = pooled_small_batch([1.0, 2.0, 3.0], [40, 30, 30])
    assert mean_sq == pytest.approx(2.0)
    assert b == pytest.approx(3 / (1 / 40 + 2 / 30))


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
    assert (fresh.g_sq, fresh.trace_sigma, fresh.b_simple, fresh.count) == (gns.g_sq, gns.trace_sigma,
                                                                             gns.b_simple, gns.count)
    gns.update(4.0, 8, 1.5, 64)
    fresh.update(4.0, 8, 1.5, 64)
    assert fresh.state_dict() == gns.state_dict()
    with pytest.raises(ValueError, match="ema"):
        GradientNoiseScale(ema=0.5).load_state_dict(state)


# --------------------------------------------------------------------------- squared norms


def test_sq_norm_and_micro_batch_probe() -> None:
    ts = [torch.tensor([3.0, 4.0]), None, torch.tensor([[1.0, 2.0]])]
    assert sq_norm(ts) == pytest.approx(30.0)
    assert sq_norm(ts, scale=2.0) == pytest.approx(120.0)
    assert sq_norm_tensor(ts).dtype == torch.float64
    assert sq_norm([]) == 0.0

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
        assert value == pytest.approx(sq_norm(own), rel=1e-10)


# --------------------------------------------------------------------------- norm test


def _known_samples(c: float) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Four samples of 16 around g = e_1 with deviations +-c e_2, +-c e_3: Var = 16 * 4c^2 / 3."""
    g = torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=torch.float64)
    devs = [torch.tensor(v, dtype=torch.float64) * c for v in
            ([0, 1, 0, 0], [0, -1, 0, 0], [0, 0, 1, 0], [0, 0, -1, 0])]
    return [g + dv for dv in devs], g


def test_norm_test_asks_for_the_batch_of_the_formula() -> None:
    eta = 0.5
    samples, g = _known_samples(c=2.0)
    var = 16 * 4 * 2.0**2 / 3
    res = norm_test_batch(samples, [16] * 4, eta)
    assert res.variance == pytest.approx(var)
    assert res.grad_sq == pytest.approx(1.0) and res.batch == 64
    assert not res.ok  # 85.3/64 > 0.25
    assert res.required == pytest.approx(var / (eta**2 * 1.0))
    assert res.suggested == math.ceil(var / (eta**2 * 1.0)) == 342
    # the squared-norm form gives the same answer from one scalar per sample
    from_sq = norm_test_from_sq_norms([float(s.square().sum()) for s in samples], [16] * 4, 1.0, eta)
    assert from_sq.suggested == 342 and from_sq.variance == pytest.approx(var)
    # small deviations pass and keep the batch
    ok = norm_test_batch(_known_samples(c=0.5)[0], [16] * 4, eta)
    assert ok.ok and ok.suggested == 64


def test_norm_test_variance_is_unbiased_with_uneven_samples() -> None:
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
    var = ((w[None, :, None] * (means - big[:, None, :]).square()).sum((1, 2)) / (len(sizes) - 1))
    assert float(var.mean()) == pytest.approx(float(sig.square().sum()), rel=0.03)
    # the squared-norm form is the same number, trial by trial
    for t in range(3):
        sq = [float(means[t, i].square().sum()) for i in range(len(sizes))]
        assert per_example_variance(sq, sizes, float(big[t].square().sum())) == pytest.approx(float(var[t]))


def test_norm_test_edge_cases_and_smoothed_form() -> None:
    assert norm_test(0.0, 1.0, 32, 0.5).ok
    zero_grad = norm_test(1.0, 0.0, 32, 0.5)
    assert not zero_grad.ok and zero_grad.suggested is None and math.isinf(zero_grad.required)
    with pytest.raises(ValueError):
        norm_test_batch([torch.ones(3)], [8], 0.5)
    gns = GradientNoiseScale(ema=0.0)
    assert gns.norm_test(64, 0.5) is None
    gns.update(2.0 + 50.0 / 8, 8, 2.0 + 50.0 / 64, 64)
    res = gns.norm_test(64, 0.5)
    assert res is not None and res.suggested == math.ceil(50.0 / (0.25 * (2.0 + 50.0 / 64)))


# --------------------------------------------------------------------------- AdaScale


def test_adascale_gain() -> None:
    trace, g_sq, b0 = 640.0, 1.0, 64  # B_simple = 640, var at B0 = 10
    assert adascale_gain(trace, g_sq, 1.0, b0) == pytest.approx(1.0)
    r4 = adascale_gain(trace, g_sq, 4.0, b0)
    assert r4 == pytest.approx((10 + 1) / (10 / 4 + 1))
    b_simple = trace / g_sq
    assert r4 == pytest.approx((1 + b_simple / b0) / (1 + b_simple / (4 * b0)))
    gains = [adascale_gain(trace, g_sq, k, b0) for k in (1, 2, 4, 8, 16)]
    assert gains == sorted(gains) and all(1.0 <= r <= k for r, k in zip(gains, (1, 2, 4, 8, 16)))
    assert adascale_gain(0.0, 1.0, 8.0, b0) == 1.0  # no noise: keep the base lr
    assert adascale_gain(5.0, 0.0, 8.0, b0) == 8.0  # no signal: linear scaling
    assert adascale_gain(-5.0, 1.0, 8.0, b0) == 1.0  # a negative early estimate is clipped
    gns = GradientNoiseScale(ema=0.0)
    assert gns.gain(4.0, b0) is None
    gns.update(g_sq + trace / 8, 8, g_sq + trace / 64, 64)
    assert gns.gain(4.0, b0) == pytest.approx(r4)


def test_adascale_signal_is_normalized_at_the_base_batch() -> None:
    trace, g_sq, b0 = 640.0, 1.0, 64
    gns = GradientNoiseScale(ema=0.0)
    assert gns.adascale_signal(b0) is None
    gns.update(g_sq + trace / 8, 8, g_sq + trace / 64, 64)
    sig = gns.adascale_signal(b0)
    assert sig is not None
    assert sig.var == pytest.approx(trace / b0) and sig.sqr == pytest.approx(g_sq)
    assert sig.gain(4.0) == pytest.approx(adascale_gain(trace, g_sq, 4.0, b0))
