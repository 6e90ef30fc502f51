"""The worker loop's throughput meter and the pace of its pushes to the driver.

Throughput windows run push to push on the wall clock (so the cost of pushing metrics
counts), minus the time set aside for validation and checkpoints:
``samples_per_s = samples / (t_push - t_window_start - t_aside)``.  The steps until the next
push follow from the same window (:func:`push_interval`).  See ``docs/architecture.md``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass


def push_interval(log_every: int, push_every_s: float, steps: int, seconds: float) -> int:
    """Steps until the next push of metrics to the driver: ``push_every_s`` at the pace of the
    last window (``steps`` in ``seconds``), never fewer than ``log_every``, at most 10 000.  Fast
    steps would otherwise push (an actor call that wakes the monitor and, in turn, the driver)
    dozens of times a second for a progress bar that needs a few."""
    if push_every_s <= 0 or steps <= 0 or seconds <= 0:
        return log_every
    return max(log_every, min(10_000, int(push_every_s * steps / seconds)))


@dataclass(frozen=True)
class Reading:
    """One closed window: its throughput and the steps until the next push."""

    samples_per_s: float
    push_interval: int


class ThroughputMeter:
    """Counts samples and steps from one push to the next; :meth:`aside` excludes a block's time."""

    def __init__(self, log_every: int, push_every_s: float, clock: Callable[[], float] = time.perf_counter) -> None:
        self.log_every, self.push_every_s = log_every, push_every_s
        self._clock = clock
        self._samples, self._steps, self._aside = 0, 0, 0.0
        self._start = clock()

    def count(self, samples: int) -> None:
        """One optimizer step of ``samples`` samples."""
        self._samples += samples
        self._steps += 1

    @contextmanager
    def aside(self) -> Iterator[None]:
        """Time spent in the block (validation, a checkpoint) does not count as training."""
        t = self._clock()
        try:
            yield
        finally:
            self._aside += self._clock() - t

    def read(self) -> Reading:
        """Close the window (at a push) and start the next one."""
        now = self._clock()
        busy = max(now - self._start - self._aside, 1e-9)
        reading = Reading(self._samples / busy, push_interval(self.log_every, self.push_every_s, self._steps, busy))
        self._samples, self._steps, self._start, self._aside = 0, 0, now, 0.0
        return reading
