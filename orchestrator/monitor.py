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
    def __init__(self) -> None:
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

    def request_stop(self) -> None:
        self._stop = True
