"""The driver's live channel to a running phase: one small named Ray actor per run.

Rank 0 pushes (step, metrics) records and events; the driver drains them to log
to MLflow and move the progress bar, and may ask the run to stop (the answer to
rank 0's next push).  It needs no CPU of its own.
"""

from __future__ import annotations

from typing import Any

import ray


@ray.remote(num_cpus=0)
class Monitor:
    def __init__(self, resize_policy: Any = None, max_local_batch: int = 1, min_workers: int = 1,
                 max_workers: int = 1) -> None:
        self._resize = resize_policy
        self._limits = (max_local_batch, min_workers, max_workers)
        self.resize_to = 0
        self._records: list[tuple[int, dict[str, float]]] = []
        self._events: list[dict[str, Any]] = []
        self._stop = False
        self._acked = -1

    def push(self, records: list, events: list) -> dict[str, bool]:
        self._records.extend(records)
        self._events.extend(events)
        return {"stop": self._stop, "acked": self._acked}

    def ack(self, step: int) -> None:
        """The driver has logged every record up to ``step``."""
        self._acked = max(self._acked, step)

    def drain(self) -> tuple[list, list]:
        records, events = self._records, self._events
        self._records, self._events = [], []
        return records, events

    def on_batch_change(self, step: int, batch_size: int, workers: int) -> int:
        """Rank 0 reports a new global batch; answer the worker count to restart with (0 = keep)."""
        if self._resize is None:
            return 0
        max_local, lo, hi = self._limits
        d = self._resize.decide(batch_size, max_local, workers, lo, hi)
        self._events.append({"kind": "resize_decision", "step": step, "batch": batch_size,
                             "workers": getattr(d, "workers", workers), "reason": d.reason})
        self.resize_to = d.workers if d else 0
        return self.resize_to

    def get_resize_to(self) -> int:
        return self.resize_to

    def request_stop(self) -> None:
        self._stop = True
