"""Rank 0's live channel to the driver.

The driver creates one small named Ray actor per run (the monitor).  Rank 0
buffers (step, metrics, time) records and pushes them about every ``train.push_every_s``; the push answers
with the driver's decision (``{"stop": bool}``) which rank 0 reads at the next
flush, so the training loop never waits on the driver.  Other ranks do not talk
to the monitor; the loop broadcasts rank 0's decision to them.
"""

from __future__ import annotations

import time
from typing import Any

Record = tuple[int, dict[str, float], float]  # (step, metrics, wall time the step ended)


class Reporter:
    def __init__(self, monitor_name: str | None, namespace: str | None, enabled: bool):
        self._handle = None
        if enabled and monitor_name:
            import ray

            self._handle = ray.get_actor(monitor_name, namespace=namespace)
        self._records: list[Record] = []
        # Records the driver has not yet confirmed it logged (and the newest one): they ride in
        # each checkpoint, so a driver killed before logging them gets them again on resume.
        self._unacked: list[Record] = []
        self._events: list[dict[str, Any]] = []
        self._pending = None
        self._stop = False
        self._handover = False

    def log(self, step: int, metrics: dict[str, float], when: float | None = None) -> None:
        """Buffer a step's metrics; ``when`` (default: now) becomes the rows' MLflow timestamp."""
        if self._handle is not None:
            record = (step, metrics, time.time() if when is None else when)
            self._records.append(record)
            self._unacked.append(record)

    def pending(self) -> list[list]:
        """Unconfirmed records as plain lists (checkpoint-safe)."""
        return [[s, dict(m), t] for s, m, t in self._unacked]

    def replay(self, records: list[list]) -> None:
        """Send records restored from a checkpoint again; the driver drops what it already has."""
        for s, m, *when in records:  # checkpoints written before records carried their time have none
            self.log(int(s), {k: float(v) for k, v in m.items()}, float(when[0]) if when else None)

    def _answer(self, decision: dict) -> None:
        self._stop = bool(decision.get("stop", False)) or self._stop
        self._handover = bool(decision.get("handover", False))
        acked = decision.get("acked", -1)
        if self._unacked and acked >= 0:
            # The newest record stays even once logged: restored with a checkpoint, it gives the
            # driver's piecewise metrics (orchestrator/tracking.py) the point where training resumes.
            self._unacked = [r for r in self._unacked if r[0] > acked] or self._unacked[-1:]

    def event(self, kind: str, **data: Any) -> None:
        if self._handle is not None:
            self._events.append({"kind": kind, "time": time.time(), **data})

    def ask_resize(self, step: int, batch_size: int, workers: int) -> tuple[int, bool]:
        """The batch changed: (workers the driver wants now, 0 = keep the group; overlap?)."""
        if self._handle is None:
            return 0, False
        import ray

        self.flush()
        d = ray.get(self._handle.on_batch_change.remote(step, batch_size, workers))
        return int(d["workers"]), d["mode"] == "overlap"

    @property
    def handover(self) -> bool:
        """The new group is ready: checkpoint and end this one (an overlapping resize)."""
        return self._handover

    def handed_over(self, phase: int, step: int, path: str) -> None:
        if self._handle is not None:
            import ray

            ray.get(self._handle.handed_over.remote(phase, step, path))

    def await_handover(self, phase: int, poll_s: float = 0.02) -> str | None:
        """A new group started early: say it is ready, then wait for the old group's last
        checkpoint; its path, or None when the resize was called off."""
        import ray

        ray.get(self._handle.ready.remote(phase))
        while True:
            answer = ray.get(self._handle.handover.remote(phase))
            if answer:
                return answer.get("path")
            time.sleep(poll_s)

    def flush(self, wait: bool = False) -> bool:
        """Send what is buffered; return the latest stop decision known to rank 0."""
        if self._handle is None:
            return False
        import ray

        if self._pending is not None:
            self._answer(ray.get(self._pending))
            self._pending = None
        if self._records or self._events or wait:
            self._pending = self._handle.push.remote(self._records, self._events)
            self._records, self._events = [], []
            if wait:
                self._answer(ray.get(self._pending))
                self._pending = None
        return self._stop
