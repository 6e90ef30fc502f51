"""A Ray Train controller callback for a worker that fails: the run's monitor is told at once.

The driver's bar then says the group restarts (orchestrator/run/monitor.py), and Ray's view of the
nodes is re-read before the restarted group is sized (orchestrator/run/reservations.py)."""

from __future__ import annotations

import ray
from ray.train import UserCallback

from orchestrator.run.reservations import refresh
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
        # before Ray Train sizes the restarted group: its view of the nodes may predate a lost one
        refresh(timeout_s=None)
        try:
            ray.get_actor(self.monitor_name, namespace=self.namespace).group_failed.remote(self.phase, message)
        except Exception:  # a notice for the bar never fails the run (no monitor: the run ended)
            pass
