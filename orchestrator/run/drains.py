"""The nodes Ray is draining (a spot node's notice): the driver's look at them, so the run leaves such
a node before its deadline by a planned resize.

A cloud's warning that it reclaims a spot or preemptible node becomes a drain with a deadline (the
autoscaler does it; by hand: ``ray drain-node --reason DRAIN_NODE_REASON_PREEMPTION
--deadline-remaining-seconds N``).  Leaving the node first spares the run a restart and the steps
since its last checkpoint, which a node that dies without notice costs.

Where the notice is read: Ray Core keeps the draining nodes and their deadlines in its GCS, and
new work is no longer placed on a draining node.  The driver reads them every
:data:`EVERY_S` (``ray._private.state.state.get_draining_nodes()``, the call Ray Train's own
preemption watcher makes: Ray has no public API for a node's drain on the driver's side; the public
``ray.train.get_preemption_info()`` is a collective call every worker would have to make at the
same steps, polled by Ray Train only every 5 s).  The group's workers say at their start which node
each rank runs on (``PhaseStart.nodes``), so the monitor knows whether a drain touches the run
(orchestrator/run/resizing.py ``ResizeCoordinator.drain_notice``).  A Ray without the call (an older
or newer one that moved it) is read as "no node draining": a drained node is then met as a lost
one, with a restart once it is gone.

The driver's own node may be drained too (a driver started off the head: ``python train.py`` on a
worker node, a Ray Client's host): the run cannot move the driver, so the driver stops the group at
a checkpoint (rank 0 saves at its next push) and exits resumable with the command that resumes it
elsewhere (orchestrator/run/outcome.py ``DriverDrained``; exit status 75, "try again", so a job
system's retry resumes the run by its key).  Which node the driver is on is Ray's
``get_runtime_context().get_node_id()``: the node whose raylet this process joined, the one whose
drain ends it.  Ray never drains the head node (a drain of it is accepted and ignored: checked on
Ray 2.60), where a driver started by ``ray job submit`` or a KubeRay RayJob runs.

Ray also rejects an idle-termination drain of a node that still runs work, so a drain that touches
a running group is a preemption (or a person's ``ray drain-node`` of that kind).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping

import ray

EVERY_S = 1.0  # the driver's look at the draining nodes (one GCS call)

log = logging.getLogger(__name__)


def draining_nodes() -> dict[str, float | None]:
    """The nodes Ray is draining now: ``{node id: deadline (epoch seconds), None: no deadline}``
    (empty without a Ray to ask, or where this Ray does not say)."""
    if not ray.is_initialized():
        return {}
    try:
        from ray._private.state import state  # Ray's private state API, only where a drain is looked for

        raw = state.get_draining_nodes()
    except Exception as e:  # a Ray that moved the call: no notice, a lost node's path
        log.debug("could not read the draining nodes: %s", e)
        return {}
    return {str(node): (ms / 1000.0 if ms else None) for node, ms in (raw or {}).items()}


def driver_node() -> str | None:
    """The Ray node this driver joined (None without a Ray)."""
    if not ray.is_initialized():
        return None
    return ray.get_runtime_context().get_node_id()


def room_outside(draining: Mapping[str, object], per_worker: Mapping[str, float]) -> int:
    """Workers of ``per_worker`` that fit the free resources of the live nodes that are not draining
    (new work is not placed on a draining node)."""
    try:
        from ray._private.state import available_resources_per_node  # Ray's private state API, only at a drain

        free = available_resources_per_node()
    except Exception as e:  # unknown: no room is assumed (the resize restarts)
        log.debug("could not read the nodes' free resources: %s", e)
        return 0
    total = 0
    for node, have in free.items():
        if node in draining:
            continue
        fits = min(
            (math.floor(have.get(k, 0.0) / v + 1e-9) for k, v in per_worker.items() if v > 0),
            default=0,
        )
        total += max(0, fits)
    return total


class DrainWatch:
    """The driver's look at the draining nodes every ``every_s``: :meth:`poll_drain_notices` gives them (an empty
    dict: none) when a look is due, None between looks; :meth:`own_drain` whether the driver's own
    node (``own``, asked once) is among them."""

    def __init__(
        self,
        every_s: float = EVERY_S,
        source: Callable[[], dict[str, float | None]] = draining_nodes,
        clock: Callable[[], float] = time.monotonic,
        own: Callable[[], str | None] = driver_node,
    ) -> None:
        self.every_s, self.source, self.clock = every_s, source, clock
        self._looked = -math.inf
        self._own = own
        self._node: str | None = None

    def own_drain(self, draining: Mapping[str, float | None]) -> tuple[str, float | None] | None:
        """``(the driver's node, its deadline)`` when ``draining`` holds the node this driver runs
        on, else None."""
        if not draining:
            return None
        if self._node is None:
            self._node = self._own()
        if self._node is None or self._node not in draining:
            return None
        return self._node, draining[self._node]

    def poll_drain_notices(self) -> dict[str, float | None] | None:
        now = self.clock()
        if now - self._looked < self.every_s:
            return None
        self._looked = now
        return self.source()
