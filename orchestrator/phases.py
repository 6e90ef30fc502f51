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

import math
import threading
import time
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, ClassVar

from orchestrator.config import RootConfig
from orchestrator.events import (GroupRestarted, OverlapFellBack, ResizeCalledOff, ResizeHandedOver, ResizeMeasured,
                                 ResizeRecord)
from orchestrator.nodes import CapacityWait
from orchestrator.listeners import ProgressListener, RecordsCallback, RunListener, TrackingListener
from orchestrator.progress import Progress, total_samples
from orchestrator.tracking import RunTracker
from trainers.link import metrics as M
from trainers.link import messages as msg
from trainers.link.messages import Diverged, Event, FirstStep, PhaseStart, Record, Resize, ResizeDecided
from trainers.link.runtime import Runtime
from trainers.loop.storage import resolve

POLL_S = 0.5
CAPACITY_EVERY_S = 2.0  # how often the driver counts the workers the live nodes hold
CAPACITY_SAY_EVERY_S = 15.0  # how often it says that it waits for capacity


def _live_nodes() -> list[dict] | None:
    """The cluster's nodes as ``ray.nodes()`` lists them (None without a Ray to ask)."""
    import ray

    return ray.nodes() if ray.is_initialized() else None


class CapacityLost(Exception):
    """Fewer than ``scaling.min_workers`` fit the live nodes for ``scaling.capacity_timeout_s``."""
# After Ctrl-C/SIGTERM the workers are asked to stop (a last checkpoint at their next push) and the
# driver drains them for at most this long: `ray job stop` sends SIGKILL 3 s after its SIGTERM.
STOP_WAIT_S = 2.0


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


# --------------------------------------------------------------------------- the runner


class PhaseRunner:
    """Runs one training run as a sequence of ``fit()`` phases (the context the states act on)."""

    def __init__(self, cfg: RootConfig, tracker: RunTracker, verbose: bool = False, progress: bool = True,
                 on_records: Callable[[list[Record]], None] | None = None,
                 functions: dict[str, Callable[..., Any]] | None = None):
        self.cfg, self.tracker, self.verbose = cfg, tracker, verbose
        self.functions = functions  # factories sent by value (trainers/workload/build.py), in the payload
        self.progress = Progress(total_samples(cfg, functions), enabled=progress)
        self.listeners: list[RunListener] = [TrackingListener(tracker), ProgressListener(self.progress)]
        if on_records is not None:
            self.listeners.append(RecordsCallback(on_records))
        self.poll_s = POLL_S  # how often the monitor is drained (a search lowers it to prune sooner)
        self.train_run_name = f"elastic-{tracker.run_id}"  # all phases and resumes share it
        self.storage_path = resolve(cfg.checkpoint.storage_path)  # a local folder made absolute, or a URI
        self.events: list[Event] = []
        self.diverged: Diverged | None = None  # the run stopped on a non-finite loss
        self.failure: str | None = None  # the run could not go on (no room for min_workers): why
        self.capacity = CapacityWait(cfg.scaling.min_workers, cfg.scaling.capacity_timeout_s)
        self._capacity_at = self._capacity_said = -math.inf
        self.live_nodes: Callable[[], list[dict] | None] = _live_nodes
        self.monitor: Any = None
        self.monitor_name, self.namespace = "", None
        self.t_start = time.time()
        self.restarts = int(tracker.last_value(M.RESTARTS, 0))
        self.resumes = 0  # set by run_training for a resumed run: keeps phase run names unique
        self.state: RunState = Starting()
        self.last_idx = -1
        self.called_off = 0  # overlapping resizes whose new group never took over
        self.resizes: list[dict[str, Any]] = []  # measured resizes, as RunSummary lists them
        self._starts: dict[int, int] = {}  # phase -> times its group started (more than once: restarts)
        self._entered: dict[int, float] = {}  # phase -> when its loop was entered on rank 0
        self._first_step: dict[int, float] = {}  # phase -> when its group made its first step
        self._overlap_wanted: int | None = None  # workers of a new group to start beside the old one
        self._unmeasured: ResizeRecord | None = None  # the last resize, until its new group's first step
        from trainers.policies.resize import WorkerCount

        self.worker_count = WorkerCount.from_config(cfg)  # the one the batch plan asks (trainers/policies/plan.py)

    # -- the loop ------------------------------------------------------------------------------

    def run(self) -> Any:
        """Step the states until a terminal one: the last ``fit()``'s result, or its error raised."""
        import ray

        self.state = Starting()
        try:
            while not self.state.terminal:
                self.state = self.state.step(self)
            if isinstance(self.state, Failed):
                raise self.state.error
            return self.state.result
        except CapacityLost as e:  # the checkpoints are kept: resume once the cluster has room again
            self.failure = str(e)
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
            if self.monitor is not None:
                ray.kill(self.monitor)
                self.monitor = None

    def _stop_and_drain(self, wait_s: float) -> None:
        """Ask the group to stop (rank 0 checkpoints at its next push and ends) and drain the
        monitor until it says the group ended, or for ``wait_s`` at most."""
        self.monitor.request_stop.remote()
        seen, deadline = len(self.events), time.monotonic() + wait_s
        while True:
            self.pump(timeout=max(0.1, deadline - time.monotonic()))
            if any(isinstance(ev, (msg.Stopped, msg.Finished, Diverged)) for ev in self.events[seen:]):
                return
            if time.monotonic() >= deadline:
                return
            time.sleep(0.05)

    def request_stop(self) -> None:
        if self.monitor is not None:
            self.monitor.request_stop.remote()

    def first_step_s(self) -> float | None:
        """Seconds from the run's start to its first optimizer step."""
        return next((ev.time - self.t_start for ev in self.events if isinstance(ev, FirstStep)), None)

    # -- phases ----------------------------------------------------------------------------------

    def initial_workers(self) -> int:
        """Enough workers for the initial batch (or for the batch a resumed run had reached)."""
        workers = self.worker_count.initial(self.cfg.batch.size)
        return max(workers, min(int(self.tracker.last_value(M.WORKERS, 0)), self.cfg.scaling.max_workers))

    def phase_run_name(self, phase: int) -> str:
        """A restart after a worker failure happens inside a phase's ``fit()`` (Ray Train's
``FailureConfig``): the driver sees the same phase start again and counts it (``restarts``).

Each phase is its own Ray Train run (two may run at once during an overlapping
        resize); the workers restore the newest checkpoint across all of them."""
        if phase == 0:
            return self.train_run_name
        return f"{self.train_run_name}-r{self.resumes}p{phase}"

    def resources(self) -> dict[str, float]:
        s = self.cfg.scaling
        resources = {"CPU": s.cpus_per_worker}
        if s.use_gpu:
            resources["GPU"] = s.gpus_per_worker
        return resources

    def _trainer(self, workers: int, phase: int, handover: bool) -> Any:
        from ray.train import FailureConfig, RunConfig, ScalingConfig
        from ray.train.torch import TorchTrainer

        from trainers.loop.trainer import train_loop_per_worker

        s = self.cfg.scaling
        num_workers: int | tuple[int, int] = workers
        if s.min_workers < workers:
            num_workers = (s.min_workers, workers)
        runtime = Runtime(monitor_name=self.monitor_name, namespace=self.namespace, phase=phase, workers=workers,
                          handover=handover, storage=self.storage_path, run_prefix=self.train_run_name,
                          run_name=self.phase_run_name(phase))
        payload: dict[str, Any] = {"config": self.cfg.loop_dict(), "runtime": runtime.model_dump()}
        if self.functions:
            payload["functions"] = dict(self.functions)  # cloudpickled by Ray
        return TorchTrainer(
            train_loop_per_worker,
            train_loop_config=payload,
            scaling_config=ScalingConfig(num_workers=num_workers, use_gpu=s.use_gpu,
                                         resources_per_worker=self.resources(),
                                         placement_strategy=s.placement.upper(),
                                         elastic_resize_monitor_interval_s=s.capacity_check_s),
            run_config=RunConfig(
                name=self.phase_run_name(phase),
                storage_path=self.storage_path,
                failure_config=FailureConfig(max_failures=s.max_failures),
            ),
        )

    def start_phase(self, workers: int, idx: int, handover: bool) -> _Phase:
        """Start ``fit()`` for one phase in a thread (the driver thread keeps pumping)."""
        ph = _Phase(idx, workers, self._trainer(workers, idx, handover))
        if not handover and self.monitor is not None:  # a cold start: what a resize's new group costs here
            self.monitor.starting.remote(idx, time.time())
        self.last_idx = max(self.last_idx, idx)  # a failed early start keeps its index (and run name)
        ph.thread.start()
        return ph

    def await_room(self, workers: int, timeout_s: float = 10.0) -> bool:
        """Wait (pumping) until the cluster has room for ``workers`` workers.  Ray frees a
        finished group's resources a moment after its ``fit()`` returns; started before that, an
        elastic group (``min_workers < max_workers``) would start with fewer workers than wanted."""
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
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from orchestrator.monitor import Monitor

        s = self.cfg.scaling
        self.namespace = ray.get_runtime_context().namespace
        self.monitor_name = f"elastic-monitor-{uuid.uuid4().hex[:12]}"
        overlap = self.resources() if s.resize_mode == "overlap" else None
        # On the driver's own node: a lost worker node must not take the driver's link with it.
        here = NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(), soft=False)
        self.monitor = Monitor.options(name=self.monitor_name, namespace=self.namespace,
                                       scheduling_strategy=here).remote(
            self.worker_count, overlap_resources=overlap, only_if_pays=s.resize_when == "pays")

    def poll(self, ph: _Phase) -> None:
        """Wait up to ``poll_s`` for the phase's ``fit()`` to return, then pump."""
        ph.thread.join(self.poll_s)
        self.pump()
        self.watch_capacity()

    def watch_capacity(self) -> None:
        """Every few seconds, whether ``scaling.min_workers`` still fit the live nodes; while they do
        not (a node was lost), say so, and end the run once ``scaling.capacity_timeout_s`` is over."""
        from orchestrator.nodes import workers_that_fit

        now = time.monotonic()
        if now - self._capacity_at < CAPACITY_EVERY_S:
            return
        self._capacity_at = now
        nodes = self.live_nodes()
        if nodes is None:
            return
        status = self.capacity.update(workers_that_fit(nodes, self.resources()))
        if status is not None and now - self._capacity_said >= CAPACITY_SAY_EVERY_S:
            self._capacity_said = now
            self.progress.write(status)
        if self.capacity.expired():
            how = (f"fit(resume={self.tracker.run_id!r}, ...) with the same functions" if self.functions
                   else f"python -m orchestrator resume {self.tracker.run_id}")
            raise CapacityLost(self.capacity.message(how))

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
            self.events.append(ev)
            self._observe(ev)
            self.emit(ev)
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

    def _observe(self, ev: Event) -> None:
        """The runner's own bookkeeping of the workers' events."""
        if isinstance(ev, Diverged):
            self.diverged = ev
        elif isinstance(ev, FirstStep):
            self._first_step.setdefault(ev.phase, ev.time)
        elif isinstance(ev, ResizeDecided) and ev.mode == "overlap":
            self._overlap_wanted = ev.workers
        elif isinstance(ev, PhaseStart):
            self._starts[ev.phase] = self._starts.get(ev.phase, 0) + 1
            if self._starts[ev.phase] > 1:  # the same phase started again: Ray Train restarted the group
                self.restarts += 1
                self.emit(GroupRestarted(step=ev.step, workers=ev.workers, restarts=self.restarts))
            self._entered.setdefault(ev.phase, ev.entered)

    def take_overlap_wanted(self) -> int | None:
        """The workers of a new group to start beside the running one, once."""
        want, self._overlap_wanted = self._overlap_wanted, None
        return want

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
        self.called_off += 1
        self.emit(ResizeCalledOff(workers=nxt.workers))
        self.wait(nxt)

    def record_resize(self, old: _Phase, r: Resize) -> ResizeRecord:
        record = ResizeRecord(from_workers=old.workers, to=r.to, mode=r.mode, step=int(r.handover_step),
                              time=r.handover_time, decided=r.time, fit_returned=old.ended, phase=old.idx + 1)
        self._unmeasured = record
        self.emit(ResizeHandedOver(resize=record))
        return record

    def maybe_measure_resize(self) -> None:
        """Measure (and log, through the listeners) the last resize once its new group has made
        its first step (:meth:`ResizeRecord.measure`)."""
        r = self._unmeasured
        if r is None or r.fit_called is None or r.phase not in self._first_step:
            return
        self._unmeasured = None
        r.measure(entered=self._entered.get(r.phase, r.fit_called), first=self._first_step[r.phase])
        if r.mode == "overlap" and self.monitor is not None and r.latency_s is not None:
            self.monitor.set_costs.remote(pause_s=r.latency_s)
        self.emit(ResizeMeasured(resize=r))
        self.resizes.append(r.as_dict())
