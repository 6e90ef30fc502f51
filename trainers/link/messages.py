"""What crosses between rank 0 of a worker group and the driver's monitor actor.

Three kinds of message, all plain frozen dataclasses (Ray pickles them as they are; both
sides import this module, so no tag or schema is needed on the wire):

* **records**: ``(step, metrics, time)`` tuples, one per optimizer step, pushed in batches;
* **events**: one :class:`Event` subclass per thing that happened (a phase started, the batch
  changed, a checkpoint was written...); the driver dispatches on the type;
* **answers**: what the monitor replies to rank 0 (:class:`PushAnswer`, :class:`ResizeAnswer`,
  :class:`HandoverAnswer`).

The monitor's record of a resize in progress (:class:`Resize`) is handed to the driver
when the old group has written its last checkpoint.  The whole protocol, with a diagram:
``docs/architecture.md``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import psutil

Record = tuple[int, dict[str, float], float]  # (step, metrics, wall time the step ended)
ResizeMode = Literal["", "overlap", "restart"]  # "": keep the group


def record_from_list(row: Sequence[Any], now: float | None = None) -> Record:
    """A record restored from a checkpoint: ``[step, metrics, time]``, or ``[step, metrics]`` as
    checkpoints written before records carried their time hold them (then the time is ``now``)."""
    step, metrics, *when = row
    t = float(when[0]) if when else (time.time() if now is None else now)
    return int(step), {k: float(v) for k, v in metrics.items()}, t


# --------------------------------------------------------------------------- events


@dataclass(frozen=True, kw_only=True)
class Event:
    """Something rank 0 (or the monitor) saw, with the wall time it happened.  ``kind`` names the
    type in logs and tests (the wire carries the object itself)."""

    kind: ClassVar[str] = "event"
    time: float = field(default_factory=time.time)


def process_started() -> float:
    """When this process was started (wall time; 0.0 where the system does not say): a group's rank 0
    for :class:`PhaseStart`, the CLI for the time a command was invoked."""
    try:
        return psutil.Process().create_time()
    except (psutil.Error, OSError):
        return 0.0


@dataclass(frozen=True, kw_only=True)
class PhaseStart(Event):
    """A worker group entered its loop and restored its state (once per group start: the same
    ``phase`` twice means Ray Train restarted the group after a failure)."""

    kind: ClassVar[str] = "phase_start"
    phase: int
    workers: int
    step: int
    resumed: bool
    threads: int
    entered: float  # when rank 0 entered ``train_loop_per_worker``
    built: float  # when the trainer (data, model, process group) was built
    spawned: float = 0.0  # when rank 0's process was started (0: not known)
    nodes: tuple[str, ...] = ()  # each rank's Ray node id (which ranks a drained node holds: run/drains.py)
    train_samples: int = 0  # the training set's samples per epoch (the driver's bar: data it does not load)


@dataclass(frozen=True, kw_only=True)
class FirstStep(Event):
    """A group finished its first optimizer step."""

    kind: ClassVar[str] = "first_step"
    step: int
    phase: int


@dataclass(frozen=True, kw_only=True)
class BatchChange(Event):
    """The batch policy changed the global batch ``old`` -> ``new`` before step ``step + 1``."""

    kind: ClassVar[str] = "batch_change"
    step: int
    old: int
    new: int


@dataclass(frozen=True, kw_only=True)
class ResizeDecided(Event):
    """The monitor's answer to a batch change (sent by the monitor itself): ``workers`` the batch
    needs, ``mode`` "" when the group stays as it is."""

    kind: ClassVar[str] = "resize_decision"
    step: int
    batch: int
    workers: int
    reason: str
    mode: ResizeMode


@dataclass(frozen=True, kw_only=True)
class ResizeSkipped(Event):
    """The batch wanted ``wanted`` workers, but the resize could not pay for itself before the end
    of training (trainers/policies/resize.py ``resize_pays``): the group of ``workers`` stays."""

    kind: ClassVar[str] = "resize_skipped"
    step: int
    batch: int
    workers: int
    wanted: int
    gain_s: float
    cost_s: float
    reason: str


@dataclass(frozen=True, kw_only=True)
class GoodputDecided(Event):
    """The monitor asked Pollux's goodput (``scaling.policy: goodput``) at ``step``, with the group at
    global batch ``batch`` on ``workers`` workers: it chose ``to_batch`` on ``to_workers`` (``mode`` ""
    when the group stays).  ``goodput``: the predicted goodput (B0-equivalent samples/s) of the
    current ``(B, W)`` and of the chosen one; ``alternatives``: ``(B, W, goodput)`` of the best batch
    at every W; ``gain_s``/``cost_s``: what the best resize would save over the remaining budget and
    what it costs; ``reason``: all of it in words (trainers/policies/goodput.py)."""

    kind: ClassVar[str] = "goodput_decision"
    step: int
    batch: int
    workers: int
    to_batch: int
    to_workers: int
    mode: ResizeMode
    goodput: float
    chosen_goodput: float
    b_noise: float | None
    gain_s: float
    cost_s: float
    alternatives: tuple[tuple[int, int, float], ...]
    reason: str

    @property
    def changes(self) -> bool:
        """B or W changes."""
        return (self.to_batch, self.to_workers) != (self.batch, self.workers)


@dataclass(frozen=True, kw_only=True)
class NewGroupReady(Event):
    """A group started early (overlapping resize) is set up and waits for the handover."""

    kind: ClassVar[str] = "new_group_ready"
    phase: int


@dataclass(frozen=True, kw_only=True)
class CheckpointSaved(Event):
    """Rank 0 wrote a checkpoint (``resize_to`` > 0: the last one before a resize)."""

    kind: ClassVar[str] = "checkpoint"
    step: int
    resize_to: int = 0
    path: str = ""  # where it was written (a folder or an object-store URI): its MLflow LoggedModel refers to it


@dataclass(frozen=True, kw_only=True)
class ResizeCheckpoint(Event):
    """The group ended at its last checkpoint, for the group of ``resize_to`` workers."""

    kind: ClassVar[str] = "resize_checkpoint"
    step: int
    resize_to: int


@dataclass(frozen=True, kw_only=True)
class AutoWarmupEnd(Event):
    """The automatic warmup stopped growing the learning rate (trainers/policies/schedules.py)."""

    kind: ClassVar[str] = "auto_warmup_end"
    step: int
    peak_lr: float
    reason: str


@dataclass(frozen=True, kw_only=True)
class WorkerWarning(Event):
    """Something the user should know (a corrupt checkpoint skipped, an older one used)."""

    kind: ClassVar[str] = "warning"
    message: str


@dataclass(frozen=True, kw_only=True)
class Finished(Event):
    """Training reached ``train.epochs``."""

    kind: ClassVar[str] = "finished"
    step: int


@dataclass(frozen=True, kw_only=True)
class Stopped(Event):
    """The driver asked the run to stop; it did, at a checkpoint."""

    kind: ClassVar[str] = "stopped"
    step: int


@dataclass(frozen=True, kw_only=True)
class Diverged(Event):
    """The global batch's loss at ``step`` was not finite (every rank saw the same all-reduced
    value): the group stopped before the optimizer step, so the newest checkpoint (``checkpoint``,
    None if there is none) holds the last finite state."""

    kind: ClassVar[str] = "diverged"
    step: int
    value: float
    checkpoint: str | None = None
    rollbacks: int = 0  # rollbacks done before this (train.on_nonfinite: rollback)

    @property
    def message(self) -> str:
        kept = (
            f"the last finite checkpoint is {self.checkpoint}" if self.checkpoint else "no checkpoint was written yet"
        )
        after = f" after {self.rollbacks} rollback(s) (train.max_rollbacks)" if self.rollbacks else ""
        return (
            f"training diverged at step {self.step}{after}: train/loss = {self.value}; {kept}; lower "
            f"optimizer.lr or lengthen the warmup"
        )


@dataclass(frozen=True, kw_only=True)
class CheckpointQuarantined(Event):
    """Rank 0 met a damaged checkpoint on restore (``reason``), restored an older one and moved
    the damaged one from ``path`` to ``moved_to`` (trainers/loop/checkpoint.py)."""

    kind: ClassVar[str] = "checkpoint_quarantined"
    path: str
    reason: str
    moved_to: str


@dataclass(frozen=True, kw_only=True)
class WorkloadFailed(Event):
    """The user's own code (a dataset, a model, a loss) raised on a worker: ``where`` is its
    innermost frame in the user's files (``my_data.py:42 in __getitem__``), ``error`` the exception
    in one line, ``traceback`` the whole of it.  ``deterministic``: an error that a restart would
    meet again (not an ``OSError``, ``TimeoutError`` or ``MemoryError``), so the group is not
    restarted for it (trainers/link/failure.py)."""

    kind: ClassVar[str] = "workload_failed"
    rank: int
    phase: int
    where: str
    error: str
    traceback: str
    deterministic: bool
    resumable: bool = False  # what the run reads from did not answer (trainers/errors.EndsRun): resume once it does

    @property
    def signature(self) -> tuple[str, str]:
        """The same error again (after a restart): the same place and exception type."""
        return self.where, self.error.split(":", 1)[0]

    @property
    def message(self) -> str:
        return f"{self.where}: {self.error}"


@dataclass(frozen=True, kw_only=True)
class StorageFailed(Event):
    """Rank 0 could not write the checkpoint of ``step`` because its storage is full, over its
    quota or read-only (``trainers/loop/storage.py StorageFull``): every rank ended the group at
    once, without a restart (a retry would write into the same disk).  ``message`` says which path,
    why and the space free there; the newest intact checkpoint is ``checkpoint`` (None: none yet)."""

    kind: ClassVar[str] = "storage_failed"
    step: int
    path: str
    code: int
    free: int | None
    message: str
    fix: str
    checkpoint: str | None = None


@dataclass(frozen=True, kw_only=True)
class RolledBack(Event):
    """``train.on_nonfinite: rollback``: the loss at ``step`` was ``value`` (not finite); the group
    reloaded ``checkpoint`` (step ``to_step``), the learning rate is now ``lr_factor`` times the
    policies' (``trainers/loop/rollback.py``), and training goes on.  ``rollbacks``: how many so far."""

    kind: ClassVar[str] = "rolled_back"
    step: int
    value: float
    checkpoint: str
    to_step: int
    rollbacks: int
    lr_factor: float

    @property
    def message(self) -> str:
        return (
            f"non-finite loss {self.value} at step {self.step}: rolled back to step {self.to_step} "
            f"({self.checkpoint}), learning rate x{self.lr_factor:g} (rollback {self.rollbacks})"
        )


# --------------------------------------------------------------------------- answers


@dataclass(frozen=True)
class PushAnswer:
    """The monitor's answer to a push: ``stop`` the run; every record up to step ``acked`` is in
    MLflow (-1: none yet); ``handover``: the new group is ready, checkpoint and end this one;
    ``judged``: the driver has judged the records up to that step (a search's pruner; -1: none yet);
    ``to``: with ``handover``, the workers of the group that takes over."""

    stop: bool = False
    acked: int = -1
    handover: bool = False
    judged: int = -1
    to: int = 0


@dataclass(frozen=True)
class ResizeAnswer:
    """The monitor's answer to a batch change (or to goodput's periodic question): the workers the
    group must have now (0: keep it) and how to get there; ``batch``: the global batch goodput chose
    (0: keep B)."""

    workers: int = 0
    mode: ResizeMode = ""
    batch: int = 0

    @property
    def overlap(self) -> bool:
        return self.mode == "overlap"


@dataclass(frozen=True)
class HandoverAnswer:
    """For a group started early: restore ``path`` (the old group's last checkpoint), give up
    (``cancel``: the resize was called off), or neither yet (keep waiting)."""

    path: str | None = None
    cancel: bool = False

    @property
    def decided(self) -> bool:
        return self.cancel or self.path is not None


# --------------------------------------------------------------------------- the monitor's resize


@dataclass
class Resize:
    """A resize the monitor decided for the running group, from the decision to the handover.

    ``step``/``time``: when it was decided; ``ready``: the new group may take over (at once with a
    restart); ``path``/``handover_step``/``handover_time``: the old group's last checkpoint."""

    from_workers: int
    to: int
    mode: ResizeMode
    step: int
    time: float
    ready: bool
    path: str | None = None
    handover_step: int | None = None
    handover_time: float | None = None
