"""The monitor's resizes (orchestrator/run/monitor.py), plain Python: what a resize costs here, which one
the running group needs and how it is carried out, and its handover from the old group to the new.

Two modes:

* ``restart`` (break before make): the old group checkpoints at once and ends;
  the driver then starts the next phase, which restores that checkpoint.
* ``overlap`` (make before break), chosen when the cluster has room for both
  groups at once: the old group keeps training at the new batch (with more
  micro-batches) while the driver starts the new group; the new group gets
  ready (data, model, process group) and says so; the old group checkpoints at
  its next step and ends; the new group restores that checkpoint and goes on.
  Training never stands still for the new group's start.

If the new group cannot start, the driver turns an overlap into a restart.

With ``scaling.policy: goodput`` rank 0 also asks every ``batch.check_every`` steps, sending what
it measured (:class:`~trainers.policies.goodput.GoodputInputs`); the coordinator adds what a resize
costs here and answers goodput's ``(B, W)``, with a :class:`GoodputDecided` event that says why.

Capacity that comes back is used the same way: while a group runs smaller than its phase asked for
(Ray Train restarted it with the workers left after a node was lost), the driver asks every
``scaling.capacity_check_s`` (:meth:`ResizeCoordinator.capacity_check`); once more workers fit the
free resources and the batch wants them, a resize up is decided, and rank 0 hands over at its next
push, as for a batch that outgrew the group.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from orchestrator.record.events import CapacityReturned, NodeDrained
from trainers.link import metrics as M
from trainers.link.messages import (
    Event,
    FirstStep,
    GoodputDecided,
    HandoverAnswer,
    PhaseStart,
    Record,
    Resize,
    ResizeAnswer,
    ResizeDecided,
    ResizeSkipped,
)
from trainers.policies.goodput import GoodputInputs
from trainers.policies.resize import ResizeEconomics, WorkerCount, resize_pays

DEFAULT_OVERLAP_PAUSE_S = 1.0  # an overlapping resize's pause until one is measured on this cluster


def has_room(available: dict[str, float], per_worker: dict[str, float], workers: int) -> bool:
    """Whether ``workers`` more workers of ``per_worker`` resources fit in ``available``."""
    return all(available.get(k, 0.0) + 1e-9 >= v * workers for k, v in per_worker.items() if v > 0)


def workers_in(available: dict[str, float], per_worker: dict[str, float]) -> int:
    """How many workers of ``per_worker`` resources fit in ``available`` (the cluster's free resources)."""
    return max(
        0, min((math.floor((available.get(k, 0.0) + 1e-9) / v) for k, v in per_worker.items() if v > 0), default=0)
    )


class ResizeCosts:
    """What a resize costs on this cluster, as measured so far, and whether a resize must pay for
    itself (``scaling.resize_when: pays``; :func:`trainers.policies.resize.resize_pays`)."""

    def __init__(self, only_if_pays: bool = False) -> None:
        self.only_if_pays = only_if_pays
        self.start_s: float | None = None  # a group's start: its fit() call to its first step
        self.pause_s = DEFAULT_OVERLAP_PAUSE_S  # an overlapping resize's pause
        self._cold: dict[int, float] = {}  # phase -> when its group was started cold (not for a handover)

    def starting(self, phase: int, when: float) -> None:
        self._cold[phase] = when

    def stepped(self, ev: FirstStep) -> None:
        """A group's first step: if it was started cold, what a new group costs here."""
        if ev.phase in self._cold:
            self.start_s = max(ev.time - self._cold.pop(ev.phase), 0.0)

    def measured(self, start_s: float | None = None, pause_s: float | None = None) -> None:
        """What the driver measured: a new group's start (call to first step) and the pause of an
        overlapping resize (None: not measured, kept as it is)."""
        if start_s is not None:
            self.start_s = start_s
        if pause_s is not None:
            self.pause_s = pause_s

    def economics(
        self, to: int, workers: int, mode: str, remaining_samples: float | None, samples_per_s: float | None
    ) -> ResizeEconomics | None:
        """The resize's gain and cost, or None where they cannot be judged yet (no throughput or
        start time measured) or are not asked for: then the resize goes ahead."""
        if not self.only_if_pays or self.start_s is None or not samples_per_s or remaining_samples is None:
            return None
        return resize_pays(
            remaining_samples, samples_per_s, workers, to, self.start_s, self.pause_s, overlap=mode == "overlap"
        )

    def goodput_cost(self, mode: str) -> tuple[float, float]:
        """What goodput charges a resize in ``mode``: ``(cost_s, lead_s)``, the seconds training stands
        still (a restart: a group's start; an overlap: its pause) and the seconds the old group trains
        on before the new one takes over (an overlap: a group's start).  Nothing without
        ``only_if_pays`` (``resize_when: always``); a start not measured yet counts as 0."""
        if not self.only_if_pays:
            return 0.0, 0.0
        start = self.start_s or 0.0
        return (self.pause_s, start) if mode == "overlap" else (start, 0.0)


class Handover:
    """Carry the decided resize from the old group to the new: readiness, checkpoint, cancel, done.

    :attr:`resize`: the resize of the current phase, once decided (one at a time)."""

    def __init__(self) -> None:
        self.resize: Resize | None = None
        self._paths: dict[int, str | None] = {}  # new phase -> checkpoint path (None: cancelled)
        self._done: list[Resize] = []

    def begin(self, resize: Resize) -> None:
        self.resize = resize

    def due(self) -> Resize | None:
        """The resize the running group hands over for at its next push: decided, its new group
        ready (a restart's at once), no checkpoint written for it yet."""
        r = self.resize
        return r if r is not None and r.ready and r.path is None else None

    def handed_over(self, phase: int, step: int, path: str) -> None:
        """The old group (of ``phase``) wrote its last checkpoint, at ``path``, and is ending."""
        if self.resize is not None:
            self.resize.path, self.resize.handover_step, self.resize.handover_time = path, step, time.time()
            self._paths[phase + 1] = path
            self._done.append(self.resize)
            self.resize = None  # the new group decides its own next resize

    def handed(self, phase: int) -> bool:
        """Whether ``phase``'s group handed over (or its successor was called off): it only tears down."""
        return phase + 1 in self._paths

    def ready(self, phase: int) -> bool:
        """The new group of ``phase`` is set up and waits for the old group's last checkpoint;
        False where no resize waits for it (handed over or called off already)."""
        if self.resize is not None and phase not in self._paths:
            self.resize.ready = True
            return True
        return False

    def answer(self, phase: int) -> HandoverAnswer:
        """The checkpoint the group of ``phase`` restores, a cancel, or nothing yet."""
        if phase in self._paths:
            path = self._paths[phase]
            return HandoverAnswer(cancel=True) if path is None else HandoverAnswer(path=path)
        return HandoverAnswer()

    def take(self) -> list[Resize]:
        """The resizes handed over since the last call."""
        done, self._done = self._done, []
        return done

    def cancel(self, phase: int) -> None:
        """The old group ended without handing over: the new group of ``phase`` must not train."""
        self._paths.setdefault(phase, None)

    def fall_back(self) -> None:
        """The new group could not start: the old group checkpoints at its next step and ends."""
        if self.resize is not None and self.resize.path is None:
            self.resize.mode, self.resize.ready = "restart", True


class ResizeCoordinator:
    """Decide the running group's resize and its mode: for its batch, by goodput, for capacity back.

    ``workers``: the run's worker count (:class:`~trainers.policies.resize.WorkerCount`, the one
    the batch plan and ``plan`` ask), None: never resize; ``overlap``: the per-worker resources when
    overlapping resizes are allowed (None: always restart); ``per_worker``: a worker's resources,
    for :meth:`capacity_check` (None: capacity that comes back is not used); ``available``: the
    cluster's free resources now; a decision starts in ``handover`` and is told through ``emit``;
    ``grow_room``: what an autoscaler can still add, counted with ``available`` when a bigger group's
    overlap is judged (its nodes are asked for at the decision: orchestrator/run/autoscaling.py)."""

    def __init__(
        self,
        workers: WorkerCount | None,
        overlap: dict[str, float] | None,
        per_worker: dict[str, float] | None,
        available: Callable[[], dict[str, float]],
        costs: ResizeCosts,
        handover: Handover,
        emit: Callable[[Event], None],
        grow_room: Callable[[], dict[str, float]] | None = None,
    ) -> None:
        self._workers = workers
        self._grow_room = grow_room
        self._overlap = overlap
        self._per_worker = per_worker
        self._available = available
        self.costs = costs
        self.handover = handover
        self._emit = emit
        self._world: dict[int, int] = {}  # phase -> workers its group started with (the latest start)
        self._nodes: dict[int, tuple[str, ...]] = {}  # phase -> each rank's node (the latest start)
        self._latest: tuple[int, int] | None = None  # (step, global batch) of the newest record

    def observe(self, records: list[Record], events: list[Event]) -> None:
        """What rank 0 pushed: a cold-started group's first step (what a new group costs on this
        cluster), each group's workers, the newest global batch."""
        for ev in events:
            if isinstance(ev, FirstStep):
                self.costs.stepped(ev)
            elif isinstance(ev, PhaseStart):
                self._world[ev.phase] = ev.workers
                self._nodes[ev.phase] = tuple(ev.nodes)
        for step, metrics, *_ in reversed(records):
            if M.BATCH_GLOBAL in metrics:
                self._latest = (int(step), int(metrics[M.BATCH_GLOBAL]))
                break

    def _mode(self, to: int, available: dict[str, float] | None = None, grow: bool = False) -> str:
        if self._overlap is None:
            return "restart"
        room = self._available() if available is None else available
        if grow and self._grow_room is not None:  # a bigger group's nodes can still be added
            extra = self._grow_room()
            room = {k: room.get(k, 0.0) + extra.get(k, 0.0) for k in {*room, *extra}}
        return "overlap" if has_room(room, self._overlap, to) else "restart"

    def _begin(self, workers: int, to: int, mode: str, step: int) -> None:
        self.handover.begin(
            Resize(from_workers=workers, to=to, mode=mode, step=step, time=time.time(), ready=mode == "restart")
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
        """Rank 0 reports its global batch; answer the workers it needs now (0 = keep) and how.
        With ``only_if_pays``, a resize that cannot pay for itself over the ``remaining_samples``
        at the measured ``samples_per_s`` is skipped (:func:`trainers.policies.resize.resize_pays`).
        With goodput's ``inputs`` (``scaling.policy: goodput``) that hold a measured step time,
        goodput decides (:meth:`_goodput`)."""
        r = self.handover.resize
        if r is not None:  # already decided (e.g. a restarted old group asks again)
            return ResizeAnswer(r.to, r.mode)
        if self._workers is None:
            return ResizeAnswer()
        if inputs is not None and self._workers.measures and inputs.step_times.get("profile"):
            return self._goodput(step, batch_size, workers, remaining_samples, inputs)
        # (goodput before any step time was measured: the workers the batch needs, judged as below)
        d = self._workers.decide(batch_size, workers)
        mode = ""
        if d:
            mode = self._mode(d.workers, grow=d.workers > workers)
            econ = self.costs.economics(d.workers, workers, mode, remaining_samples, samples_per_s)
            if econ is not None and not econ.pays:
                self._emit(
                    ResizeSkipped(
                        step=step,
                        batch=batch_size,
                        workers=workers,
                        wanted=d.workers,
                        gain_s=econ.gain_s,
                        cost_s=econ.cost_s,
                        reason=econ.reason,
                    )
                )
                return ResizeAnswer()
            self._begin(workers, d.workers, mode, step)
        self._emit(
            ResizeDecided(
                step=step, batch=batch_size, workers=getattr(d, "workers", workers), reason=d.reason, mode=mode
            )
        )
        return ResizeAnswer(d.workers if d else 0, mode)

    def _goodput(
        self, step: int, batch_size: int, workers: int, remaining_samples: float | None, inputs: GoodputInputs
    ) -> ResizeAnswer:
        """Goodput's ``(B, W)`` from rank 0's measurements and the resize costs measured here: judged
        first with the costs of the mode a resize would take (an overlap where configured), and again
        with a restart's when the chosen group has no room beside this one."""
        wc = self._workers
        assert wc is not None

        def decide(mode: str):  # (decision, goodput's choice)
            cost, lead = self.costs.goodput_cost(mode)
            return wc.decide_measured(batch_size, workers, inputs, remaining_samples, cost, lead)

        d, g = decide("overlap" if self._overlap is not None else "restart")
        mode = self._mode(d.workers, grow=d.workers > workers) if d else ""
        if d and mode == "restart" and self._overlap is not None:
            d, g = decide("restart")
            mode = "restart" if d else ""
        to_batch = g.batch if g is not None else batch_size
        to_workers = d.workers if d else workers
        if d:
            self._begin(workers, d.workers, mode, step)
            self._emit(ResizeDecided(step=step, batch=to_batch, workers=d.workers, reason=d.reason, mode=mode))
        if g is not None:
            self._emit(
                GoodputDecided(
                    step=step,
                    batch=batch_size,
                    workers=workers,
                    to_batch=to_batch,
                    to_workers=to_workers,
                    mode=mode,
                    goodput=g.current.goodput,
                    chosen_goodput=g.chosen.goodput,
                    b_noise=inputs.b_noise,
                    gain_s=g.gain_s,
                    cost_s=g.cost_s,
                    alternatives=tuple((c.batch, c.workers, c.goodput) for c in g.alternatives),
                    reason=g.reason,
                )
            )
        elif not d:
            self._emit(ResizeDecided(step=step, batch=batch_size, workers=workers, reason=d.reason, mode=""))
        return ResizeAnswer(d.workers if d else 0, mode, to_batch if to_batch != batch_size else 0)

    def capacity_check(self, phase: int, asked: int) -> int:
        """The driver's look for capacity that came back, while ``phase``'s group (which asked for
        ``asked`` workers) trains: if Ray Train started it smaller (a node was lost, or the cluster
        was short when it started), the batch wants more workers than it has and more fit the free
        resources, decide a resize up to what fits; rank 0 hands over at its next push.  Returns
        the workers to grow to (0: none)."""
        world = self._world.get(phase)
        if (
            self.handover.resize is not None
            or self._workers is None
            or self._per_worker is None
            or world is None
            or world >= asked
            or self._latest is None
            or self.handover.handed(phase)
        ):  # it handed over: its fit() is only tearing down
            return 0
        step, batch = self._latest
        d = self._workers.decide(batch, world)
        if not d:
            return 0
        available = self._available()
        fit = world + workers_in(available, self._per_worker)  # the group's own resources are freed at a restart
        to = min(d.workers, fit)
        if to <= world:
            return 0
        mode = self._mode(to, available)
        self._begin(world, to, mode, step)
        reason = (
            f"capacity returned: {fit} workers fit where the group has {world}; B={batch} wants "
            f"{d.workers}; growing {world} -> {to}"
        )
        self._emit(CapacityReturned(step=step, workers=world, to=to, fit=fit, mode=mode, reason=reason))
        self._emit(ResizeDecided(step=step, batch=batch, workers=to, reason=reason, mode=mode))
        return to

    def drain_notice(self, phase: int, draining: dict[str, float | None], room: int) -> int:
        """The driver saw nodes being drained (``{node: deadline}``, orchestrator/run/drains.py) while
        ``phase``'s group trains.  If some hold ranks of the group, decide a planned resize to the
        workers left on the other nodes (``scaling.min_workers`` at least: then the new group waits
        for capacity, as after a lost node), B unchanged: an overlap where ``room`` (workers that
        fit the free resources outside the draining nodes) holds the new group beside the old one,
        else a restart (a group that has moved onto a node drained since, as during an overlapping
        resize, moves off it so too); rank 0 checkpoints and hands over at its next push.  Returns the workers to
        move to (0: the drain does not touch the group, or a resize is under way already)."""
        nodes = self._nodes.get(phase, ())
        hit = sorted({n for n in nodes if n in draining})
        if (
            not hit
            or self.handover.resize is not None
            or self.handover.handed(phase)
            or self._workers is None
            or self._latest is None
        ):
            return 0
        step, batch = self._latest
        world = len(nodes)
        lost = sum(n in draining for n in nodes)
        floor = self._workers.min_workers
        to = max(world - lost, floor)
        # below min_workers on the group's other nodes, the new group needs more: the free room outside
        # the drained nodes, and the group's own nodes there once it ends (a restart); none: it waits
        waits = world - lost < floor and room + world - lost < floor
        mode = "overlap" if self._overlap is not None and not waits and room >= to else "restart"
        self._begin(world, to, mode, step)
        deadline = min((d for n in hit if (d := draining[n]) is not None), default=None)
        node = hit[0]
        left = "no deadline" if deadline is None else f"{max(0.0, deadline - time.time()):.0f} s"
        reason = f"node {node[:8]} drained (preemption, {left}): moving W {world} -> {to} at step {step}"
        if waits:
            reason += (
                f" (only {world - lost} workers are left outside the drained node, below scaling.min_workers "
                f"{floor}: the new group waits for capacity)"
            )
        self._emit(
            NodeDrained(
                step=step,
                node=node,
                deadline=deadline,
                time=time.time(),
                workers=world,
                lost=lost,
                to=to,
                mode=mode,
                waits=waits,
                reason=reason,
            )
        )
        self._emit(ResizeDecided(step=step, batch=batch, workers=to, reason=reason, mode=mode))
        return to

    def fall_back_to_restart(self) -> None:
        """The new group could not start: the resize under way restarts, and no later resize of this
        run tries to overlap again."""
        self.handover.fall_back()
        self._overlap = None
