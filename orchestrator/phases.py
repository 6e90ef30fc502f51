"""The driver's control loop: one training run as a sequence of ``TorchTrainer.fit()`` phases.

Built the way Ray Train V2's controller is (``ray/train/v2/_internal/execution/controller``):
the run is always in one small state object, and :meth:`PhaseRunner.run` steps it until a
terminal state::

    Starting -> Running <-> Overlapping          (a new group starts beside the old one)
                   |             |
                   v             v
                PhaseEnded (the old group's fit() returned)
                   |-> Resizing -> Running       (a resize handed over: the new group trains)
                   |-> Finished | Failed         (terminal)

A restart after a worker failure happens inside a phase's ``fit()`` (Ray Train's
``FailureConfig``): the driver sees the same phase start again and counts it (``restarts``).

Each phase is its own Ray Train run (``elastic-<run>``, ``elastic-<run>-r<resume>p<phase>``)
under one storage path.  Rank 0 writes checkpoints straight into its phase's folder; a new
group (a resize, a restart after a failure, a ``resume``) restores the newest intact
checkpoint across all of the training run's folders (trainers/loop/trainer.py).  What the driver
does with records and events (MLflow, the progress bar) is up to listeners
(orchestrator/listeners.py).  See ``docs/architecture.md``.
"""

from __future__ import annotations

import threading
import time
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, ClassVar

from orchestrator import command
from orchestrator.config import RootConfig
from orchestrator.events import (GroupRestarted, OverlapFellBack, ResizeCalledOff, ResizeHandedOver, ResizeMeasured,
                                 ResizeRecord)
from orchestrator.nodes import CapacityWatch
from orchestrator.listeners import ProgressListener, RecordsCallback, RunListener, TrackingListener
from orchestrator.progress import Progress, total_samples
from orchestrator.reservations import TAG as RESERVATIONS_TAG
from orchestrator.reservations import ray_train_run_id, recorded
from orchestrator.reservations import refresh as refresh_nodes
from orchestrator.tracking import RunTracker, TrackingLost
from trainers.link import metrics as M
from trainers.link import messages as msg
from trainers.link.messages import (Diverged, Event, FirstStep, PhaseStart, Record, Resize, ResizeDecided,
                                    StorageFailed, WorkloadFailed)
from trainers.link.runtime import Runtime
from trainers.loop.storage import resolve

POLL_S = 0.5
NEVER_S = 1e9  # Ray Train's own look for capacity that came back: the driver does it (look_for_capacity)


class CapacityLost(Exception):
    """Fewer than ``scaling.min_workers`` fit the live nodes for ``scaling.capacity_timeout_s``."""
# After Ctrl-C/SIGTERM the workers are asked to stop (a last checkpoint at their next push) and the
# driver drains them for at most this long: `ray job stop` sends SIGKILL 3 s after its SIGTERM.
STOP_WAIT_S = 2.0
# Once the tracking server has stayed away for tracking.outage_timeout_s, the group is stopped at a
# checkpoint; nothing hurries the driver then, but it must end.
TRACKING_STOP_WAIT_S = 60.0


def resume_command(run_id: str, tracking_uri: str, functions: dict[str, Callable[..., Any]] | None = None) -> str:
    """The exact command that continues a run (from Python for functions sent by value); the
    tracking URI with any credential masked (the person gives it again)."""
    if functions:
        return f"fit(resume={run_id!r}, ...) with the same functions"
    from orchestrator.command import cli
    from orchestrator.uris import absolute_tracking_uri, redact_uri

    return f"{cli()} resume {run_id} --tracking-uri {redact_uri(absolute_tracking_uri(tracking_uri))}"


def storage_failed_message(ev: StorageFailed, run_id: str, tracking_uri: str,
                           functions: dict[str, Callable[..., Any]] | None = None) -> str:
    """One line: which path is full (why, the space free there), what is kept, and the resume command."""
    kept = f"the newest checkpoint is {ev.checkpoint}" if ev.checkpoint else "no checkpoint was written yet"
    return (f"{ev.message}; training stopped at step {ev.step} without restarting (a restart would write into "
            f"the same storage); {kept}; {ev.fix}, then: {resume_command(run_id, tracking_uri, functions)}")


class _Phase:
    """One ``fit()`` running in a thread."""

    def __init__(self, idx: int, workers: int, trainer: Any):
        self.idx, self.workers = idx, workers
        self.box: dict[str, Any] = {}
        self.t_called, self.ended = 0.0, 0.0

        def fit() -> None:
            self.t_called = time.time()
            try:
                self.box["result"] = trainer.fit()
            except BaseException as e:  # surfaced on the driver thread
                self.box["error"] = e
            self.ended = time.time()

        self.thread = threading.Thread(target=fit, name=f"fit-phase{idx}", daemon=True)

    @property
    def alive(self) -> bool:
        return self.thread.is_alive()


# --------------------------------------------------------------------------- states


class RunState(ABC):
    """Where the run is.  :meth:`step` does one poll's work and returns the next state (itself
    to stay); ``early`` is a group started ahead of a resize, which must not train if the run
    ends here."""

    terminal: ClassVar[bool] = False
    early: _Phase | None = None

    @abstractmethod
    def step(self, run: PhaseRunner) -> RunState: ...


@dataclass
class Starting(RunState):
    """Create the monitor and start phase 0 with enough workers for the (restored) batch."""

    def step(self, run: PhaseRunner) -> RunState:
        run.make_monitor()
        return Running(run.start_phase(run.initial_workers(), 0, handover=False))


@dataclass
class Running(RunState):
    """One group trains; the driver pumps the monitor every poll.  An overlapping resize decided
    by the monitor starts the new group beside it."""

    cur: _Phase

    def step(self, run: PhaseRunner) -> RunState:
        run.poll(self.cur)
        if not self.cur.alive:
            return PhaseEnded(self.cur)
        run.look_for_capacity(self.cur)
        want = run.take_overlap_wanted()
        if want is not None:
            return Overlapping(self.cur, run.start_phase(want, self.cur.idx + 1, handover=True))
        return self


@dataclass
class Overlapping(RunState):
    """The old group trains on while the new group (``early``) starts; the old group hands over
    once the new one is ready.  A new group that ends without taking over could not start: the
    resize falls back to a restart."""

    cur: _Phase
    early: _Phase | None

    def step(self, run: PhaseRunner) -> RunState:
        run.poll(self.cur)
        nxt = self.early
        if nxt is not None and not nxt.alive and self.cur.alive and run.handover_path(nxt.idx) is None:
            # (One that took over may well end first: it trains while the old group's fit() tears down.)
            run.fall_back_to_restart(nxt)
            return Running(self.cur)
        if self.cur.alive:
            return self
        return PhaseEnded(self.cur, nxt)


@dataclass
class PhaseEnded(RunState):
    """The group's ``fit()`` returned: either it handed over to a resize, or the run is over
    (finished, stopped or failed), and a new group started early is called off."""

    cur: _Phase
    early: _Phase | None = None

    def step(self, run: PhaseRunner) -> RunState:
        run.pump()
        done = run.take_handovers()
        if "error" in self.cur.box or not done:
            if self.early is not None:
                run.call_off(self.early)
            if "error" in self.cur.box:
                return Failed(self.cur.box["error"])
            return Finished(self.cur.box["result"])
        return Resizing(self.cur, done[-1], self.early)


@dataclass
class Resizing(RunState):
    """A resize handed over.  With a restart (break before make) the next phase starts once the
    old group's resources are free; with an overlap the new group is already there."""

    old: _Phase
    resize: Resize
    early: _Phase | None = None

    def step(self, run: PhaseRunner) -> RunState:
        record = run.record_resize(self.old, self.resize)
        nxt = self.early
        if nxt is None:
            run.await_room(record.to)
            nxt = run.start_phase(record.to, run.last_idx + 1, handover=False)
        record.fit_called = nxt.t_called or time.time()
        record.phase = nxt.idx  # after a fallback to restart, not old.idx + 1 (that index failed to start)
        run.take_overlap_wanted()
        run.maybe_measure_resize()
        return Running(nxt)


@dataclass
class Finished(RunState):
    """Terminal: the last group's ``fit()`` returned (training finished or was stopped)."""

    result: Any
    terminal: ClassVar[bool] = True

    def step(self, run: PhaseRunner) -> RunState:
        return self


@dataclass
class Failed(RunState):
    """Terminal: the last group's ``fit()`` raised (Ray Train ran out of ``max_failures``)."""

    error: BaseException
    terminal: ClassVar[bool] = True

    def step(self, run: PhaseRunner) -> RunState:
        return self


# --------------------------------------------------------------------------- what the runner keeps


class RunNames:
    """Where a run's phases go: the storage they share and each phase's Ray Train run name."""

    def __init__(self, run_id: str, storage_path: str) -> None:
        self.train_run_name = f"elastic-{run_id}"  # all phases and resumes share it
        self.storage_path = resolve(storage_path)  # a local folder made absolute, or a URI
        self.resumes = 0  # set by run_training for a resumed run: keeps phase run names unique
        self.last_idx = -1  # the newest phase started (a failed early start keeps its index)
        self.ray_train_runs = ""  # the newest groups' Ray Train run ids (orchestrator/reservations.py)

    def phase_run_name(self, phase: int) -> str:
        """Each phase is its own Ray Train run (two may run at once during an overlapping
        resize); the workers restore the newest checkpoint across all of them."""
        if phase == 0:
            return self.train_run_name
        return f"{self.train_run_name}-r{self.resumes}p{phase}"


class MonitorLink:
    """The driver's handle on the run's monitor actor (orchestrator/monitor.py), and what the
    workers are told about it (``Runtime``)."""

    def __init__(self) -> None:
        self.actor: Any = None
        self.name, self.namespace = "", None
        self.judged_metrics: list[str] = []  # values the driver judges (a pruned search trial)

    def create(self, cfg: RootConfig, resources: dict[str, float]) -> None:
        import ray

        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from orchestrator.monitor import Monitor
        from trainers.policies.resize import WorkerCount

        s = cfg.scaling
        self.namespace = ray.get_runtime_context().namespace
        self.name = f"elastic-monitor-{uuid.uuid4().hex[:12]}"
        overlap = resources if s.resize_mode == "overlap" else None
        # On the driver's own node: a lost worker node must not take the driver's link with it.
        here = NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(), soft=False)
        self.actor = Monitor.options(name=self.name, namespace=self.namespace, scheduling_strategy=here).remote(
            WorkerCount.from_config(cfg), overlap_resources=overlap, only_if_pays=s.resize_when == "pays",
            per_worker=resources)

    def runtime(self, **fields: Any) -> Runtime:
        """What a phase's workers are told: this monitor, the judged metrics, and ``fields``."""
        return Runtime(monitor_name=self.name, namespace=self.namespace, judged_metrics=list(self.judged_metrics),
                       **fields)

    def kill(self) -> None:
        import ray

        if self.actor is not None:
            ray.kill(self.actor)
            self.actor = None


class EventBook:
    """What the workers' events told the driver: every event, when each phase's group entered its
    loop and made its first step, restarts of a group, a divergence, a new group wanted beside the
    running one."""

    def __init__(self, restarts: int) -> None:
        self.events: list[Event] = []
        self.t_start = time.time()
        self.restarts = restarts
        self.diverged: Diverged | None = None  # the run stopped on a non-finite loss
        self.failure: str | None = None  # the run could not go on (no room for min_workers): why
        self.starts: dict[int, int] = {}  # phase -> times its group started (more than once: restarts)
        self.entered: dict[int, float] = {}  # phase -> when its loop was entered on rank 0
        self.first_step: dict[int, float] = {}  # phase -> when its group made its first step
        self.overlap_wanted: int | None = None  # workers of a new group to start beside the old one
        self.user_errors: list[WorkloadFailed] = []  # the user's code raised on a worker (trainers/link/failure.py)
        self.fatal: WorkloadFailed | None = None  # the one that ends the run (the monitor's rule)
        self.storage_failed: StorageFailed | None = None  # a checkpoint's storage was full: the run ended
        self.tracking_lost: TrackingLost | None = None  # the tracking server stayed away: the run stopped

    @property
    def user_error(self) -> WorkloadFailed | None:
        """The user's error to report for a run that failed: the one that ended it, else the last."""
        return self.fatal or (self.user_errors[-1] if self.user_errors else None)

    def observe(self, ev: Event) -> list[Event]:
        """Keep ``ev``; return the driver's own events it implies (a group restarted)."""
        self.events.append(ev)
        if isinstance(ev, Diverged):
            self.diverged = ev
        elif isinstance(ev, StorageFailed):
            self.storage_failed = ev
        elif isinstance(ev, FirstStep):
            self.first_step.setdefault(ev.phase, ev.time)
        elif isinstance(ev, WorkloadFailed):
            repeated = any(e.signature == ev.signature for e in self.user_errors)
            self.user_errors.append(ev)
            if self.fatal is None and (ev.deterministic or repeated):  # as orchestrator/monitor.py decides
                self.fatal = ev
        elif isinstance(ev, ResizeDecided) and ev.mode == "overlap":
            self.overlap_wanted = ev.workers
        elif isinstance(ev, PhaseStart):
            self.starts[ev.phase] = self.starts.get(ev.phase, 0) + 1
            self.entered.setdefault(ev.phase, ev.entered)
            if self.starts[ev.phase] > 1:  # the same phase started again: Ray Train restarted the group
                self.restarts += 1
                return [GroupRestarted(step=ev.step, workers=ev.workers, restarts=self.restarts)]
        return []

    def take_overlap_wanted(self) -> int | None:
        """The workers of a new group to start beside the running one, once."""
        want, self.overlap_wanted = self.overlap_wanted, None
        return want

    def first_step_s(self) -> float | None:
        """Seconds from the run's start to its first optimizer step."""
        return next((ev.time - self.t_start for ev in self.events if isinstance(ev, FirstStep)), None)

    def ended_since(self, seen: int) -> bool:
        """Whether a group said it ended (stopped, finished, diverged) after the first ``seen`` events."""
        return any(isinstance(ev, (msg.Stopped, msg.Finished, Diverged)) for ev in self.events[seen:])

    @property
    def stopped(self) -> bool:
        """The last group stopped before the planned end (the driver asked it to)."""
        ends = [ev for ev in self.events if isinstance(ev, (msg.Stopped, msg.Finished, Diverged))]
        return bool(ends) and isinstance(ends[-1], msg.Stopped)


class ResizeBook:
    """The run's resizes: the last one until its new group's first step measures it, those
    measured (as ``RunSummary.resizes`` lists them), and those called off."""

    def __init__(self) -> None:
        self.measured: list[dict[str, Any]] = []
        self.called_off = 0  # overlapping resizes whose new group never took over
        self.unmeasured: ResizeRecord | None = None

    def record(self, old: _Phase, r: Resize) -> ResizeRecord:
        record = ResizeRecord(from_workers=r.from_workers, to=r.to, mode=r.mode, step=int(r.handover_step),
                              time=r.handover_time, decided=r.time, fit_returned=old.ended, phase=old.idx + 1)
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


# --------------------------------------------------------------------------- the runner


class PhaseRunner:
    """Runs one training run as a sequence of ``fit()`` phases (the context the states act on).

    What it keeps is split by concern: ``names`` (where phases go), ``link`` (the monitor actor),
    ``book`` (what the workers' events said), ``resize_book`` (measured resizes), ``listeners``
    (what is done with records and events)."""

    def __init__(self, cfg: RootConfig, tracker: RunTracker, verbose: bool = False, progress: bool = True,
                 on_records: Callable[[list[Record]], None] | None = None,
                 functions: dict[str, Callable[..., Any]] | None = None):
        self.cfg, self.tracker = cfg, tracker
        self.functions = functions  # factories sent by value (trainers/workload/build.py), in the payload
        self.progress = Progress(total_samples(cfg, functions), enabled=progress)
        self.listeners: list[RunListener] = [TrackingListener(tracker), ProgressListener(self.progress)]
        if on_records is not None:
            self.listeners.append(RecordsCallback(on_records))
        self.poll_s = POLL_S  # how often the monitor is drained (a search lowers it to prune sooner)
        self.names = RunNames(tracker.run_id, cfg.checkpoint.storage_path)
        self.link = MonitorLink()
        self.book = EventBook(restarts=int(tracker.last_value(M.RESTARTS, 0)))
        self.resize_book = ResizeBook()
        self.state: RunState = Starting()
        self.capacity = CapacityWatch(cfg.scaling.min_workers, cfg.scaling.capacity_timeout_s,
                                      grow_every_s=cfg.scaling.capacity_check_s, on_change=refresh_nodes)
        tracker.warn = self.progress.write  # "the tracking server does not answer" under the bar

    # -- what runner.py and run_info.py read (kept where it belongs, shown here) -------------------

    @property
    def train_run_name(self) -> str:
        return self.names.train_run_name

    @property
    def storage_path(self) -> str:
        return self.names.storage_path

    @property
    def resumes(self) -> int:
        return self.names.resumes

    @resumes.setter
    def resumes(self, n: int) -> None:
        self.names.resumes = n

    @property
    def t_start(self) -> float:
        return self.book.t_start

    @t_start.setter
    def t_start(self, t: float) -> None:
        self.book.t_start = t

    @property
    def monitor(self) -> Any:
        return self.link.actor

    @monitor.setter
    def monitor(self, actor: Any) -> None:
        self.link.actor = actor

    @property
    def events(self) -> list[Event]:
        return self.book.events

    @property
    def diverged(self) -> Diverged | None:
        return self.book.diverged

    @property
    def failure(self) -> str | None:
        return self.book.failure

    @property
    def tracking(self) -> TrackingListener:
        """The listener that keeps the run's MLflow tags (the first one)."""
        return next(li for li in self.listeners if isinstance(li, TrackingListener))

    @property
    def user_error(self) -> WorkloadFailed | None:
        """The user's error that ended the run (None: none did)."""
        return self.book.fatal

    @property
    def tracking_lost(self) -> TrackingLost | None:
        """The tracking server did not answer for ``tracking.outage_timeout_s``: the run stopped."""
        return self.book.tracking_lost

    @property
    def restarts(self) -> int:
        return self.book.restarts

    @property
    def resizes(self) -> list[dict[str, Any]]:
        return self.resize_book.measured

    @property
    def called_off(self) -> int:
        return self.resize_book.called_off

    @property
    def last_idx(self) -> int:
        return self.names.last_idx

    def first_step_s(self) -> float | None:
        """Seconds from the run's start to its first optimizer step."""
        return self.book.first_step_s()

    # -- the loop ------------------------------------------------------------------------------

    def run(self) -> Any:
        """Step the states until a terminal one: the last ``fit()``'s result, or its error raised."""
        import ray

        self.state = Starting()
        try:
            while not self.state.terminal:
                self.state = self.state.step(self)
            if isinstance(self.state, Failed) and self.book.user_error is None:
                raise self.state.error
            if isinstance(self.state, Failed):  # Ray Train's error carries the user's, said better by it
                self.book.fatal = self.book.user_error
            full = self.book.storage_failed
            if full is not None:  # FAILED with the message (run_training), never a restart
                self.book.failure = storage_failed_message(full, self.tracker.run_id, self.tracker.uri,
                                                           self.functions)
            return None if self.book.fatal is not None else self.state.result
        except CapacityLost as e:  # the checkpoints are kept: resume once the cluster has room again
            self.book.failure = str(e)
            return None
        except TrackingLost as e:  # stop at a checkpoint; the records it carries are logged on resume
            self.book.tracking_lost = e
            if self.monitor is not None:
                try:
                    self._stop_and_drain(TRACKING_STOP_WAIT_S)
                except Exception:  # noqa: BLE001 - the newest checkpoint is where the resume goes on
                    pass
            return None
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM: stop the workers cleanly, what they trained reaches MLflow
            if self.monitor is not None:
                try:
                    self._stop_and_drain(STOP_WAIT_S)
                except Exception:  # noqa: BLE001 - a resume re-logs whatever is missing
                    pass
            raise
        finally:
            early = self.state.early
            if early is not None and early.alive and self.monitor is not None:
                ray.get(self.monitor.cancel_overlap.remote(early.idx))
            for listener in self.listeners:
                listener.close()
            self.link.kill()

    def _stop_and_drain(self, wait_s: float) -> None:
        """Ask the group to stop (rank 0 checkpoints at its next push and ends) and drain the
        monitor until it says the group ended, or for ``wait_s`` at most."""
        self.monitor.request_stop.remote()
        seen, deadline = len(self.events), time.monotonic() + wait_s
        while True:
            self.pump(timeout=max(0.1, deadline - time.monotonic()))
            if self.book.ended_since(seen):
                return
            if time.monotonic() >= deadline:
                return
            time.sleep(0.05)

    def request_stop(self) -> None:
        if self.monitor is not None:
            self.monitor.request_stop.remote()

    def judge(self, metrics: list[str]) -> None:
        """Before the run starts: the driver judges these metrics' values (a pruned search trial);
        rank 0 waits for the verdict on one at the next (:meth:`verdict`)."""
        self.link.judged_metrics = list(metrics)

    def verdict(self, step: int, stop: bool) -> None:
        """The driver judged the values up to ``step``: ``stop`` the run there, or go on."""
        if self.monitor is not None:
            self.monitor.judged.remote(int(step), bool(stop))

    @property
    def stopped(self) -> bool:
        """The run ended because it was asked to stop, before its planned end."""
        return self.book.stopped

    # -- phases ----------------------------------------------------------------------------------

    def initial_workers(self) -> int:
        """Enough workers for the initial batch (or for the batch a resumed run had reached)."""
        from trainers.policies.resize import WorkerCount

        # the count the batch plan and the monitor ask too (trainers/policies/plan.py)
        s = self.cfg.scaling
        workers = WorkerCount.from_config(self.cfg).initial(self.cfg.batch.size)
        last = min(int(self.tracker.last_value(M.WORKERS, 0)), s.max_workers)
        if s.policy == "goodput" and last:  # goodput may have shrunk the group: a resumed run goes on at its W
            return max(last, s.min_workers)
        return max(workers, last)

    def phase_run_name(self, phase: int) -> str:
        return self.names.phase_run_name(phase)

    def resources(self) -> dict[str, float]:
        s = self.cfg.scaling
        resources = {"CPU": s.cpus_per_worker}
        if s.use_gpu:
            resources["GPU"] = s.gpus_per_worker
        return resources

    def _trainer(self, workers: int, phase: int, handover: bool) -> Any:
        from ray.train import FailureConfig, RunConfig, ScalingConfig
        from ray.train.torch import TorchTrainer

        from orchestrator.failures import FailureNotice
        from trainers.loop.trainer import train_loop_per_worker

        s = self.cfg.scaling
        num_workers: int | tuple[int, int] = workers
        if s.min_workers < workers:
            num_workers = (s.min_workers, workers)
        runtime = self.link.runtime(phase=phase, workers=workers, handover=handover, storage=self.storage_path,
                                    run_prefix=self.train_run_name, run_name=self.phase_run_name(phase),
                                    goodput=s.policy == "goodput")
        payload: dict[str, Any] = {"config": self.cfg.loop_dict(), "runtime": runtime.model_dump()}
        if self.functions:
            payload["functions"] = dict(self.functions)  # cloudpickled by Ray
        return TorchTrainer(
            train_loop_per_worker,
            train_loop_config=payload,
            scaling_config=ScalingConfig(num_workers=num_workers, use_gpu=s.use_gpu,
                                         resources_per_worker=self.resources(),
                                         placement_strategy=s.placement.upper(),
                                         # the driver grows the group itself, at a checkpoint
                                         # (look_for_capacity); Ray Train's own growth would redo the
                                         # steps since the last one
                                         elastic_resize_monitor_interval_s=NEVER_S),
            run_config=RunConfig(
                name=self.phase_run_name(phase),
                storage_path=self.storage_path,
                failure_config=FailureConfig(max_failures=s.max_failures),
                callbacks=[FailureNotice(self.link.name, self.link.namespace, phase)] if self.link.name else [],
            ),
        )

    def start_phase(self, workers: int, idx: int, handover: bool) -> _Phase:
        """Start ``fit()`` for one phase in a thread (the driver thread keeps pumping)."""
        trainer = self._trainer(workers, idx, handover)
        ph = _Phase(idx, workers, trainer)
        train_id = ray_train_run_id(trainer)
        if train_id:  # a resume after this driver is killed drops the group's reservation by it
            self.names.ray_train_runs = recorded(self.names.ray_train_runs, train_id)
            self.tracker.set_tags({RESERVATIONS_TAG: self.names.ray_train_runs})
        if not handover and self.monitor is not None:  # a cold start: what a resize's new group costs here
            self.monitor.starting.remote(idx, time.time())
        self.names.last_idx = max(self.names.last_idx, idx)  # a failed early start keeps its index (and run name)
        ph.thread.start()
        return ph

    def await_room(self, workers: int, timeout_s: float = 60.0) -> bool:
        """Wait (pumping) until the cluster has room for ``workers`` workers.  Ray frees a
        finished group's resources a moment after its ``fit()`` returns; started before that, an
        elastic group (``min_workers < max_workers``) would start with fewer workers than wanted.
        On a loaded machine the old group's processes take many seconds to go: hence a minute."""
        import ray

        from orchestrator.monitor import has_room

        deadline = time.time() + timeout_s
        while not has_room(ray.available_resources(), self.resources(), workers):
            if time.time() > deadline:
                return False  # start anyway: Ray starts what fits (or waits for it)
            self.pump()
            time.sleep(0.05)
        return True

    def wait(self, ph: _Phase) -> None:
        while ph.alive:
            ph.thread.join(self.poll_s)
            self.pump()

    # -- the monitor -------------------------------------------------------------------------------

    def make_monitor(self) -> None:
        self.link.create(self.cfg, self.resources())

    def poll(self, ph: _Phase) -> None:
        """Wait up to ``poll_s`` for the phase's ``fit()`` to return, then pump."""
        ph.thread.join(self.poll_s)
        self.pump()
        status = self.capacity.look(self.resources())
        if status is not None:
            self.progress.write(status)
        if self.capacity.wait.expired():
            how = (f"fit(resume={self.tracker.run_id!r}, ...) with the same functions" if self.functions
                   else f"{command.cli()} resume {self.tracker.run_id}")
            raise CapacityLost(self.capacity.wait.message(how))
        lost = self.tracker.outage_expired()  # the tracking server stayed away too long: stop at a checkpoint
        if lost is not None:
            raise lost

    def look_for_capacity(self, ph: _Phase) -> None:
        """Every ``scaling.capacity_check_s``: ask the monitor whether ``ph``'s group, smaller than it
        asked for (a node was lost), can grow again (:meth:`orchestrator.monitor.MonitorState.capacity_check`);
        its decision comes back as events, and rank 0 hands over at its next push."""
        if not self.capacity.grow_due():
            return
        import ray

        ray.get(self.monitor.capacity_check.remote(ph.idx, ph.workers))

    def pump(self, timeout: float | None = None) -> None:
        """Drain the monitor: records and events to the listeners (the ack, what MLflow holds,
        rides on the drain: one call to the monitor per poll)."""
        import ray

        ref = self.monitor.drain.remote(self.tracker.written_upto)
        records, events = ray.get(ref) if timeout is None else ray.get(ref, timeout=timeout)
        for ev in events:
            # in step order: the records up to an event's step reach the listeners before it (a
            # progress bar prints "batch: 16 -> 72 at step 20" when it shows step 20, not later)
            step = getattr(ev, "step", None)
            if step is not None and records and records[0][0] <= step:
                upto = next((i for i, r in enumerate(records) if r[0] > step), len(records))
                self._deliver(records[:upto])
                records = records[upto:]
            implied = self.book.observe(ev)
            for driver_event in implied:
                self.emit(driver_event)
            self.emit(ev)
            if isinstance(ev, WorkloadFailed) and self.book.fatal is ev and self.monitor is not None:
                self.monitor.request_stop.remote()  # a group that is still training (an overlap's old one) ends
            if isinstance(ev, FirstStep):
                self.maybe_measure_resize()
        self._deliver(records)

    def _deliver(self, records: list[Record]) -> None:
        if records:
            for listener in self.listeners:
                listener.on_records(records)

    def emit(self, event: Event) -> None:
        for listener in self.listeners:
            listener.on_event(event)

    def take_overlap_wanted(self) -> int | None:
        """The workers of a new group to start beside the running one, once."""
        return self.book.take_overlap_wanted()

    def handover_path(self, phase: int) -> str | None:
        import ray

        return ray.get(self.monitor.handover.remote(phase)).path

    def take_handovers(self) -> list[Resize]:
        import ray

        return ray.get(self.monitor.take_handovers.remote())

    # -- resizes ---------------------------------------------------------------------------------------

    def fall_back_to_restart(self, nxt: _Phase) -> None:
        """The new group ended without taking over: it could not start."""
        import ray

        self.emit(OverlapFellBack(workers=nxt.workers, error=nxt.box.get("error")))
        ray.get(self.monitor.fall_back_to_restart.remote())

    def call_off(self, nxt: _Phase) -> None:
        """The run ended before the new group took over: it must not train."""
        import ray

        ray.get(self.monitor.cancel_overlap.remote(nxt.idx))
        self.resize_book.called_off += 1
        self.emit(ResizeCalledOff(workers=nxt.workers))
        self.wait(nxt)

    def record_resize(self, old: _Phase, r: Resize) -> ResizeRecord:
        record = self.resize_book.record(old, r)
        self.emit(ResizeHandedOver(resize=record))
        return record

    def maybe_measure_resize(self) -> None:
        """Measure (and log, through the listeners) the last resize once its new group has made
        its first step (:meth:`ResizeRecord.measure`)."""
        r = self.resize_book.measure(self.book)
        if r is None:
            return
        if r.mode == "overlap" and self.monitor is not None and r.latency_s is not None:
            self.monitor.set_costs.remote(pause_s=r.latency_s)
        self.emit(ResizeMeasured(resize=r))
