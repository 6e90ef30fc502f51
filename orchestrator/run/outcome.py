"""How a training run ends: its terminal states, and what each one means to a person.

The driver's loop (orchestrator/run/phases.py) steps its states until one of these; the entry point
(orchestrator/run/runner.py) closes the run with it.  Each carries its cause::

    Finished        the last group reached train.epochs                       FINISHED  0
    Stopped         asked to stop before its planned end (a pruned trial,     FINISHED  0
                    request_stop): it stopped at a checkpoint
    Diverged        a non-finite loss (the last finite checkpoint kept)       FAILED    1
    UserCodeFailed  the user's code raised on a worker, not to be retried     FAILED    1
    OutOfStorage    a checkpoint's storage, or the driver's disk, is full     FAILED    1
    TrackingGone    the tracking server stayed away past its timeout          FAILED    1  (MLflow: RUNNING)
    CapacityLost    fewer than scaling.min_workers fit the live nodes         FAILED    1
    RayTrainFailed  fit() raised an error not the user's (max_failures spent) FAILED    1  (raised on)
    DriverFailed    the driver's own code raised                              FAILED    1  (raised on)
    Interrupted     Ctrl-C or SIGTERM                                         KILLED  130  (RunInterrupted)
    DriverDrained   the driver's own node is being drained (a preemption      KILLED   75  (resumable)
                    notice): the group stopped at a checkpoint

:func:`ending` is the one place that turns a terminal state into the MLflow status, the CLI's exit
status and the one line printed and tagged ``elastic.failure`` (a drain's: ``elastic.drain_reason``).
Two rules live here too, once each: the resume command (:meth:`Resume.command`) and which user
error ends a run (:func:`is_fatal`).  See ``docs/architecture.md``.
"""

from __future__ import annotations

import time
import traceback as tb
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from orchestrator.config.command import cli
from orchestrator.config.uris import absolute_tracking_uri, redact_uri
from trainers.errors import one_line
from trainers.link import messages as msg
from trainers.link import tags as T
from trainers.loop.storage import StorageFull

EXIT_OK, EXIT_FAILED, EXIT_INTERRUPTED = 0, 1, 130
EXIT_DRAINED = 75  # EX_TEMPFAIL: try again (a job system's retry resumes the run by its key)
TRACEBACK_ARTIFACT = "failure/traceback.txt"


# --------------------------------------------------------------------------- the rules


@dataclass(frozen=True)
class Resume:
    """What continuing a run takes: its MLflow run id, its tracking store, and whether its factories
    were sent by value (only Python has them then: ``fit(resume=...)``)."""

    run_id: str
    tracking_uri: str = ""
    from_python: bool = False

    def command(self, store: bool = True) -> str:
        """The command that continues the run, as a person types it: the CLI's ``resume`` (with the
        tracking store, any credential masked, unless ``store`` is False), or ``fit(resume=...)``."""
        if self.from_python:
            return f"fit(resume={self.run_id!r}, ...) with the same functions"
        line = f"{cli()} resume {self.run_id}"
        if store and self.tracking_uri:
            line += f" --tracking-uri {redact_uri(absolute_tracking_uri(self.tracking_uri))}"
        return line


def is_fatal(ev: msg.WorkloadFailed, earlier: Iterable[msg.WorkloadFailed]) -> bool:
    """Whether the user's error ``ev`` ends the run instead of a restart: one a restart would meet
    again (``deterministic``), or the same error (place and type) met before, among ``earlier``."""
    return ev.deterministic or any(e.signature == ev.signature for e in earlier)


# --------------------------------------------------------------------------- the terminal states


class Outcome:
    """A terminal state of the driver's loop: how the run ended, and why."""


@dataclass(frozen=True)
class Finished(Outcome):
    """The last group's ``fit()`` returned at the run's planned end."""

    result: Any = None


@dataclass(frozen=True)
class Stopped(Outcome):
    """Asked to stop before its planned end (a pruned search trial, ``request_stop``): the group
    stopped at a checkpoint; what it trained is kept."""

    result: Any = None


@dataclass(frozen=True)
class Diverged(Outcome):
    """The loss went non-finite (``train.on_nonfinite: stop``, or rollbacks spent)."""

    event: msg.Diverged


@dataclass(frozen=True)
class UserCodeFailed(Outcome):
    """The user's code raised on a worker (trainers/link/failure.py): an error :func:`is_fatal`
    says a restart would meet again, or the one met last when Ray Train gave up."""

    event: msg.WorkloadFailed


@dataclass(frozen=True)
class OutOfStorage(Outcome):
    """A storage the run writes to is full, over its quota or read-only: the checkpoints' (``full``
    is rank 0's event: the group ended without a restart) or the driver's own (``full`` is the
    error: ``elastic_run.json``, MLflow's artifacts)."""

    full: msg.StorageFailed | StorageFull


@dataclass(frozen=True)
class TrackingGone(Outcome):
    """The tracking server did not answer for ``tracking.outage_timeout_s`` (or went away while
    the run was closed): the group stopped at a checkpoint whose records a resume logs.
    ``report``: the tracker's account (what was not recorded, the checkpoints, how to go on)."""

    lost: Exception
    report: str


@dataclass(frozen=True)
class CapacityLost(Outcome):
    """Fewer than ``scaling.min_workers`` fit the live nodes for ``scaling.capacity_timeout_s``
    (orchestrator/run/nodes.py says so in ``message``); the checkpoints are kept."""

    message: str


@dataclass(frozen=True)
class RayTrainFailed(Outcome):
    """The last group's ``fit()`` raised an error that is not the user's: Ray Train spent
    ``scaling.max_failures``, or the group could not start.  The error goes on up."""

    error: BaseException


@dataclass(frozen=True)
class DriverFailed(Outcome):
    """The driver itself raised (a bug, the monitor actor lost).  The error goes on up."""

    error: BaseException


@dataclass(frozen=True)
class Interrupted(Outcome):
    """Ctrl-C or SIGTERM (``ray job stop``): the group was asked to stop at a checkpoint.
    ``steps``: the newest step logged; ``checkpoint``: the newest checkpoint's step (None: none)."""

    steps: int
    checkpoint: int | None


@dataclass(frozen=True)
class DriverDrained(Outcome):
    """The node the driver runs on is being drained (``deadline``: epoch seconds, None: none given):
    the group was asked to stop at a checkpoint.  ``steps``: the newest step logged;
    ``checkpoint``: the newest checkpoint's step (None: none)."""

    node: str
    deadline: float | None
    steps: int
    checkpoint: int | None


# --------------------------------------------------------------------------- what each means


@dataclass(frozen=True)
class Ending:
    """What a terminal state means: the MLflow run's status, the CLI's exit status, the one line
    printed and tagged ``tag`` (None: none), and the traceback logged as
    :data:`TRACEBACK_ARTIFACT` (None: none)."""

    status: str
    exit_code: int
    message: str | None = None
    traceback: str | None = None
    tag: str = T.FAILURE  # a drain of the driver's node: T.DRAIN_REASON


def ending(end: Outcome, resume: Resume) -> Ending:
    """The one mapping from a terminal state to its :class:`Ending`; ``resume`` says how the run
    continues (in the messages of the ends a resume can cure)."""
    match end:
        case Finished() | Stopped():
            return Ending("FINISHED", EXIT_OK)
        case Diverged(event=ev):  # no final model; the checkpoints kept (the last finite one named)
            return Ending("FAILED", EXIT_FAILED, ev.message)
        case UserCodeFailed(event=ev) if ev.resumable:  # a store that did not answer: the checkpoints kept
            return Ending(
                "FAILED",
                EXIT_FAILED,
                f"{ev.message} (rank {ev.rank}; not retried: a restart would meet it again): {resume.command()}",
                ev.traceback,
            )
        case UserCodeFailed(event=ev):
            return Ending("FAILED", EXIT_FAILED, user_error_message(ev), ev.traceback)
        case OutOfStorage(full=msg.StorageFailed() as ev):
            kept = f"the newest checkpoint is {ev.checkpoint}" if ev.checkpoint else "no checkpoint was written yet"
            return Ending(
                "FAILED",
                EXIT_FAILED,
                f"{ev.message}; training stopped at step {ev.step} without restarting (a restart would "
                f"write into the same storage); {kept}; {ev.fix}, then: {resume.command()}",
            )
        case OutOfStorage(full=StorageFull() as err):
            return Ending("FAILED", EXIT_FAILED, f"{err.message}; {err.fix}, then: {resume.command()}")
        case TrackingGone(report=report):  # the tracker leaves the MLflow run RUNNING, for the resume
            return Ending("FAILED", EXIT_FAILED, report)
        case CapacityLost(message=message):
            return Ending("FAILED", EXIT_FAILED, message)
        case RayTrainFailed(error=e) | DriverFailed(error=e):
            return Ending(
                "FAILED", EXIT_FAILED, one_line(e, 300), "".join(tb.format_exception(type(e), e, e.__traceback__))
            )
        case Interrupted(steps=steps, checkpoint=None):
            return Ending(
                "KILLED",
                EXIT_INTERRUPTED,
                f"stopped by Ctrl-C or SIGTERM after step {steps}, before its "
                "first checkpoint: nothing to resume; train it anew",
            )
        case Interrupted(steps=steps, checkpoint=step):
            how = ("from Python: " if resume.from_python else "") + resume.command(store=False)
            return Ending(
                "KILLED",
                EXIT_INTERRUPTED,
                f"stopped by Ctrl-C or SIGTERM after step {steps}; it continues "
                f"from its checkpoint at step {step} with: {how}",
            )
        case DriverDrained():
            return Ending("KILLED", EXIT_DRAINED, drained_message(end, resume), tag=T.DRAIN_REASON)
    raise TypeError(f"not a terminal state: {end!r}")


def drained_message(end: DriverDrained, resume: Resume) -> str:
    """One line for a run whose driver's node was drained: the node, the notice, where it stopped, how it goes on."""
    left = "no deadline" if end.deadline is None else f"{max(0.0, end.deadline - time.time()):.0f} s left"
    head = f"the driver's node {end.node[:8]} is being drained (preemption, {left})"
    if end.checkpoint is None:
        return f"{head}: stopped after step {end.steps}, before its first checkpoint: nothing to resume; train it anew"
    how = ("from Python: " if resume.from_python else "") + resume.command(store=False)
    return (
        f"{head}: stopped after step {end.steps} at its checkpoint at step {end.checkpoint}; "
        f"resume it from another node with: {how}"
    )


def user_error_message(ev: msg.WorkloadFailed) -> str:
    """One line for a run the user's code ended: where, what, why it was not retried, where the
    traceback is."""
    why = "not retried: a restart would meet it again" if ev.deterministic else "met again after a restart"
    return f"{ev.message} (rank {ev.rank}; {why}; full traceback: artifact {TRACEBACK_ARTIFACT} of the run)"
