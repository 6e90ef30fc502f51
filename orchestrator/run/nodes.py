"""What the cluster's live nodes can hold: how many workers fit, and the driver's bounded wait for
room after a node is lost.

Ray Train restarts a group that lost a node with the workers that fit (``num_workers=(min, max)``)
and waits, without end, while fewer than ``min_workers`` fit.  The driver makes that wait visible
and bounded: :class:`CapacityWait` says what it waits for and, after ``scaling.capacity_timeout_s``,
why the run must end (the checkpoints are kept: ``resume`` continues once capacity is back).
Workers never span nodes, so what fits is counted node by node, not from the cluster's totals.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping

import ray

from orchestrator.run.drains import DrainWatch


def workers_that_fit(nodes: Iterable[Mapping], per_worker: Mapping[str, float]) -> int:
    """Workers of ``per_worker`` resources that the live ``nodes`` (``ray.nodes()`` entries) hold
    together, each node counted on its own total resources."""
    total = 0
    for node in nodes:
        if not node.get("Alive", node.get("alive", False)):
            continue
        have = node.get("Resources", {})
        fits = min((math.floor(have.get(k, 0.0) / v + 1e-9) for k, v in per_worker.items() if v > 0), default=0)
        total += max(0, fits)
    return total


class CapacityWait:
    """Tracks whether ``min_workers`` fit; from the first poll at which they do not, the time waited.

    :meth:`update` returns None while there is room, else a one-line status for the progress bar;
    :meth:`expired` is true once the wait has lasted ``timeout_s``."""

    def __init__(self, min_workers: int, timeout_s: float, clock=time.monotonic):
        self.min_workers, self.timeout_s, self.clock = min_workers, timeout_s, clock
        self.since: float | None = None
        self.fit = min_workers

    def update(self, fit: int) -> str | None:
        self.fit = fit
        if fit >= self.min_workers:
            self.since = None
            return None
        if self.since is None:
            self.since = self.clock()
        return (
            f"waiting for capacity: {fit} of scaling.min_workers {self.min_workers} workers fit the live "
            f"nodes ({self.waited_s():.0f} of {self.timeout_s:g} s)"
        )

    def waited_s(self) -> float:
        return 0.0 if self.since is None else self.clock() - self.since

    def expired(self) -> bool:
        return self.since is not None and self.waited_s() >= self.timeout_s

    def message(self, resume: str) -> str:
        return (
            f"lost capacity: only {self.fit} of scaling.min_workers {self.min_workers} workers fit the live "
            f"nodes for {self.waited_s():.0f} s (scaling.capacity_timeout_s {self.timeout_s:g}); add nodes, "
            f"then continue from the newest checkpoint with: {resume}"
        )


def live_nodes() -> list[dict] | None:
    """The cluster's nodes as ``ray.nodes()`` lists them (None without a Ray to ask)."""

    return ray.nodes() if ray.is_initialized() else None


class CapacityWatch:
    """The driver's look at the live nodes every ``every_s``: feeds :class:`CapacityWait`, and gives
    a line to show every ``say_every_s`` while it waits (None otherwise); and the pace of its look
    for capacity that came back (:meth:`grow_due`, every ``grow_every_s``).  When the set of live
    nodes changes (one lost, one joined) it calls ``on_change`` (the driver has Ray Train's view of
    the nodes re-read: orchestrator/run/reservations.py)."""

    def __init__(
        self,
        min_workers: int,
        timeout_s: float,
        every_s: float = 2.0,
        say_every_s: float = 15.0,
        nodes=live_nodes,
        clock=time.monotonic,
        grow_every_s: float = 30.0,
        on_change: Callable[[], object] | None = None,
        drains: DrainWatch | None = None,
    ):
        self.wait = CapacityWait(min_workers, timeout_s, clock=clock)
        self.every_s, self.say_every_s, self.nodes, self.clock = every_s, say_every_s, nodes, clock
        self._looked = self._said = -math.inf
        self.grow_every_s, self._grow_asked = grow_every_s, clock()
        self.on_change, self._alive = on_change, None  # the live nodes' ids at the last look
        self.drains = drains or DrainWatch()

    def grow_due(self) -> bool:
        """Whether ``grow_every_s`` passed since the last look for capacity that came back (then it counts as made)."""
        now = self.clock()
        if now - self._grow_asked < self.grow_every_s:
            return False
        self._grow_asked = now
        return True

    def poll_live_nodes(self, per_worker: Mapping[str, float]) -> str | None:
        now = self.clock()
        if now - self._looked < self.every_s:
            return None
        self._looked = now
        nodes = self.nodes()
        if nodes is None:
            return None
        alive = frozenset(n.get("NodeID") for n in nodes if n.get("Alive", n.get("alive", False)))
        if self._alive is not None and alive != self._alive and self.on_change is not None:
            self.on_change()
        self._alive = alive
        status = self.wait.update(workers_that_fit(nodes, per_worker))
        if status is None or now - self._said < self.say_every_s:
            return None
        self._said = now
        return status
