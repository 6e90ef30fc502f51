"""A Ray Train controller callback that tells the run's monitor (orchestrator/run/monitor.py) at once
when a worker of a group fails, so the driver's bar says the group restarts."""

from __future__ import annotations

import ray
from ray.train import UserCallback

from trainers.errors import one_line


class FailureNotice(UserCallback):
    """Runs in Ray Train's controller: tells the run's monitor when a worker of a phase's group
    raised or died, so the driver shows the group restarting at once (Ray Train restarts it inside
    ``fit()``, and the driver would otherwise only learn of it when the new group reports)."""

    def __init__(self, monitor_name: str, namespace: str | None, phase: int) -> None:
        self.monitor_name, self.namespace, self.phase = monitor_name, namespace, phase

    def after_exception(self, run_context, worker_exceptions) -> None:  # Ray Train's signature
        first = next(iter(worker_exceptions.values()), None) if worker_exceptions else None
        message = one_line(first, 200) if first else "unknown"
        try:
            ray.get_actor(self.monitor_name, namespace=self.namespace).group_failed.remote(self.phase, message)
        except Exception:  # a notice for the bar never fails the run (no monitor: the run ended)
            pass
