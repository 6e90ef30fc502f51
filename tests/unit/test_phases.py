"""The driver's phase states (orchestrator/run/phases.py) without Ray: a fake monitor (the real
:class:`MonitorState`, called directly) and fake ``fit()`` phases that play a worker group's part."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from orchestrator.record.checkpoint_models import CheckpointModels
from orchestrator.record.progress_bar import Progress
from orchestrator.run.monitor import MonitorState
from orchestrator.run.outcome import CapacityLost, Finished, RayTrainFailed
from orchestrator.run.phases import PhaseRunner
from orchestrator.run.run_books import GroupPlan, RunStart
from tests.helpers import StateLink, make_config
from trainers.link.messages import FirstStep, PhaseStart
from trainers.policies.resize import WorkerCount, WorkersForBatch


class FakeTracker:
    run_id, uri = "abc", "mem://"

    def __init__(self) -> None:
        self.metrics: list = []
        self.tags: dict[str, Any] = {}
        # what the runner reads of what is logged (orchestrator/record/run_tracker.py)
        self.written_upto, self.newest_step, self.history = -1, -1, {}
        self.checkpoints = CheckpointModels(None, self.run_id, "0")  # no store: a checkpoint's model stays pending

    def log_metrics(self, records, flush: bool = False) -> None:
        self.metrics.extend(records)

    def set_tags(self, tags: dict[str, Any]) -> None:
        self.tags.update(tags)

    def last_value(self, key: str, default: float = 0.0) -> float:
        return default

    def outage_expired(self):  # the store always answers here
        return None


def make_runner(cfg, tracker, start: RunStart | None = None, **kwargs: Any) -> PhaseRunner:
    """A runner without a progress bar, for a run that brings ``start`` (a new run by default)."""
    plan = GroupPlan.from_config(cfg, kwargs.pop("functions", None))
    return PhaseRunner(plan, tracker, start or RunStart(), Progress(0, enabled=False), **kwargs)


class FakeFit:
    """``fit()`` of a phase: runs ``play(monitor, phase)`` in the phase's thread."""

    def __init__(self, play: Callable[[MonitorState, int], Any], monitor: MonitorState, phase: int) -> None:
        self.play, self.monitor, self.phase = play, monitor, phase

    def fit(self) -> Any:
        return self.play(self.monitor, self.phase)


def _runner(
    tmp_path,
    monkeypatch,
    plays: dict[int, Callable[[MonitorState, int], Any]],
    resize_mode: str,
    free_cpus: float = 8.0,
) -> tuple[PhaseRunner, FakeTracker, list[tuple[int, int, bool]]]:
    import ray

    cfg = make_config(
        tmp_path,
        "mem://",
        batch={"size": 32, "max_local_batch": 32},
        scaling={"min_workers": 1, "max_workers": 4, "cpus_per_worker": 0.5, "resize_mode": resize_mode},
    )
    tracker = FakeTracker()
    monkeypatch.setattr(ray, "available_resources", lambda: {"CPU": free_cpus})
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": free_cpus})
    state = MonitorState(
        WorkerCount(WorkersForBatch(), 32, 1, 4),
        overlap_resources={"CPU": 0.5} if resize_mode == "overlap" else None,
        available=lambda: {"CPU": free_cpus},
    )
    runner = make_runner(cfg, tracker, poll_s=0.01, link=StateLink(state))
    started: list[tuple[int, int, bool]] = []

    def trainer(workers: int, phase: int, handover: bool) -> FakeFit:
        started.append((phase, workers, handover))
        return FakeFit(plays[phase], state, phase)

    monkeypatch.setattr(runner, "_trainer", trainer)
    return runner, tracker, started


def _group(m: MonitorState, phase: int, workers: int, step: int) -> None:
    m.push(
        [(step + 1, {"workers": float(workers)}, 1.0)],
        [
            PhaseStart(phase=phase, workers=workers, step=step, resumed=phase > 0, threads=1, entered=1.0, built=1.0),
            FirstStep(step=step + 1, phase=phase),
        ],
    )


def test_a_restart_resize_starts_the_next_phase_after_the_old_one_ends(tmp_path, monkeypatch):
    def old(m: MonitorState, phase: int) -> str:
        _group(m, phase, 1, 0)
        assert m.on_batch_change(10, 64, 1).mode == "restart"
        m.handed_over(phase, 10, "/store/checkpoint_step00000010_resize")
        return "old"

    def new(m: MonitorState, phase: int) -> str:
        _group(m, phase, 2, 10)
        return "done"

    runner, tracker, started = _runner(tmp_path, monkeypatch, {0: old, 1: new}, "restart")
    assert runner.run() == Finished("done") and runner.link.actor is None
    assert started == [(0, 1, False), (1, 2, False)]
    (r,) = runner.resize_book.measured
    assert (r["mode"], r["from"], r["to"], r["step"], r["phase"]) == ("restart", 1, 2, 10, 1)
    assert r["latency_s"] is not None and r["overlap_s"] == 0.0
    logged = [r[1] for r in tracker.metrics if "resize/from" in r[1]]
    # the latency's parts are in the timeline artifact (orchestrator/record/timeline.py), not seven one-dot charts
    assert logged == [{"resize/from": 1.0, "resize/to": 2.0, "resize/latency_s": r["latency_s"]}]
    assert runner.resize_book.called_off == 0 and runner.book.first_step_s() is not None


def test_an_overlap_starts_the_new_group_beside_the_old_one_and_hands_over(tmp_path, monkeypatch):
    go = threading.Event()

    def old(m: MonitorState, phase: int) -> str:
        _group(m, phase, 1, 0)
        assert m.on_batch_change(10, 64, 1).mode == "overlap"
        while not m.push([], []).handover:  # trains on until the new group is ready
            go.wait(0.005)
        m.handed_over(phase, 14, "/store/checkpoint_step00000014_resize")
        return "old"

    def new(m: MonitorState, phase: int) -> str:
        m.ready(phase)
        while not m.handover(phase).decided:
            go.wait(0.005)
        assert m.handover(phase).path.endswith("14_resize")
        _group(m, phase, 2, 14)
        return "done"

    runner, _, started = _runner(tmp_path, monkeypatch, {0: old, 1: new}, "overlap")
    assert runner.run() == Finished("done")
    assert started == [(0, 1, False), (1, 2, True)]
    (r,) = runner.resize_book.measured
    assert (r["mode"], r["from"], r["to"], r["step"]) == ("overlap", 1, 2, 14)


def test_an_overlap_is_called_off_when_training_ends_first(tmp_path, monkeypatch):
    def old(m: MonitorState, phase: int) -> str:
        _group(m, phase, 1, 0)
        assert m.on_batch_change(10, 64, 1).mode == "overlap"
        while not m.handovers.resize.ready:  # the new group is ready; the old one finishes anyway
            threading.Event().wait(0.005)
        return "finished"

    def new(m: MonitorState, phase: int) -> None:
        m.ready(phase)
        while not m.handover(phase).decided:
            threading.Event().wait(0.005)
        assert m.handover(phase).cancel

    runner, _, started = _runner(tmp_path, monkeypatch, {0: old, 1: new}, "overlap")
    assert runner.run() == Finished("finished")
    assert runner.resize_book.measured == [] and runner.resize_book.called_off == 1 and len(started) == 2


def test_a_restarted_group_counts_and_a_failed_fit_ends_the_run_with_its_error(tmp_path, monkeypatch):
    def flaky(m: MonitorState, phase: int) -> None:
        _group(m, phase, 1, 0)
        _group(m, phase, 1, 5)  # Ray Train restarted the group after a failure
        raise RuntimeError("out of failures")

    runner, tracker, _ = _runner(tmp_path, monkeypatch, {0: flaky}, "restart")
    end = runner.run()
    assert isinstance(end, RayTrainFailed) and str(end.error) == "out of failures" and runner.book.restarts == 1
    assert (5, {"restarts": 1.0}) in tracker.metrics and tracker.tags["elastic.restarts"] == 1


def test_a_new_group_that_cannot_start_falls_back_to_a_restart(tmp_path, monkeypatch):
    def old(m: MonitorState, phase: int) -> str:
        _group(m, phase, 1, 0)
        assert m.on_batch_change(10, 64, 1).mode == "overlap"
        while not m.push([], []).handover:  # handover once the driver fell back to a restart
            threading.Event().wait(0.005)
        m.handed_over(phase, 12, "/store/checkpoint_step00000012_resize")
        return "old"

    def broken(m: MonitorState, phase: int) -> None:
        raise RuntimeError("no room after all")

    def new(m: MonitorState, phase: int) -> str:
        _group(m, phase, 2, 12)
        return "done"

    runner, tracker, started = _runner(tmp_path, monkeypatch, {0: old, 1: broken, 2: new}, "overlap")
    assert runner.run() == Finished("done")
    assert started == [(0, 1, False), (1, 2, True), (2, 2, False)]  # the failed start keeps its index
    assert [r["mode"] for r in runner.resize_book.measured] == ["restart"]
    assert (
        "overlapping resize fell back to restart: RuntimeError('no room after all')" in tracker.tags["elastic.warnings"]
    )


def test_the_progress_bar_counts_samples_and_shows_the_policy_batch(capsys):
    from orchestrator.record.progress_bar import Progress

    p = Progress(total=1000, enabled=True)
    p.update([(1, {"samples_seen": 16.0, "batch/global": 16.0, "workers": 1.0, "epoch": 0.016}, 0.0)])
    p.update([(30, {"samples_seen": 800.0, "batch/global": 64.0, "workers": 2.0, "epoch": 0.8}, 0.0)])
    assert (p.bar.n, p.bar.total) == (800, 1000) and p.step == 30
    p.close()
    err = capsys.readouterr().err
    assert "B=64" in err and "W=2" in err and "step=30" in err


def test_listeners_get_records_and_events_in_step_order(tmp_path, monkeypatch):
    """An event at step s reaches the listeners after the records up to s and before later ones."""

    from orchestrator.record.listeners import RunListener
    from trainers.link.messages import BatchChange

    seen: list = []

    class Recorder(RunListener):
        def on_records(self, records):
            seen.extend(("record", r[0]) for r in records)

        def on_event(self, event):
            seen.append(("event", getattr(event, "step", None)))

    cfg = make_config(tmp_path, "mem://")
    state = MonitorState(WorkerCount(WorkersForBatch(), 32, 1, 1))
    state.push([(s, {"train/loss": 1.0}, 0.0) for s in range(18, 23)], [BatchChange(step=20, old=16, new=32)])
    runner = make_runner(cfg, FakeTracker(), listeners=[Recorder()], link=StateLink(state))
    runner.drain_monitor()
    assert seen == [("record", 18), ("record", 19), ("record", 20), ("event", 20), ("record", 21), ("record", 22)]


def test_an_interrupted_driver_stops_the_group_and_drains_its_last_records(tmp_path, monkeypatch):
    """Ctrl-C or SIGTERM on the driver: the group is asked to stop (its last checkpoint), and what
    it pushes until it ends reaches the tracker before the interruption goes on."""
    import time

    from trainers.link.messages import Stopped

    def group(m: MonitorState, phase: int) -> str:
        _group(m, phase, 1, 0)
        step = 1
        while not m.push([(step, {"train/loss": 1.0}, 1.0)], []).stop:
            step += 1
            time.sleep(0.002)
        m.push([(step + 1, {"train/loss": 0.5}, 1.0)], [Stopped(step=step + 1)])
        return "stopped"

    runner, tracker, _ = _runner(tmp_path, monkeypatch, {0: group}, "restart")
    poll = runner.poll

    def interrupted_poll(ph) -> None:
        poll(ph)
        if any(r[0] >= 5 for r in tracker.metrics):
            raise KeyboardInterrupt

    monkeypatch.setattr(runner, "poll", interrupted_poll)
    with pytest.raises(KeyboardInterrupt):
        runner.run()
    assert tracker.metrics[-1][1] == {"train/loss": 0.5}  # pushed after the stop, drained before the end
    assert any(isinstance(ev, Stopped) for ev in runner.book.events) and runner.link.actor is None


def test_the_runner_keeps_a_dozen_things_or_fewer(tmp_path):
    """What the runner knows is split by concern (names, monitor link, event book, resizes), so
    the runner itself holds a dozen attributes or fewer; runner.py reads them from their owners."""
    runner = make_runner(make_config(tmp_path, "mem://"), FakeTracker())
    assert len(vars(runner)) <= 12, sorted(vars(runner))
    names = runner.names
    assert names.train_run_name == "elastic-abc" and names.storage_path.startswith(str(tmp_path))
    assert names.phase_run_name(3) == "elastic-abc-r0p3" and names.folder == f"{names.storage_path}/elastic-abc"
    assert (runner.resize_book.measured, runner.resize_book.called_off, runner.book.restarts, runner.link.actor) == (
        [],
        0,
        0,
        None,
    )


def test_what_a_resumed_run_brings_reaches_its_owners_at_construction(tmp_path):
    """A resume's record (runner.read_start) is the runner's only source of what earlier drivers left:
    phase run names, the reservations it holds, restarts, the W it goes on at, the tags the
    listeners go on from, the time the run counts from."""
    cfg = make_config(
        tmp_path, "mem://", batch={"size": 32, "max_local_batch": 32}, scaling={"min_workers": 1, "max_workers": 4}
    )
    start = RunStart(
        t0=5.0,
        resumes=2,
        ray_train_runs="r1,r2",
        restarts=3,
        workers=3,
        tags={"elastic.warnings": "earlier warning", "elastic.resizes_called_off": "2"},
    )
    runner = make_runner(cfg, FakeTracker(), start, judged=["val/loss"], poll_s=0.2)
    assert runner.names.phase_run_name(3) == "elastic-abc-r2p3" and runner.names.ray_train_runs == "r1,r2"
    assert (runner.book.restarts, runner.book.t_start, runner.initial_workers()) == (3, 5.0, 3)
    assert runner.tracking.warnings == ["earlier warning"] and runner.tracking.called_off == 2
    assert runner.link.runtime(phase=0).judged_metrics == ["val/loss"] and runner.poll_s == 0.2
    fresh = make_runner(cfg, FakeTracker())
    assert (fresh.names.resumes, fresh.book.restarts, fresh.initial_workers(), fresh.tracking.warnings) == (0, 0, 1, [])


def test_a_restart_waits_for_room_only_where_the_freed_resources_could_make_it(tmp_path, monkeypatch):
    """The old group's resources are freed a moment after its fit() returns: the new group waits for
    them.  Where the live nodes, all free, could not hold it (a node lost; an autoscaler nothing asked
    ahead), it starts at once with what fits, not after the minute's wait."""
    import ray

    runner, _, _ = _runner(tmp_path, monkeypatch, {}, "restart", free_cpus=0.5)
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 1.0})  # 4 workers of 0.5 CPU never fit
    t0 = time.monotonic()
    assert runner.await_room(4, timeout_s=30) is False
    assert time.monotonic() - t0 < 5
    free = [0.5]
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 2.0})
    monkeypatch.setattr(ray, "available_resources", lambda: {"CPU": free[0]})
    freed = threading.Timer(0.3, lambda: free.__setitem__(0, 2.0))  # the old group's workers gone
    t0 = time.monotonic()
    freed.start()
    assert runner.await_room(4, timeout_s=30) is True
    assert time.monotonic() - t0 >= 0.25
    free[0] = 0.5  # held by something else for good: the wait ends at its limit
    assert runner.await_room(4, timeout_s=0.2) is False


def test_a_stop_while_records_are_delivered_is_raised_once_every_listener_has_them(tmp_path, monkeypatch):
    """A SIGTERM that lands while the driver hands drained records to its listeners: they all get
    them, then the stop is raised.  Cut off halfway, the records were gone from the monitor and
    counted as written, never logged: acked, rank 0 dropped them from its checkpoints (a stopped
    ``ray job``'s resumed run lacked 8 steps of ``train/loss``)."""
    import signal

    from orchestrator import interrupts
    from orchestrator.record.listeners import RunListener

    runner, tracker, _ = _runner(tmp_path, monkeypatch, {}, "restart")

    class StopArrives(RunListener):  # the stop lands in the first listener's turn
        def on_records(self, records):
            signal.raise_signal(signal.SIGTERM)
            for _ in range(100):  # the handler runs between bytecodes
                pass

    runner.listeners.insert(0, StopArrives())
    runner.link.actor.push([(1, {"train/loss": 1.0}, 1.0), (2, {"train/loss": 0.5}, 2.0)], [])
    with interrupts.terminate_as_interrupt(), pytest.raises(KeyboardInterrupt):
        runner.drain_monitor()
    assert [r[0] for r in tracker.metrics] == [1, 2]


def test_a_run_without_room_for_min_workers_ends_failed_after_its_wait_with_how_to_resume(tmp_path, monkeypatch):
    """A lost node left fewer than ``scaling.min_workers`` places: the driver says it waits, and once
    ``capacity_timeout_s`` is over it ends the run with one message (the group never ran again)."""
    from orchestrator.run.nodes import CapacityWatch

    stop = threading.Event()

    def stuck(m: MonitorState, phase: int) -> str:
        _group(m, phase, 1, 0)
        stop.wait(30)  # Ray Train waits for room that never comes
        return "never"

    runner, _, _ = _runner(tmp_path, monkeypatch, {0: stuck}, "restart")
    now = [0.0]

    def live_nodes():
        now[0] += 7.0  # each look at the cluster is a few seconds later
        return [{"Alive": False, "Resources": {"CPU": 2.0}}, {"Alive": True, "Resources": {"CPU": 0.25}}]

    monkeypatch.setattr(
        runner,
        "capacity",
        CapacityWatch(min_workers=1, timeout_s=60, every_s=0.0, nodes=live_nodes, clock=lambda: now[0]),
    )
    said: list[str] = []
    monkeypatch.setattr(runner.progress, "write", said.append)
    try:
        end = runner.run()
    finally:
        stop.set()
    assert isinstance(end, CapacityLost)
    assert end.message.startswith("lost capacity: only 0 of scaling.min_workers 1 workers fit the live nodes")
    from orchestrator.config.command import cli

    assert end.message.endswith(f"with: {cli()} resume {runner.tracker.run_id}")
    assert said and said[0].startswith("waiting for capacity: 0 of scaling.min_workers 1 workers fit")


def _stoppable(m: MonitorState, phase: int) -> str:
    """A group that trains until the monitor tells it to stop, then stops at a checkpoint."""
    import time

    from trainers.link.messages import Stopped

    _group(m, phase, 1, 0)
    step = 1
    while not m.push([(step, {"train/loss": 1.0}, 1.0)], []).stop:
        step += 1
        time.sleep(0.002)
    m.push([(step + 1, {"train/loss": 0.5}, 1.0)], [Stopped(step=step + 1)])
    return "stopped"


def test_a_run_asked_to_stop_before_its_end_ends_stopped(tmp_path, monkeypatch):
    from orchestrator.record.listeners import RunListener
    from orchestrator.run.outcome import Stopped

    runner, _, _ = _runner(tmp_path, monkeypatch, {0: _stoppable}, "restart")

    class StopAtFive(RunListener):  # a search trial's pruner, or a test's stop
        def on_records(self, records):
            if records[-1][0] >= 5:
                runner.request_stop()

    runner.listeners.append(StopAtFive())
    assert runner.run() == Stopped("stopped")


def test_a_tracking_server_away_too_long_stops_the_group_and_ends_the_run_with_the_trackers_account(
    tmp_path, monkeypatch
):
    """No exception between the poll and the loop: the poll stops the group at a checkpoint, drains
    it and returns the end, with the tracker's one line (its resume command names the store)."""

    from orchestrator.config.command import cli
    from orchestrator.record.run_tracker import TrackingLost
    from orchestrator.run.outcome import TrackingGone

    runner, tracker, _ = _runner(tmp_path, monkeypatch, {0: _stoppable}, "restart")
    lost = TrackingLost("the tracking server mem:// did not answer for 8 s")
    told: list = []

    def outage_expired():
        return lost if any(r[0] >= 5 for r in tracker.metrics) and not told else None

    def lost_message(error, stopped_at, checkpoints, resume):
        told.append((error, stopped_at, checkpoints, resume))
        return "the account"

    monkeypatch.setattr(tracker, "outage_expired", outage_expired, raising=False)
    monkeypatch.setattr(tracker, "lost_message", lost_message, raising=False)
    end = runner.run()
    assert end == TrackingGone(lost, "the account")
    assert tracker.metrics[-1][1] == {"train/loss": 0.5}  # the group stopped and was drained first
    ((error, _, checkpoints, resume),) = told
    assert error is lost and checkpoints == f"{runner.names.folder} (none written yet)"
    assert resume == f"{cli()} resume abc --tracking-uri mem://"


def _failed(where: str, deterministic: bool):
    from trainers.link.messages import WorkloadFailed

    return WorkloadFailed(
        rank=0, phase=0, where=where, error="ValueError: bad", traceback="tb", deterministic=deterministic
    )


@pytest.mark.parametrize(
    "events, error, want",
    [
        ([], None, "Finished"),
        (["stopped"], None, "Stopped"),
        (["stopped", "finished"], None, "Finished"),  # a stop that came after the end: it finished
        (["diverged"], None, "Diverged"),
        (["storage"], None, "OutOfStorage"),
        (["diverged", "storage", "fatal"], None, "UserCodeFailed"),  # the user's error first
        (["diverged", "storage"], None, "Diverged"),
        (["transient"], None, "Finished"),  # retried once by Ray Train, and it went on
        (["transient"], RuntimeError("out of failures"), "UserCodeFailed"),  # Ray Train gave up on the user's error
        (["storage"], RuntimeError("out of failures"), "RayTrainFailed"),
        ([], RuntimeError("out of failures"), "RayTrainFailed"),
    ],
)
def test_the_book_says_how_the_run_ended_the_gravest_first(events, error, want):
    from orchestrator.run.run_books import EventBook
    from trainers.link import messages as msg

    made = {
        "stopped": msg.Stopped(step=3),
        "finished": msg.Finished(step=4),
        "diverged": msg.Diverged(step=5, value=float("nan")),
        "storage": msg.StorageFailed(step=6, path="/d", code=28, free=0, message="full", fix="free space"),
        "fatal": _failed("my.py:1 in f", True),
        "transient": _failed("my.py:2 in g", False),
    }
    book = EventBook()
    for name in events:
        book.observe(made[name])
    end = book.outcome("result", error)
    assert type(end).__name__ == want, end
    if want == "UserCodeFailed":
        assert end.event in (made["fatal"], made["transient"])


def test_the_same_user_error_again_is_fatal_and_stops_the_group(tmp_path, monkeypatch):
    """The driver's book decides with outcome.is_fatal, as the monitor does: a transient error
    is let through once, the same one again ends the run, and the driver asks the group to stop."""
    from orchestrator.run.outcome import UserCodeFailed

    transient = _failed("my_data.py:9 in __getitem__", False)

    def group(m: MonitorState, phase: int) -> str:
        _group(m, phase, 1, 0)
        m.push([], [transient])
        step = 2
        while not m.push([(step, {"train/loss": 1.0}, 1.0)], [transient] if step == 4 else []).stop:
            step += 1
            threading.Event().wait(0.002)
        return "stopped"

    runner, _, _ = _runner(tmp_path, monkeypatch, {0: group}, "restart")
    assert runner.run() == UserCodeFailed(transient) and len(runner.book.user_errors) == 2


def test_the_book_says_where_the_time_to_the_first_step_went():
    """RunSummary.start: the parts from the driver's start to the first step sum to first_step_s,
    in order; a rank 0 that does not know its process's start counts it in the worker's part;
    no first step, no parts."""
    from orchestrator.run.run_books import EventBook
    from trainers.link import messages as msg

    book = EventBook(t_start=100.0)
    assert book.start_parts(101.0, 103.0) == {}
    book.fit_called[0] = 104.0
    start = dict(phase=0, workers=1, step=0, resumed=False, threads=1, entered=109.0, built=110.5)
    book.observe(msg.PhaseStart(**start, spawned=106.0))
    book.observe(msg.FirstStep(step=1, phase=0, time=111.0))
    parts = book.start_parts(101.0, 103.0)
    assert parts == {
        "launch_s": 1.0,
        "ray_s": 2.0,
        "driver_s": 1.0,
        "group_s": 2.0,
        "worker_s": 3.0,
        "build_s": 1.5,
        "step_s": 0.5,
    }
    assert sum(parts.values()) == book.first_step_s() == 11.0
    unknown = EventBook(t_start=100.0)
    unknown.fit_called[0] = 104.0
    unknown.observe(msg.PhaseStart(**start))  # spawned unknown (0.0)
    unknown.observe(msg.FirstStep(step=1, phase=0, time=111.0))
    assert unknown.start_parts() == {"driver_s": 4.0, "group_s": 0.0, "worker_s": 5.0, "build_s": 1.5, "step_s": 0.5}


def test_a_group_starts_without_ray_datas_manager_unless_given_datasets(monkeypatch):
    """Ray Train starts a DatasetManager actor (a process importing Ray Data) for every group, with
    datasets or not; the driver's groups get no datasets (the data order is ours): none is started.
    Its other parts (the process group's setup, the placement group's cleaner where it can work:
    tests/unit/test_ray_env.py, ...) all stay."""
    from ray.train import ScalingConfig
    from ray.train.torch import TorchTrainer

    from orchestrator.run import phases
    from orchestrator.run.phases import GroupTrainer

    monkeypatch.setattr(phases, "dashboard_running", lambda: True)  # this Ray's dashboard answers

    def names(trainer) -> list[str]:
        return [type(c).__name__ for c in trainer._create_default_callbacks()]

    scaling = ScalingConfig(num_workers=1)
    ours, ray_train = (
        names(GroupTrainer(lambda c: None, scaling_config=scaling)),
        names(TorchTrainer(lambda c: None, scaling_config=scaling)),
    )
    assert "DatasetsCallback" in ray_train  # what Ray Train does: if this fails, Ray no longer starts it
    assert ours == [n for n in ray_train if n != "DatasetsCallback"]
    assert {"BackendSetupCallback", "PlacementGroupCleanerCallback"} <= set(ours)
    with_data = GroupTrainer(lambda c: None, scaling_config=scaling, datasets={"train": [1, 2]})
    assert names(with_data) == ray_train


def _checkpoint_at(runner: PhaseRunner, step: int, finished: bool, records: list, batch: int = 32) -> None:
    """A real checkpoint of the run at ``step`` (trainers/loop/checkpoint.py's format)."""
    from trainers.loop.checkpoint import checkpoint_name, write_checkpoint
    from trainers.loop.storage import join

    payload = {
        "train": {"step": step, "epoch": 1, "cursor": 0, "samples_seen": batch * step, "finished": finished},
        "batch": {"size": batch, "policy": {}},
        "reporter": {"records": records},
    }
    write_checkpoint(join(runner.names.folder, checkpoint_name(step)), payload)


def test_a_resume_at_the_planned_end_closes_without_a_group_and_logs_what_the_checkpoint_carries(tmp_path):
    """A run stopped after its last step was trained, before its driver closed it: the newest
    checkpoint is the finished one, so a resume starts no worker group (no phase, no monitor) and
    ends Finished; the step records that checkpoint still carried reach MLflow (the tracker drops
    what it already holds); a checkpoint that is not the planned end still starts a group."""
    cfg = make_config(tmp_path, "mem://", batch={"size": 32, "max_local_batch": 32})
    tracker = FakeTracker()
    runner = make_runner(cfg, tracker, RunStart(resumes=1))
    _checkpoint_at(runner, 50, finished=False, records=[])
    _checkpoint_at(runner, 58, finished=True, records=[[58, {"train/loss": 0.5}, 12.0], [57, {"val/loss": 0.7}, 11.0]])

    def no_group(*_: Any, **__: Any) -> None:
        raise AssertionError("a worker group was started for a run with nothing left to train")

    runner.start_phase = no_group  # type: ignore[method-assign]
    runner._make_monitor = no_group  # type: ignore[method-assign]
    assert isinstance(runner.run(), Finished)
    assert tracker.metrics == [(57, {"val/loss": 0.7}, 11.0), (58, {"train/loss": 0.5}, 12.0)]

    unfinished = make_runner(
        make_config(tmp_path / "b", "mem://", batch={"size": 32}), FakeTracker(), RunStart(resumes=1)
    )
    _checkpoint_at(unfinished, 58, finished=False, records=[])
    assert unfinished.names.finished_records(print) is None
    fresh = make_runner(cfg, FakeTracker())  # a new run never looks (its folder is another run's here)
    fresh._make_monitor = no_group  # type: ignore[method-assign]
    with pytest.raises(AssertionError, match="worker group was started"):
        fresh.run()


def test_a_resume_starts_the_group_its_newest_checkpoints_batch_needs(tmp_path):
    """The killed driver's last W row may not have reached MLflow (it dies between the workers'
    checkpoint and its own write): a resume sizes its first group for the batch of the checkpoint it
    restores, not for the config's initial batch and that stale W (a group too small for the batch
    would be restarted at once: a second group start)."""
    cfg = make_config(
        tmp_path, "mem://", batch={"size": 32, "max_local_batch": 32}, scaling={"min_workers": 1, "max_workers": 4}
    )
    runner = make_runner(cfg, FakeTracker(), RunStart(resumes=1, workers=1))
    assert runner.initial_workers() == 1  # nothing read yet: the config's batch, the logged W
    _checkpoint_at(runner, 40, finished=False, records=[], batch=96)
    assert runner.names.finished_records(print) is None  # training is left: a group starts
    assert runner.names.restored_batch == 96 and runner.initial_workers() == 3
