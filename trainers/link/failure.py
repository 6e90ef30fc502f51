"""An exception on a worker, told apart as the user's (raised in the user's own files: a dataset's
``__getitem__``, a model's ``forward``) and sent to the driver as one line with its place.

An error of what the run reads that its own retries could not cure (``trainers/errors.py``
:class:`EndsRun`: a store that stopped answering) is sent the same way, as not retried, its place the
config field it names: the run ends at once with its checkpoints, for a resume.

Such an error is not retried when a restart would meet it again: the worker reports it to the
run's monitor (orchestrator/run/monitor.py) before raising, and the group Ray Train restarts for it
asks the monitor first (:func:`ended_by_user_error`) and returns at once.  See
``docs/architecture.md`` (failures).
"""

from __future__ import annotations

import os
import re
import sys
import sysconfig
import traceback
from typing import Any

from trainers.errors import EndsRun, first_line, one_line
from trainers.link.messages import WorkloadFailed

_PROJECT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The project's own packages: their frames are never the user's.
_OURS = tuple(os.path.join(_PROJECT, p) + os.sep for p in ("trainers", "orchestrator", "search"))
_LIBRARIES = tuple(
    {
        os.path.realpath(p) + os.sep
        for p in (sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib"))
        if p
    }
    | {os.path.realpath(sys.prefix) + os.sep, os.path.realpath(sys.base_prefix) + os.sep}
)
# A frame quoted in the text of an exception re-raised from a DataLoader worker process.
_QUOTED = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)', re.M)
# Errors a restart may not meet again (a file system, a network, memory): Ray Train retries them.
TRANSIENT = (OSError, MemoryError)


def is_user_file(filename: str) -> bool:
    """Whether ``filename`` is the user's code: not this project's packages, not the Python
    installation (standard library, site-packages), not generated (``<string>``, ``<frozen ...>``)."""
    if not filename or filename.startswith("<"):
        return False
    path = os.path.abspath(filename)
    if path.startswith(_OURS) or "site-packages" in path.split(os.sep) or "dist-packages" in path.split(os.sep):
        return False
    return not os.path.realpath(path).startswith(_LIBRARIES)


def _frames(exc: BaseException) -> list[tuple[str, int, str]]:
    """``(file, line, function)`` of ``exc``'s traceback, outermost first, then those quoted in its
    text (a DataLoader worker's exception is re-raised in the loop's process with the original
    traceback as text)."""
    frames = [(f.filename, f.lineno or 0, f.name) for f in traceback.extract_tb(exc.__traceback__)]
    text = str(exc)
    if "Traceback (most recent call last)" in text:
        frames += [(m["file"], int(m["line"]), m["func"]) for m in _QUOTED.finditer(text)]
    return frames


def _one_line(exc: BaseException) -> str:
    """``Type: message`` of the exception; for one re-raised from a DataLoader worker, the
    original's last line (the type and message the user's code raised)."""
    text = str(exc)
    if "Traceback (most recent call last)" in text:
        last = [line for line in text.strip().splitlines() if line.strip()][-1].strip()
        return last[:300]
    return one_line(exc, 300)


def user_error(exc: BaseException, rank: int = 0, phase: int = 0) -> WorkloadFailed | None:
    """The event for ``exc`` when it was raised in the user's code (its innermost frame there
    names the place), None when it was not (ours, a library's, Ray's)."""
    for cause in (exc, exc.__cause__, exc.__context__):
        if cause is None:
            continue
        user = [f for f in _frames(cause) if is_user_file(f[0])]
        if user:
            file, line, func = user[-1]
            text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
            return WorkloadFailed(
                rank=rank,
                phase=phase,
                where=f"{os.path.basename(file)}:{line} in {func}",
                error=_one_line(cause),
                traceback=text,
                deterministic=not isinstance(cause, TRANSIENT),
            )
    return None


def run_ending_error(exc: BaseException, rank: int = 0, phase: int = 0) -> WorkloadFailed | None:
    """The event for ``exc`` when it (or its cause) is an :class:`EndsRun` error: its place is the
    field its one-line message names (``data.root: shard ...``), never retried.  None otherwise."""
    for cause in (exc, exc.__cause__, exc.__context__):
        if not isinstance(cause, EndsRun):
            continue
        text = str(cause)
        if "Traceback (most recent call last)" in text:  # re-raised from a DataLoader process: its last line
            line = [s for s in text.strip().splitlines() if s.strip()][-1].strip()
            line = line.split(": ", 1)[1] if ": " in line else line  # "module.Type: message"
        else:
            line = first_line(text, None)
        where, _, error = line.partition(": ")
        return WorkloadFailed(
            rank=rank,
            phase=phase,
            where=where if error else type(cause).__name__,
            error=(error or where)[:400],
            traceback="".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
            deterministic=True,
            resumable=True,
        )
    return None


def _monitor(runtime: Any) -> Any:
    import ray

    if not runtime.monitor_name:
        return None
    try:
        return ray.get_actor(runtime.monitor_name, namespace=runtime.namespace)
    except ValueError:  # no driver any more
        return None


def report_user_error(exc: BaseException, runtime: Any, rank: int) -> WorkloadFailed | None:
    """Tell the run's monitor about ``exc`` if it is the user's, or one that ends the run
    (:func:`run_ending_error`; waits for the monitor to have it, so the driver knows before Ray
    Train's error reaches it); returns the event sent."""
    event = run_ending_error(exc, rank=rank, phase=runtime.phase) or user_error(exc, rank=rank, phase=runtime.phase)
    monitor = _monitor(runtime) if event is not None else None
    if monitor is not None:
        import ray

        try:
            ray.get(monitor.workload_failed.remote(event), timeout=30)
        except Exception:  # Ray Train's own error still ends the group
            pass
    return event


def ended_by_user_error(runtime: Any) -> bool:
    """Whether an earlier group of this run met a user error that this one would meet again
    (the monitor's verdict): then this group must not train."""
    monitor = _monitor(runtime)
    if monitor is None:
        return False
    import ray

    try:
        return ray.get(monitor.fatal.remote(), timeout=30) is not None
    except Exception:  # a monitor that does not answer: training goes on
        return False
