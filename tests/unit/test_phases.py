"""The driver's phase states (orchestrator/phases.py) without Ray: a fake monitor (the real
:class:`MonitorState`, called directly) and fake ``fit()`` phases that play a worker group's part."""

from __future__ import annotations

import threading
from typing import Any, Callable

import pytest

from orchestrator.phases import Failed, Finished, PhaseRunner
from trainers.policies.resize import WorkerCount, WorkersForBatch
from tests.helpers import make_config
from trainers.link.messages import FirstStep, PhaseStart
from orchestrator.monitor import MonitorState


class _Remote:
    def __init__(self, fn: Callable[..., Any]) -> None:
        self.remote = fn


class FakeMonitor:
    """A :class:`MonitorState` whose methods answer ``.remote(...)`` at once (``ray.get`` is identity)."""

    def __init__(self, state: MonitorState) -> None:
        self.state = state

    def __getattr__(self, name: str) -> _Remote:
        return _Remote(getattr(self.state, name))


class FakeTracker:
    run_id, uri, written_upto = "abc", "mem://", -1

    def __init__(self) -> None:
        self.metrics: list = []
        self.tags: dict[str, Any] = {}

    def log_metrics(self, records, flush: bool = False) -> None:
        self.metrics.extend(records)

    def set_tags(self, tags: dict[str, Any]) -> None:
        self.tags.update(tags)

    def last_value(self, key: str, default: float = 0.0) -> float:
        return default

    def outage_expired(self):  # the store always answers here
        return None


class FakeFit:
    """``fit()`` of a phase: runs ``play(monitor, phase)`` in the phase's thread."""

    def __init__(self, play: Callable[[MonitorState, int], Any], monitor: MonitorState, phase: int) -> None:
        self.play, self.monitor, self.phase = play, monitor, phase

    def fit(self) -> Any:
        return self.play(self.monitor, self.phase)


def _runner(tmp_path, monkeypatch, plays: dict[int, Callable[[MonitorState, int], Any]], resize_mode: str,
            free_cpus: float = 8.0) -> tuple[PhaseRunner, FakeTracker, list[tuple[int, int, bool]]]:
    import ray

    cfg = make_config(tmp_path, "mem://", batch={"size": 32, "max_local_batch": 32},
                      scaling={"min_workers": 1, "max_workers": 4, "cpus_per_worker": 0.5,
                               "resize_mode": resize_mode})
    tracker = FakeTracker()
    monkeypatch.setattr(ray, "get", lambda x: x)
    monkeypatch.setattr(ray, "kill", lambda x: None)
    monkeypatch.setattr(ray, "available_resources", lambda: {"CPU": free_cpus})
    runner = PhaseRunner(cfg, tracker, progress=False)  # type: ignore[arg-type]
    runner.poll_s = 0.01
    state = MonitorState(WorkerCount(WorkersForBatch(), 32, 1, 4),
                         overlap_resources={"CPU": 0.5} if resize_mode == "overlap" else None,
                         available=lambda: {"CPU": free_cpus})
    started: list[tuple[int, int, bool]] = []

    def make_monitor() -> None:
        runner.monitor = FakeMonitor(state)

    def trainer(workers: int, phase: int, handover: bool) -> FakeFit:
        started.append((phase, workers, handover))
        return FakeFit(plays[phase], state, phase)

    monkeypatch.setattr(runner, "make_monitor", make_monitor)
    monkeypatch.setattr(runner, "_trainer", trainer)
    return runner, tracker, started


def _group(m: MonitorState, phase: int, workers: int, step: int) -> None:
    m.push([(step + 1, {"workers": float(workers)}, 1.0)],
           [PhaseStart(phase=phase, workers=workers, step=step, resumed=phase > 0, threads=1, entered=1.0,
                       built=1.0), FirstStep(step=step + 1, phase=phase)])


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
    assert runner.run() == "done"
    assert isinstance(runner.state, Finished) and runner.monitor is None
    assert started == [(0, 1, False), (1, 2, False)]
    (r,) = runner.resizes
    assert (r["mode"], r["from"], r["to"], r["step"], r["phase"]) == ("restart", 1, 2, 10, 1)
    assert r["latency_s"] is not None and r["overlap_s"] == 0.0
    logged = [r[1] for r in tracker.metrics if "resize/from" in r[1]]
    # the latency's parts are in the timeline artifact (orchestrator/timeline.py), not seven one-dot charts
    assert logged == [{"resize/from": 1.0, "resize/to": 2.0, "resize/latency_s": r["latency_s"]}]
    assert runner.called_off == 0 and runner.first_step_s() is not None


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
    assert runner.run() == "done"
    assert started == [(0, 1, False), (1, 2, True)]
    (r,) = runner.resizes
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
    assert runner.run() == "finished"
    assert runner.resizes == [] and runner.called_off == 1 and len(started) == 2


def test_a_restarted_group_counts_and_a_failed_fit_raises(tmp_path, monkeypatch):
    def flaky(m: MonitorState, phase: int) -> None:
        _group(m, phase, 1, 0)
        _group(m, phase, 1, 5)  # Ray Train restarted the group after a failure
        raise RuntimeError("out of failures")

    runner, tracker, _ = _runner(tmp_path, monkeypatch, {0: flaky}, "restart")
    with pytest.raises(RuntimeError, match="out of failures"):
        runner.run()
    assert isinstance(runner.state, Failed) and runner.restarts == 1
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
    assert runner.run() == "done"
    assert started == [(0, 1, False), (1, 2, True), (2, 2, False)]  # the failed start keeps its index
    assert [r["mode"] for r in runner.resizes] == ["restart"]
    assert "overlapping resize fell back to restart: RuntimeError('no room after all')" in tracker.tags["elastic.warnings"]


def test_the_progress_bar_counts_samples_and_shows_the_policy_batch(capsys):
    from orchestrator.progress import Progress

    p = Progress(total=1000, enabled=True)
    p.update([(1, {"samples_seen": 16.0, "batch/global": 16.0, "workers": 1.0, "epoch": 0.016}, 0.0)])
    p.update([(30, {"samples_seen": 800.0, "batch/global": 64.0, "workers": 2.0, "epoch": 0.8}, 0.0)])
    assert (p.bar.n, p.bar.total) == (800, 1000) and p.step == 30
    p.close()
    err = capsys.readouterr().err
    assert "B=64" in err and "W=2" in err and "step=30" in err


def test_listeners_get_records_and_events_in_step_order(tmp_path, monkeypatch):
    """An event at step s reaches the listeners after the records up to s and before later ones."""
    import ray

    from orchestrator.listeners import RunListener
    from trainers.link.messages import BatchChange

    seen: list = []

    class Recorder(RunListener):
        def on_records(self, records):
            seen.extend(("record", r[0]) for r in records)

        def on_event(self, event):
            seen.append(("event", getattr(event, "step", None)))

    cfg = make_config(tmp_path, "mem://")
    monkeypatch.setattr(ray, "get", lambda x: x)
    runner = PhaseRunner(cfg, FakeTracker(), progress=False)  # type: ignore[arg-type]
    runner.listeners = [Recorder()]
    state = MonitorState(WorkerCount(WorkersForBatch(), 32, 1, 1))
    state.push([(s, {"train/loss": 1.0}, 0.0) for s in range(18, 23)], [BatchChange(step=20, old=16, new=32)])
    runner.monitor = FakeMonitor(state)
    runner.pump()
    assert seen == [("record", 18), ("record", 19), ("record", 20), ("event", 20), ("record", 21), ("record", 22)]


def test_an_interrupted_driver_stops_the_group_and_drains_its_last_records(tmp_path, monkeypatch):
    """Ctrl-C or SIGTERM on the driver: the group is asked to stop (its last checkpoint), and what
    it pushes until it ends reaches the tracker before the interruption goes on."""
    import time

    import ray

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
    monkeypatch.setattr(ray, "get", lambda x, timeout=None: x)
    poll = runner.poll

    def interrupted_poll(ph) -> None:
        poll(ph)
        if any(r[0] >= 5 for r in tracker.metrics):
            raise KeyboardInterrupt

    monkeypatch.setattr(runner, "poll", interrupted_poll)
    with pytest.raises(KeyboardInterrupt):
        runner.run()
    assert tracker.metrics[-1][1] == {"train/loss": 0.5}  # pushed after the stop, drained before the end
    assert any(isinstance(ev, Stopped) for ev in runner.events) and runner.monitor is None


def test_the_runner_keeps_a_dozen_things_or_fewer(tmp_path):
    """What the runner knows is split by concern (names, monitor link, event book, resizes), so
    the runner itself holds a dozen attributes or fewer; runner.py reads them through it."""
    runner = PhaseRunner(make_config(tmp_path, "mem://"), FakeTracker(), progress=False)  # type: ignore[arg-type]
    assert len(vars(runner)) <= 12, sorted(vars(runner))
    assert runner.train_run_name == "elastic-abc" and runner.storage_path.startswith(str(tmp_path))
    runner.resumes, runner.t_start = 2, 5.0
    assert runner.phase_run_name(3) == "elastic-abc-r2p3" and runner.book.t_start == 5.0
    assert (runner.resizes, runner.called_off, runner.restarts, runner.monitor) == ([], 0, 0, None)


def test_a_run_without_room_for_min_workers_ends_failed_after_its_wait_with_how_to_resume(tmp_path, monkeypatch):
    """A lost node left fewer than ``scaling.min_workers`` places: the driver says it waits, and once
    ``capacity_timeout_s`` is over it ends the run with one message (the group never ran again)."""
    from orchestrator.nodes import CapacityWatch

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

    runner.capacity = CapacityWatch(min_workers=1, timeout_s=60, every_s=0.0, nodes=live_nodes,
                                    clock=lambda: now[0])
    said: list[str] = []
    runner.progress.write = said.append  # type: ignore[method-assign]
    try:
        assert runner.run() is None
    finally:
        stop.set()
    assert runner.failure.startswith("lost capacity: only 0 of scaling.min_workers 1 workers fit the live nodes")
    from orchestrator.command import cli

    assert runner.failure.endswith(f"with: {cli()} resume {runner.tracker.run_id}")
    assert said and said[0].startswith("waiting for capacity: 0 of scaling.min_workers 1 workers fit")
