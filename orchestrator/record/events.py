"""What the driver itself observes about a run (beside the workers' events in
trainers/link/messages.py), and its record of each resize.

Listeners (orchestrator/record/listeners.py) receive both kinds; see ``docs/architecture.md``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from trainers.link.messages import Event, ResizeMode


@dataclass
class ResizeRecord:
    """One resize, from the monitor's decision to the new group's first step.

    ``time``: the old group's last checkpoint; ``decided``: the monitor's decision;
    ``fit_returned``: the old group's ``fit()`` returned; ``fit_called``: the new group's ``fit()``
    was called; ``phase``: the new group's phase.  Once the new group made its first step the
    driver fills in where training stood still (:meth:`measure`)."""

    from_workers: int
    to: int
    mode: ResizeMode
    step: int
    time: float
    decided: float
    fit_returned: float
    phase: int
    fit_called: float | None = None
    latency_s: float | None = None
    parts: dict[str, float] = field(default_factory=dict)

    def measure(self, entered: float, first: float) -> None:
        """``latency_s`` runs from the old group's last checkpoint to the new group's first step:
        training stood still that long.  Where the time goes (``parts``): ``overlap_s``, the old
        group trained on while the new one started (overlap only); ``teardown_s``, the old group's
        teardown (restart only: with overlap it is off the critical path); ``start_s``, the new
        ``fit()`` call to its loop's entry on rank 0; ``setup_s``, loop entry to the first step
        (data, model, process group, restore)."""
        assert self.fit_called is not None
        overlap = self.mode == "overlap"
        self.parts = {
            "overlap_s": self.time - self.decided if overlap else 0.0,
            "teardown_s": 0.0 if overlap else self.fit_returned - self.time,
            "start_s": entered - self.fit_called,
            "setup_s": first - entered,
        }
        self.latency_s = first - self.time

    def as_dict(self) -> dict[str, Any]:
        """The resize as ``RunSummary.resizes`` lists it (keys ``from``, ``to``, ``mode``, ``step``,
        ``time``, ``decided``, ``fit_returned``, ``phase``, ``fit_called``, ``latency_s`` and the parts)."""
        return {
            "from": self.from_workers,
            "to": self.to,
            "mode": self.mode,
            "step": self.step,
            "time": self.time,
            "decided": self.decided,
            "fit_returned": self.fit_returned,
            "phase": self.phase,
            "fit_called": self.fit_called,
            "latency_s": self.latency_s,
            **self.parts,
        }


@dataclass(frozen=True, kw_only=True)
class GroupRestarted(Event):
    """Ray Train restarted a phase's group after a worker failure (the ``restarts``-th time)."""

    kind: ClassVar[str] = "group_restarted"
    step: int
    workers: int
    restarts: int


@dataclass(frozen=True, kw_only=True)
class ResizeHandedOver(Event):
    """The old group wrote its last checkpoint; the new group takes over (or starts now)."""

    kind: ClassVar[str] = "resize_handed_over"
    resize: ResizeRecord


@dataclass(frozen=True, kw_only=True)
class ResizeMeasured(Event):
    """A resize's new group made its first step: the resize's figures are known."""

    kind: ClassVar[str] = "resize_measured"
    resize: ResizeRecord


@dataclass(frozen=True, kw_only=True)
class OverlapFellBack(Event):
    """A new group started for an overlapping resize could not start: resizing by restart."""

    kind: ClassVar[str] = "overlap_fell_back"
    workers: int
    error: BaseException | None


@dataclass(frozen=True, kw_only=True)
class ResizeCalledOff(Event):
    """Training ended before the new group of an overlapping resize was ready."""

    kind: ClassVar[str] = "resize_called_off"
    workers: int


@dataclass(frozen=True, kw_only=True)
class CapacityReturned(Event):
    """Room for more workers came back while the group ran with ``workers`` (fewer than its phase
    asked for): the monitor decided a resize to ``to`` (``fit`` workers fit), handed over at the
    group's next push."""

    kind: ClassVar[str] = "capacity_returned"
    step: int
    workers: int
    to: int
    fit: int
    mode: ResizeMode
    reason: str


@dataclass(frozen=True, kw_only=True)
class NodeDrained(Event):
    """A node that holds ``lost`` of the group's ``workers`` is being drained (a preemption notice)
    with ``deadline`` (epoch seconds; None: none given): the monitor decided a planned resize to
    ``to`` workers on the other nodes, handed over at the group's next push (orchestrator/run/drains.py).
    ``waits``: fewer than ``scaling.min_workers`` fit elsewhere, so the new group waits for capacity."""

    kind: ClassVar[str] = "node_drained"
    step: int
    node: str
    deadline: float | None
    time: float
    workers: int
    lost: int
    to: int
    mode: ResizeMode
    waits: bool
    reason: str


@dataclass(frozen=True, kw_only=True)
class GroupFailed(Event):
    """A worker of ``phase``'s group raised or died (Ray Train's controller saw it): the group is
    torn down and, while ``scaling.max_failures`` allows, restarted from the last checkpoint."""

    kind: ClassVar[str] = "group_failed"
    phase: int
    message: str
