"""The driver <-> worker link without Ray or processes: named broadcast records, rank 0's
channel (checkpoint records old and new), the throughput meter, and the events' names."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from trainers.link import agreement, messages
from trainers.link.agreement import Action, PushDecision, WorkersNeeded
from trainers.link.channel import Channel
from trainers.link.messages import PushAnswer, ResizeAnswer, record_from_list
from trainers.loop.meter import Reading, ThroughputMeter


class _Bar:
    """A progress bar's stand-in: the lines written under it."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def write(self, line: str) -> None:
        self.lines.append(line)

    def close(self) -> None:
        pass


@pytest.mark.parametrize(
    "record",
    [
        WorkersNeeded(0, False),
        WorkersNeeded(3, True),
        WorkersNeeded(2, False),
        PushDecision(Action.GO, 10),
        PushDecision(Action.STOP, 1),
        PushDecision(Action.HAND_OVER, 10_000),
    ],
)
def test_records_round_trip_through_one_int64_tensor(record):
    t = agreement.encode(record)
    assert t.dtype.is_floating_point is False and t.numel() == len(record.__dataclass_fields__)
    back = agreement.decode(type(record), t.tolist())
    assert back == record and type(back) is type(record)
    assert all(type(getattr(back, k)) is type(getattr(record, k)) for k in record.__dataclass_fields__)


def test_one_worker_agrees_with_itself_without_a_process_group():
    r = PushDecision(Action.STOP, 7)
    assert agreement.agree(r, world=1) is r


def test_channel_without_a_monitor_is_silent():
    ch = Channel(None, None, enabled=True)
    ch.log(1, {"a": 1.0})
    ch.emit(messages.Finished(step=1))
    assert ch.pending() == [] and ch.flush(wait=True) is False
    assert ch.ask_resize(1, 64, 1) == ResizeAnswer(0, "") and not ch.ask_resize(1, 64, 1).overlap


def test_channel_keeps_unacknowledged_records_and_the_newest_one():
    ch = Channel(None, None, enabled=False, monitor=object())  # records kept until acknowledged
    for s in range(1, 6):
        ch.log(s, {"train/loss": 1.0 / s}, when=100.0 + s)
    ch.receive(PushAnswer(acked=3))
    assert [r[0] for r in ch.pending()] == [4, 5]
    ch.receive(PushAnswer(acked=5))
    assert ch.pending() == [[5, {"train/loss": 0.2}, 105.0]]  # the newest stays for a resume
    ch.receive(PushAnswer(stop=True, acked=5, handover=True))
    ch.receive(PushAnswer(stop=False, acked=5, handover=False))
    assert ch._stop is True and ch.handover is False  # a stop is never taken back


def test_checkpoint_records_old_and_new_replay():
    ch = Channel(None, None, enabled=False, monitor=object())
    ch.load_state_dict({"pending_metrics": [[3, {"lr": 1}, 50.0], [4, {"lr": 2.0}]]})  # new, then old format
    (s3, m3, t3), (s4, m4, t4) = ch.pending()
    assert (s3, m3, t3) == (3, {"lr": 1.0}, 50.0) and isinstance(m3["lr"], float)
    assert (s4, m4) == (4, {"lr": 2.0}) and t4 > 1e9  # no time recorded: the time of the replay
    again = Channel(None, None, enabled=False, monitor=object())
    again.load_state_dict(ch.state_dict())
    assert again.pending() == ch.pending()
    assert record_from_list([7, {"x": 1}], now=5.0) == (7, {"x": 1.0}, 5.0)


def test_events_cross_ray_as_picklable_frozen_dataclasses_with_stable_kinds():
    kinds = {
        cls.kind
        for cls in (
            messages.PhaseStart,
            messages.FirstStep,
            messages.BatchChange,
            messages.ResizeDecided,
            messages.NewGroupReady,
            messages.CheckpointSaved,
            messages.ResizeCheckpoint,
            messages.AutoWarmupEnd,
            messages.WorkerWarning,
            messages.Finished,
            messages.Stopped,
        )
    }
    assert kinds == {
        "phase_start",
        "first_step",
        "batch_change",
        "resize_decision",
        "new_group_ready",
        "checkpoint",
        "resize_checkpoint",
        "auto_warmup_end",
        "warning",
        "finished",
        "stopped",
    }
    ev = messages.BatchChange(step=3, old=32, new=64)
    assert pickle.loads(pickle.dumps(ev)) == ev and ev.time > 1e9
    with pytest.raises(dataclasses.FrozenInstanceError):
        ev.step = 4  # type: ignore[misc]


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_meter_counts_push_to_push_minus_the_time_set_aside():
    clock = Clock()
    m = ThroughputMeter(log_every=10, push_every_s=0.25, clock=clock)
    for _ in range(10):
        m.count(64)
        clock.t += 0.01
    with m.aside():  # validation: not training time
        clock.t += 5.0
    r = m.read()
    assert r == Reading(samples_per_s=pytest.approx(640 / 0.1), push_interval=25)  # 100 steps/s * 0.25 s
    # the next window starts at the push
    m.count(32)
    clock.t += 0.5
    assert m.read() == Reading(samples_per_s=pytest.approx(64.0), push_interval=10)  # slow: never below log_every


def test_meter_without_time_based_pushes_and_with_an_empty_window():
    clock = Clock()
    m = ThroughputMeter(log_every=7, push_every_s=0.0, clock=clock)
    m.count(8)
    clock.t += 1.0
    assert m.read().push_interval == 7
    assert m.read() == Reading(samples_per_s=0.0, push_interval=7)  # nothing since the last push


def test_checkpoint_models_keep_the_newest_steps_linked_metrics_within_a_bound():
    """A checkpoint's event may follow its step's record by thousands of fast steps: the newest
    RECENT steps' linked metrics (val/* and the training loss, nothing else) are always kept, and
    what is kept stays bounded, however the records arrive."""
    from orchestrator.record.checkpoint_models import RECENT, CheckpointModels

    cm = CheckpointModels(None, "r", "0")
    for step in range(3 * RECENT + 7):  # one record a push, as a fast loop sends them
        cm.seen([(step, {"train/loss": step / 10, "lr": 0.1, "val/accuracy": 0.5}, 100.0 + step)])
    newest = 3 * RECENT + 6
    assert RECENT <= len(cm.recent) <= 2 * RECENT
    assert all(s in cm.recent for s in range(newest - RECENT + 1, newest + 1))
    assert cm.recent[newest] == ({"train/loss": newest / 10, "val/accuracy": 0.5}, 100.0 + newest)
    cm.seen([(newest + 1 + i, {"train/loss": 1.0}) for i in range(RECENT)])  # one push of many, no times
    assert cm.recent[newest + RECENT] == ({"train/loss": 1.0}, 0.0) and len(cm.recent) <= 2 * RECENT


def test_listeners_log_and_print_what_the_runner_did_before():
    """MLflow and the progress bar as listeners: the same metrics, tags and lines as the runner's
    own branches wrote before (orchestrator/record/listeners.py)."""
    from orchestrator.record.checkpoint_models import CheckpointModels
    from orchestrator.record.events import (
        GroupRestarted,
        OverlapFellBack,
        ResizeCalledOff,
        ResizeHandedOver,
        ResizeMeasured,
        ResizeRecord,
    )
    from orchestrator.record.listeners import ProgressListener, TrackingListener

    class Tracker:
        def __init__(self) -> None:
            self.metrics: list = []
            self.tags: dict = {}
            self.history: dict = {}  # what RunTracker keeps of the logged points
            self.checkpoints = CheckpointModels(None, "r", "0")  # the run's checkpoints' models (none here)

        def log_metrics(self, records, flush=False):
            self.metrics.extend(records)

        def set_tags(self, tags):
            self.tags.update(tags)

    tr, bar = Tracker(), _Bar()
    listeners = [TrackingListener(tr), ProgressListener(bar)]  # type: ignore[arg-type]
    r = ResizeRecord(
        from_workers=1,
        to=2,
        mode="restart",
        step=45,
        time=10.0,
        decided=9.0,
        fit_returned=11.0,
        phase=1,
        fit_called=11.5,
    )
    r.measure(entered=12.0, first=13.0)
    assert (r.latency_s, r.parts) == (3.0, {"overlap_s": 0.0, "teardown_s": 1.0, "start_s": 0.5, "setup_s": 1.0})
    assert r.as_dict()["from"] == 1 and r.as_dict()["latency_s"] == 3.0 and r.as_dict()["setup_s"] == 1.0
    for ev in (
        messages.PhaseStart(phase=0, workers=1, step=0, resumed=False, threads=2, entered=1.0, built=1.0),
        messages.BatchChange(step=5, old=32, new=64),
        messages.AutoWarmupEnd(step=6, peak_lr=0.123456, reason="loss rose"),
        GroupRestarted(step=7, workers=2, restarts=1),
        messages.WorkerWarning(message="skipping corrupt checkpoint: x"),
        OverlapFellBack(workers=2, error=RuntimeError("no")),
        ResizeCalledOff(workers=4),
        ResizeHandedOver(resize=r),
        ResizeMeasured(resize=r),
    ):
        for listener in listeners:
            listener.on_event(ev)
    for listener in listeners:  # a batch change and a resize wait for a step run with them: none ran
        listener.close()
    assert bar.lines == [
        "auto warmup ended at step 6: peak lr 0.1235 (loss rose)",
        "worker group restarted from step 7 with 2 workers (restart 1)",
        "warning: skipping corrupt checkpoint: x",
        "warning: the new group of 2 workers did not start (RuntimeError); resizing by restart",
        "resize to 4 workers called off: training ended before the new group was ready",
        "batch: B 32 -> 64 at step 5",
        "resize: W 1 -> 2 at step 45 (restarting the group)",
    ]
    assert tr.tags == {
        "elastic.worker_threads": 2,
        "elastic.restarts": 1,
        "elastic.warnings": "skipping corrupt checkpoint: x\n"
        "overlapping resize fell back to restart: RuntimeError('no')",
        "elastic.resizes_called_off": 1,  # a called-off resize leaves a trace in MLflow
        "elastic.resize_called_off_reason": "resize to 4 workers called off: training ended before "
        "the new group was ready",
    }
    assert tr.metrics == [
        (7, {"restarts": 1.0}),
        (45, {"resize/from": 1.0, "resize/to": 2.0, "resize/latency_s": 3.0}),
    ]  # parts: timeline.json


def test_a_resumed_runs_listeners_go_on_from_the_earlier_drivers_tags_and_say_what_failed():
    """A resumed driver's warnings, quarantined checkpoints and resize counts add to the earlier
    drivers' (a tag is rewritten whole); a user's error is a line, a quarantine a tag."""
    from orchestrator.record.checkpoint_models import CheckpointModels
    from orchestrator.record.events import ResizeCalledOff
    from orchestrator.record.listeners import ProgressListener, TrackingListener

    class Tracker:
        def __init__(self) -> None:
            self.tags: dict = {}
            self.history: dict = {}  # nothing trained (RunTracker.history)
            self.checkpoints = CheckpointModels(None, "r", "0")

        def set_tags(self, tags):
            self.tags.update(tags)

    tr, bar = Tracker(), _Bar()
    tracking = TrackingListener(tr)  # type: ignore[arg-type]
    tracking.continue_from(
        {
            "elastic.warnings": "an earlier warning",
            "elastic.resizes_called_off": "2",
            "elastic.checkpoints_quarantined": "a moved to b: damaged",
        }
    )
    fatal = messages.WorkloadFailed(
        rank=1,
        phase=0,
        where="my_data.py:42 in __getitem__",
        error="ValueError: corrupt record 17",
        traceback="...",
        deterministic=True,
    )
    transient = messages.WorkloadFailed(
        rank=0, phase=0, where="my_data.py:9 in read", error="OSError: gone", traceback="...", deterministic=False
    )
    for ev in (
        messages.WorkerWarning(message="a new warning"),
        ResizeCalledOff(workers=4),
        messages.CheckpointQuarantined(path="c", reason="damaged too", moved_to="d"),
        transient,
        fatal,
    ):
        tracking.on_event(ev)
        ProgressListener(bar).on_event(ev)  # type: ignore[arg-type]
    assert tr.tags["elastic.warnings"] == (
        "an earlier warning\na new warning\nmy_data.py:9 in read: OSError: gone (rank 0); the group was restarted"
    )
    assert tr.tags["elastic.resizes_called_off"] == 3
    assert tr.tags["elastic.checkpoints_quarantined"] == "a moved to b: damaged\nc moved to d: damaged too"
    assert bar.lines[-2:] == [
        "warning: my_data.py:9 in read: OSError: gone (rank 0); Ray Train restarts the group, "
        "the same error again ends the run",
        "error: my_data.py:42 in __getitem__: ValueError: corrupt record 17",
    ]
