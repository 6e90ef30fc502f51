"""The worker-count policy: how many workers the next phase should have.

Ray Train resizes a worker group only by restarting it, so the driver runs training
as phases (``docs/architecture.md``); inside a phase, rank 0 asks the driver after
every batch change whether the group should grow, the driver asks this policy, and
if so the group checkpoints and ends the phase with ``resize_to``.  ``plan`` asks the
same policy through :class:`trainers.policy.PolicySet`.  No Ray in here: the policy
is a pure function of its arguments, unit-tested in milliseconds.

A policy answers a :class:`ResizeDecision` (start the next phase with ``workers``)
or a :class:`NoopDecision` (keep the group; falsy, so ``if decision:`` reads "if
the group changes"), each with the reason to log (``trainers/decisions.py``).

:func:`workers_for_batch` is the one formula for "workers a global batch needs";
the driver's first phase, ``plan`` and :class:`WorkersForBatch` all use it.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod

from trainers.decisions import NoopDecision, ResizeDecision

__all__ = ["NoopDecision", "RESIZE_POLICIES", "ResizeDecision", "ResizePolicy", "WorkersForBatch",
           "build_resize_policy", "workers_for_batch"]


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
    def decide(self, batch_size: int, max_local_batch: int, current_workers: int, min_workers: int,
               max_workers: int) -> ResizeDecision | NoopDecision:
        """The worker count for the next phase, or keep the current one."""

    @staticmethod
    def _check(batch_size: int, max_local_batch: int, current_workers: int, min_workers: int,
               max_workers: int) -> None:
        for label, v in (("batch_size", batch_size), ("max_local_batch", max_local_batch),
                         ("current_workers", current_workers), ("min_workers", min_workers),
                         ("max_workers", max_workers)):
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
    trigger a restart either.  A throughput-aware policy (Pollux-style goodput:
    measured samples/s per W times statistical efficiency from the noise scale) can
    subclass :class:`ResizePolicy` and may also shrink.
    """

    name = "workers_for_batch"

    def decide(self, batch_size: int, max_local_batch: int, current_workers: int, min_workers: int,
               max_workers: int) -> ResizeDecision | NoopDecision:
        self._check(batch_size, max_local_batch, current_workers, min_workers, max_workers)
        need = math.ceil(batch_size / max_local_batch)
        wanted = workers_for_batch(batch_size, max_local_batch, min_workers, max_workers)
        if wanted <= current_workers:
            return NoopDecision(f"B={batch_size} needs {need} worker(s) of max_local_batch {max_local_batch}; "
                                f"keeping {current_workers}")
        capped = " (capped by max_workers)" if wanted < need else ""
        return ResizeDecision(wanted, f"B={batch_size} needs {need} worker(s) of max_local_batch "
                                      f"{max_local_batch}; growing {current_workers} -> {wanted}{capped}")


RESIZE_POLICIES: dict[str, type[ResizePolicy]] = {"workers_for_batch": WorkersForBatch}


def build_resize_policy(name: str = "workers_for_batch") -> ResizePolicy:
    try:
        return RESIZE_POLICIES[name]()
    except KeyError:
        raise ValueError(f"resize policy: unknown {name!r}; expected one of {', '.join(RESIZE_POLICIES)}") from None
