"""The worker-count policy: how many workers the next phase should have.

Ray Train resizes a worker group only by restarting it, so the driver runs training
as phases (``docs/architecture.md``); inside a phase, rank 0 asks the driver after
every batch change whether the group should grow, the driver asks this policy, and
if so the group checkpoints and ends the phase with ``resize_to``.  No Ray in here: the policy
is a pure function of its arguments, unit-tested in milliseconds.

A policy answers a :class:`ResizeDecision` (start the next phase with ``workers``)
or a :class:`NoopDecision` (keep the group; falsy, so ``if decision:`` reads "if
the group changes"), each with the reason to log (``trainers/policies/decisions.py``).

:func:`workers_for_batch` is the one formula for "workers a global batch needs".
:class:`WorkerCount` is the policy within the ``scaling`` bounds, and the one object every
worker count is asked of: the driver's first phase (its ``initial``), the monitor's resize
decisions and the batch plan that ``plan`` steps (:class:`trainers.policies.plan.BatchPlan`)
all call its :meth:`WorkerCount.decide`.
:class:`GoodputResize` (``goodput``) chooses W, and B with it, by Pollux's goodput
(``trainers/policies/goodput.py``), shrinking the group too when that is better.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

from trainers.policies.decisions import NoopDecision, ResizeDecision
from trainers.policies.goodput import GoodputDecision, GoodputInputs, StepTimeModel, optimize

__all__ = [
    "NoopDecision",
    "RESIZE_POLICIES",
    "ResizeDecision",
    "ResizeEconomics",
    "ResizePolicy",
    "WorkerCount",
    "GoodputResize",
    "WorkersForBatch",
    "build_resize_policy",
    "resize_pays",
    "workers_for_batch",
]


def workers_for_batch(batch_size: int, max_local_batch: int, min_workers: int, max_workers: int) -> int:
    """Workers a global batch ``B`` needs so that no worker accumulates gradients.

    ``clamp(ceil(B / max_local_batch), min_workers, max_workers)``, and never more than
    ``B`` (a worker with an empty slice only adds communication).
    """
    need = math.ceil(batch_size / max_local_batch)
    return min(max(need, min_workers), max_workers, batch_size)


class ResizePolicy(ABC):
    """Decides the worker count for a global batch.  Subclasses implement :meth:`decide` only.

    Called on rank 0 (or the driver) whenever the global batch changes, and at the
    start of a phase, with:

    * ``batch_size``: the global batch B now in force;
    * ``max_local_batch``: the largest micro-batch one worker runs at once;
    * ``current_workers``: the worker count **the current phase asked for** (the
      upper bound of its ``ScalingConfig``), not the count Ray managed to start:
      a group that Ray shrank after a worker loss would otherwise keep asking for
      the size it has already asked for, restarting forever;
    * ``min_workers``/``max_workers``: the ``scaling`` section's bounds.

    Anything that raises a ``ValueError`` here is a caller bug, and the message
    shows the bad value.
    """

    name: str = ""

    @abstractmethod
    def decide(
        self, batch_size: int, max_local_batch: int, current_workers: int, min_workers: int, max_workers: int
    ) -> ResizeDecision | NoopDecision:
        """The worker count for the next phase, or keep the current one."""

    @staticmethod
    def _check(batch_size: int, max_local_batch: int, current_workers: int, min_workers: int, max_workers: int) -> None:
        for label, v in (
            ("batch_size", batch_size),
            ("max_local_batch", max_local_batch),
            ("current_workers", current_workers),
            ("min_workers", min_workers),
            ("max_workers", max_workers),
        ):
            if v <= 0:
                raise ValueError(f"{label} must be > 0, got {v}")
        if min_workers > max_workers:
            raise ValueError(f"min_workers {min_workers} is above max_workers {max_workers}")


class WorkersForBatch(ResizePolicy):
    """As many workers as the batch needs to avoid extra gradient accumulation, grow-only.

    ``wanted = clamp(ceil(B / max_local_batch), min_workers, max_workers)``, and never
    more than ``B`` (a worker with an empty slice only adds communication).
    Resize only when ``wanted > current_workers``.

    Why grow-only: the batch policies only grow B, so the need never falls; a
    restart costs a fixed ~20 s (``docs/architecture.md``), which shrinking to save
    resources does not repay within a run; and a group that Ray shrank after a
    failure keeps training correctly (B is the math, W a resource), so it must not
    trigger a restart either.  The throughput-aware policy, :class:`GoodputResize`
    (Pollux's goodput: measured step times per W times the statistical efficiency from
    the noise scale), may also shrink.
    """

    name = "workers_for_batch"

    def decide(
        self, batch_size: int, max_local_batch: int, current_workers: int, min_workers: int, max_workers: int
    ) -> ResizeDecision | NoopDecision:
        self._check(batch_size, max_local_batch, current_workers, min_workers, max_workers)
        need = math.ceil(batch_size / max_local_batch)
        wanted = workers_for_batch(batch_size, max_local_batch, min_workers, max_workers)
        if wanted <= current_workers:
            return NoopDecision(
                f"B={batch_size} needs {need} worker(s) of max_local_batch {max_local_batch}; keeping {current_workers}"
            )
        capped = " (capped by max_workers)" if wanted < need else ""
        return ResizeDecision(
            wanted,
            f"B={batch_size} needs {need} worker(s) of max_local_batch "
            f"{max_local_batch}; growing {current_workers} -> {wanted}{capped}",
        )


class GoodputResize(ResizePolicy):
    """Pollux's choice of W (and B) by goodput, grown or shrunk (``trainers/policies/goodput.py``).

    Fed by the caller between decisions: :meth:`observe` with measured step times (the
    :class:`~trainers.policies.goodput.StepTimeModel` it fits) and, in :meth:`decide`, the
    noise scale ``b_noise`` (``B_simple``), the base batch B0, the remaining samples of the run
    and what a resize costs here (``start_s`` or the overlap's pause, as the monitor measures).
    ``max_batch`` > B lets it pick a larger batch too; the chosen one is in ``last.batch``.

    Until a step time has been measured it decides as :class:`WorkersForBatch` (the workers the
    batch needs); after that, by :func:`~trainers.policies.goodput.optimize`, which may keep a
    W the batch "needs" more of (accumulating instead), or shrink the group when the fitted
    synchronisation cost outweighs the compute it spreads.  ``last`` keeps the latest
    :class:`~trainers.policies.goodput.GoodputDecision` (its reason lists the predicted goodput
    of the best batch at every W).
    """

    name = "goodput"

    def __init__(self, model: StepTimeModel | None = None, round_to: int = 1):
        self.model = model if model is not None else StepTimeModel()
        self.round_to = round_to
        self.last: GoodputDecision | None = None

    def observe(self, local_batch: int, workers: int, seconds: float, count: int = 1) -> None:
        """A measured step time (or the mean of ``count`` steps) at local batch b on W workers."""
        self.model.observe(local_batch, workers, seconds, count)

    def decide(
        self,
        batch_size: int,
        max_local_batch: int,
        current_workers: int,
        min_workers: int,
        max_workers: int,
        *,
        b_noise: float | None = None,
        base_batch: int | None = None,
        remaining_samples: float | None = None,
        resize_cost_s: float = 0.0,
        lead_s: float = 0.0,
        max_batch: int | None = None,
        round_to: int | None = None,
    ) -> ResizeDecision | NoopDecision:
        self._check(batch_size, max_local_batch, current_workers, min_workers, max_workers)
        fit = self.model.fit()
        if fit is None:
            self.last = None
            d = WorkersForBatch().decide(batch_size, max_local_batch, current_workers, min_workers, max_workers)
            why = f"no step time measured yet, deciding as workers_for_batch: {d.reason}"
            return ResizeDecision(d.workers, why) if d else NoopDecision(why)
        self.last = optimize(
            fit,
            batch_size,
            current_workers,
            min_workers,
            max_workers,
            base_batch=base_batch or batch_size,
            b_noise=b_noise,
            max_batch=max_batch,
            round_to=self.round_to if round_to is None else round_to,
            remaining_samples=remaining_samples,
            resize_cost_s=resize_cost_s,
            lead_s=lead_s,
        )
        if self.last.resize:
            return ResizeDecision(self.last.workers, self.last.reason)
        return NoopDecision(self.last.reason)


RESIZE_POLICIES: dict[str, type[ResizePolicy]] = {"workers_for_batch": WorkersForBatch, "goodput": GoodputResize}


def build_resize_policy(name: str = "workers_for_batch") -> ResizePolicy:
    try:
        return RESIZE_POLICIES[name]()
    except KeyError:
        raise ValueError(f"resize policy: unknown {name!r}; expected one of {', '.join(RESIZE_POLICIES)}") from None


@dataclass(frozen=True)
class WorkerCount:
    """The worker count of a global batch: ``policy`` within ``min_workers..max_workers``, for
    micro-batches of at most ``max_local_batch``.  Plain data, so the driver ships it to its
    monitor actor as is."""

    policy: ResizePolicy
    max_local_batch: int
    min_workers: int = 1
    max_workers: int = 1

    @classmethod
    def from_config(cls, cfg: Any) -> WorkerCount:
        """From a config's ``batch`` section and, on the driver, its ``scaling`` bounds (a
        worker's config has none: 1..1, it never decides a resize itself)."""
        scaling = getattr(cfg, "scaling", None)
        return cls(
            build_resize_policy(scaling.policy if scaling else "workers_for_batch"),
            cfg.batch.max_local_batch,
            scaling.min_workers if scaling else 1,
            scaling.max_workers if scaling else 1,
        )

    def initial(self, batch_size: int) -> int:
        """Workers a run starting at global batch ``batch_size`` starts with (:func:`workers_for_batch`)."""
        return workers_for_batch(batch_size, self.max_local_batch, self.min_workers, self.max_workers)

    def decide(self, batch_size: int, current_workers: int) -> ResizeDecision | NoopDecision:
        """The policy's answer for B, the current phase having asked for ``current_workers``."""
        return self.policy.decide(batch_size, self.max_local_batch, current_workers, self.min_workers, self.max_workers)

    @property
    def measures(self) -> bool:
        """Whether the policy decides from what the run measures (``goodput``)."""
        return isinstance(self.policy, GoodputResize)

    def decide_measured(
        self,
        batch_size: int,
        current_workers: int,
        inputs: GoodputInputs,
        remaining_samples: float | None,
        resize_cost_s: float = 0.0,
        lead_s: float = 0.0,
    ) -> tuple[ResizeDecision | NoopDecision, GoodputDecision | None]:
        """Goodput's answer from the run's measurements ``inputs`` (step times, ``B_noise``, the batch
        bounds), with what a resize costs here (``resize_cost_s``, an overlap's ``lead_s``): the
        decision and goodput's choice of ``(B, W)`` with its reason (None before any step time was
        measured: then the workers the batch needs, as ``workers_for_batch``)."""
        if not isinstance(self.policy, GoodputResize):
            raise ValueError(f"decide_measured: the worker-count policy is {self.policy.name!r}, not goodput")
        self.policy.model.load_state_dict(inputs.step_times)
        d = self.policy.decide(
            batch_size,
            self.max_local_batch,
            current_workers,
            self.min_workers,
            self.max_workers,
            b_noise=inputs.b_noise,
            base_batch=inputs.base_batch,
            remaining_samples=remaining_samples,
            resize_cost_s=resize_cost_s,
            lead_s=lead_s,
            max_batch=max(inputs.max_batch, batch_size),
            round_to=inputs.round_to,
        )
        return d, self.policy.last


# --------------------------------------------------------------------------- does it pay?


@dataclass(frozen=True)
class ResizeEconomics:
    """What a resize would gain and cost, in seconds of the run's remaining wall time."""

    pays: bool
    gain_s: float
    cost_s: float
    reason: str


def resize_pays(
    remaining_samples: float, samples_per_s: float, workers: int, to: int, start_s: float, pause_s: float, overlap: bool
) -> ResizeEconomics:
    """Whether growing the group from ``workers`` to ``to`` can pay for itself before training ends.

    ``T = remaining_samples / samples_per_s`` is the time training has left at the measured
    throughput.  The new group is assumed to run ``to / workers`` times as fast: the ideal
    speed-up, an upper bound, so a resize refused here could not have paid even at best.

    * ``overlap``: the old group trains on while the new one starts (``start_s``, the start of a
      group measured on this cluster); the new group then trains the rest, ``T - start_s``, at
      the higher rate, after a pause of ``pause_s``.  Gain ``(T - start_s) (1 - workers / to)``,
      cost ``pause_s``; when ``T <= start_s`` the new group would never take over.
    * restart: training stands still while the new group starts: gain ``T (1 - workers / to)``,
      cost ``start_s``.

    The resize pays when the gain is larger than the cost.
    """
    if samples_per_s <= 0 or to <= workers:
        raise ValueError(
            f"resize_pays: needs samples_per_s > 0 and to > workers, got {samples_per_s}, {workers} -> {to}"
        )
    left = max(remaining_samples, 0.0) / samples_per_s
    speedup = 1.0 - workers / to
    if overlap:
        gain, cost = max(left - start_s, 0.0) * speedup, pause_s
    else:
        gain, cost = left * speedup, start_s
    pays = gain > cost
    verdict = "growing" if pays else "keeping the group"
    if overlap and left <= start_s:
        why = f"training ends in ~{left:.0f} s, before a new group could start (~{start_s:.0f} s here); {verdict}"
    else:
        why = (
            f"{workers} -> {to} workers would save ~{gain:.1f} s of the ~{left:.0f} s left at best, "
            f"for a {'pause' if overlap else 'restart'} of ~{cost:.1f} s; {verdict}"
        )
    return ResizeEconomics(pays, gain, cost, why)
