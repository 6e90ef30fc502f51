"""A stop (Ctrl-C, ``ray job stop``'s SIGTERM, a scheduler's) as a ``KeyboardInterrupt`` in the
drivers (the training CLI, the search), and the writes a stop must not cut in half.

Python runs a signal's handler between any two bytecodes of the main thread.  A KeyboardInterrupt
raised inside an MLflow call can leave that call's SQL transaction open (MLflow rolls back on an
``Exception`` only): the store's SQLite file stays locked, so the run's own last writes (its KILLED
status, the checkpoint it stopped at) fail with "database is locked" and MLflow prints their
tracebacks.  A LoggedModel cut between its creation and its finalization stays PENDING for ever.
Inside :func:`deferred_interrupts` a stop waits for the write to end and is raised there; a second
stop while one waits is raised at once (a store that hangs cannot hold the driver)."""

from __future__ import annotations

import contextlib
import functools
import inspect
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

T = TypeVar("T")

_active = False  # inside terminate_as_interrupt(): SIGTERM and SIGINT raise KeyboardInterrupt
_pending = False  # a stop came: its KeyboardInterrupt may have been lost (see raise_pending_interrupt)
_writing = 0  # how deep the main thread is in deferred_interrupts()
_deferred = False  # a stop came while writing: raised when the outermost write ends

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_signals: tuple[signal.Signals, ...] = ()  # the ones terminate_as_interrupt() handles now


def _on_stop(signum: int, frame: Any) -> None:
    global _pending, _deferred
    if _writing and not _deferred:
        _deferred = True
        return
    _pending = True
    raise KeyboardInterrupt


def active() -> bool:
    """Whether :func:`terminate_as_interrupt` is in force (in this process's main thread)."""
    return _active and threading.current_thread() is threading.main_thread()


def reinstall() -> None:
    """Put the handler back on SIGTERM where something replaced it (``ray.init`` installs its own:
    ``sys.exit``, with which the driver dies in teardown without a status message)."""
    if active() and signal.SIGTERM in _signals:
        signal.signal(signal.SIGTERM, _on_stop)


@contextlib.contextmanager
def through_ray_init() -> Iterator[None]:
    """Around ``ray.init``, which puts its own SIGTERM handler in at its start (``sys.exit(15)``): a
    SIGTERM while Ray starts or is joined (seconds) exited the driver with status 15 and no word.
    Inside :func:`terminate_as_interrupt` that exit is the stop (a ``KeyboardInterrupt``, as Ctrl-C
    there is), and the stop's handler is back once ``ray.init`` returns or fails."""
    global _pending
    try:
        yield
    except SystemExit as e:
        if not active() or e.code != signal.SIGTERM or signal.SIGTERM not in _signals:
            raise
        _pending = True
        raise KeyboardInterrupt from None
    finally:
        reinstall()


def raise_pending_interrupt() -> None:
    """Raise the KeyboardInterrupt of a stop whose own was lost: one raised inside a weakref callback
    or ``__del__`` (a garbage collection) is printed as "Exception ignored" and dropped, so the stop
    would never reach the run.  The drivers' loops call this at every poll."""
    global _pending
    if _pending:
        _pending = False
        raise KeyboardInterrupt


@contextlib.contextmanager
def deferred_interrupts() -> Iterator[None]:
    """A write the store must see whole: a stop that comes inside is raised when it ends (the
    outermost one, where these nest); a second stop is raised at once.  Outside
    :func:`terminate_as_interrupt`, or off the main thread (where signals never land), it only runs
    the block."""
    global _writing, _deferred, _pending
    if not active():
        yield
        return
    _writing += 1
    try:
        yield
    finally:
        _writing -= 1
        if not _writing and _deferred:
            _deferred, _pending = False, True
            raise KeyboardInterrupt


def _quiet_lost_interrupt(previous: Callable[[Any], None]) -> Callable[[Any], None]:
    """An unraisable hook that drops the "Exception ignored in: ..." report of a stop's
    KeyboardInterrupt lost in a weakref callback or ``__del__``: it is not lost (it is pending, and
    the driver's loop raises it again), and its traceback on the run's stderr reads as a crash.
    Every other unraisable exception goes to the hook that was there."""

    def hook(unraisable: Any) -> None:
        if unraisable.exc_type is KeyboardInterrupt and _pending:
            return
        previous(unraisable)

    return hook


@contextlib.contextmanager
def terminate_as_interrupt(sigterm: bool = True) -> Iterator[None]:
    """Within this block SIGTERM (``ray job stop``, ``kill``, a scheduler) stops the driver as Ctrl-C
    does: ``KeyboardInterrupt``, so the run ends KILLED with its message and Ray is shut down; and
    both wait for the end of a write in :func:`deferred_interrupts`.  ``sigterm=False`` (``fit()``
    in a user's program, whose SIGTERM is the program's own): Ctrl-C only.  Outside the main thread
    (where Python cannot set handlers), or nested in another such block, it does nothing."""
    global _active, _pending, _writing, _deferred, _signals
    if threading.current_thread() is not threading.main_thread() or _active:
        yield
        return
    wanted = STOP_SIGNALS if sigterm else (signal.SIGINT,)
    # a signal the process was started ignoring stays ignored (a shell's background job: SIGINT)
    _signals = tuple(sig for sig in wanted if signal.getsignal(sig) is not signal.SIG_IGN)
    old = {sig: signal.signal(sig, _on_stop) for sig in _signals}
    old_hook = sys.unraisablehook
    sys.unraisablehook = _quiet_lost_interrupt(old_hook)
    _active, _pending, _writing, _deferred = True, False, 0, False
    try:
        yield
    finally:
        _active, _pending, _writing, _deferred, _signals = False, False, 0, False, ()
        for sig, handler in old.items():
            signal.signal(sig, handler)
        sys.unraisablehook = old_hook


_DEFERRING: dict[type, type] = {}  # a class -> its subclass whose public methods defer a stop


def _deferring_method(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        with deferred_interrupts():
            return method(*args, **kwargs)

    return call


def deferring(obj: T) -> T:
    """``obj`` (an ``MlflowClient``, an Optuna storage: a driver's one seam to a store) with every
    public method of its class run in :func:`deferred_interrupts`, so that no stop lands inside a
    store's transaction.  Its class becomes a subclass of the same name (``isinstance`` holds, as
    Optuna's checks of its storages need)."""
    cls = type(obj)
    if cls in _DEFERRING.values():
        return obj
    sub = _DEFERRING.get(cls)
    if sub is None:
        methods = {
            name: _deferring_method(attr)
            for klass in reversed(cls.__mro__)
            for name, attr in vars(klass).items()
            if not name.startswith("_") and inspect.isfunction(attr)
        }
        sub = _DEFERRING[cls] = type(cls.__name__, (cls,), {**methods, "__module__": cls.__module__})
    obj.__class__ = sub
    return obj
