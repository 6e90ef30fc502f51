"""Per-step metric series reduced to the points where they bend, each (metric, step) once.

A :data:`PIECEWISE` metric (constant for long stretches, or growing by the same amount every step)
is kept only where a constant stretch or slope begins and ends, plus its newest point when asked
(:meth:`SeriesCompressor.release`): the lines MLflow draws between the points pass through every
step's value.  Every other metric keeps every step.  Plain Python, no MLflow: the tracker
(orchestrator/record/run_tracker.py) writes the points this returns."""

from __future__ import annotations

from collections import defaultdict

from trainers.link import metrics as M

# Metrics whose per-step series is piecewise linear, with the tolerance a dropped point may miss the
# line by, relative to its value.
PIECEWISE = {
    M.LR: 0.0,
    M.WEIGHT_DECAY: 0.0,
    M.MF: 0.0,
    M.BATCH_GLOBAL: 0.0,
    M.BATCH_SAMPLES: 0.0,
    M.BATCH_LOCAL: 0.0,
    M.BATCH_ACCUM_STEPS: 0.0,
    M.WORKERS: 0.0,
    M.SAMPLES_SEEN: 0.0,
    M.EPOCH: 1e-12,
}
PIECEWISE.update({M.COMBINE_SYNCS: 0.0, M.COMBINE_BYTES_SENT: 0.0, M.COMBINE_BYTES_SAVED: 0.0})  # change at syncs
# dmsgd / decentlam: constant per step for a fixed W and model (the consensus distance keeps every step)
PIECEWISE.update({M.COMBINE_BYTES_PER_STEP: 0.0, M.COMBINE_ALLREDUCE_BYTES_PER_STEP: 0.0})
# Of those, the step functions (a value kept for a stretch, then a jump): a jump's first point is
# logged at once, not held, so every step up to what the driver acks can be read back exactly after
# the driver dies (a resumed run's timeline: orchestrator/record/history.py).
STEPWISE = frozenset({M.BATCH_GLOBAL, M.WORKERS, M.BATCH_SAMPLES})

Point = tuple[str, int, float, float]  # (metric, step, value, the wall time its step ran)


class Segment:
    """The open segment of one piecewise metric: its last logged point, the first and the last
    point since then that were held back because they lie on one line with it."""

    __slots__ = ("anchor", "first", "held")

    def __init__(self, anchor: tuple[int, float] | None = None):
        self.anchor = anchor
        self.first: tuple[int, float] | None = None
        self.held: tuple[int, float] | None = None

    def on_line(self, step: int, value: float, tol: float) -> bool:
        (sa, va), (s1, v1) = self.anchor, self.first
        if tol == 0.0:  # exact for constants and integer-valued series (no division)
            return (value - va) * (s1 - sa) == (v1 - va) * (step - sa)
        return abs(va + (v1 - va) * (step - sa) / (s1 - sa) - value) <= tol * max(1.0, abs(value))

    def add(self, step: int, value: float, tol: float, stepwise: bool = False) -> list[tuple[int, float]]:
        """The points to log now for the next point of the series (a step seen before is ignored);
        ``stepwise``: a jump's first point is logged now too (see :data:`STEPWISE`)."""
        last = self.held or self.anchor
        if last is not None and step <= last[0]:
            return []
        if self.anchor is None:
            self.anchor = (step, value)
            return [self.anchor]
        if self.first is None or self.on_line(step, value, tol):
            jump = stepwise and self.first is None and value != self.anchor[1]
            self.first = self.first or (step, value)
            self.held = (step, value)
            return [self.held] if jump else []
        out = [self.held]
        if stepwise and value != self.held[1]:
            out.append((step, value))
        self.anchor, self.first, self.held = self.held, (step, value), (step, value)
        return out

    def release(self) -> list[tuple[int, float]]:
        """Log the held point now (end of a run, or the UI should catch up); the segment restarts there."""
        if self.held is None:
            return []
        out = [self.held]
        self.anchor, self.first, self.held = self.held, None, None
        return out


class SeriesCompressor:
    """Reduce per-step metric records to the points that keep every series exact, each once.

    :attr:`history`: every point kept so far, per metric (with a resumed run's, :meth:`restore`)."""

    def __init__(self) -> None:
        self.history: dict[str, list[tuple[int, float]]] = defaultdict(list)
        self._kept: set[tuple[str, int]] = set()
        self._segments: dict[str, Segment] = {}  # piecewise metric -> its open segment
        self._when: dict[int, float] = {}  # step -> when it ran, for the steps a point may still be made of
        self.newest_step = -1  # the newest step of the records given (-1: none yet)

    def restore(self, history: dict[str, list[tuple[int, float]]]) -> None:
        """What a resumed run already holds: none of it is kept again, and each piecewise series
        goes on from its newest point."""
        for key, points in history.items():
            for step, value in points:
                self._kept.add((key, step))
                self.history[key].append((step, value))
        for key in set(PIECEWISE) & set(self.history):
            self.history[key].sort()
            self._segments[key] = Segment(self.history[key][-1])

    def add(self, records: list[tuple], now: float) -> list[Point]:
        """The points to log for ``records``, each ``(step, metrics, time)``: ``time`` is when the
        step ran (a point's time; ``now`` for a record without one).  A piecewise point may be held
        back and come out with a later record's points or at :meth:`release`."""
        points: list[tuple[str, int, float]] = []
        for step, metrics, *when in records:
            self.newest_step = max(self.newest_step, step)
            if when:
                self._when[step] = when[0]
            for key, value in metrics.items():
                value = float(value)
                if (key, step) in self._kept:
                    continue
                tol = PIECEWISE.get(key)
                if tol is None:
                    points.append((key, step, value))
                else:
                    seg = self._segments.get(key) or self._segments.setdefault(key, Segment())
                    points += [(key, *p) for p in seg.add(step, value, tol, key in STEPWISE)]
        return self._keep(points, now)

    def release(self, now: float) -> list[Point]:
        """Every piecewise series' held point (its newest), to log now; its segment restarts there."""
        return self._keep([(key, *p) for key, seg in self._segments.items() for p in seg.release()], now)

    def _keep(self, points: list[tuple[str, int, float]], now: float) -> list[Point]:
        out = []
        for key, step, value in points:
            if (key, step) in self._kept:
                continue
            self._kept.add((key, step))
            self.history[key].append((step, value))
            out.append((key, step, value, self._when.get(step, now)))
        # keep the times of the steps a held point may still be made of (each segment's newest)
        oldest = min([seg.held[0] for seg in self._segments.values() if seg.held] + [self.newest_step])
        if self._when and min(self._when) < oldest:
            self._when = {s: t for s, t in self._when.items() if s >= oldest}
        return out

    def last_step(self) -> int:
        """The newest step of any point kept (0: none)."""
        return max((s for _, s in self._kept), default=0)

    def last_value(self, key: str, default: float = 0.0) -> float:
        """The value of ``key``'s newest point kept (``default``: none)."""
        points = self.history.get(key)
        return max(points)[1] if points else default

    def held_times(self) -> dict[int, float]:
        """The step times still kept (those a held point may need)."""
        return dict(self._when)
