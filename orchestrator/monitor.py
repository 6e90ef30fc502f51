"""The driver's side of the link: one small named Ray actor per training run (the monitor).

Rank 0 pushes ``(step, metrics, time)`` records and events (trainers/link/channel.py); the
driver drains them to log to MLflow and move the progress bar, and may ask the run to stop
(the answer to rank 0's next push).  It needs no CPU of its own.

It also coordinates a resize (``docs/architecture.md``, resizes).  Two modes:

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
it measured (:class:`~trainers.policies.goodput.GoodputInputs`); the monitor adds what a resize
costs here and answers goodput's ``(B, W)``, with a :class:`GoodputDecided` event that says why.

Capacity that comes back is used the same way: while a group runs smaller than its phase asked for
(Ray Train restarted it with the workers left after a node was lost), the driver asks every
``scaling.capacity_check_s`` (:meth:`MonitorState.capacity_check`); once more workers fit the free
resources and the batch wants them, the monitor decides a resize up, and rank 0 hands over at its
next push, as for a batch that outgrew the group.
"""

from __future__ import annotations

import math
import time
from typing import Callable

import ray

from orchestrator.events import CapacityReturned
from trainers.link import metrics as M
from trainers.link.messages import (Event, FirstStep, GoodputDecided, HandoverAnswer, NewGroupReady, PhaseStart,
                                    PushAnswer, Record, Resize, ResizeAnswer, ResizeDecided, ResizeSkipped,
                                    WorkloadFailed)
from trainers.policies.goodput import GoodputInputs
from trainers.policies.resize import ResizeEconomics, WorkerCount, resize_pays

DEFAULT_OVERLAP_PAUSE_S = 1.0  # an overlapping resize's pause until one is measured on this cluster


def has_room(available: dict[str, float], per_worker: dict[str, float], workers: int) -> bool:
    """Whether ``workers`` more workers of ``per_worker`` resources fit in ``available``."""
    return all(available.get(k, 0.0) + 1e-9 >= v * workers for k, v in per_worker.items() if v > 0)


def workers_in(available: dict[str, float], per_worker: dict[str, float]) -> int:
    """How many workers of ``per_worker`` resources fit in ``available`` (the cluster's free resources)."""
    return max(0, min((math.floor((available.get(k, 0.0) + 1e-9) / v) for k, v in per_worker.items() if v > 0),
                      default=0))


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

    def economics(self, to: int, workers: int, mode: str, remaining_samples: float | None,
                  samples_per_s: float | None) -> ResizeEconomics | None:
        """The resize's gain and cost, or None where they cannot be judged yet (no throughput or
        start time measured) or are not asked for: then the resize goes ahead."""
        if not self.only_if_pays or self.start_s is None or not samples_per_s or remaining_samples is None:
            return None
        return resize_pays(remaining_samples, samples_per_s, workers, to, self.start_s, self.pause_s,
                           overlap=mode == "overlap")

    def goodput_cost(self, mode: str) -> tuple[float, float]:
        """What goodput charges a resize in ``mode``: ``(cost_s, lead_s)``, the seconds training stands
        still (a restart: a group's start; an overlap: its pause) and the seconds the old group trains
        on before the new one takes over (an overlap: a group's start).  Nothing without
        ``only_if_pays`` (``resize_when: always``); a start not measured yet counts as 0."""
        if not self.only_if_pays:
            return 0.0, 0.0
        start = self.start_s or 0.0
        return (self.pause_s, start) if mode == "overlap" else (start, 0.0)


class MonitorState:
    """The monitor's logic, plain Python (unit-tested without Ray); :data:`Monitor` is the actor.

    ``workers``: the run's worker count (:class:`~trainers.policies.resize.WorkerCount`, the one
    the batch plan and ``plan`` ask), None: never resize; ``overlap_resources``: the per-worker
    resources when overlapping resizes are allowed (None: always restart); ``per_worker``: a
    worker's resources, for :meth:`capacity_check` (None: capacity that comes back is not used)."""

    def __init__(self, workers: WorkerCount | None = None, overlap_resources: dict[str, float] | None = None,
                 available: Callable[[], dict[str, float]] | None = None, only_if_pays: bool = False,
                 per_worker: dict[str, float] | None = None) -> None:
        self._available = available or ray.available_resources  # the cluster's free resources now
        self._workers = workers
        self._overlap = overlap_resources
        self._per_worker = per_worker
        self._world: dict[int, int] = {}  # phase -> workers its group started with (the latest start)
        self._latest: tuple[int, int] | None = None  # (step, global batch) of the newest record
        self._records: list[Record] = []
        self._events: list[Event] = []
        self._stop = False
        self._acked = -1
        self._judged = -1  # the driver judged the records up to this step (a search's pruner)
        self.resize: Resize | None = None  # the resize of the current phase, once decided
        self._handover_paths: dict[int, str | None] = {}  # new phase -> checkpoint path (None: cancelled)
        self._done: list[Resize] = []
        self.costs = ResizeCosts(only_if_pays)  # measured here and set by the driver (:meth:`set_costs`)
        self._user_errors: dict[tuple[str, str], int] = {}  # a user error's signature -> times met
        self._fatal: WorkloadFailed | None = None  # the user error that ends the run

    # -- rank 0 of the running group -----------------------------------------------------

    def push(self, records: list[Record], events: list[Event]) -> PushAnswer:
        for ev in events:  # a cold-started group's first step: what a new group costs on this cluster
            if isinstance(ev, FirstStep):
                self.costs.stepped(ev)
            elif isinstance(ev, PhaseStart):
                self._world[ev.phase] = ev.workers
        for step, metrics, *_ in reversed(records):
            if M.BATCH_GLOBAL in metrics:
                self._latest = (int(step), int(metrics[M.BATCH_GLOBAL]))
                break
        self._records.extend(records)
        self._events.extend(events)
        r = self.resize
        handover = bool(r and r.ready and r.path is None)
        return PushAnswer(stop=self._stop, acked=self._acked, handover=handover, judged=self._judged,
                          to=r.to if r is not None and handover else 0)

    def starting(self, phase: int, when: float) -> None:
        """The driver starts ``phase``'s group cold (its ``fit()`` is called at ``when``); its first
        step gives the start cost of a group here."""
        self.costs.starting(phase, when)

    def set_costs(self, start_s: float | None = None, pause_s: float | None = None) -> None:
        """What a resize costs here, as the driver measured it: a new group's start (call to first
        step) and the pause of an overlapping resize."""
        if start_s is not None:
            self.costs.start_s = start_s
        if pause_s is not None:
            self.costs.pause_s = pause_s

    def on_batch_change(self, step: int, batch_size: int, workers: int, remaining_samples: float | None = None,
                        samples_per_s: float | None = None, inputs: GoodputInputs | None = None) -> ResizeAnswer:
        """Rank 0 reports its global batch; answer the workers it needs now (0 = keep) and how.
        With ``only_if_pays``, a resize that cannot pay for itself over the ``remaining_samples``
        at the measured ``samples_per_s`` is skipped (:func:`trainers.policies.resize.resize_pays`).
        With goodput's ``inputs`` (``scaling.policy: goodput``) that hold a measured step time,
        goodput decides (:meth:`_goodput`)."""
        if self.resize is not None:  # already decided (e.g. a restarted old group asks again)
            return ResizeAnswer(self.resize.to, self.resize.mode)
        if self._workers is None:
            return ResizeAnswer()
        if inputs is not None and self._workers.measures and inputs.step_times.get("profile"):
            return self._goodput(step, batch_size, workers, remaining_samples, inputs)
        # (goodput before any step time was measured: the workers the batch needs, judged as below)
        d = self._workers.decide(batch_size, workers)
        mode = ""
        if d:
            mode = "overlap" if self._overlap is not None and has_room(
                self._available(), self._overlap, d.workers) else "restart"
            econ = self.costs.economics(d.workers, workers, mode, remaining_samples, samples_per_s)
            if econ is not None and not econ.pays:
                self._events.append(ResizeSkipped(step=step, batch=batch_size, workers=workers, wanted=d.workers,
                                                  gain_s=econ.gain_s, cost_s=econ.cost_s, reason=econ.reason))
                return ResizeAnswer()
            self.resize = Resize(from_workers=workers, to=d.workers, mode=mode, step=step, time=time.time(),
                                 ready=mode == "restart")
        self._events.append(ResizeDecided(step=step, batch=batch_size, workers=getattr(d, "workers", workers),
                                          reason=d.reason, mode=mode))
        return ResizeAnswer(d.workers if d else 0, mode)

    def _mode(self, to: int) -> str:
        return "overlap" if self._overlap is not None and has_room(self._available(), self._overlap, to) \
            else "restart"

    def _goodput(self, step: int, batch_size: int, workers: int, remaining_samples: float | None,
                 inputs: GoodputInputs) -> ResizeAnswer:
        """Goodput's ``(B, W)`` from rank 0's measurements and the resize costs measured here: judged
        first with the costs of the mode a resize would take (an overlap where configured), and again
        with a restart's when the chosen group has no room beside this one."""
        wc = self._workers
        assert wc is not None

        def decide(mode: str):  # noqa: ANN202 - (decision, goodput's choice)
            cost, lead = self.costs.goodput_cost(mode)
            return wc.decide_measured(batch_size, workers, inputs, remaining_samples, cost, lead)

        d, g = decide("overlap" if self._overlap is not None else "restart")
        mode = self._mode(d.workers) if d else ""
        if d and mode == "restart" and self._overlap is not None:
            d, g = decide("restart")
            mode = "restart" if d else ""
        to_batch = g.batch if g is not None else batch_size
        to_workers = d.workers if d else workers
        if d:
            self.resize = Resize(from_workers=workers, to=d.workers, mode=mode, step=step, time=time.time(),
                                 ready=mode == "restart")
            self._events.append(ResizeDecided(step=step, batch=to_batch, workers=d.workers, reason=d.reason,
                                              mode=mode))
        if g is not None:
            self._events.append(GoodputDecided(
                step=step, batch=batch_size, workers=workers, to_batch=to_batch, to_workers=to_workers, mode=mode,
                goodput=g.current.goodput, chosen_goodput=g.chosen.goodput, b_noise=inputs.b_noise,
                gain_s=g.gain_s, cost_s=g.cost_s,
                alternatives=tuple((c.batch, c.workers, c.goodput) for c in g.alternatives), reason=g.reason))
        elif not d:
            self._events.append(ResizeDecided(step=step, batch=batch_size, workers=workers, reason=d.reason,
                                              mode=""))
        return ResizeAnswer(d.workers if d else 0, mode, to_batch if to_batch != batch_size else 0)

    def capacity_check(self, phase: int, asked: int) -> int:
        """The driver's look for capacity that came back, while ``phase``'s group (which asked for
        ``asked`` workers) trains: if Ray Train started it smaller (a node was lost, or the cluster
        was short when it started), the batch wants more workers than it has and more fit the free
        resources, decide a resize up to what fits; rank 0 hands over at its next push.  Returns
        the workers to grow to (0: none)."""
        world = self._world.get(phase)
        if (self.resize is not None or self._workers is None or self._per_worker is None or world is None
                or world >= asked or self._latest is None
                or phase + 1 in self._handover_paths):  # it handed over: its fit() is only tearing down
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
        mode = "overlap" if self._overlap is not None and has_room(available, self._overlap, to) else "restart"
        self.resize = Resize(from_workers=world, to=to, mode=mode, step=step, time=time.time(),
                             ready=mode == "restart")
        reason = (f"capacity returned: {fit} workers fit where the group has {world}; B={batch} wants "
                  f"{d.workers}; growing {world} -> {to}")
        self._events.append(CapacityReturned(step=step, workers=world, to=to, fit=fit, mode=mode, reason=reason))
        self._events.append(ResizeDecided(step=step, batch=batch, workers=to, reason=reason, mode=mode))
        return to

    def handed_over(self, phase: int, step: int, path: str) -> None:
        """The old group (of ``phase``) wrote its last checkpoint, at ``path``, and is ending."""
        if self.resize is not None:
            self.resize.path, self.resize.handover_step, self.resize.handover_time = path, step, time.time()
            self._handover_paths[phase + 1] = path
            self._done.append(self.resize)
            self.resize = None  # the new group decides its own next resize

    # -- any rank of a group ----------------------------------------------------------------------

    def workload_failed(self, ev: WorkloadFailed) -> None:
        """A worker's user code raised (trainers/link/failure.py).  A deterministic error, or the
        same error met again after a restart, ends the run: the group Ray Train restarts for it
        returns at once (:meth:`fatal`)."""
        seen = self._user_errors[ev.signature] = self._user_errors.get(ev.signature, 0) + 1
        if self._fatal is None and (ev.deterministic or seen > 1):
            self._fatal = ev
        self._events.append(ev)

    def fatal(self) -> WorkloadFailed | None:
        """The user error that ends the run, if any: a new group must not train."""
        return self._fatal

    # -- rank 0 of a new group started early (overlap) ----------------------------------------

    def ready(self, phase: int) -> None:
        """The new group of ``phase`` is set up and waits for the old group's last checkpoint."""
        if self.resize is not None and phase not in self._handover_paths:
            self.resize.ready = True
            self._events.append(NewGroupReady(phase=phase))

    def handover(self, phase: int) -> HandoverAnswer:
        """The checkpoint the group of ``phase`` restores, a cancel, or nothing yet."""
        if phase in self._handover_paths:
            path = self._handover_paths[phase]
            return HandoverAnswer(cancel=True) if path is None else HandoverAnswer(path=path)
        return HandoverAnswer()

    # -- the driver --------------------------------------------------------------------------

    def drain(self, acked: int = -1) -> tuple[list[Record], list[Event]]:
        """The records and events pushed since the last drain; ``acked``: the driver has logged
        every record up to that step (rank 0 may drop them from its checkpoints)."""
        self._acked = max(self._acked, acked)
        records, events = self._records, self._events
        self._records, self._events = [], []
        return records, events

    def take_handovers(self) -> list[Resize]:
        """The resizes handed over since the last call (the driver starts or switches phases)."""
        done, self._done = self._done, []
        return done

    def cancel_overlap(self, phase: int) -> None:
        """The old group ended without handing over (finished, stopped, failed): the new group of
        ``phase`` must not train."""
        self._handover_paths.setdefault(phase, None)

    def fall_back_to_restart(self) -> None:
        """The new group could not start: the old group checkpoints at its next step and ends."""
        if self.resize is not None and self.resize.path is None:
            self.resize.mode, self.resize.ready = "restart", True
        self._overlap = None

    def request_stop(self) -> None:
        self._stop = True

    def group_failed(self, phase: int, message: str) -> None:
        """Ray Train's controller saw a worker of ``phase``'s group fail (:class:`FailureNotice`)."""
        from orchestrator.events import GroupFailed

        self._events.append(GroupFailed(phase=phase, message=message))

    def judged(self, step: int, stop: bool) -> None:
        """The driver's verdict on the records up to ``step`` (a search trial's pruner): ``stop``
        or go on.  Rank 0 waits for it at its next judged value (trainers/link/channel.py)."""
        self._stop = self._stop or stop
        self._judged = max(self._judged, int(step))


Monitor = ray.remote(num_cpus=0)(MonitorState)

