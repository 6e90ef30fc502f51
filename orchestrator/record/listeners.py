"""Listeners: what the driver does with a run's records and events, one concern each
(MLflow, the progress bar, a caller's callback).

The phase runner (orchestrator/run/phases.py) only dispatches; each listener matches the event types
it cares about.  The pattern is Ray Train V2's controller callbacks; see ``docs/architecture.md``."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mlflow.entities import Metric

from orchestrator.record.checkpoint_models import CheckpointModels
from orchestrator.record.events import (
    CapacityReturned,
    GroupFailed,
    GroupRestarted,
    NodeDrained,
    OverlapFellBack,
    ResizeCalledOff,
    ResizeHandedOver,
    ResizeMeasured,
)
from orchestrator.record.progress_bar import Progress, epochs_samples
from orchestrator.record.run_tracker import RunTracker
from orchestrator.record.timeline import Timeline
from trainers.link import metrics as M
from trainers.link import tags as T
from trainers.link.messages import (
    AutoWarmupEnd,
    BatchChange,
    CheckpointQuarantined,
    CheckpointSaved,
    Diverged,
    Event,
    GoodputDecided,
    PhaseStart,
    Record,
    ResizeSkipped,
    RolledBack,
    WorkerWarning,
    WorkloadFailed,
)
from trainers.loop.storage import store_for

TAG_EVERY_S = 5.0  # goodput's latest reason is tagged at most this often (one MLflow call per tag)


class RunListener:
    """Hooks with nothing to do by default; override the ones a listener needs."""

    def on_records(self, records: list[Record]) -> None:
        """Step records drained from the monitor (never empty)."""

    def on_event(self, event: Event) -> None:
        """A worker's event (trainers/link/messages.py) or the driver's (orchestrator/record/events.py)."""

    def close(self) -> None:
        """The run is over (whatever its outcome)."""


class TrackingListener(RunListener):
    """Everything MLflow holds about a run's progress: step metrics, ``restarts``, ``resize/from``,
    ``resize/to``, ``resize/latency_s``
    and the tags ``elastic.worker_threads``, ``elastic.restarts``, ``elastic.warnings``; goodput's
    decisions (``scaling.policy: goodput``): ``goodput/*`` metrics at each, the tags
    ``elastic.goodput.decisions``, ``elastic.goodput.reason`` (the latest) and, for each that
    changed B or W, ``elastic.goodput.change.<n>`` (its reason, with every alternative's goodput);
    ``elastic.capacity_returned`` (resizes up after capacity came back) with the last one's reason;
    a drained node left by a planned resize: ``drain/workers`` and ``drain/left_s`` at its step, the
    tags ``elastic.drains`` and ``elastic.drain_reason`` (the last one's line).

    A resize's ``resize/*`` values are logged at its step and again at the last step of the stretch
    it opened (before the next resize, or the driver's last step): one point per resize would be a
    lone dot in MLflow's charts, two make a step line across the stretch the resize paid for.

    Each checkpoint is an MLflow LoggedModel with its step and its metrics, referring to where the
    checkpoint lives (:class:`~orchestrator.record.checkpoint_models.CheckpointModels`)."""

    def __init__(self, tracker: RunTracker) -> None:
        self.tracker = tracker
        self.checkpoints: CheckpointModels = tracker.checkpoints  # the run's (RunTracker builds it)
        self.warnings: list[str] = []
        self.quarantined: list[str] = []  # damaged checkpoints moved aside (trainers/loop/checkpoint.py)
        self.called_off = 0
        self.skipped = 0
        self.grown = 0
        self.drains = 0  # planned resizes off drained nodes
        self.goodput_decisions = 0
        self.goodput_changes = 0
        self._goodput_reason: str | None = None  # the latest decision's, tagged at most every TAG_EVERY_S
        self._goodput_tagged = -TAG_EVERY_S
        self.open_resize: tuple[int, dict[str, float]] | None = None  # the last resize: its step, its values

    def _tag_goodput(self, now: float) -> None:
        self._goodput_tagged = now
        self.tracker.set_tags({T.GOODPUT_DECISIONS: self.goodput_decisions, T.GOODPUT_REASON: self._goodput_reason})

    def close(self) -> None:
        if self._goodput_reason is not None:  # the last decision's reason, whenever it came
            self._tag_goodput(time.monotonic())
        history = self.tracker.history
        try:
            self._end_open_resize(max((s for s, _ in history.get(M.TRAIN_LOSS, [])), default=0))
        except Exception:  # the other listeners still close (a store that does not answer)
            pass
        if self.checkpoints.logged or self.checkpoints.pending:
            self.checkpoints.close(exists=lambda path: store_for(path).kind(path) is not None)

    def continue_from(self, tags: dict[str, str]) -> None:
        """A resumed run: the run-level tags this listener adds to go on from what the earlier
        drivers set (a new warning must not write over theirs)."""
        self.warnings = [w for w in tags.get(T.WARNINGS, "").splitlines() if w]
        self.quarantined = [q for q in tags.get(T.CHECKPOINTS_QUARANTINED, "").splitlines() if q]
        self.called_off = int(tags.get(T.RESIZES_CALLED_OFF, 0) or 0)
        self.skipped = int(tags.get(T.RESIZES_SKIPPED, 0) or 0)
        self.grown = int(tags.get(T.CAPACITY_RETURNED, 0) or 0)
        self.drains = int(tags.get(T.DRAINS, 0) or 0)

    def _end_open_resize(self, last_step: int) -> None:
        if self.open_resize is not None:
            step, values = self.open_resize
            self.open_resize = None
            if last_step > step:
                self.tracker.log_metrics([(last_step, values)], flush=True)

    def on_records(self, records: list[Record]) -> None:
        self.tracker.log_metrics(records)
        self.checkpoints.seen(records)

    def _warn(self, message: str) -> None:
        self.warnings.append(message)
        self.tracker.set_tags({T.WARNINGS: "\n".join(self.warnings)[-5000:]})

    def on_event(self, event: Event) -> None:
        match event:
            case PhaseStart(threads=threads, nodes=nodes):
                self.tracker.set_tags({T.WORKER_THREADS: threads})
                system = getattr(self.tracker, "system", None)  # (a test's tracker samples nothing)
                if system is not None:
                    system.follow(nodes)  # each node of the new group logs its system metrics
            case GroupRestarted(step=step, restarts=n):
                self.tracker.log_metrics([(step, {M.RESTARTS: float(n)})], flush=True)
                self.tracker.set_tags({T.RESTARTS: n})
            case WorkerWarning(message=message):
                self._warn(message)
            case CheckpointSaved(step=step, path=path) if path and not self.tracker.lost:
                self.checkpoints.saved(step, path)
            case CheckpointQuarantined(path=path, reason=reason, moved_to=moved_to):  # the line: its warning
                self.quarantined.append(f"{path} moved to {moved_to}: {reason}")
                self.tracker.set_tags({T.CHECKPOINTS_QUARANTINED: "\n".join(self.quarantined)[-5000:]})
            case WorkloadFailed(deterministic=False):  # retried by Ray Train: a note; a failure is tagged at the end
                self._warn(f"{event.message} (rank {event.rank}); the group was restarted")
            case RolledBack(step=step, rollbacks=n, lr_factor=factor):
                # straight to MLflow: two rollbacks at the same step are two points (log_metrics keeps one)
                ms = int(event.time * 1000)
                self.tracker.log_rows(
                    [Metric(M.ROLLBACKS, float(n), ms, step), Metric(M.LR_FACTOR, float(factor), ms, step)]
                )
                self.tracker.set_tags({T.ROLLBACKS: n, T.rollback(n): event.message[:5000]})
            case OverlapFellBack(error=err):
                self._warn(f"overlapping resize fell back to restart: {err!r}"[:500])
            case ResizeCalledOff(workers=workers):  # a resize that paid for a group it never used
                self.called_off += 1
                self.tracker.set_tags(
                    {
                        T.RESIZES_CALLED_OFF: self.called_off,
                        T.RESIZE_CALLED_OFF_REASON: f"resize to {workers} workers called off: training ended before "
                        "the new group was ready",
                    }
                )
            case ResizeSkipped(step=step, gain_s=gain, cost_s=cost, reason=reason):
                self.skipped += 1
                self.tracker.log_metrics(
                    [(step, {M.RESIZE_SKIPPED_GAIN_S: gain, M.RESIZE_SKIPPED_COST_S: cost})], flush=True
                )
                self.tracker.set_tags({T.RESIZES_SKIPPED: self.skipped, T.RESIZE_SKIPPED_REASON: reason})
            case GoodputDecided(step=step):
                self.goodput_decisions += 1
                m = {M.GOODPUT_CURRENT: event.goodput, M.GOODPUT_CHOSEN: event.chosen_goodput}
                if event.b_noise is not None:
                    m[M.GOODPUT_B_NOISE] = event.b_noise
                self.tracker.log_metrics([(step, m)], flush=event.changes)
                self._goodput_reason = f"step {step}: {event.reason}"[:5000]
                if event.changes:
                    self.goodput_changes += 1
                    self.tracker.set_tags({T.goodput_change(self.goodput_changes): self._goodput_reason})
                now = time.monotonic()
                if event.changes or now - self._goodput_tagged >= TAG_EVERY_S:  # a decision can come every few steps
                    self._tag_goodput(now)
            case NodeDrained(step=step, reason=reason):
                self.drains += 1
                left = 0.0 if event.deadline is None else max(0.0, event.deadline - event.time)
                values = {M.DRAINED_WORKERS: float(event.lost), M.DRAINED_LEFT_S: left}
                self.tracker.log_metrics([(step, values)], flush=True)
                self.tracker.set_tags({T.DRAINS: self.drains, T.DRAIN_REASON: reason})
            case CapacityReturned(reason=reason):
                self.grown += 1
                self.tracker.set_tags({T.CAPACITY_RETURNED: self.grown, T.CAPACITY_RETURNED_REASON: reason})
            case ResizeMeasured(resize=r):  # where the time went: the timeline artifact (TimelineListener)
                self._end_open_resize(r.step - 1)  # the previous resize's stretch ended at this one
                values = {
                    M.RESIZE_FROM: float(r.from_workers),
                    M.RESIZE_TO: float(r.to),
                    M.RESIZE_LATENCY_S: float(r.latency_s or 0.0),
                }
                self.tracker.log_metrics([(r.step, values)], flush=True)
                self.open_resize = (r.step, values)


@dataclass
class _Change:
    """A change of B and/or W at ``step`` whose line waits for the first step run with it: that
    step's record carries the LR and MF the policies gave the new B and W (the MF rule reads B / W,
    so neither is known before the new group's first step)."""

    step: int
    batch: tuple[int, int] | None = None  # (old, new)
    workers: tuple[int, int] | None = None  # (old, new)
    how: str = ""
    lr: float | None = None  # before the change
    mf: float | None = None

    def reached_by(self, step: int) -> bool:
        """Every step after a batch change runs with the new B, and every step after a resize's
        handover step is the new group's."""
        return step > self.step

    def line(self, metrics: dict[str, float] | None) -> str:
        """``batch: B 32 -> 64 and W 1 -> 2 at step 45 (restarting the group): lr 0.1 -> 0.2, mf 0.9``."""
        what = " and ".join(
            f"{name} {a} -> {b}"
            for name, ab in (("B", self.batch), ("W", self.workers))
            if ab is not None
            for a, b in [ab]
        )
        head = f"{'batch' if self.batch is not None else 'resize'}: {what} at step {self.step}"
        head += f" ({self.how})" if self.how else ""
        if metrics is None:  # the run ended before a step ran with it
            return head
        parts = []
        if self.batch is None and M.BATCH_GLOBAL in metrics:
            parts.append(f"B {int(metrics[M.BATCH_GLOBAL])}")
        if M.WORKERS in metrics and (self.workers is None or int(metrics[M.WORKERS]) != self.workers[1]):
            # an elastic group may start with fewer workers than asked for
            parts.append(f"W {int(metrics[M.WORKERS])}" + (f" of {self.workers[1]} asked" if self.workers else ""))
        for name, before, key in (("lr", self.lr, M.LR), ("mf", self.mf, M.MF)):
            if key in metrics:
                now = metrics[key]
                parts.append(
                    f"{name} {before:.4g} -> {now:.4g}"
                    if before is not None and f"{before:.4g}" != f"{now:.4g}"
                    else f"{name} {now:.4g}"
                )
        return head + (": " + ", ".join(parts) if parts else "")


class ProgressListener(RunListener):
    """The progress bar, and a line for each thing a person watching should know.  A batch change
    or a resize is written once the first step with the new B and W has run, with the LR and MF
    that step used (:class:`_Change`); while a group restarts the bar says ``restarting``.  The bar's
    total is ``epochs`` (``train.epochs``) times the training set its workers report at their start.
    An error that ends the run is written once however many ranks met it, and the group's failure
    that follows it is not announced as a restart."""

    def __init__(self, progress: Progress, epochs: float = 1.0) -> None:
        self.progress = progress
        self.epochs = epochs
        self.pending: list[_Change] = []
        self.ending: set[str] = set()  # the errors that end the run, written (every rank may meet one)

    def on_records(self, records: list[Record]) -> None:
        self.progress.update(records)
        if not self.pending:
            return
        for step, metrics, *_ in records:
            for change in [c for c in self.pending if c.reached_by(step)]:
                self.pending.remove(change)
                self.progress.write(change.line(metrics))

    def _before(self, step: int) -> _Change:
        last = getattr(self.progress, "last", {})
        return _Change(step=step, lr=last.get(M.LR), mf=last.get(M.MF))

    def on_event(self, event: Event) -> None:
        write = self.progress.write
        match event:
            case PhaseStart(train_samples=n) if n:
                self.progress.sized(epochs_samples(self.epochs, n))
            case BatchChange(step=step, old=old, new=new):
                change = self._before(step)
                change.batch = (old, new)
                self.pending.append(change)
            case AutoWarmupEnd(step=step, peak_lr=peak, reason=reason):
                write(f"auto warmup ended at step {step}: peak lr {peak:.4g} ({reason})")
            case GroupRestarted(step=step, workers=workers, restarts=n):
                write(f"worker group restarted from step {step} with {workers} workers (restart {n})")
                if hasattr(self.progress, "restarting"):  # restoring its checkpoint: no rate until it steps
                    self.progress.restarting(f"after a failure, restart {n}")
            case GroupFailed() if self.ending:  # the run ends: the restarted group returns at once
                pass
            case GroupFailed(message=message):
                write(
                    f"warning: a worker failed ({message}); the group restarts from its last checkpoint "
                    "while scaling.max_failures allows"
                )
                if hasattr(self.progress, "restarting"):
                    self.progress.restarting("a worker failed")
            case Diverged():
                write(f"error: {event.message}")
            case WorkloadFailed(deterministic=True) if self.ending:  # the run ends with the first (its ranks'
                pass  # lines differ in what each measured: a store's retry time)
            case WorkloadFailed(deterministic=True):
                self.ending.add(event.message)
                write(f"error: {event.message}")
            case WorkloadFailed():
                write(
                    f"warning: {event.message} (rank {event.rank}); Ray Train restarts the group, the same error "
                    "again ends the run"
                )
            case RolledBack():
                write(f"warning: {event.message}")
            case WorkerWarning(message=message):
                write(f"warning: {message}")
            case OverlapFellBack(workers=workers, error=err):
                write(
                    f"warning: the new group of {workers} workers did not start "
                    f"({type(err).__name__ if err else 'ended early'}); resizing by restart"
                )
            case GoodputDecided(step=step, reason=reason) if event.changes:
                write(f"goodput at step {step}: {reason}")
            case CapacityReturned(step=step, reason=reason):
                write(f"{reason} at the group's next push (step {step} reached)")
            case NodeDrained(reason=reason):
                write(reason)
            case ResizeSkipped(step=step, wanted=wanted, reason=reason):
                write(f"resize to {wanted} workers skipped at step {step}: {reason}")
            case ResizeCalledOff(workers=workers):
                write(f"resize to {workers} workers called off: training ended before the new group was ready")
            case ResizeHandedOver(resize=r):
                how = "the new group took over" if r.mode == "overlap" else "restarting the group"
                # a batch change at the handover's step caused it: one line for both
                change = next((c for c in self.pending if c.step == r.step and c.workers is None), None)
                if change is None:
                    change = self._before(r.step)
                    self.pending.append(change)
                change.workers, change.how = (r.from_workers, r.to), how
                if r.mode != "overlap" and hasattr(self.progress, "restarting"):
                    self.progress.restarting(f"W {r.from_workers} -> {r.to}")

    def close(self) -> None:
        for change in self.pending:  # the run ended before a step ran with them
            self.progress.write(change.line(None))
        self.pending = []
        self.progress.close()


class TimelineListener(RunListener):
    """The run's stretches of constant B and W and its resizes (orchestrator/record/timeline.py): the
    summary table, and the timeline table and chart logged at the end of the run; and what each worker
    group held (the timeline's ``holds``: its ``fit()`` thread writes the hold down, the group's
    ``PhaseStart`` its workers), saved with ``on_holds`` after each change (a resume carries the cost)."""

    def __init__(
        self,
        timeline: Timeline | None = None,
        on_resize: Callable[[list[dict]], None] | None = None,
        on_holds: Callable[[dict], None] | None = None,
        on_drain: Callable[[list[dict]], None] | None = None,
    ) -> None:
        self.timeline = timeline or Timeline()
        self.on_drain = on_drain  # given the run's drains after each one (a resume's timeline shows them)
        self.on_resize = on_resize  # given the run's resizes after each one measured (orchestrator/record/history.py)
        self.on_holds = on_holds  # given the holds (Holds.as_dict) after they changed (orchestrator/record/history.py)
        self.saved_holds = self.timeline.holds.version  # the version of the holds saved last

    def save_holds(self, force: bool = False) -> None:
        """Save the holds if they changed since the last save (once per change, whether the store took it)."""
        holds = self.timeline.holds
        if self.on_holds is not None and (force or holds.version != self.saved_holds):
            self.saved_holds = holds.version
            self.on_holds(holds.as_dict(time.time()))

    def on_records(self, records: list[Record]) -> None:
        self.timeline.add_records(records)
        self.save_holds()

    def on_event(self, event: Event) -> None:
        match event:
            case PhaseStart(phase=phase, workers=workers, entered=entered):
                self.timeline.holds.started(phase, workers, entered)
                self.save_holds()
            case ResizeMeasured(resize=r):
                self.timeline.add_resize(r.as_dict())
                if self.on_resize is not None:
                    self.on_resize(self.timeline.resizes)
            case ResizeCalledOff(workers=workers):
                self.timeline.called_off.append(workers)
            case NodeDrained():
                self.add_drain(
                    {
                        "step": event.step,
                        "time": event.time,
                        "node": event.node,
                        "deadline": event.deadline,
                        "from": event.workers,
                        "to": event.to,
                        "mode": event.mode,
                    }
                )

    def add_drain(self, drain: dict[str, Any]) -> None:
        """A drained node the run left (a planned resize's, or the driver's own node's: ``mode``
        ``stop``, ``to`` 0), in the timeline and saved for a resumed run's timeline."""
        self.timeline.add_drain(drain)
        if self.on_drain is not None:
            self.on_drain(self.timeline.drains)


class RecordsCallback(RunListener):
    """A caller's functions on each batch of records (a search trial's pruner, a test's stop) and
    on each event (a search trial's restarts, for its driver's line)."""

    def __init__(
        self, fn: Callable[[list[Record]], None] | None, on_event: Callable[[Event], None] | None = None
    ) -> None:
        self.fn, self.event_fn = fn, on_event

    def on_records(self, records: list[Record]) -> None:
        if self.fn is not None:
            self.fn(records)

    def on_event(self, event: Event) -> None:
        if self.event_fn is not None:
            self.event_fn(event)
