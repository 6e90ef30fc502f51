"""Pollux's goodput (Qiao et al., OSDI'21): choose the global batch B and the worker count W together.

A pure model, in the style of AdaptDL's ``goodput.py``: no Ray, no clock, no torch.

    goodput(B, W) = throughput(B, W) x efficiency(B)

**Statistical efficiency** of a batch B relative to the base batch B0 (``optimizer.base_batch_size``),
from the gradient noise scale ``B_noise`` (McCandlish et al. 2018; ``B_simple`` of
``trainers/policies/noise.py``)::

    E(B) = (B_noise + B0) / (B_noise + B)

the progress one sample makes at B, as a fraction of what it makes at B0 (AdaptDL's ``gain / scale``:
``(var + sqr) / (var / k + sqr) / k`` with ``k = B / B0`` is the same expression).  ``goodput`` is
then in B0-equivalent samples per second.

**Throughput** ``B / T(b, W)`` from a step-time model fitted to the measured step times, with ``b =
ceil(B / W)`` the largest local batch (rank 0's slice; the step waits for it)::

    T(b, W) = alpha + beta * b + gamma * (W - 1)

``alpha``: per-step time that does not grow with the batch (optimizer step, launches, the
loop's bookkeeping); ``beta``: compute seconds per local sample, forward and backward, gradient
accumulation included (a step runs ``ceil(b / max_local_batch)`` micro-batches, whose fixed cost
is small next to ``beta * b`` once micro-batches are not tiny); ``gamma``: synchronisation seconds
per extra worker (a ring all-reduce takes ``2 (W - 1)`` hops, each with a latency; 0 at W = 1).

Why this model and not Pollux's ``T = (T_comp^g + T_sync^g)^(1/g)``: the measurements come
from few configurations (every W is a whole phase, so a run sees two or three W), and Pollux's
six parameters with a free overlap ``g`` are not identified by them; its fit is a non-convex
minimisation that needs a solver and priors.  The additive model is linear in its parameters,
so it is fitted by non-negative least squares (``scipy.optimize.nnls``): deterministic, the same
on every caller, and exact on data that follows it.  It is Pollux's model at ``g = 1`` (no
overlap of compute and synchronisation), which over-estimates the step time when DDP overlaps
the all-reduce with backward: the conservative side for the sync cost, so it errs towards fewer
workers, never towards a resize that does not pay.

**The fit** (:meth:`StepTimeModel.fit`).  Observations are kept as the mean step time per
``(b, W)`` (AdaptDL keeps a profile per configuration the same way) and fitted by relative error
(each configuration weighted by ``sqrt(count) / mean``), so that a fast configuration counts as
much as a slow one.  Parameters that the observations cannot separate are fixed, as AdaptDL does:

* one W seen: ``gamma`` is not identified; it is fixed to ``prior_sync_s`` (default 0, the
  optimistic side: adding workers looks free until a second W has been measured, which is how
  Pollux explores; the resize must still pay for its cost, see below);
* one local batch seen, or the local batch moving only with W (B fixed, W varied): ``alpha`` and
  ``beta`` are not separated; ``alpha`` is tied to the compute time of the mean observed local
  batch (``alpha = beta * mean b``: half of that step's compute time is fixed, AdaptDL's choice,
  optimistic about growing B).

**The choice** (:func:`optimize`).  B is a multiple of ``round_to`` between ``min_batch`` (by
default the current B: batches only grow in this project) and ``max_batch``; W runs from
``min_workers`` to ``max_workers`` (never more than B), smaller than the current W included.  What
is scored: for every W, the batches of a geometric grid (64 points, as AdaptDL's, plus the bounds
and the current B), each replaced by the largest batch of its class, the one with the same local
batch ``ceil(B / W)`` (the same step time for more samples: it dominates the smaller ones,
:func:`top_of_class`).  A batch between grid points whose class holds no grid point is not scored.
Without a noise estimate the efficiency of other batches is unknown, so only the current B is
scored (efficiency is the same for every W at one B).  The options compared are: keep ``(B, W)``;
the best B at the current W (a batch change is free); the best ``(B', W')`` with another W, which
costs a resize.  Each is judged by the time it needs for the rest of the run's progress,
``P = remaining_samples x E(B)`` B0-equivalent samples at the
current B::

    t(option) = P / goodput(option) + cost(option)

and the smallest ``t`` wins: a resize is taken only when what it saves over the remaining budget,
``P / goodput(best at W) - P / goodput(B', W')``, is more than its measured cost (a group's start
for ``restart``, the pause for ``overlap``; ``trainers/policies/resize.py``).  An overlapping
resize also has a lead (``lead_s``, the new group's start, during which the old group trains on at
its own pace), so it saves only over what is left after it, ``(t_stay - lead_s)(1 - goodput(stay)
/ goodput(B', W'))``, as :func:`~trainers.policies.resize.resize_pays` reckons it.  Ties go to fewer
workers, then to the smaller batch.  The decision carries its reason and the predicted goodput of
the best batch at every W, for the log.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = [
    "Candidate",
    "GoodputDecision",
    "GoodputInputs",
    "StepTimeFeed",
    "StepTimeFit",
    "StepTimeModel",
    "batch_candidates",
    "efficiency",
    "evaluate",
    "optimize",
]


# --------------------------------------------------------------------------- efficiency


def efficiency(batch_size: float, b_noise: float, base_batch: float) -> float:
    """``E(B) = (B_noise + B0) / (B_noise + B)``: progress per sample at B relative to B0 (Pollux)."""
    if batch_size <= 0 or base_batch <= 0:
        raise ValueError(f"efficiency: needs B and B0 > 0 (got {batch_size}, {base_batch})")
    if not math.isfinite(b_noise) or b_noise < 0:
        raise ValueError(f"efficiency: needs a finite B_noise >= 0 (got {b_noise})")
    return (b_noise + base_batch) / (b_noise + batch_size)


# --------------------------------------------------------------------------- the step-time model


@dataclass(frozen=True)
class StepTimeFit:
    """``T(b, W) = alpha + beta * b + gamma * (W - 1)`` in seconds; ``fixed`` names what the data could
    not identify and how it was set (for the log)."""

    alpha: float
    beta: float
    gamma: float
    points: int
    fixed: tuple[str, ...] = ()

    def step_time(self, local_batch: float, workers: int) -> float:
        return self.alpha + self.beta * local_batch + self.gamma * (workers - 1)

    def throughput(self, batch_size: int, workers: int) -> float:
        """Samples per second at global batch B on W workers (rank 0 takes ``ceil(B / W)``)."""
        t = self.step_time(math.ceil(batch_size / workers), workers)
        return batch_size / t if t > 0 else math.inf

    def describe(self) -> str:
        out = (
            f"T(b, W) = {self.alpha:.4g} + {self.beta:.4g} b + {self.gamma:.4g} (W - 1) s from {self.points} "
            f"configuration(s)"
        )
        return out + (f" ({'; '.join(self.fixed)})" if self.fixed else "")


class StepTimeModel:
    """Measured step times per ``(local batch, workers)``, fitted on demand (:meth:`fit`).

    ``observe(b, W, seconds)`` adds one step (or, with ``count``, the mean of ``count`` steps);
    callers should leave out the first steps of a group (start-up, compilation).  Plain-typed
    ``state_dict``, so it can ride in a checkpoint.
    """

    def __init__(self, prior_sync_s: float = 0.0):
        if not math.isfinite(prior_sync_s) or prior_sync_s < 0:
            raise ValueError(f"prior_sync_s: must be a finite number >= 0 (got {prior_sync_s})")
        self.prior_sync_s = float(prior_sync_s)
        self._profile: dict[tuple[int, int], tuple[int, float]] = {}  # (b, W) -> (steps, mean seconds)

    def observe(self, local_batch: int, workers: int, seconds: float, count: int = 1) -> None:
        if local_batch <= 0 or workers <= 0 or count <= 0:
            raise ValueError(
                f"observe: needs local_batch, workers and count > 0 (got {local_batch}, {workers}, {count})"
            )
        if not (math.isfinite(seconds) and seconds > 0):
            raise ValueError(f"observe: needs a finite step time > 0 (got {seconds})")
        key = (int(local_batch), int(workers))
        n, mean = self._profile.get(key, (0, 0.0))
        total = n + count
        self._profile[key] = (total, mean + (seconds - mean) * count / total)

    @property
    def configurations(self) -> dict[tuple[int, int], tuple[int, float]]:
        """``{(b, W): (steps, mean seconds)}``, a copy."""
        return dict(self._profile)

    def fit(self) -> StepTimeFit | None:
        """The least-squares fit (see the module docstring), or None before any observation."""
        if not self._profile:
            return None
        keys = sorted(self._profile)
        b = np.array([k[0] for k in keys], dtype=np.float64)
        w = np.array([k[1] for k in keys], dtype=np.float64)
        n = np.array([self._profile[k][0] for k in keys], dtype=np.float64)
        t = np.array([self._profile[k][1] for k in keys], dtype=np.float64)
        weight = np.sqrt(n) / t
        fixed: list[str] = []
        fit_sync = len(set(w.tolist())) >= 2
        if not fit_sync:
            fixed.append(f"gamma = {self.prior_sync_s:g}: one worker count measured")
        target = t - (0.0 if fit_sync else self.prior_sync_s * (w - 1))
        # Can the local batch's effect be told apart from the fixed time and from W?
        full = [np.ones_like(b), b] + ([w - 1] if fit_sync else [])
        separable = len(set(b.tolist())) >= 2 and np.linalg.matrix_rank(np.stack(full, axis=1)) == len(full)
        if separable:
            cols = full
        else:
            b_ref = float(np.average(b, weights=n))
            fixed.append(f"alpha = beta x {b_ref:.4g}: the local batch was not varied on its own")
            cols = [b + b_ref] + ([w - 1] if fit_sync else [])
        from scipy.optimize import nnls  # only the goodput policy fits its step-time model (scipy)

        a = np.stack(cols, axis=1) * weight[:, None]
        x, _ = nnls(a, target * weight)
        if separable:
            alpha, beta = float(x[0]), float(x[1])
            gamma = float(x[2]) if fit_sync else self.prior_sync_s
        else:
            beta = float(x[0])
            alpha = beta * b_ref
            gamma = float(x[1]) if fit_sync else self.prior_sync_s
        return StepTimeFit(alpha=alpha, beta=beta, gamma=gamma, points=len(keys), fixed=tuple(fixed))

    def state_dict(self) -> dict[str, Any]:
        return {
            "prior_sync_s": self.prior_sync_s,
            "profile": [[b, w, n, m] for (b, w), (n, m) in sorted(self._profile.items())],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.prior_sync_s = float(state["prior_sync_s"])
        self._profile = {(int(b), int(w)): (int(n), float(m)) for b, w, n, m in state["profile"]}


# --------------------------------------------------------------------------- the choice


@dataclass(frozen=True)
class Candidate:
    """One ``(B, W)`` with its predicted step time, throughput (samples/s), efficiency and goodput."""

    batch: int
    workers: int
    step_time_s: float
    throughput: float
    efficiency: float
    goodput: float

    def describe(self) -> str:
        return (
            f"B={self.batch} W={self.workers}: goodput {self.goodput:.4g} (x {self.throughput:.4g}/s x E "
            f"{self.efficiency:.3f})"
        )


@dataclass(frozen=True)
class GoodputDecision:
    """What :func:`optimize` chose: ``batch`` and ``workers`` (``resize``: W changes), the current and
    chosen candidates, the best batch at every W (``alternatives``, by W), the predicted seconds the
    chosen resize saves over the remaining budget and what it costs, and the reason to log."""

    batch: int
    workers: int
    resize: bool
    chosen: Candidate
    current: Candidate
    alternatives: tuple[Candidate, ...]
    gain_s: float
    cost_s: float
    reason: str
    fit: StepTimeFit | None = field(default=None, compare=False)

    @property
    def batch_changes(self) -> bool:
        return self.batch != self.current.batch


def evaluate(fit: StepTimeFit, batch_size: int, workers: int, b_noise: float | None, base_batch: int) -> Candidate:
    """The candidate ``(B, W)`` under ``fit``; without ``b_noise`` the efficiency is taken as 1."""
    x = fit.throughput(batch_size, workers)
    e = 1.0 if b_noise is None else efficiency(batch_size, b_noise, base_batch)
    return Candidate(batch_size, workers, fit.step_time(math.ceil(batch_size / workers), workers), x, e, x * e)


def batch_candidates(lo: int, hi: int, round_to: int = 1, count: int = 64, include: Iterable[int] = ()) -> list[int]:
    """Batches to score between ``lo`` and ``hi``: ``count`` points spaced geometrically (as AdaptDL
    does), rounded to multiples of ``round_to`` within the bounds, plus ``lo``, ``hi`` and ``include``."""
    if lo <= 0 or hi < lo or round_to <= 0:
        raise ValueError(f"batch_candidates: needs 0 < lo <= hi and round_to > 0 (got {lo}, {hi}, {round_to})")
    out = {lo, hi, *include}
    if hi > lo:
        for x in np.geomspace(lo, hi, count):
            r = int(round(float(x) / round_to)) * round_to
            if lo <= r <= hi:
                out.add(r)
    return sorted(v for v in out if lo <= v <= hi)


def top_of_class(batch_size: int, workers: int, hi: int, round_to: int = 1) -> int:
    """The largest batch, a multiple of ``round_to`` up to ``hi``, that keeps ``batch_size``'s local batch
    ``ceil(B / W)`` on ``workers``: the same step time for more samples, so it dominates every smaller
    batch of its class (``batch_size`` itself where none is larger)."""
    top = min(hi, workers * math.ceil(batch_size / workers)) // round_to * round_to
    return max(top, batch_size)


def _best(cands: Iterable[Candidate]) -> Candidate:
    # highest goodput; ties to fewer workers, then the smaller batch
    return max(cands, key=lambda c: (c.goodput, -c.workers, -c.batch))


def optimize(
    fit: StepTimeFit,
    current_batch: int,
    current_workers: int,
    min_workers: int,
    max_workers: int,
    *,
    base_batch: int,
    b_noise: float | None = None,
    min_batch: int | None = None,
    max_batch: int | None = None,
    round_to: int = 1,
    remaining_samples: float | None = None,
    resize_cost_s: float = 0.0,
    lead_s: float = 0.0,
    batches: Iterable[int] | None = None,
) -> GoodputDecision:
    """The ``(B, W)`` that makes the rest of the run's progress soonest (see the module docstring).

    ``min_batch`` defaults to the current B (grow-only), ``max_batch`` to the current B too (only W is
    chosen unless a larger B is allowed); ``batches`` replaces the candidate grid.  With
    ``remaining_samples`` unknown (None) a resize cannot be judged and is never taken.  ``lead_s``:
    seconds the current group trains on before a new one takes over (an overlap's start).
    """
    for label, v in (
        ("current_batch", current_batch),
        ("current_workers", current_workers),
        ("min_workers", min_workers),
        ("max_workers", max_workers),
        ("base_batch", base_batch),
        ("round_to", round_to),
    ):
        if v <= 0:
            raise ValueError(f"optimize: {label} must be > 0, got {v}")
    if min_workers > max_workers:
        raise ValueError(f"optimize: min_workers {min_workers} is above max_workers {max_workers}")
    for label, v in (("resize_cost_s", resize_cost_s), ("lead_s", lead_s)):
        if not (math.isfinite(v) and v >= 0):
            raise ValueError(f"optimize: {label} must be a finite number >= 0, got {v}")
    lo = current_batch if min_batch is None else min_batch
    hi = current_batch if max_batch is None else max_batch
    if b_noise is None:  # efficiency unknown: only the current batch can be judged
        grid = [current_batch]
    elif batches is not None:
        grid = sorted({int(x) for x in batches if lo <= x <= hi} | {current_batch})
    else:
        grid = batch_candidates(min(lo, current_batch), max(hi, current_batch), round_to, include=(current_batch,))
        grid = [x for x in grid if lo <= x <= hi or x == current_batch]
    ws = range(min_workers, max_workers + 1)
    # B's step time is T(ceil(B/W), W): per W, a grid B within the bounds is scored by the largest B of its
    # class (top_of_class); without a noise estimate only the current B is scored, as it is
    movable = b_noise is not None
    pairs = {
        (top_of_class(bb, w, hi, round_to) if movable and lo <= bb <= hi else bb, w)
        for bb in grid
        for w in ws
        if w <= bb
    }
    cands = [evaluate(fit, bb, w, b_noise, base_batch) for bb, w in sorted(pairs)]
    current = evaluate(fit, current_batch, current_workers, b_noise, base_batch)
    by_w: dict[int, Candidate] = {}
    for c in cands:
        if c.workers not in by_w or _best([by_w[c.workers], c]) is c:
            by_w[c.workers] = c
    alternatives = tuple(by_w[w] for w in sorted(by_w))
    stay = _best([current, *(c for c in cands if c.workers == current_workers)])
    best = _best(cands) if cands else current
    table = "; ".join(c.describe() for c in alternatives)
    head = f"{fit.describe()}; B_noise {'unknown' if b_noise is None else f'{b_noise:.4g}'}"

    def keep(chosen: Candidate, why: str, gain: float = 0.0) -> GoodputDecision:
        change = (
            f"B {current_batch} -> {chosen.batch} at W={current_workers}"
            if chosen.batch != current_batch
            else f"keeping B={current_batch} W={current_workers}"
        )
        return GoodputDecision(
            chosen.batch,
            current_workers,
            False,
            chosen,
            current,
            alternatives,
            gain,
            resize_cost_s if best.workers != current_workers else 0.0,
            f"{change}: {why}; {head}; best per W: {table}",
            fit,
        )

    if best.workers == current_workers or best.goodput <= stay.goodput:
        return keep(stay, f"best goodput {stay.goodput:.4g} is at W={current_workers}")
    if remaining_samples is None:
        return keep(
            stay,
            f"W={best.workers} predicts goodput {best.goodput:.4g} > {stay.goodput:.4g}, but the "
            f"remaining budget is unknown, so its resize cannot be judged",
        )
    progress = max(remaining_samples, 0.0) * current.efficiency
    t_stay = progress / stay.goodput if stay.goodput > 0 else math.inf
    t_move = progress / best.goodput if best.goodput > 0 else math.inf
    gain = t_stay - t_move if lead_s <= 0 else max(t_stay - lead_s, 0.0) * (1.0 - t_move / t_stay)
    if gain <= resize_cost_s:
        return keep(
            stay,
            f"W={best.workers} (B={best.batch}) predicts goodput {best.goodput:.4g} > "
            f"{stay.goodput:.4g}, saving ~{gain:.1f} s of the ~{t_stay:.0f} s left, less than its "
            f"~{resize_cost_s:.1f} s cost",
            gain,
        )
    direction = "shrinking" if best.workers < current_workers else "growing"
    return GoodputDecision(
        best.batch,
        best.workers,
        True,
        best,
        current,
        alternatives,
        gain,
        resize_cost_s,
        f"{direction} W {current_workers} -> {best.workers}, "
        f"{f'B {current_batch} -> {best.batch}' if best.batch != current_batch else f'at B={best.batch}'}: "
        f"goodput {best.goodput:.4g} vs {stay.goodput:.4g} at W={current_workers} saves ~"
        f"{gain:.1f} s of the ~{t_stay:.0f} s left, more than its ~{resize_cost_s:.1f} s cost; "
        f"{head}; best per W: {table}",
        fit,
    )


# --------------------------------------------------------------------------- what a run feeds it


@dataclass(frozen=True)
class GoodputInputs:
    """What rank 0 sends the driver's monitor with a question about W (``scaling.policy: goodput``):
    its step times (a :meth:`StepTimeModel.state_dict`), the noise scale ``b_noise`` (None: not
    estimated yet), the base batch B0 and the batches goodput may choose (``max_batch``: the current
    B when the batch is not goodput's to choose; multiples of ``round_to``).  Plain data: Ray pickles
    it as it is."""

    step_times: dict[str, Any]
    b_noise: float | None
    base_batch: int
    max_batch: int
    round_to: int = 1


class StepTimeFeed:
    """Rank 0's side of goodput: the measured step times of a run (its :class:`StepTimeModel`,
    checkpointed: a resumed run decides with what it had measured) and when to ask.

    ``observe`` takes every step; the first ``skip`` steps of a group, and of a new batch, are left
    out (a group's start, a new shape's first passes), and so are steps that did not take a whole
    global batch (an epoch's short tail: its local batch is not the policy's).  :meth:`due`: the
    steps at which the run asks (every ``every`` steps, ``batch.check_every``: the cadence of the
    other noise-driven decisions, so each ask sees a freshly smoothed ``B_noise``; one actor call per
    ask, and a resize only when it pays); :meth:`ready`: the current ``(b, W)`` has at least
    ``min_steps`` measured steps (a new group asks only once it has measured itself)."""

    def __init__(self, every: int, skip: int = 2, min_steps: int = 3, model: StepTimeModel | None = None):
        if every <= 0 or skip < 0 or min_steps <= 0:
            raise ValueError(
                f"StepTimeFeed: needs every > 0, skip >= 0, min_steps > 0 (got {every}, {skip}, {min_steps})"
            )
        self.every, self.skip, self.min_steps = every, skip, min_steps
        self.model = model if model is not None else StepTimeModel()
        self._fresh = 0  # steps since the group started or the batch changed

    def restart(self) -> None:
        """A group started or the batch changed: its next ``skip`` steps are left out."""
        self._fresh = 0

    def observe(self, local_batch: int, workers: int, seconds: float, whole: bool = True) -> bool:
        """One step of local batch b on W workers took ``seconds``; ``whole``: it took a whole global
        batch.  Returns whether the step was kept."""
        self._fresh += 1
        if self._fresh <= self.skip or not whole or not (math.isfinite(seconds) and seconds > 0):
            return False
        self.model.observe(local_batch, workers, seconds)
        return True

    def due(self, step: int) -> bool:
        return step > 0 and step % self.every == 0

    def ready(self, local_batch: int, workers: int) -> bool:
        return self.model.configurations.get((local_batch, workers), (0, 0.0))[0] >= self.min_steps

    def inputs(self, b_noise: float | None, base_batch: int, max_batch: int, round_to: int = 1) -> GoodputInputs:
        """What the monitor needs to decide; a ``b_noise`` that is not a finite number >= 0 (an early,
        noisy estimate) counts as not known yet."""
        usable = b_noise is not None and math.isfinite(b_noise) and b_noise >= 0
        return GoodputInputs(
            self.model.state_dict(), float(b_noise) if usable else None, int(base_batch), int(max_batch), int(round_to)
        )

    def state_dict(self) -> dict[str, Any]:
        return self.model.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state)
