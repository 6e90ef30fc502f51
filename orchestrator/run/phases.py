"""The driver's control loop: one training run as a sequence of ``TorchTrainer.fit()`` phases.

Built the way Ray Train V2's controller is (``ray/train/v2/_internal/execution/controller``):
the run is always in one small state object, and :meth:`PhaseRunner.run` steps it until a
terminal state, which it returns (the terminal states: orchestrator/run/outcome.py)::

    Starting -> Running <-> Overlapping          (a new group starts beside the old one)
                   |   +-> AwaitingNodes -+      (an autoscaling cluster: the old group trains on
                   |                              while the new group's nodes come)
                   |             |
                   +-------------+-> CapacityLost | TrackingGone  (a poll of either: no room for
                   |             |                 min_workers, or no tracking server, for too long)
                   v             v
                PhaseEnded (the old group's fit() returned)
                   |-> Resizing -> Running       (a resize handed over: the new group trains)
                   |-> Finished | Stopped        (the planned end; asked to stop before it)
                   |-> Diverged | UserCodeFailed | OutOfStorage     (what the workers' events said)
                   |-> RayTrainFailed            (fit() raised, not the user's error)

    Ctrl-C or SIGTERM anywhere: the group stops at a checkpoint, the KeyboardInterrupt goes on
    up and orchestrator/run/runner.py ends the run Interrupted.

A restart after a worker failure happens inside a phase's ``fit()`` (Ray Train's
``FailureConfig``): the driver sees the same phase start again and counts it (``restarts``).

Each phase is its own Ray Train run (``elastic-<run>``, ``elastic-<run>-r<resume>p<phase>``)
under one storage path.  Rank 0 writes checkpoints straight into its phase's folder; a new
group (a resize, a restart after a failure, a ``resume``) restores the newest intact
checkpoint across all of the training run's folders (trainers/loop/trainer.py).  What the driver
does with records and events (MLflow, the progress bar) is up to listeners
(orchestrator/record/listeners.py).  See ``docs/architecture.md``.
"""

from __future__ import annotations

import math
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.train import FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

from orchestrator.interrupts import deferred_interrupts, raise_pending_interrupt
from orchestrator.record.cost import GroupHold
from orchestrator.record.listeners import ProgressListener, RunListener, TimelineListener, TrackingListener
from orchestrator.record.progress_bar import Progress
from orchestrator.record.run_tracker import RunTracker
from orchestrator.run.autoscaling import NodeSupply, NodeSupplyListener
from orchestrator.run.drains import DrainWatch, room_outside
from orchestrator.run.failures import FailureNotice
from orchestrator.run.monitor_link import MonitorLink
from orchestrator.run.nodes import CapacityWatch
from orchestrator.run.outcome import (
    CapacityLost,
    DriverDrained,
    Finished,
    Outcome,
    Resume,
    TrackingGone,
)
from orchestrator.run.ray_env import dashboard_running, on_own_local_ray
from orchestrator.run.reservations import ray_train_run_id, recorded, release_unfinished
from orchestrator.run.reservations import refresh as refresh_nodes
from orchestrator.run.resizing import has_room
from orchestrator.run.run_books import EventBook, GroupPlan, ResizeBook, RunNames, RunStart
from trainers.link import tags as T
from trainers.link.messages import Event, FirstStep, Record, Resize, WorkloadFailed
from trainers.loop.trainer import train_loop_per_worker

POLL_S = 0.5
SAY_WAIT_S = 5.0  # a wait for an autoscaler's nodes is said once it lasts this long
NEVER_S = 1e9  # Ray Train's own look for capacity that came back: the driver does it (look_for_capacity)

# After Ctrl-C/SIGTERM the workers are asked to stop (a last checkpoint at their next push) and the
# driver drains them for at most this long: `ray job stop` sends SIGKILL 3 s after its SIGTERM.
STOP_WAIT_S = 2.0
# The driver's own node drained: the group's stop at a checkpoint is waited for until this long
# before the node's deadline, and never longer than DRAIN_STOP_WAIT_S.
DRAIN_MARGIN_S, DRAIN_STOP_WAIT_S = 5.0, 60.0
# Once the tracking server has stayed away for tracking.outage_timeout_s, the group is stopped at a
# checkpoint; nothing hurries the driver then, but it must end.
TRACKING_STOP_WAIT_S = 60.0


class GroupTrainer(TorchTrainer):
    """Ray Train's ``TorchTrainer`` without the Ray Data part it starts for every group even when
    it is given no datasets (as here: the data order is ours): a ``DatasetManager`` actor, one more
    process that imports Ray Data at each group start and stays beside the loop.  Where Ray names
    its callbacks otherwise, nothing is left out.  On a Ray whose dashboard does not answer (the
    orchestrator's own local Ray, started without one) Ray Train's ``PlacementGroupCleaner`` is left out
    too: it needs Ray's State API, so there it is a detached process per group that fails an ask every
    second and never cleans (orchestrator/run/ray_env.py ``dashboard_running``)."""

    def _create_default_callbacks(self) -> list:
        callbacks = super()._create_default_callbacks()
        left_out = set() if self.datasets else {"DatasetsCallback"}
        if not dashboard_running():
            left_out.add("PlacementGroupCleanerCallback")
        return [c for c in callbacks if type(c).__name__ not in left_out]


class _Phase:
    """One ``fit()`` running in a thread; ``hold`` writes down how long its group held its
    resources (orchestrator/record/cost.py: the run's cost)."""

    def __init__(self, idx: int, workers: int, trainer: Any, hold: GroupHold | None = None):
        self.idx, self.workers = idx, workers
        self.train_id = ray_train_run_id(trainer)  # its reservation's name (orchestrator/run/reservations.py)
        self.box: dict[str, Any] = {}
        self.t_called, self.ended = 0.0, 0.0

        def fit() -> None:
            self.t_called = time.time()
            if hold is not None:
                hold.called(self.t_called)
            try:
                self.box["result"] = trainer.fit()
            except BaseException as e:  # surfaced on the driver thread
                self.box["error"] = e
            self.ended = time.time()
            if hold is not None:
                hold.returned(self.ended)

        self.thread = threading.Thread(target=fit, name=f"fit-phase{idx}", daemon=True)

    @property
    def alive(self) -> bool:
        return self.thread.is_alive()

    @property
    def returned(self) -> bool:
        """Whether its ``fit()`` has returned (``alive`` is not to be trusted after a Ctrl-C: CPython
        marks a thread stopped when a signal's exception interrupts a ``join`` of it)."""
        return self.ended > 0.0


# --------------------------------------------------------------------------- states


class RunState(ABC):
    """Where the run is.  :meth:`step` does one poll's work and returns the next state (itself
    to stay), or the terminal state the run ended in; ``early`` is a group started ahead of a
    resize, which must not train if the run ends here."""

    early: _Phase | None = None

    @abstractmethod
    def step(self, run: PhaseRunner) -> RunState | Outcome: ...


@dataclass
class Starting(RunState):
    """Create the monitor and start phase 0 with enough workers for the (restored) batch."""

    def step(self, run: PhaseRunner) -> RunState | Outcome:
        first = run.begin()
        return first if isinstance(first, Finished) else Running(first)


@dataclass
class Running(RunState):
    """One group trains; the driver drains the monitor every poll.  An overlapping resize decided
    by the monitor starts the new group beside it."""

    cur: _Phase

    def step(self, run: PhaseRunner) -> RunState | Outcome:
        end = run.poll(self.cur)
        if end is not None:
            return end
        if not self.cur.alive:
            return PhaseEnded(self.cur)
        run.look_for_capacity(self.cur)
        drained = run.look_for_drains(self.cur)
        if drained is not None:  # the driver's own node is being drained
            return drained
        want = run.book.take_overlap_wanted()
        if want is not None:
            if run.nodes.active and not run.room_for(want):
                return AwaitingNodes(self.cur, want)
            return Overlapping(self.cur, run.start_phase(want, self.cur.idx + 1, handover=True))
        return self


@dataclass
class AwaitingNodes(RunState):
    """An overlapping resize on an autoscaling cluster: the old group trains on while the nodes asked
    for the new group come (orchestrator/run/autoscaling.py); the new group starts once the live
    nodes have room for it (or after ``scaling.node_wait_s``, with what is there), never small on
    the nodes already up only to grow by another restart."""

    cur: _Phase
    want: int
    since: float = field(default_factory=time.monotonic)

    def step(self, run: PhaseRunner) -> RunState | Outcome:
        end = run.poll(self.cur)
        if end is not None:
            return end
        if not self.cur.alive:  # the run ended before the nodes came
            return PhaseEnded(self.cur)
        if run.room_for(self.want) or time.monotonic() - self.since >= run.nodes.room_wait_s(0.0):
            return Overlapping(self.cur, run.start_phase(self.want, self.cur.idx + 1, handover=True))
        return self


@dataclass
class Overlapping(RunState):
    """The old group trains on while the new group (``early``) starts; the old group hands over
    once the new one is ready.  A new group that ends without taking over could not start: the
    resize falls back to a restart."""

    cur: _Phase
    early: _Phase | None

    def step(self, run: PhaseRunner) -> RunState | Outcome:
        end = run.poll(self.cur)
        if end is not None:  # the run ends here: the new group must not train
            run.resize_book.cancel_early(self.early)
            return end
        nxt = self.early
        if nxt is not None and not nxt.alive and self.cur.alive and run.link.handover_path(nxt.idx) is None:
            # (One that took over may well end first: it trains while the old group's fit() tears down.)
            run.resize_book.fell_back(nxt)
            return Running(self.cur)
        if self.cur.alive:
            return self
        return PhaseEnded(self.cur, nxt)


@dataclass
class PhaseEnded(RunState):
    """The group's ``fit()`` returned: either it handed over to a resize, or the run is over
    (how: :meth:`EventBook.outcome`), and a new group started early is called off."""

    cur: _Phase
    early: _Phase | None = None

    def step(self, run: PhaseRunner) -> RunState | Outcome:
        run.drain_monitor()
        done = run.link.take_handovers()
        if "error" in self.cur.box or not done:
            if self.early is not None:
                run.resize_book.call_off(self.early)
                run.wait(self.early)
            return run.book.outcome(self.cur.box.get("result"), self.cur.box.get("error"))
        return Resizing(self.cur, done[-1], self.early)


@dataclass
class Resizing(RunState):
    """A resize handed over.  With a restart (break before make) the next phase starts once the
    old group's resources are free; with an overlap the new group is already there."""

    old: _Phase
    resize: Resize
    early: _Phase | None = None

    def step(self, run: PhaseRunner) -> RunState | Outcome:
        record = run.resize_book.handed_over(self.old, self.resize)
        nxt = self.early
        if nxt is None:
            run.await_room(record.to)
            nxt = run.start_phase(record.to, run.names.last_idx + 1, handover=False)
        record.fit_called = nxt.t_called or time.time()
        record.phase = nxt.idx  # after a fallback to restart, not old.idx + 1 (that index failed to start)
        run.book.take_overlap_wanted()
        run.resize_book.measure_last(run.book)
        return Running(nxt)


# --------------------------------------------------------------------------- the runner


class PhaseRunner:
    """Runs one training run as a sequence of ``fit()`` phases (the context the states act on).

    Everything it needs comes to its constructor: what its groups start with (``plan``, a
    :class:`GroupPlan`), what the run brings (``start``, a :class:`RunStart`), the progress bar, the
    caller's listeners, how often to poll and the metrics the driver judges.  What it keeps is split
    by concern: ``names`` (where phases go), ``link`` (the monitor actor), ``book`` (what the workers'
    events said), ``resize_book`` (measured resizes), ``listeners`` (what is done with records and
    events)."""

    def __init__(
        self,
        plan: GroupPlan,
        tracker: RunTracker,
        start: RunStart,
        progress: Progress,
        listeners: Sequence[RunListener] = (),
        poll_s: float = POLL_S,
        judged: Sequence[str] = (),
        nodes: NodeSupply | None = None,
        link: MonitorLink | None = None,
    ):
        self.plan, self.tracker, self.start = plan, tracker, start
        self.progress = progress
        tracking = TrackingListener(tracker)
        tracking.continue_from(start.tags)  # a resumed run's tags go on from what its earlier drivers set
        # an autoscaling cluster's nodes, asked ahead (inactive: nothing asked): its request is
        # withdrawn with the listeners' close, however the run ends
        supply = NodeSupplyListener(nodes or NodeSupply())
        self.listeners: list[RunListener] = [tracking, ProgressListener(progress, plan.epochs), *listeners, supply]
        self.poll_s = poll_s  # how often the monitor is drained (a search lowers it to prune sooner)
        self.names = RunNames(tracker.run_id, plan.storage_path, start.resumes, start.ray_train_runs)
        self.link = link or MonitorLink(judged)  # (a test gives one that calls a MonitorState directly)
        self.groups: list[_Phase] = []  # every group this driver started
        self.book = EventBook(restarts=start.restarts, t_start=start.t0)
        self.resize_book = ResizeBook(self.link, self.emit)
        # On a local Ray this process started (one node, the driver's) no node comes, goes or is
        # drained: the looks at the nodes (every 2 s), at the drains (every second) and for capacity
        # that came back cost the loop's cores for nothing, so each is made once
        once = on_own_local_ray()
        self.capacity = CapacityWatch(
            plan.scaling.min_workers,
            plan.scaling.capacity_timeout_s,
            every_s=math.inf if once else 2.0,
            grow_every_s=math.inf if once else plan.scaling.capacity_check_s,
            on_change=refresh_nodes,
            drains=DrainWatch(every_s=math.inf) if once else None,
        )

    @property
    def tracking(self) -> TrackingListener:
        """The listener that keeps the run's MLflow tags (the first one)."""
        return next(li for li in self.listeners if isinstance(li, TrackingListener))

    @property
    def nodes(self) -> NodeSupply:
        """The run's requests to an autoscaling cluster and its waits for nodes (orchestrator/run/autoscaling.py)."""
        return next(li.supply for li in self.listeners if isinstance(li, NodeSupplyListener))

    def resume(self) -> Resume:
        """How a person continues this run (the messages of the ends a resume cures)."""
        return Resume(self.tracker.run_id, self.tracker.uri, from_python=bool(self.plan.functions))

    # -- the loop ------------------------------------------------------------------------------

    def run(self) -> Outcome:
        """Step the states until a terminal one (orchestrator/run/outcome.py) and return it.  Ctrl-C or
        SIGTERM (a KeyboardInterrupt) stops the group at a checkpoint and drains what it pushes on
        its way up (orchestrator/run/runner.py ends the run Interrupted)."""
        state: RunState | Outcome = Starting()
        try:
            while isinstance(state, RunState):
                raise_pending_interrupt()  # a SIGTERM whose KeyboardInterrupt a garbage collection swallowed
                state = state.step(self)
            return state
        except KeyboardInterrupt:  # what the workers trained until they stop reaches MLflow
            self.stop_and_drain(STOP_WAIT_S)
            raise
        finally:
            if isinstance(state, RunState):  # left by an exception: a group started early must not train
                self.resize_book.cancel_early(state.early)
            for listener in self.listeners:
                listener.close()
            self.link.kill()
            # a group whose fit() has not returned (a stop, a drain of this node, an error) dies with
            # this driver before its controller drops its reservation: the next run would wait 180 s
            release_unfinished([ph.train_id for ph in self.groups if not ph.returned and ph.train_id])

    def begin(self) -> _Phase | Finished:
        """The run's first phase: the monitor, then phase 0 with enough workers for the (restored)
        batch, on an autoscaling cluster once their nodes are up.  A resumed run whose newest
        checkpoint is its planned end (stopped after its last step was trained, before its driver
        closed it) starts no group: the records that checkpoint carries reach the listeners (what
        MLflow already holds is not logged again) and the run is Finished."""
        if self.start.resumed:
            records = self.names.finished_records(self.progress.write)
            if records is not None:
                with deferred_interrupts():  # all of them reach the listeners (drain_monitor)
                    self._deliver(sorted(records, key=lambda r: r[0]))
                return Finished(None)
        self._make_monitor()
        workers = self.initial_workers()
        self._await_first_nodes(workers)
        return self.start_phase(workers, 0, handover=False)

    def stop_and_drain(self, wait_s: float) -> None:
        """Ask the group to stop (rank 0 checkpoints at its next push and ends) and drain the
        monitor until it says the group ended, or for ``wait_s`` at most."""
        if not self.link.up:
            return
        try:
            self.link.request_stop()
            seen, deadline = len(self.book.events), time.monotonic() + wait_s
            while True:
                self.drain_monitor(timeout=max(0.1, deadline - time.monotonic()))
                if self.book.ended_since(seen) or time.monotonic() >= deadline:
                    return
                time.sleep(0.05)
        except Exception:  # the newest checkpoint is where a resume goes on
            pass

    def request_stop(self) -> None:
        self.link.request_stop()

    def verdict(self, step: int, stop: bool) -> None:
        """The driver judged the values up to ``step``: ``stop`` the run there, or go on."""
        self.link.judged(step, stop)

    def tracking_gone(self, lost: Exception) -> TrackingGone:
        """The run's end when the tracking server stayed away: the tracker's account of what it did
        not record, where the checkpoints are and the command that records it all once it is back."""
        newest = self.names.newest_checkpoint_step()
        where = self.names.folder + (f" (newest at step {newest})" if newest is not None else " (none written yet)")
        return TrackingGone(
            lost,
            self.tracker.lost_message(lost, max(self.tracker.newest_step, 0), where, self.resume().command()),
        )

    # -- phases ----------------------------------------------------------------------------------

    def initial_workers(self) -> int:
        """Enough workers for the initial batch (or for the batch a resumed run had reached)."""

        # the count the batch plan and the monitor ask too (trainers/policies/plan.py); a resumed
        # run's batch is its newest checkpoint's: the W its killed driver last logged may be older
        # (not yet written when it died), and a group too small for the batch is restarted at once
        s = self.plan.scaling
        workers = self.plan.workers.initial(self.names.restored_batch or self.plan.batch_size)
        last = min(self.start.workers, s.max_workers)
        if s.policy == "goodput" and last:  # goodput may have shrunk the group: a resumed run goes on at its W
            return max(last, s.min_workers)
        return max(workers, last)

    def _resources(self) -> dict[str, float]:
        return self.plan.scaling.per_worker()

    def _trainer(self, workers: int, phase: int, handover: bool) -> Any:

        plan, s = self.plan, self.plan.scaling
        num_workers: int | tuple[int, int] = workers
        if s.min_workers < workers:
            num_workers = (s.min_workers, workers)
        names = self.names
        runtime = self.link.runtime(
            phase=phase,
            workers=workers,
            handover=handover,
            storage=names.storage_path,
            run_prefix=names.train_run_name,
            run_name=names.phase_run_name(phase),
            goodput=s.policy == "goodput",
            **self.tracker.system.sampled(),  # rank 0 sends its node's system metrics only where no one else does
        )
        payload: dict[str, Any] = {"config": plan.loop_config, "runtime": runtime.model_dump()}
        if plan.functions:
            payload["functions"] = dict(plan.functions)  # cloudpickled by Ray
        return GroupTrainer(
            train_loop_per_worker,
            train_loop_config=payload,
            scaling_config=ScalingConfig(
                num_workers=num_workers,
                use_gpu=s.use_gpu,
                resources_per_worker=self._resources(),
                placement_strategy=s.placement.upper(),
                # the driver grows the group itself, at a checkpoint
                # (look_for_capacity); Ray Train's own growth would redo the
                # steps since the last one
                elastic_resize_monitor_interval_s=NEVER_S,
            ),
            run_config=RunConfig(
                name=names.phase_run_name(phase),
                storage_path=names.storage_path,
                failure_config=FailureConfig(max_failures=s.max_failures),
                callbacks=[FailureNotice(self.link.name, self.link.namespace, phase)] if self.link.name else [],
            ),
        )

    def start_phase(self, workers: int, idx: int, handover: bool) -> _Phase:
        """Start ``fit()`` for one phase in a thread (the driver thread keeps draining the monitor)."""
        trainer = self._trainer(workers, idx, handover)
        ph = _Phase(idx, workers, trainer, self._hold(idx, workers))
        self.groups.append(ph)
        if ph.train_id:  # a resume after this driver is killed drops the group's reservation by it
            self.names.ray_train_runs = recorded(self.names.ray_train_runs, ph.train_id)
            self.tracker.set_tags({T.RAY_TRAIN_RUNS: self.names.ray_train_runs})
        if not handover:  # a cold start: what a resize's new group costs here
            self.link.starting(idx, time.time())
        self.names.last_idx = max(self.names.last_idx, idx)  # a failed early start keeps its index (and run name)
        if self.nodes.active and self.plan.scaling.min_workers < workers:
            refresh_nodes()  # an elastic group is sized on the nodes that came for it, not on a 20 s old view
        self.book.fit_called.setdefault(idx, time.time())
        ph.thread.start()
        return ph

    def _hold(self, idx: int, workers: int) -> GroupHold | None:
        """Where phase ``idx``'s group writes down what it holds: the timeline's (None without one)."""
        timeline = next((li.timeline for li in self.listeners if isinstance(li, TimelineListener)), None)
        return timeline.holds.group(idx, workers, self._resources()) if timeline is not None else None

    def await_room(self, workers: int, timeout_s: float = 60.0) -> bool:
        """Wait (draining the monitor) until the cluster has room for ``workers`` workers.  Ray frees a
        finished group's resources a moment after its ``fit()`` returns; started before that, an
        elastic group (``min_workers < max_workers``) would start with fewer workers than wanted.
        On a loaded machine the old group's processes take many seconds to go: hence a minute; on an
        autoscaling cluster that asked for the new group's nodes, up to ``scaling.node_wait_s``.  No
        wait where nothing was asked for and the cluster's nodes, all free, could not hold the group
        (a lost node, an autoscaler not asked ahead): freed resources would not make the room."""

        wait_s = self.nodes.room_wait_s(timeout_s)  # an autoscaling cluster: for the nodes asked for
        t0, said = time.time(), not self.nodes.active
        while not self.room_for(workers):
            if time.time() > t0 + wait_s or not (self.nodes.active or self._could_hold(workers)):
                return False  # start anyway: Ray starts what fits (or waits for it)
            if not said and time.time() > t0 + SAY_WAIT_S:
                self.progress.write(
                    f"waiting for the autoscaler's nodes: room for {workers} workers (at most {wait_s:g} s)"
                )
                said = True
            self.drain_monitor()
            self.nodes.resend()
            time.sleep(0.05)
        return True

    def room_for(self, workers: int) -> bool:
        """Whether the cluster's free resources hold ``workers`` workers now."""
        return has_room(ray.available_resources(), self._resources(), workers)

    def _could_hold(self, workers: int) -> bool:
        """Whether the cluster's live nodes, all free, would hold ``workers`` workers."""
        return has_room(ray.cluster_resources(), self._resources(), workers)

    def _await_first_nodes(self, workers: int) -> None:
        """An autoscaling cluster: ask for the first group's nodes and wait (at most
        ``scaling.node_wait_s``) until they are up; how long they took is a node's launch time here."""
        if not self.nodes.active:
            return
        self.nodes.starting(workers)
        t0 = time.monotonic()
        if self.room_for(workers):
            return
        if self.await_room(workers, 0.0):
            self.nodes.launched_in(time.monotonic() - t0)

    def wait(self, ph: _Phase) -> None:
        while ph.alive:
            ph.thread.join(self.poll_s)
            self.drain_monitor()

    # -- the monitor -------------------------------------------------------------------------------

    def _make_monitor(self) -> None:
        self.link.create(self.plan.workers, self.plan.scaling, self._resources(), grow_room=self.nodes.grow_room())

    def poll(self, ph: _Phase) -> Outcome | None:
        """Wait up to ``poll_s`` for the phase's ``fit()`` to return, then drain the monitor.  The run's end
        (None while it goes on) when the live nodes have had no room for ``scaling.min_workers``,
        or the tracking server no answer, for too long."""
        ph.thread.join(self.poll_s)
        self.drain_monitor()
        self.nodes.resend()
        status = self.capacity.poll_live_nodes(self._resources())
        if status is not None:
            self.progress.write(status)
        if self.capacity.wait.expired():  # the checkpoints are kept: resume once the cluster has room again
            return CapacityLost(self.capacity.wait.message(self.resume().command(store=False)))
        lost = self.tracker.outage_expired()
        if lost is not None:  # stop at a checkpoint; the records it carries are logged on resume
            self.stop_and_drain(TRACKING_STOP_WAIT_S)
            return self.tracking_gone(lost)
        return None

    def look_for_capacity(self, ph: _Phase) -> None:
        """Every ``scaling.capacity_check_s``: ask the monitor whether ``ph``'s group, smaller than it
        asked for (a node was lost), can grow again (:meth:`orchestrator.run.monitor.MonitorState.capacity_check`);
        its decision comes back as events, and rank 0 hands over at its next push."""
        if not self.capacity.grow_due():
            return

        self.link.capacity_check(ph.idx, ph.workers)

    def look_for_drains(self, ph: _Phase) -> DriverDrained | None:
        """Every second: nodes being drained (a preemption's notice, orchestrator/run/drains.py) that
        hold workers of ``ph``'s group make the monitor decide a planned resize to the other nodes
        (:meth:`orchestrator.run.monitor.MonitorState.drain_notice`); rank 0 checkpoints and hands
        over at its next push, before the node's deadline.  A node that dies without notice keeps the
        lost node's path (Ray Train restarts the group from the newest checkpoint).  The driver's own
        node drained: the group stops at a checkpoint and the run ends resumable (returned)."""
        draining = self.capacity.drains.poll_drain_notices()
        if not draining:
            return None
        own = self.capacity.drains.own_drain(draining)
        if own is not None:
            return self.driver_drained(*own, workers=ph.workers)
        self.link.drain_notice(ph.idx, draining, room_outside(draining, self._resources()))
        return None

    def driver_drained(self, node: str, deadline: float | None, workers: int) -> DriverDrained:
        """The node this driver runs on is being drained: no resize can move the driver, so the
        group of ``workers`` stops (rank 0 checkpoints at its next push) and is waited for until a
        few seconds before the node's deadline (:data:`DRAIN_STOP_WAIT_S` at most).  The timeline
        keeps the drain (a ``drain`` row, ``mode`` stop), carried into the resumed run's."""
        seen = time.time()
        left = DRAIN_STOP_WAIT_S if deadline is None else deadline - seen - DRAIN_MARGIN_S
        self.progress.write(f"the driver's node {node[:8]} is being drained: stopping the run at a checkpoint")
        self.stop_and_drain(min(DRAIN_STOP_WAIT_S, max(left, STOP_WAIT_S)))
        newest = self.names.newest_checkpoint_step()
        steps = max(self.tracker.newest_step, 0)
        drain = {"step": steps, "time": seen, "node": node, "deadline": deadline, "from": workers, "to": 0}
        for listener in self.listeners:
            if isinstance(listener, TimelineListener):
                listener.add_drain({**drain, "mode": "stop"})
        return DriverDrained(node, deadline, steps=steps, checkpoint=newest)

    def drain_monitor(self, timeout: float | None = None) -> None:
        """Drain the monitor: records and events to the listeners (the ack, what MLflow holds,
        rides on the drain: one call to the monitor per poll).  A stop that comes meanwhile is raised
        once every listener has them: records cut off halfway (taken from the monitor, counted as
        written, never logged) would be acked, and rank 0 would drop them from its checkpoints."""

        with deferred_interrupts():
            self._drain_monitor(timeout)

    def _drain_monitor(self, timeout: float | None) -> None:
        records, events = self.link.drain(self.tracker.written_upto, timeout)
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
            if isinstance(ev, WorkloadFailed) and self.book.fatal is ev:
                self.request_stop()  # a group that is still training (an overlap's old one) ends
            if isinstance(ev, FirstStep):
                self.resize_book.measure_last(self.book)
        self._deliver(records)

    def _deliver(self, records: list[Record]) -> None:
        if records:
            for listener in self.listeners:
                listener.on_records(records)

    def emit(self, event: Event) -> None:
        for listener in self.listeners:
            listener.on_event(event)
