"""Gradient noise: the noise-scale estimator, the norm test and the AdaScale gain.

Everything here is plain PyTorch/Python (no Ray, no MLflow), works on scalars the
training loop already has, and is deterministic: the same inputs give the same
estimates on every rank.

Notation (DESIGN.md section 5): per-example gradients ``g(x)`` with mean ``G`` and
per-example covariance ``Sigma``; ``g_b`` is the mean gradient of ``b`` examples
drawn i.i.d., so

    E[g_b] = G,   E|g_b - G|^2 = tr(Sigma)/b,   E|g_b|^2 = |G|^2 + tr(Sigma)/b.      (1)

**Gradient noise scale** (McCandlish, Kaplan, Amodei et al. 2018, "An empirical
model of large-batch training", appendix A).  Solving (1) at two batch sizes
``b_small < b_big`` gives unbiased estimates

    |G|^2      ~ (b_big*|g_big|^2 - b_small*|g_small|^2) / (b_big - b_small)
    tr(Sigma)  ~ (|g_small|^2 - |g_big|^2) / (1/b_small - 1/b_big)

Each estimate is very noisy from one step, so both are smoothed with an EMA and
``B_simple = EMA(tr Sigma) / EMA(|G|^2)`` (the ratio of the means, not the mean of
the ratios, which would be biased).  ``B_simple`` approximates the critical batch:
steps S = S_min(1 + B_noise/B), samples E = E_min(1 + B/B_noise).

**Norm test** (Byrd, Chin, Nocedal, Wu 2012, "Sample size selection in
optimization methods for machine learning", eq. 3.9-3.12; used with local SGD by
Lau, Liu, Kolar 2024).  The batch ``B`` is big enough while the expected squared
error of its gradient is at most ``eta^2`` times the squared gradient norm:

    Var / B <= eta^2 |g_B|^2,     otherwise take B' = ceil(Var / (eta^2 |g_B|^2)),  (2)

where ``Var = tr(Sigma)`` is the per-example variance summed over coordinates.
Here the samples are not single examples but ``n`` gradients ``g_i`` (one per
worker or micro-batch), each the mean over ``b_i`` examples, that partition the
batch: ``B = sum b_i`` and ``g_B = sum b_i g_i / B``.  Then
``E|g_i - g_B|^2 = tr(Sigma)(1/b_i - 1/B)`` and summing ``b_i`` times it over i gives
``tr(Sigma)(n - 1)``, so the unbiased per-example variance estimate is

    Var ~ sum_i b_i |g_i - g_B|^2 / (n - 1) = (sum_i b_i |g_i|^2 - B |g_B|^2) / (n - 1).  (3)

With equal ``b_i = b`` this is ``b`` times the sample variance of the ``g_i`` (summed
over coordinates), and it equals the noise-scale ``tr(Sigma)`` estimate above with
``b_small = b``, ``b_big = B``.  The right-hand form needs only squared norms, so a
loop can compute it from one scalar per worker.  In expectation (2) reads
``B >= B_simple (1/eta^2 - 1)``: the test is only meaningful for ``eta < 1``.

**AdaScale gain** (Johnson, Agrawal, Gu, Guestrin 2020, "AdaScale SGD", eq. 5).
At scale ``k = B/B0`` the learning rate of the base batch ``B0`` is multiplied by

    r = (sigma^2 + mu^2) / (sigma^2/k + mu^2),    1 <= r <= k for k >= 1,

where ``sigma^2 = E|g_B0 - G|^2`` is the gradient variance *at the base batch* and
``mu^2 = |G|^2``.  By (1), ``sigma^2 = tr(Sigma)/B0`` with the per-example
``tr(Sigma)`` this module estimates, so ``r = (B_simple/B0 + 1)/(B_simple/B + 1)``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

__all__ = [
    "AdaScaleSignal",
    "GradientNoiseScale",
    "MicroBatchGradNorms",
    "NormTestResult",
    "adascale_gain",
    "norm_test",
    "norm_test_batch",
    "norm_test_from_sq_norms",
    "per_example_variance",
    "pooled_small_batch",
    "sq_norm",
    "sq_norm_tensor",
]


# --------------------------------------------------------------------------- squared norms


def sq_norm_tensor(tensors: Iterable[torch.Tensor | None], scale: float = 1.0) -> torch.Tensor:
    """``scale^2 * sum_t |t|^2`` as a float64 0-dim tensor on the tensors' device (``None`` entries skipped).

    Stays on the device (no host sync), so a loop can ``all_reduce`` it before
    reading it.  ``scale`` converts what ``.grad`` holds into a mean gradient, e.g.
    ``B / (W * b)`` when the loss was scaled by ``W / B`` (see ``trainers/loop.py``)
    and the accumulated gradient covers ``b`` examples.
    """
    norms = [torch.linalg.vector_norm(t.detach()).double() for t in tensors if t is not None]
    if not norms:
        return torch.zeros((), dtype=torch.float64)
    total = torch.stack([n.to(norms[0].device) for n in norms]).square().sum()
    return total * (float(scale) ** 2)


def sq_norm(tensors: Iterable[torch.Tensor | None], scale: float = 1.0) -> float:
    """``scale^2 * sum_t |t|^2`` as a Python float (one host sync)."""
    return float(sq_norm_tensor(tensors, scale))


class MicroBatchGradNorms:
    """Squared norm of each micro-batch's own gradient during gradient accumulation.

    With accumulation, ``.grad`` after micro-batch ``j`` is the sum of the first
    ``j`` contributions; the ``j``-th one is the difference to the previous
    ``.grad``.  Call :meth:`reset` before the first backward of a step and
    :meth:`after_backward` after each backward; it returns
    ``scale^2 * |grad_now - grad_before|^2`` (a float64 device tensor).  Costs one
    copy of the gradients.  Under DDP only backward passes inside ``no_sync()`` are
    a worker's own gradient: the synchronizing one already holds the all-reduced sum.
    """

    def __init__(self, params: Iterable[torch.nn.Parameter]):
        self.params = [p for p in params if p.requires_grad]
        self._prev: list[torch.Tensor | None] | None = None

    def reset(self) -> None:
        self._prev = None

    @torch.no_grad()
    def after_backward(self, scale: float = 1.0) -> torch.Tensor:
        prev = self._prev or [None] * len(self.params)
        deltas: list[torch.Tensor] = []
        for p, before in zip(self.params, prev):
            if p.grad is None:
                continue
            deltas.append(p.grad if before is None else p.grad - before)
        out = sq_norm_tensor(deltas, scale)
        self._prev = [None if p.grad is None else p.grad.detach().clone() for p in self.params]
        return out


def pooled_small_batch(sq_norms: Sequence[float], sizes: Sequence[float]) -> tuple[float, float]:
    """Pool several small-batch squared norms into one ``(small_sq, b_small)`` pair for the estimator.

    By (1), the mean of ``|g_i|^2`` over samples of sizes ``b_i`` has expectation
    ``|G|^2 + tr(Sigma) * mean(1/b_i)``, so it is an unbiased "small" measurement at
    the harmonic mean size ``b_small = 1/mean(1/b_i)`` (= ``b`` when all are equal).
    """
    if len(sq_norms) != len(sizes) or not sq_norms:
        raise ValueError(f"need one size per squared norm and at least one, got {len(sq_norms)} norms "
                         f"and {len(sizes)} sizes")
    if any(b <= 0 for b in sizes):
        raise ValueError(f"sizes must be positive, got {list(sizes)}")
    n = len(sizes)
    mean_sq = math.fsum(float(s) for s in sq_norms) / n
    inv = math.fsum(1.0 / float(b) for b in sizes) / n
    return mean_sq, 1.0 / inv


# --------------------------------------------------------------------------- noise scale


def _check_pair(b_small: float, b_big: float) -> None:
    if not (b_small > 0 and b_big > b_small):
        raise ValueError(f"need 0 < b_small < b_big, got b_small={b_small}, b_big={b_big}")


class GradientNoiseScale:
    """EMA estimates of ``|G|^2`` and per-example ``tr(Sigma)``, and ``B_simple`` (McCandlish et al. 2018).

    Each :meth:`update` turns one pair of measurements (squared norm of a mean
    gradient over ``b_small`` examples and over ``b_big`` examples) into the unbiased
    estimates in the module docstring and folds them into bias-corrected EMAs
    ``m_t = ema*m_{t-1} + (1-ema)*x_t``, read as ``m_t / (1 - ema^t)`` (Adam's
    correction; ``ema=0`` keeps only the latest).  The same EMA of the raw
    ``|g_big|^2`` feeds the smoothed norm test :meth:`norm_test`.

    State is plain floats and ints (:meth:`state_dict`), so it checkpoints with
    ``torch.save`` and loads with ``weights_only=True``.
    """

    def __init__(self, ema: float = 0.95):
        if not (0.0 <= ema < 1.0):
            raise ValueError(f"ema must be in [0, 1), got {ema}")
        self.ema = float(ema)
        self.count = 0
        self._g_sq = 0.0  # raw (uncorrected) EMA accumulators
        self._trace = 0.0
        self._big_sq = 0.0
        self.last_b_big = 0.0

    # -- updates ---------------------------------------------------------------------------

    @staticmethod
    def estimate(small_sq: float, b_small: float, big_sq: float, b_big: float) -> tuple[float, float]:
        """One step's unbiased ``(|G|^2, tr(Sigma))`` from squared norms at two batch sizes."""
        _check_pair(b_small, b_big)
        g_sq = (b_big * big_sq - b_small * small_sq) / (b_big - b_small)
        trace = (small_sq - big_sq) / (1.0 / b_small - 1.0 / b_big)
        return g_sq, trace

    def update(self, small_sq: float, b_small: float, big_sq: float, b_big: float) -> None:
        """Fold in one measurement: ``small_sq = |g_small|^2`` at ``b_small``, ``big_sq = |g_big|^2`` at ``b_big``.

        ``small_sq`` may be the mean of several small squared norms (see
        :func:`pooled_small_batch`).  Non-finite inputs are ignored (a skipped step
        with an inf/nan gradient must not poison the EMA).
        """
        small_sq, big_sq, b_small, b_big = float(small_sq), float(big_sq), float(b_small), float(b_big)
        if not all(math.isfinite(v) for v in (small_sq, big_sq)):
            return
        g_sq, trace = self.estimate(small_sq, b_small, big_sq, b_big)
        a = 1.0 - self.ema
        self._g_sq = self.ema * self._g_sq + a * g_sq
        self._trace = self.ema * self._trace + a * trace
        self._big_sq = self.ema * self._big_sq + a * big_sq
        self.count += 1
        self.last_b_big = b_big

    def update_from_samples(self, sample_sq: Sequence[float], sample_sizes: Sequence[float],
                            big_sq: float, b_big: float) -> None:
        """:meth:`update` from several small squared norms (per worker / micro-batch) and the combined one."""
        small_sq, b_small = pooled_small_batch(sample_sq, sample_sizes)
        self.update(small_sq, b_small, big_sq, b_big)

    # -- readings --------------------------------------------------------------------------

    def _corrected(self, raw: float) -> float | None:
        if self.count == 0:
            return None
        return raw / (1.0 - self.ema ** self.count)

    @property
    def g_sq(self) -> float | None:
        """Smoothed ``|G|^2`` (may be <= 0 early on: the estimate is a difference), ``None`` before any update."""
        return self._corrected(self._g_sq)

    @property
    def trace_sigma(self) -> float | None:
        """Smoothed per-example ``tr(Sigma)``, ``None`` before any update."""
        return self._corrected(self._trace)

    @property
    def big_sq(self) -> float | None:
        """Smoothed raw ``|g_big|^2`` (biased upward by ``tr(Sigma)/b_big``), ``None`` before any update."""
        return self._corrected(self._big_sq)

    @property
    def b_simple(self) -> float | None:
        """``B_simple = EMA(tr Sigma) / EMA(|G|^2)``; ``None`` until both are positive (not yet estimable)."""
        if self.count == 0 or self._g_sq <= 0.0 or self._trace <= 0.0:
            return None
        return self._trace / self._g_sq  # the bias corrections cancel

    def gain(self, k: float, base_batch: float) -> float | None:
        """AdaScale gain at scale ``k = B/B0`` from the smoothed estimates (``None`` until estimable)."""
        if self.b_simple is None:
            return None
        return adascale_gain(self.trace_sigma or 0.0, self.g_sq or 0.0, k, base_batch)

    def adascale_signal(self, base_batch: float) -> AdaScaleSignal | None:
        """``(var, sqr) = (tr(Sigma)/B0, |G|^2)`` for an AdaScale rule ``r = (var+sqr)/(var/k+sqr)``.

        ``None`` until ``B_simple`` is estimable.  Fits ``trainers.schedules.NoiseSignal``.
        """
        if self.b_simple is None or base_batch <= 0:
            return None
        return AdaScaleSignal(var=(self.trace_sigma or 0.0) / float(base_batch), sqr=self.g_sq or 0.0)

    def norm_test(self, batch: int, eta: float) -> NormTestResult | None:
        """The norm test (2) on the smoothed ``tr(Sigma)`` and ``|g_big|^2`` (``None`` before any update)."""
        if self.count == 0:
            return None
        return norm_test(self.trace_sigma or 0.0, self.big_sq or 0.0, batch, eta)

    # -- checkpoint ------------------------------------------------------------------------

    def state_dict(self) -> dict[str, float | int]:
        """Plain floats and ints only (safe for ``torch.load(weights_only=True)``)."""
        return {"ema": self.ema, "count": self.count, "g_sq": self._g_sq, "trace": self._trace,
                "big_sq": self._big_sq, "last_b_big": self.last_b_big}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        missing = {"ema", "count", "g_sq", "trace", "big_sq", "last_b_big"} - set(state)
        if missing:
            raise KeyError(f"GradientNoiseScale state lacks {sorted(missing)}")
        if float(state["ema"]) != self.ema:
            # the accumulators are only meaningful with the decay they were built with
            raise ValueError(f"checkpoint has ema={state['ema']}, this estimator ema={self.ema}")
        self.count = int(state["count"])
        self._g_sq = float(state["g_sq"])
        self._trace = float(state["trace"])
        self._big_sq = float(state["big_sq"])
        self.last_b_big = float(state["last_b_big"])


@dataclass(frozen=True)
class AdaScaleSignal:
    """AdaScale's inputs: ``var`` = gradient variance at the base batch B0 (``tr(Sigma)/B0``), ``sqr`` = ``|G|^2``."""

    var: float
    sqr: float

    def gain(self, k: float) -> float:
        """``r = (var + sqr)/(var/k + sqr)``, see :func:`adascale_gain`."""
        return adascale_gain(self.var, self.sqr, k, 1.0)


def adascale_gain(trace_sigma: float, g_sq: float, k: float, base_batch: float) -> float:
    """AdaScale gain ``r = (var + sqr)/(var/k + sqr)`` (Johnson et al. 2020) with consistent normalization.

    ``var = max(tr(Sigma), 0) / base_batch`` is the gradient variance at the base
    batch ``B0`` (``tr(Sigma)`` per example, as :class:`GradientNoiseScale` reports),
    ``sqr = max(|G|^2, 0)``, ``k = B/B0``.  Equivalently
    ``r = (1 + B_simple/B0) / (1 + B_simple/B)``.  Limits: no noise -> 1 (keep the
    base lr); no signal -> ``k`` (linear scaling).  Negative estimates (noise in an
    early EMA) are clipped to 0.
    """
    if k <= 0 or base_batch <= 0:
        raise ValueError(f"need k > 0 and base_batch > 0, got k={k}, base_batch={base_batch}")
    var = max(float(trace_sigma), 0.0) / float(base_batch)
    sqr = max(float(g_sq), 0.0)
    if var == 0.0:
        return 1.0
    if sqr == 0.0:
        return float(k)
    return (var + sqr) / (var / k + sqr)


# --------------------------------------------------------------------------- norm test


@dataclass(frozen=True)
class NormTestResult:
    """The norm test's answer for a batch of size ``batch``.

    ``ok``: ``variance / batch <= eta^2 * grad_sq``.  ``required``: the unrounded
    smallest batch that passes, ``variance / (eta^2 grad_sq)`` (``inf`` when the
    gradient is zero but noisy).  ``suggested``: ``batch`` when ok, else
    ``ceil(required)``; ``None`` when no finite batch passes.
    """

    ok: bool
    suggested: int | None
    required: float
    variance: float
    grad_sq: float
    batch: int
    eta: float


def norm_test(variance: float, grad_sq: float, batch: int, eta: float) -> NormTestResult:
    """Byrd et al. (2012) norm test (2) from a per-example variance ``tr(Sigma)`` and ``|g_B|^2``."""
    if eta <= 0:
        raise ValueError(f"eta must be > 0, got {eta}")
    if batch <= 0:
        raise ValueError(f"batch must be > 0, got {batch}")
    variance, grad_sq = float(variance), float(grad_sq)
    if variance <= 0.0:  # no measurable noise: any batch passes
        return NormTestResult(True, batch, 0.0, variance, grad_sq, batch, eta)
    if grad_sq <= 0.0:
        return NormTestResult(False, None, math.inf, variance, grad_sq, batch, eta)
    required = variance / (eta * eta * grad_sq)
    ok = variance / batch <= eta * eta * grad_sq
    return NormTestResult(ok, batch if ok else math.ceil(required), required, variance, grad_sq, batch, eta)


def per_example_variance(sample_sq: Sequence[float], batch_sizes: Sequence[float], big_sq: float) -> float:
    """Estimate (3): ``(sum_i b_i |g_i|^2 - B |g_B|^2) / (n - 1)``, ``B = sum b_i``.

    Requires the samples to partition the batch and ``g_B`` to be their
    ``b_i``-weighted mean (what DDP's mean of per-worker means is, when slices are
    weighted by their size as ``trainers/loop.py`` does).
    """
    n = len(sample_sq)
    if n < 2 or len(batch_sizes) != n:
        raise ValueError(f"need >= 2 samples with one size each, got {n} norms and {len(batch_sizes)} sizes")
    total = float(sum(batch_sizes))
    weighted = math.fsum(float(b) * float(s) for b, s in zip(batch_sizes, sample_sq))
    return (weighted - total * float(big_sq)) / (n - 1)


def norm_test_from_sq_norms(sample_sq: Sequence[float], batch_sizes: Sequence[int], big_sq: float,
                            eta: float) -> NormTestResult:
    """The norm test from squared norms only: ``|g_i|^2`` per sample, their sizes, and ``|g_B|^2``."""
    var = per_example_variance(sample_sq, batch_sizes, big_sq)
    return norm_test(var, big_sq, int(sum(batch_sizes)), eta)


def _flat(g: torch.Tensor | Sequence[torch.Tensor]) -> torch.Tensor:
    if isinstance(g, torch.Tensor):
        return g.detach().reshape(-1).double()
    return torch.cat([t.detach().reshape(-1).double() for t in g])


def norm_test_batch(sample_grads: Sequence[torch.Tensor | Sequence[torch.Tensor]], batch_sizes: Sequence[int],
                    eta: float) -> NormTestResult:
    """The norm test from the sample gradients themselves.

    ``sample_grads[i]`` is the mean gradient over ``batch_sizes[i]`` examples, as
    one tensor or a list of per-parameter tensors.  Computes ``g_B`` as the
    ``b_i``-weighted mean and the variance with the left-hand (numerically safer)
    form of (3).
    """
    n = len(sample_grads)
    if n < 2 or len(batch_sizes) != n:
        raise ValueError(f"need >= 2 sample gradients with one size each, got {n} and {len(batch_sizes)}")
    flats = [_flat(g) for g in sample_grads]
    sizes = torch.tensor([float(b) for b in batch_sizes], dtype=torch.float64, device=flats[0].device)
    stacked = torch.stack(flats)
    total = float(sizes.sum())
    mean = (sizes[:, None] * stacked).sum(0) / total
    var = float((sizes * (stacked - mean).square().sum(1)).sum()) / (n - 1)
    return norm_test(var, float(mean.square().sum()), int(round(total)), eta)
