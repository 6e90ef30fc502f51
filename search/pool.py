"""The trial actors of one search invocation, reused across trials, and the driver's slots for trials.

Each trial still gets a fresh orchestrator run (``search.trial.TrialActor.run``); reusing the
actor only saves its process start.  An actor whose process died is killed, never reused.

The actors live on the driver's node: a trial's run calls Ray Train's ``fit()`` there, and Ray Train
puts the trial's controller on the node of its caller, as the run puts its monitor
(``orchestrator.run.monitor_link.MonitorLink``).  Left to Ray, a trial actor (it holds no CPU) lands on
any node, a worker node too: losing that node would lose the trial, where losing a node of its
worker group only restarts the group from the trial's newest checkpoint.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from search.trial import TrialActor

if TYPE_CHECKING:
    from search.capacity import Capacity
    from search.records import PendingTrial, RunningTrial


class ActorPool:
    """Idle and busy ``TrialActor`` handles: ``get`` one for a trial, ``put`` it back when the trial
    ends, ``close`` them all when the driver ends."""

    def __init__(self) -> None:
        self.idle: list[Any] = []
        self.busy: list[Any] = []

    def get(self) -> Any:
        """An idle actor, or a new one (on the driver's node) when none is idle."""

        actor = self.idle.pop() if self.idle else TrialActor.options(scheduling_strategy=here()).remote()
        self.busy.append(actor)
        return actor

    def put(self, actor: Any, healthy: bool = True) -> None:
        """Give ``actor`` back after its trial: idle again if ``healthy``, else killed."""

        if actor in self.busy:
            self.busy.remove(actor)
        if healthy:
            self.idle.append(actor)
        else:
            ray.kill(actor, no_restart=True)

    def close(self) -> None:
        """Kill every actor (idle or busy); errors are ignored (the actor may be gone already)."""

        for a in self.idle + self.busy:
            try:
                ray.kill(a, no_restart=True)
            except Exception:
                pass
        self.idle, self.busy = [], []


def here() -> NodeAffinitySchedulingStrategy:
    """This process's node, and no other (the driver's: it outlives every worker node)."""
    return NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(), soft=False)


class Slots:
    """The driver's trials in flight: at most ``parallel`` running (their resources booked in
    ``capacity``), one asked trial ``pending`` a slot, and ``to_ask``: the trials this invocation
    has still to ask."""

    def __init__(self, parallel: int) -> None:
        self.parallel = max(1, parallel)
        self.capacity: Capacity | None = None  # what the cluster can ever hold, once Ray is up
        self.running: dict[int, RunningTrial] = {}  # by trial number
        self.pending: PendingTrial | None = None
        self.to_ask = 0

    @property
    def free(self) -> bool:
        """A slot is free for one more running trial."""
        return len(self.running) < self.parallel

    def fits(self, p: PendingTrial) -> bool:
        """``p`` may start now: a slot is free and the cluster has room for it."""
        return self.free and self.capacity is not None and self.capacity.fits(p.need)
