"""The driver's side of the link: one small named Ray actor per training run (the monitor).

Rank 0 pushes ``(step, metrics, time)`` records and events (trainers/link/channel.py); the
driver drains them to log to MLflow and move the progress bar, and may ask the run to stop
(the answer to rank 0's next push).  It needs no CPU of its own.

It also coordinates a resize: whether the batch, goodput or capacity that came back wants one,
how (``restart`` or ``overlap``), and the handover from the old group to the new
(orchestrator/run/resizing.py: the modes, goodput's question, capacity that comes back).

Its parts, one job each: :class:`MessageBuffer` (records, events, the driver's ack),
:class:`Verdicts` (stop, the judged step), :class:`UserErrors` (the user error that ends the run),
:class:`~orchestrator.run.resizing.ResizeCosts` (what a resize costs here),
:class:`~orchestrator.run.resizing.ResizeCoordinator` (which resize, and how) and
:class:`~orchestrator.run.resizing.Handover` (carrying it out); :class:`MonitorState` routes the actor's
calls to them.
"""

from __future__ import annotations

from collections.abc import Callable

import ray

from orchestrator.record.events import GroupFailed
from orchestrator.run.outcome import is_fatal
from orchestrator.run.resizing import (
    Handover,
    ResizeCoordinator,
    ResizeCosts,
)
from trainers.link.messages import (
    Event,
    HandoverAnswer,
    NewGroupReady,
    PushAnswer,
    Record,
    Resize,
    ResizeAnswer,
    WorkloadFailed,
)
from trainers.policies.goodput import GoodputInputs
from trainers.policies.resize import WorkerCount


class MessageBuffer:
    """Hold what rank 0 pushed until the driver drains it, and the step the driver has logged up to.

    :attr:`acked`: every record up to this step is logged (rank 0 may drop them from its checkpoints)."""

    def __init__(self) -> None:
        self._records: list[Record] = []
        self._events: list[Event] = []
        self.acked = -1

    def put(self, records: list[Record], events: list[Event]) -> None:
        self._records.extend(records)
        self._events.extend(events)

    def add(self, event: Event) -> None:
        """An event the monitor itself says (a decision, a failure), drained with rank 0's."""
        self._events.append(event)

    def drain(self, acked: int = -1) -> tuple[list[Record], list[Event]]:
        """The records and events since the last drain; ``acked``: the driver has logged every
        record up to that step (an ack never goes back)."""
        self.acked = max(self.acked, acked)
        records, events = self._records, self._events
        self._records, self._events = [], []
        return records, events


class Verdicts:
    """Keep the driver's word on the run for rank 0: stop, and the step its records are judged up to.

    :attr:`stop`: the run is to stop (never taken back); :attr:`judged`: the driver judged the
    records up to this step (a search's pruner; rank 0 waits for it at a judged value)."""

    def __init__(self) -> None:
        self.stop = False
        self.judged = -1

    def request_stop(self) -> None:
        self.stop = True

    def judge(self, step: int, stop: bool) -> None:
        self.stop = self.stop or stop
        self.judged = max(self.judged, int(step))


class UserErrors:
    """Tell which error raised in the user's code ends the run instead of a restart.

    :attr:`fatal`: that error, once met (None: none yet)."""

    def __init__(self) -> None:
        self._met: list[WorkloadFailed] = []
        self.fatal: WorkloadFailed | None = None

    def met(self, ev: WorkloadFailed) -> None:
        """The rule is orchestrator/run/outcome.py's :func:`~orchestrator.run.outcome.is_fatal`."""
        if self.fatal is None and is_fatal(ev, self._met):
            self.fatal = ev
        self._met.append(ev)


class MonitorState:
    """Answer the monitor actor's calls, each through the part that owns its subject.

    Plain Python (unit-tested without Ray); :data:`Monitor` is the actor.  ``workers``: the run's
    worker count (:class:`~trainers.policies.resize.WorkerCount`, the one the batch plan and
    ``plan`` ask), None: never resize; ``overlap_resources``: the per-worker resources when
    overlapping resizes are allowed (None: always restart); ``available``: the cluster's free
    resources now (Ray's); ``only_if_pays``: ``scaling.resize_when: pays``; ``per_worker``: a
    worker's resources, for :meth:`capacity_check` (None: capacity that comes back is not used);
    ``grow_room``: what an autoscaler can still add to the cluster, counted as room for a bigger
    group's overlap (orchestrator/run/autoscaling.py; None: only the room there now)."""

    def __init__(
        self,
        workers: WorkerCount | None = None,
        overlap_resources: dict[str, float] | None = None,
        available: Callable[[], dict[str, float]] | None = None,
        only_if_pays: bool = False,
        per_worker: dict[str, float] | None = None,
        grow_room: Callable[[], dict[str, float]] | None = None,
    ) -> None:
        self.messages = MessageBuffer()
        self.verdicts = Verdicts()
        self.user_errors = UserErrors()
        self.costs = ResizeCosts(only_if_pays)  # measured here and set by the driver (:meth:`set_costs`)
        self.handovers = Handover()
        self.resizes = ResizeCoordinator(
            workers,
            overlap_resources,
            per_worker,
            available or ray.available_resources,
            self.costs,
            self.handovers,
            self.messages.add,
            grow_room=grow_room,
        )

    # -- rank 0 of the running group -----------------------------------------------------

    def push(self, records: list[Record], events: list[Event]) -> PushAnswer:
        self.resizes.observe(records, events)
        self.messages.put(records, events)
        r = self.handovers.due()
        return PushAnswer(
            stop=self.verdicts.stop,
            acked=self.messages.acked,
            handover=r is not None,
            judged=self.verdicts.judged,
            to=r.to if r is not None else 0,
        )

    def on_batch_change(
        self,
        step: int,
        batch_size: int,
        workers: int,
        remaining_samples: float | None = None,
        samples_per_s: float | None = None,
        inputs: GoodputInputs | None = None,
    ) -> ResizeAnswer:
        """The workers rank 0's batch needs now, and how (:meth:`ResizeCoordinator.on_batch_change`)."""
        return self.resizes.on_batch_change(step, batch_size, workers, remaining_samples, samples_per_s, inputs)

    def handed_over(self, phase: int, step: int, path: str) -> None:
        """The old group (of ``phase``) wrote its last checkpoint, at ``path``, and is ending."""
        self.handovers.handed_over(phase, step, path)

    # -- any rank of a group ----------------------------------------------------------------------

    def workload_failed(self, ev: WorkloadFailed) -> None:
        """A worker's user code raised (trainers/link/failure.py).  A deterministic error, or the
        same error met again after a restart, ends the run: the group Ray Train restarts for it
        returns at once (:meth:`fatal`)."""
        self.user_errors.met(ev)
        self.messages.add(ev)

    def fatal(self) -> WorkloadFailed | None:
        """The user error that ends the run, if any: a new group must not train."""
        return self.user_errors.fatal

    # -- rank 0 of a new group started early (overlap) ----------------------------------------

    def ready(self, phase: int) -> None:
        """The new group of ``phase`` is set up and waits for the old group's last checkpoint."""
        if self.handovers.ready(phase):
            self.messages.add(NewGroupReady(phase=phase))

    def handover(self, phase: int) -> HandoverAnswer:
        """The checkpoint the group of ``phase`` restores, a cancel, or nothing yet."""
        return self.handovers.answer(phase)

    # -- the driver --------------------------------------------------------------------------

    def drain(self, acked: int = -1) -> tuple[list[Record], list[Event]]:
        """The records and events pushed since the last drain; ``acked``: the driver has logged
        every record up to that step (rank 0 may drop them from its checkpoints)."""
        return self.messages.drain(acked)

    def take_handovers(self) -> list[Resize]:
        """The resizes handed over since the last call (the driver starts or switches phases)."""
        return self.handovers.take()

    def cancel_overlap(self, phase: int) -> None:
        """The old group ended without handing over (finished, stopped, failed): the new group of
        ``phase`` must not train."""
        self.handovers.cancel(phase)

    def fall_back_to_restart(self) -> None:
        """The new group could not start: the old group checkpoints at its next step and ends, and
        later resizes of the run restart."""
        self.resizes.fall_back_to_restart()

    def starting(self, phase: int, when: float) -> None:
        """The driver starts ``phase``'s group cold (its ``fit()`` is called at ``when``); its first
        step gives the start cost of a group here."""
        self.costs.starting(phase, when)

    def set_costs(self, start_s: float | None = None, pause_s: float | None = None) -> None:
        """What a resize costs here, as the driver measured it: a new group's start (call to first
        step) and the pause of an overlapping resize."""
        self.costs.measured(start_s, pause_s)

    def capacity_check(self, phase: int, asked: int) -> int:
        """The workers ``phase``'s group, smaller than the ``asked`` for, grows to now that capacity
        came back (0: none; :meth:`ResizeCoordinator.capacity_check`)."""
        return self.resizes.capacity_check(phase, asked)

    def drain_notice(self, phase: int, draining: dict[str, float | None], room: int) -> int:
        """Nodes are being drained (``{node: deadline}``): the workers ``phase``'s group moves to, off
        them (0: none of its nodes; :meth:`ResizeCoordinator.drain_notice`)."""
        return self.resizes.drain_notice(phase, draining, room)

    def request_stop(self) -> None:
        self.verdicts.request_stop()

    def group_failed(self, phase: int, message: str) -> None:
        """Ray Train's controller saw a worker of ``phase``'s group fail (:class:`FailureNotice`)."""

        self.messages.add(GroupFailed(phase=phase, message=message))

    def judged(self, step: int, stop: bool) -> None:
        """The driver's verdict on the records up to ``step`` (a search trial's pruner): ``stop``
        or go on.  Rank 0 waits for it at its next judged value (trainers/link/channel.py)."""
        self.verdicts.judge(step, stop)


Monitor = ray.remote(num_cpus=0)(MonitorState)
