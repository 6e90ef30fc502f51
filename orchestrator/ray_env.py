"""Starting (or joining) Ray for a training run or a search, with Ray's own noise and
background CPU kept down (this machine's cores are the training's)."""

from __future__ import annotations

import logging
import os
from typing import Any


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
    if not verbose:
        for name in ("ray", "ray.train", "ray.tune", "ray.data"):
            logging.getLogger(name).setLevel(logging.ERROR)
    return True
