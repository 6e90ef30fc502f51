"""What the phase runner (orchestrator/run/phases.py) keeps, one concern per class.

:class:`GroupPlan`: what its worker groups are started with, read once from the config;
:class:`RunStart`: what a run brings to its driver; :class:`RunNames`: where its phases go;
:class:`EventBook`: what the workers' events said; :class:`ResizeBook`: the run's resizes (it also
tells the monitor what a resize's steps decided)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from orchestrator.config.schema import RootConfig, ScalingConfig
from orchestrator.record.events import (
    GroupRestarted,
    OverlapFellBack,
    ResizeCalledOff,
    ResizeHandedOver,
    ResizeMeasured,
    ResizeRecord,
)
from orchestrator.record.timeline import Timeline
from orchestrator.run.monitor_link import MonitorLink
from orchestrator.run.outcome import (
    Diverged,
    Finished,
    Outcome,
    OutOfStorage,
    RayTrainFailed,
    Stopped,
    UserCodeFailed,
    is_fatal,
)
from trainers.link import messages as msg
from trainers.link.messages import Event, FirstStep, PhaseStart, Resize, ResizeDecided, WorkloadFailed
from trainers.loop.checkpoint import CorruptCheckpoint, checkpoint_step, load_newest_checkpoint, run_checkpoints
from trainers.loop.storage import join, resolve
from trainers.policies.resize import WorkerCount


class StartedGroup(Protocol):
    """A phase's group as the books see it (``orchestrator.run.phases._Phase``)."""

    idx: int
    workers: int
    ended: float
    box: dict[str, Any]

    @property
    def alive(self) -> bool: ...


@dataclass(frozen=True)
class GroupPlan:
    """What the phase runner starts the run's worker groups with, read once from the config
    (:meth:`from_config`): the runner never sees the config itself."""

    scaling: ScalingConfig
    workers: WorkerCount  # the count the batch plan and the monitor ask too (trainers/policies/plan.py)
    batch_size: int  # the initial global batch
    epochs: float  # train.epochs (the progress bar's total is this times the training set)
    storage_path: str  # checkpoint.storage_path
    loop_config: dict[str, Any]  # the trainers' own config, sent to every worker
    functions: dict[str, Callable[..., Any]] | None = None  # factories sent by value, in the payload

    @classmethod
    def from_config(cls, cfg: RootConfig, functions: dict[str, Callable[..., Any]] | None = None) -> GroupPlan:
        return cls(
            scaling=cfg.scaling,
            workers=WorkerCount.from_config(cfg),
            batch_size=cfg.batch.size,
            epochs=cfg.train.epochs,
            storage_path=cfg.checkpoint.storage_path,
            loop_config=cfg.loop_dict(),
            functions=functions,
        )


@dataclass
class RunStart:
    """What a run brings to its driver, read once before it starts (orchestrator/run/runner.py): when
    the driver was invoked (``t0``) and, for a resumed run, what its earlier drivers left: how
    many resumed it before (phase run names stay unique), the Ray Train runs whose reservations
    it holds, their restarts and last worker count, their run-level tags and their timeline."""

    t0: float = field(default_factory=time.time)
    resumes: int = 0
    ray_train_runs: str = ""  # orchestrator/run/reservations.py
    restarts: int = 0
    workers: int = 0  # the W logged last (0: none)
    tags: dict[str, str] = field(default_factory=dict)  # the earlier drivers' tags (listeners go on from them)
    timeline: Timeline | None = None  # the earlier drivers' stretches and resizes (orchestrator/record/history.py)

    @property
    def resumed(self) -> bool:
        return self.resumes > 0


class RunNames:
    """Where a run's phases go: the storage they share and each phase's Ray Train run name."""

    def __init__(self, run_id: str, storage_path: str, resumes: int = 0, ray_train_runs: str = "") -> None:
        self.train_run_name = f"elastic-{run_id}"  # all phases and resumes share it
        self.storage_path = resolve(storage_path)  # a local folder made absolute, or a URI
        self.resumes = resumes  # earlier drivers of a resumed run: keeps phase run names unique
        self.last_idx = -1  # the newest phase started (a failed early start keeps its index)
        self.ray_train_runs = ray_train_runs  # the newest groups' Ray Train run ids (orchestrator/run/reservations.py)
        self.restored_batch: int | None = None  # a resumed run's global batch at its newest checkpoint

    @property
    def folder(self) -> str:
        """The run's (first phase's) folder, where its checkpoints are found."""
        return join(self.storage_path, self.train_run_name)

    def phase_run_name(self, phase: int) -> str:
        """Each phase is its own Ray Train run (two may run at once during an overlapping
        resize); the workers restore the newest checkpoint across all of them."""
        if phase == 0:
            return self.train_run_name
        return f"{self.train_run_name}-r{self.resumes}p{phase}"

    def newest_checkpoint_step(self) -> int | None:
        """The step of the run's newest checkpoint, across its phases (None: none, or the store
        did not answer)."""

        try:
            found = run_checkpoints(self.storage_path, self.train_run_name)
        except OSError:
            return None
        return checkpoint_step(found[0]) if found else None

    def finished_records(self, warn: Callable[[str], None]) -> list[msg.Record] | None:
        """For a resumed run: whether its newest intact checkpoint is the run's planned end (its
        ``train`` state ``finished``: the last step was trained and the group ended there, the run
        only was not closed).  Then nothing is left to train: the step records that checkpoint
        carries (those its driver had not confirmed logging) are returned, to be logged by the
        driver instead of a worker group; None when there is training left (or no checkpoint is
        readable: the group's own restore says why).  The checkpoint's global batch is kept
        (:attr:`restored_batch`): the group a resume starts is sized for it."""
        try:
            payload = load_newest_checkpoint(self.storage_path, self.train_run_name, "cpu", warn=warn)
        except (CorruptCheckpoint, OSError):
            return None
        if payload is not None:
            self.restored_batch = int(dict(payload.get("batch") or {}).get("size") or 0) or None
        if payload is None or not dict(payload.get("train") or {}).get("finished"):
            return None
        rows = dict(payload.get("reporter") or {}).get("records") or []
        return [msg.record_from_list(row) for row in rows]


class EventBook:
    """What the workers' events told the driver: every event, when each phase's group entered its
    loop and made its first step, restarts of a group, a divergence, the user's errors, a full
    storage, a new group wanted beside the running one; and so how the run ended (:meth:`outcome`)."""

    def __init__(self, restarts: int = 0, t_start: float | None = None) -> None:
        self.events: list[Event] = []
        self.t_start = time.time() if t_start is None else t_start  # when the driver was invoked
        self.restarts = restarts  # restarts of the run's groups so far (earlier drivers' included)
        self.diverged: msg.Diverged | None = None  # the run stopped on a non-finite loss
        self.starts: dict[int, int] = {}  # phase -> times its group started (more than once: restarts)
        self.entered: dict[int, float] = {}  # phase -> when its loop was entered on rank 0
        self.spawned: dict[int, float] = {}  # phase -> when its rank 0's process was started
        self.built: dict[int, float] = {}  # phase -> when its rank 0 had built data and model
        self.fit_called: dict[int, float] = {}  # phase -> when this driver called its fit()
        self.first_step: dict[int, float] = {}  # phase -> when its group made its first step
        self.overlap_wanted: int | None = None  # workers of a new group to start beside the old one
        self.user_errors: list[WorkloadFailed] = []  # the user's code raised on a worker (trainers/link/failure.py)
        self.fatal: WorkloadFailed | None = None  # the one that ends the run (outcome.is_fatal)
        self.storage_failed: msg.StorageFailed | None = None  # a checkpoint's storage was full: the run ended

    def observe(self, ev: Event) -> list[Event]:
        """Keep ``ev``; return the driver's own events it implies (a group restarted)."""
        self.events.append(ev)
        if isinstance(ev, msg.Diverged):
            self.diverged = ev
        elif isinstance(ev, msg.StorageFailed):
            self.storage_failed = ev
        elif isinstance(ev, FirstStep):
            self.first_step.setdefault(ev.phase, ev.time)
        elif isinstance(ev, WorkloadFailed):
            if self.fatal is None and is_fatal(ev, self.user_errors):
                self.fatal = ev
            self.user_errors.append(ev)
        elif isinstance(ev, ResizeDecided) and ev.mode == "overlap":
            self.overlap_wanted = ev.workers
        elif isinstance(ev, PhaseStart):
            self.starts[ev.phase] = self.starts.get(ev.phase, 0) + 1
            self.entered.setdefault(ev.phase, ev.entered)
            self.built.setdefault(ev.phase, ev.built)
            if ev.spawned:
                self.spawned.setdefault(ev.phase, ev.spawned)
            if self.starts[ev.phase] > 1:  # the same phase started again: Ray Train restarted the group
                self.restarts += 1
                return [GroupRestarted(step=ev.step, workers=ev.workers, restarts=self.restarts)]
        return []

    def outcome(self, result: Any, error: BaseException | None) -> Outcome:
        """How the run ended, once its last group's ``fit()`` returned ``result`` or raised
        ``error``: what the events said, the gravest first."""
        if error is not None:  # Ray Train's error carries the user's, which is said better by itself
            user = self.fatal or (self.user_errors[-1] if self.user_errors else None)
            return UserCodeFailed(user) if user is not None else RayTrainFailed(error)
        if self.fatal is not None:
            return UserCodeFailed(self.fatal)
        if self.diverged is not None:
            return Diverged(self.diverged)
        if self.storage_failed is not None:  # never a restart: it would write into the same storage
            return OutOfStorage(self.storage_failed)
        return Stopped(result) if self.stopped else Finished(result)

    def take_overlap_wanted(self) -> int | None:
        """The workers of a new group to start beside the running one, once."""
        want, self.overlap_wanted = self.overlap_wanted, None
        return want

    def first_step_s(self) -> float | None:
        """Seconds from the run's start to its first optimizer step."""
        return next((ev.time - self.t_start for ev in self.events if isinstance(ev, FirstStep)), None)

    def start_parts(self, launched: float | None = None, ray_up: float | None = None) -> dict[str, float]:
        """Where the time from the driver's start to its first step went (seconds, in order; empty
        before a first step): ``launch_s`` the command's Python, imports and config checks (when
        ``launched``, the moment training was called, is known); ``ray_s`` Ray started or joined (when
        ``ray_up`` is known); ``driver_s`` the driver's own work until its first ``fit()`` call (MLflow
        run, monitor); ``group_s`` Ray Train's controller, the placement group and rank 0's process
        started; ``worker_s`` that process until it entered the loop (Python, Ray's and torch's
        imports, the process group, the loop's module); ``build_s`` data and model built; ``step_s``
        the checkpoint restored and the first step.  The parts sum to ``first_step_s``."""
        first = next((ev for ev in self.events if isinstance(ev, FirstStep)), None)
        if first is None or first.phase not in self.fit_called or first.phase not in self.entered:
            return {}
        phase = first.phase
        called, entered = self.fit_called[phase], self.entered[phase]
        spawned = min(max(self.spawned.get(phase, called), called), entered)
        built = min(max(self.built.get(phase, entered), entered), first.time)
        marks, parts, last = (("launch_s", launched), ("ray_s", ray_up)), {}, self.t_start
        for name, t in marks:
            if t is not None:
                t = min(max(t, last), called)
                parts[name], last = t - last, t
        parts.update(
            driver_s=called - last,
            group_s=spawned - called,
            worker_s=entered - spawned,
            build_s=built - entered,
            step_s=first.time - built,
        )
        return parts

    def ended_since(self, seen: int) -> bool:
        """Whether a group said it ended (stopped, finished, diverged) after the first ``seen`` events."""
        return any(isinstance(ev, (msg.Stopped, msg.Finished, msg.Diverged)) for ev in self.events[seen:])

    @property
    def stopped(self) -> bool:
        """The last group stopped before the planned end (the driver asked it to)."""
        ends = [ev for ev in self.events if isinstance(ev, (msg.Stopped, msg.Finished, msg.Diverged))]
        return bool(ends) and isinstance(ends[-1], msg.Stopped)


class ResizeBook:
    """The run's resizes: the last one until its new group's first step measures it, those
    measured (as ``RunSummary.resizes`` lists them), and those called off."""

    def __init__(self, link: MonitorLink, emit: Callable[[Event], None]) -> None:
        self.link, self.emit = link, emit  # the monitor the steps tell; the listeners' events
        self.measured: list[dict[str, Any]] = []
        self.called_off = 0  # overlapping resizes whose new group never took over
        self.unmeasured: ResizeRecord | None = None

    def handed_over(self, old: StartedGroup, r: Resize) -> ResizeRecord:
        """``old``'s group handed over to the resize ``r``: its record, until the new group measures it."""
        record = self.record(old, r)
        self.emit(ResizeHandedOver(resize=record))
        return record

    def measure_last(self, book: EventBook) -> None:
        """Measure (and log, through the listeners) the last resize once its new group has made
        its first step (:meth:`ResizeRecord.measure`); an overlap's pause goes to the monitor."""
        r = self.measure(book)
        if r is None:
            return
        if r.mode == "overlap" and r.latency_s is not None:
            self.link.measured_pause(r.latency_s)
        self.emit(ResizeMeasured(resize=r))

    def fell_back(self, nxt: StartedGroup) -> None:
        """The new group ended without taking over: it could not start (a restart follows)."""
        self.emit(OverlapFellBack(workers=nxt.workers, error=nxt.box.get("error")))
        self.link.fall_back_to_restart()

    def call_off(self, nxt: StartedGroup) -> None:
        """The run ended before the new group took over: it must not train."""
        self.link.cancel_overlap(nxt.idx)
        self.called_off += 1
        self.emit(ResizeCalledOff(workers=nxt.workers))

    def cancel_early(self, ph: StartedGroup | None) -> None:
        """The run ended while a new group started beside the old one: it must not train (its
        ``fit()`` is not waited for)."""
        if ph is not None and ph.alive:
            self.link.cancel_overlap(ph.idx)

    def record(self, old: StartedGroup, r: Resize) -> ResizeRecord:
        record = ResizeRecord(
            from_workers=r.from_workers,
            to=r.to,
            mode=r.mode,
            step=int(r.handover_step),
            time=r.handover_time,
            decided=r.time,
            fit_returned=old.ended,
            phase=old.idx + 1,
        )
        self.unmeasured = record
        return record

    def measure(self, book: EventBook) -> ResizeRecord | None:
        """The last resize, measured (:meth:`ResizeRecord.measure`) once its new group has made
        its first step; ``None`` until then."""
        r = self.unmeasured
        if r is None or r.fit_called is None or r.phase not in book.first_step:
            return None
        self.unmeasured = None
        r.measure(entered=book.entered.get(r.phase, r.fit_called), first=book.first_step[r.phase])
        self.measured.append(r.as_dict())
        return r
