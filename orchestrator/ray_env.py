"""Starting (or joining) Ray for a training run or a search, with Ray's own noise and
background CPU kept down (this machine's cores are the training's)."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Iterator
from typing import Any

_term_as_interrupt = False  # inside terminate_as_interrupt(): SIGTERM raises KeyboardInterrupt


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """Within this block SIGTERM (``ray job stop``, ``kill``, a scheduler) stops the driver as Ctrl-C
    does: ``KeyboardInterrupt``, so the run ends KILLED with its message and Ray is shut down.

    ``ray.init`` installs its own SIGTERM handler (``sys.exit``: the driver then dies in teardown,
    without a status message); :func:`ensure_ray` puts this one back while the block is active.
    Outside the main thread (where Python cannot set handlers) it does nothing."""
    global _term_as_interrupt
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGTERM, _raise_interrupt)
    _term_as_interrupt = True
    try:
        yield
    finally:
        _term_as_interrupt = False
        signal.signal(signal.SIGTERM, old)


def quiet_ray_env(verbose: bool) -> None:
    """Set before Ray is imported/started: keep Ray's own log noise off the terminal."""
    os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
    if not verbose:
        os.environ.setdefault("RAY_DEDUP_LOGS", "1")
        os.environ.setdefault("RAY_TRAIN_ENABLE_STATE_TRACKING", "0")
        os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
        os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
        os.environ.setdefault("PYTHONWARNINGS", "ignore::DeprecationWarning,ignore::FutureWarning")


def ensure_ray(verbose: bool = False, num_cpus: int | None = None,
               runtime_env: dict[str, Any] | None = None) -> bool:
    """Join the cluster in ``RAY_ADDRESS`` (e.g. under ``ray job submit``) or start a local one.

    ``runtime_env`` (the user's code, orchestrator/code.py) becomes the job's runtime environment
    of a local cluster started here, so every actor (a search's trial actors too) inherits it.
    Returns True when this call started Ray (so the caller should shut it down)."""
    quiet_ray_env(verbose)
    import ray

    if ray.is_initialized():
        return False
    level = logging.INFO if verbose else logging.ERROR
    kwargs: dict[str, Any] = dict(logging_level=level, log_to_driver=verbose, configure_logging=True)
    if os.environ.get("RAY_ADDRESS"):
        ray.init(**kwargs)
    else:
        # A local cluster we start ourselves has no node that a cloud provider could preempt:
        # Ray Train's preemption watcher only costs training throughput there (~10% on 2 cores).
        os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")
        # Without a dashboard nothing reads Ray's own metrics: their collection is CPU for nothing.
        os.environ.setdefault("RAY_enable_metrics_collection", "0")
        if not verbose:
            # Ray's log monitor re-lists the session's log folder ten times a second; each fit()
            # adds ~18 files, so its CPU grows run after run (a search on one Ray: 1% of this
            # machine after 6 runs).  Worker logs are not streamed to us here: list every 5 s.
            os.environ.setdefault("RAY_LOG_MONITOR_MANY_FILES_THRESHOLD", "0")
            os.environ.setdefault("LOG_NAME_UPDATE_INTERVAL_S", "5")
        if runtime_env:
            kwargs["runtime_env"] = runtime_env
        ray.init(num_cpus=num_cpus, include_dashboard=False, **kwargs)
    if _term_as_interrupt and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _raise_interrupt)  # ray.init replaced it
    if not verbose:
        for name in ("ray", "ray.train", "ray.tune", "ray.data"):
            logging.getLogger(name).setLevel(logging.ERROR)
    return True
