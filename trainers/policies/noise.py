"""Gradient noise: the noise-scale estimator, the norm test and the AdaScale gain.

Everything here is plain PyTorch/Python (no Ray, no MLflow), works on scalars the
training loop already has, and is deterministic: the same inputs give the same
estimates on every rank.

Notation (``docs/architecture.md``): per-example gradients ``g(x)`` with mean ``G`` and
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
The loop applies it to the smoothed estimates (:meth:`GradientNoiseScale.norm_test`).

**AdaScale gain** (Johnson, Agrawal, Gu, Guestrin 2020, "AdaScale SGD", eq. 5).
At scale ``k = B/B0`` the learning rate of the base batch ``B0`` is multiplied by

    r = (sigma^2 + mu^2) / (sigma^2/k + mu^2),    1 <= r <= k for k >= 1,

where ``sigma^2 = E|g_B0 - G|^2`` is the gradient variance *at the base batch* and
``mu^2 = |G|^2``.  By (1), ``sigma^2 = tr(Sigma)/B0`` with the per-example
``tr(Sigma)`` this module estimates, so ``r = (B_simple/B0 + 1)/(B_simple/B + 1)``.
This module gives the inputs (:meth:`GradientNoiseScale.adascale_signal`); the gain
itself is the LR schedule's ``adascale`` scaling rule (``trainers/policies/schedules.py``).

**The probe** (:class:`NoiseProbe`) measures, at every optimizer step, the squared
norms the estimator needs without extra communication: the "small" gradients are
the workers' own (W > 1, read by a DDP communication hook before the all-reduce) or
the micro-batches' (W = 1), the "big" one is the all-reduced gradient of the step.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

__all__ = [
    "AdaScaleSignal",
    "GradientNoiseScale",
    "MicroBatchGradNorms",
    "NoiseProbe",
    "NormTestResult",
    "norm_test",
    "sq_norm_tensor",
]


# --------------------------------------------------------------------------- squared norms


def sq_norm_tensor(tensors: Iterable[torch.Tensor | None], scale: float = 1.0) -> torch.Tensor:
    """``scale^2 * sum_t |t|^2`` as a float64 0-dim tensor on the tensors' device (``None`` entries skipped).

    Stays on the device (no host sync), so a loop can ``all_reduce`` it before
    reading it.  ``scale`` converts what ``.grad`` holds into a mean gradient, e.g.
    ``B / (W * b)`` when the loss was scaled by ``W / B`` (see ``trainers/loop/trainer.py``)
    and the accumulated gradient covers ``b`` examples.
    """
    norms = [torch.linalg.vector_norm(t.detach()).double() for t in tensors if t is not None]
    if not norms:
        return torch.zeros((), dtype=torch.float64)
    total = torch.stack([n.to(norms[0].device) for n in norms]).square().sum()
    return total * (float(scale) ** 2)


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

        ``small_sq`` may be the mean of several small squared norms at the harmonic mean
        size (see :class:`NoiseProbe`).  Non-finite inputs are ignored (a skipped step
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

    # -- readings --------------------------------------------------------------------------

    def _corrected(self, raw: float) -> float | None:
        if self.count == 0:
            return None
        return raw / (1.0 - self.ema**self.count)

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

    def adascale_signal(self, base_batch: float) -> AdaScaleSignal | None:
        """``(var, sqr) = (tr(Sigma)/B0, |G|^2)`` for an AdaScale rule ``r = (var+sqr)/(var/k+sqr)``.

        ``None`` until ``B_simple`` is estimable.  Fits ``trainers.policies.schedules.NoiseSignal``.
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
        return {
            "ema": self.ema,
            "count": self.count,
            "g_sq": self._g_sq,
            "trace": self._trace,
            "big_sq": self._big_sq,
            "last_b_big": self.last_b_big,
        }

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


# --------------------------------------------------------------------------- the probe


def _sq_norm_hook(state: torch.Tensor, bucket):  # no annotation on bucket: DDP checks it against GradBucket
    """DDP communication hook: add the bucket's squared norm *before* the all-reduce (this
    worker's own gradient) to ``state``, then all-reduce the mean as DDP's default hook does."""
    buf = bucket.buffer()
    state += buf.double().pow(2).sum()
    buf.div_(dist.get_world_size())
    fut = dist.all_reduce(buf, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0])


class NoiseProbe:
    """The noise-scale measurement of one worker's optimizer steps, feeding a :class:`GradientNoiseScale`.

    The loop normalizes the loss of a global batch of ``B`` samples by ``W / B`` (see
    ``trainers/loop/trainer.py``), so a gradient accumulated over ``b`` of them is their mean
    gradient times ``W * b / B``; the probe rescales by ``B / (W * b)``.  Per step it
    collects the "small" statistics as four float64 sums over the small gradients
    ``g_s`` of ``b_s`` samples,

        [sum_s |g_s|^2,  sum_s 1/b_s,  sum_s b_s |g_s|^2,  count],

    and after the all-reduce (one per step, shared with the loss: :meth:`finish` returns
    the tensor to reduce) folds ``small_sq = mean_s |g_s|^2`` at the harmonic mean size
    ``b_small = count / sum_s 1/b_s`` (by (1), ``E mean_s |g_s|^2 = |G|^2 + tr(Sigma) mean_s 1/b_s``:
    an unbiased small measurement at that size) and the big ``|g_B|^2`` at ``b_big = B``
    into the estimator (McCandlish et al. 2018, appendix A).

    Where the small gradients come from: with W > 1, each worker's own gradient over its
    slice, whose squared norm :meth:`attach`'s communication hook adds up bucket by bucket
    before DDP's all-reduce; with W = 1, each micro-batch's gradient
    (:class:`MicroBatchGradNorms`), the slice being cut in two when it would be one
    micro-batch (:meth:`micro_batch_size`).

    Calls per step, in order: :meth:`begin_step`; :meth:`after_micro_batch` after each
    backward; :meth:`finish` while the gradients are still there (before the optimizer
    steps); :meth:`update` with the all-reduced statistics.
    """

    def __init__(self, ema: float, params: Iterable[torch.nn.Parameter], world: int, device: torch.device):
        self.gns = GradientNoiseScale(ema)
        self.params = [p for p in params if p.requires_grad]
        self.world, self.device = world, device
        self._local_sq = torch.zeros((), dtype=torch.float64, device=device) if world > 1 else None
        self._tracker = MicroBatchGradNorms(self.params) if world == 1 else None
        self._small = torch.zeros(4, dtype=torch.float64, device=device)
        self._big_sq: torch.Tensor | None = None

    def attach(self, model: torch.nn.Module) -> None:
        """Register the squared-norm communication hook on a DDP model (nothing to do at W = 1)."""
        if self._local_sq is not None:
            model.register_comm_hook(self._local_sq, _sq_norm_hook)

    def micro_batch_size(self, mine_len: int, max_local_batch: int) -> int:
        """The micro-batch size for this worker's slice of ``mine_len`` samples: ``max_local_batch``,
        except at W = 1 where a slice of 2 to ``max_local_batch`` samples (one micro-batch) is cut
        in two halves, to have two small gradients."""
        if self.world == 1 and 2 <= mine_len <= max_local_batch:
            return (mine_len + 1) // 2
        return max_local_batch

    def begin_step(self) -> None:
        """Zero the step's sums (before the first backward)."""
        self._small = torch.zeros(4, dtype=torch.float64, device=self.device)
        self._big_sq = None
        if self._tracker is not None:
            self._tracker.reset()
        if self._local_sq is not None:
            self._local_sq.zero_()

    def _add(self, sq: torch.Tensor, b: int) -> None:
        self._small += torch.stack([sq, sq.new_tensor(1.0 / b), sq * b, sq.new_tensor(1.0)])

    def after_micro_batch(self, batch_len: int, micro_len: int, grad_factor: float = 1.0) -> None:
        """After the backward of a micro-batch of ``micro_len`` samples of a global batch of ``batch_len``;
        ``grad_factor`` turns what ``.grad`` holds into the true gradient (fp16 loss scaling: ``1/S``,
        trainers/accel/precision.py)."""
        if self._tracker is not None:  # this micro-batch's mean gradient = delta * B / (W * b)
            self._add(self._tracker.after_backward(scale=grad_factor * batch_len / (self.world * micro_len)), micro_len)

    def finish(self, batch_len: int, mine_len: int, grad_factor: float = 1.0) -> torch.Tensor:
        """The step's small statistics (4 float64 values on the device) to all-reduce; reads
        the big gradient's squared norm, so call it before the optimizer steps and after the
        gradients are unscaled (``grad_factor``: what the DDP hook's sums, read before, are scaled by)."""
        if self._local_sq is not None and mine_len > 0:  # this worker's mean gradient (DDP hook)
            self._add(self._local_sq * (grad_factor * batch_len / (self.world * mine_len)) ** 2, mine_len)
        self._big_sq = sq_norm_tensor(p.grad for p in self.params)
        return self._small

    def update(self, reduced: list[float], batch_len: int) -> None:
        """Fold the all-reduced statistics of :meth:`finish` into the estimator."""
        if reduced[3] >= 1 and self._big_sq is not None:
            self.gns.update(
                small_sq=reduced[0] / reduced[3],
                b_small=reduced[3] / reduced[1],
                big_sq=float(self._big_sq),
                b_big=batch_len,
            )
