"""The driver's side of its link to the run's monitor actor (orchestrator/run/monitor.py).

:class:`MonitorLink` is the only code on the driver that calls the actor: one typed method per
question or notice, so the phase runner (orchestrator/run/phases.py) never builds an actor call
and a unit test fakes this class instead of Ray.  Before :meth:`create` (and after :meth:`kill`)
the notices do nothing and the questions are not asked."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from orchestrator.config.schema import ScalingConfig
from orchestrator.run.monitor import Monitor
from trainers.link.messages import Event, Record, Resize
from trainers.link.runtime import Runtime
from trainers.policies.resize import WorkerCount


class MonitorLink:
    """The run's monitor actor, and what the workers are told about it (``Runtime``)."""

    def __init__(self, judged_metrics: Sequence[str] = ()) -> None:
        self.actor: Any = None
        self.name, self.namespace = "", None
        self.judged_metrics = list(judged_metrics)  # values the driver judges (a pruned search trial)

    @property
    def up(self) -> bool:
        """The actor was created and not killed."""
        return self.actor is not None

    def create(
        self,
        workers: WorkerCount,
        s: ScalingConfig,
        resources: dict[str, float],
        grow_room: Callable[[], dict[str, float]] | None = None,
    ) -> None:
        self.namespace = ray.get_runtime_context().namespace
        self.name = f"elastic-monitor-{uuid.uuid4().hex[:12]}"
        overlap = resources if s.resize_mode == "overlap" else None
        # On the driver's own node: a lost worker node must not take the driver's link with it.
        here = NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(), soft=False)
        self.actor = Monitor.options(name=self.name, namespace=self.namespace, scheduling_strategy=here).remote(
            workers,
            overlap_resources=overlap,
            only_if_pays=s.resize_when == "pays",
            per_worker=resources,
            grow_room=grow_room,
        )

    def runtime(self, **fields: Any) -> Runtime:
        """What a phase's workers are told: this monitor, the judged metrics, and ``fields``."""
        return Runtime(
            monitor_name=self.name, namespace=self.namespace, judged_metrics=list(self.judged_metrics), **fields
        )

    def kill(self) -> None:
        if self.actor is not None:
            ray.kill(self.actor)
            self.actor = None

    def _tell(self, method: str, *args: Any, **kwargs: Any) -> None:
        """Call the actor's ``method`` without waiting (nothing before :meth:`create`)."""
        if self.actor is not None:
            getattr(self.actor, method).remote(*args, **kwargs)

    def _ask(self, method: str, *args: Any, timeout: float | None = None) -> Any:
        """The actor's answer to ``method`` (``timeout``: Ray's ``GetTimeoutError`` past it)."""
        ref = getattr(self.actor, method).remote(*args)
        return ray.get(ref) if timeout is None else ray.get(ref, timeout=timeout)

    # -- notices (not waited for) ------------------------------------------------------------------

    def request_stop(self) -> None:
        """Rank 0 checkpoints at its next push and ends the group."""
        self._tell("request_stop")

    def judged(self, step: int, stop: bool) -> None:
        """The driver judged the values up to ``step``: ``stop`` there, or go on."""
        self._tell("judged", int(step), bool(stop))

    def starting(self, phase: int, when: float) -> None:
        """A group is cold-starting (what a resize's new group costs on this cluster)."""
        self._tell("starting", phase, when)

    def measured_pause(self, pause_s: float) -> None:
        """An overlapping resize's measured pause, for the next resize's economics."""
        self._tell("set_costs", pause_s=pause_s)

    # -- questions (answered) ----------------------------------------------------------------------

    def drain(self, acked: int, timeout: float | None = None) -> tuple[list[Record], list[Event]]:
        """The records and events since the last drain; ``acked``: the driver logged every record
        up to that step."""
        return self._ask("drain", acked, timeout=timeout)

    def capacity_check(self, phase: int, workers: int) -> int:
        """Whether ``phase``'s group, smaller than it asked for, can grow again (its decision comes
        back as events)."""
        return self._ask("capacity_check", phase, workers)

    def drain_notice(self, phase: int, draining: dict[str, float | None], room: int) -> int:
        """Nodes being drained that hold workers of ``phase``'s group: a planned resize to the others."""
        return self._ask("drain_notice", phase, draining, room)

    def handover_path(self, phase: int) -> str | None:
        """The old group's last checkpoint that ``phase``'s new group takes over from."""
        return self._ask("handover", phase).path

    def take_handovers(self) -> list[Resize]:
        return self._ask("take_handovers")

    def fall_back_to_restart(self) -> None:
        """The new group of an overlapping resize could not start: the old one restarts instead."""
        self._ask("fall_back_to_restart")

    def cancel_overlap(self, phase: int) -> None:
        """``phase``'s new group must not train (the run ended before it took over)."""
        if self.actor is not None:
            self._ask("cancel_overlap", phase)
