"""What a run cost: how long each worker group held its resources, in worker-seconds (and GPU-seconds
where its workers hold GPUs).

A group holds its resources from its ``fit()`` call (Ray Train reserves its placement group then,
and waits for it) until its ``fit()`` returned (the group torn down): :class:`Hold`.  So both groups
count while an overlapping resize runs the old group beside the new one, and a restart's start-up
and teardown count as much as its training.  A hold's workers are those that started
(``PhaseStart.workers``: an elastic group may start with fewer than it asked for); until its first
start the count asked for.  A group that Ray Train restarted with another count splits its hold
there.

:class:`Holds` writes the holds down as the driver sees them (its ``fit()`` threads and the workers'
``PhaseStart`` events), and carries a resumed run's earlier drivers' holds (read back from MLflow:
orchestrator/record/history.py); :func:`split` shares them out over the timeline's stretches
(orchestrator/record/timeline.py), so the stretches' figures sum to the run's.  Pure Python: no Ray, no MLflow.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any


@dataclass
class Hold:
    """``workers`` workers of ``cpus`` CPUs and ``gpus`` GPUs each, held from ``start`` until ``end``
    (None: held still) by phase ``phase`` of the run's ``driver``-th driver (0: the first; each
    resume one more)."""

    phase: int
    workers: int
    cpus: float
    gpus: float
    start: float
    end: float | None = None
    driver: int = 0
    started: bool = False  # a PhaseStart gave its workers (else: the count asked for)
    cut: bool = False  # its driver was killed while it held: ``end`` is the last step known to have run with it

    def seconds(self, lo: float = -math.inf, hi: float = math.inf, now: float | None = None) -> float:
        """Seconds of the hold inside ``[lo, hi)``; one still held runs until ``now`` (or its start)."""
        end = self.end if self.end is not None else (now if now is not None else self.start)
        return max(0.0, min(end, hi) - max(self.start, lo))


@dataclass(frozen=True)
class Cost:
    """A run's (or a stretch's) cost: ``worker_s`` worker-seconds, ``gpu_s`` GPU-seconds, over
    ``stretches`` stretches of constant B and W."""

    worker_s: float = 0.0
    gpu_s: float = 0.0
    stretches: int = 0

    def line(self) -> str:
        """``123 worker-seconds (4 stretches)``; with GPUs ``123 worker-seconds, 123 GPU-seconds (...)``."""
        text = f"{self.worker_s:,.0f} worker-seconds"
        if self.gpu_s:
            text += f", {self.gpu_s:,.0f} GPU-seconds"
        return text + f" ({self.stretches} stretch{'es' if self.stretches != 1 else ''})"


def cost_of(holds: Sequence[Hold], lo: float = -math.inf, hi: float = math.inf, now: float | None = None) -> Cost:
    """Worker- and GPU-seconds the holds held inside ``[lo, hi)``."""
    worker_s = gpu_s = 0.0
    for h in holds:
        s = h.seconds(lo, hi, now) * h.workers
        worker_s += s
        gpu_s += s * h.gpus
    return Cost(worker_s, gpu_s)


def split(holds: Sequence[Hold], ends: Sequence[float], now: float | None = None) -> list[Cost]:
    """The holds shared out over consecutive stretches that end at ``ends`` (each stretch's last
    step): stretch i takes what was held after stretch i-1's last step up to its own, the first
    everything before it (the first group's start-up), the last everything after it (the last
    group's teardown).  The parts sum to :func:`cost_of` the whole."""
    if not ends:
        return []
    bounds = [-math.inf, *ends[:-1], math.inf]
    return [cost_of(holds, lo, hi, now) for lo, hi in zip(bounds, bounds[1:])]


class Holds:
    """The run's holds, written down as they happen: :meth:`held` and :meth:`released` from each
    group's ``fit()`` thread, :meth:`started` from the workers' ``PhaseStart`` events (the driver
    thread); ``version`` counts the changes (what the driver saves to MLflow: :meth:`as_dict`)."""

    def __init__(self, holds: Sequence[Hold] = (), as_of: float = 0.0) -> None:
        self._lock = threading.Lock()
        self.holds: list[Hold] = list(holds)
        self.driver = 0  # this driver's number (holds of earlier drivers of a resumed run stay as they were)
        self.as_of = as_of  # when the holds were saved (read back: the earlier driver held its open ones until then)
        self.version = 0

    def _open(self, phase: int) -> Hold | None:
        """This driver's newest hold of ``phase``."""
        return next((h for h in reversed(self.holds) if h.driver == self.driver and h.phase == phase), None)

    def held(self, phase: int, workers: int, cpus: float, gpus: float, t: float) -> None:
        """Phase ``phase``'s ``fit()`` was called at ``t`` for ``workers`` workers."""
        with self._lock:
            self.holds.append(Hold(phase, workers, cpus, gpus, start=t, driver=self.driver))
            self.version += 1

    def started(self, phase: int, workers: int, t: float) -> None:
        """Phase ``phase``'s group started with ``workers`` workers (entered its loop at ``t``): its
        first start gives the hold's count from the ``fit()`` call on; a restart with another count
        splits the hold at ``t``."""
        with self._lock:
            h = self._open(phase)
            if h is None:
                return
            if not h.started:
                h.workers, h.started = workers, True
            elif workers != h.workers:
                t = min(max(t, h.start), h.end if h.end is not None else t)
                self.holds.append(Hold(phase, workers, h.cpus, h.gpus, start=t, end=h.end, driver=h.driver))
                self.holds[-1].started = True
                h.end = t
            else:
                return
            self.version += 1

    def released(self, phase: int, t: float) -> None:
        """Phase ``phase``'s ``fit()`` returned at ``t``."""
        with self._lock:
            h = self._open(phase)
            if h is not None and h.end is None:
                h.end = t
                self.version += 1

    def close_open(self, t: float) -> None:
        """Every hold still open ends at ``t`` (the driver ends: what it started goes with it)."""
        with self._lock:
            for h in self.holds:
                if h.end is None:
                    h.end = max(t, h.start)
                    self.version += 1

    def resume(self, at: float) -> None:
        """A new driver takes over: the earlier drivers' open holds (a driver killed while its group
        trained) end at ``at``, the later of the last step they logged and the holds' save (or of
        a later step they ran: :meth:`ran`), and what comes next is the new driver's."""
        with self._lock:
            for h in self.holds:
                if h.end is None:
                    h.end, h.cut = max(at, self.as_of, h.start), True
            self.driver = max((h.driver for h in self.holds), default=-1) + 1
            self.version += 1

    def is_new(self, t: float) -> bool:
        """Whether a step at ``t`` ran after this driver's first group was started (True before
        this driver wrote any hold down: nothing tells)."""
        with self._lock:
            mine = [h.start for h in self.holds if h.driver == self.driver]
        return not mine or t >= min(mine)

    def ran(self, t: float) -> None:
        """A step ran at ``t``: a killed driver's group held until then at least, if no later
        driver's group had started by then (a resumed group logs the steps its checkpoint carries,
        which the killed driver had not written, with the times they ran)."""
        with self._lock:
            for h in self.holds:
                if h.cut and h.end is not None and h.end < t:
                    later = min((g.start for g in self.holds if g.driver > h.driver), default=math.inf)
                    if t < later:
                        h.end = t
                        self.version += 1

    def snapshot(self) -> list[Hold]:
        with self._lock:
            return [Hold(**asdict(h)) for h in self.holds]

    def as_dict(self, now: float) -> dict[str, Any]:
        """What is saved to MLflow (``timeline/holds.json``): the holds and when (``as_of``)."""
        return {"as_of": now, "holds": [asdict(h) for h in self.snapshot()]}

    @classmethod
    def from_dict(cls, saved: Any) -> Holds:
        """The holds :meth:`as_dict` saved (what does not parse is left out)."""
        if not isinstance(saved, dict) or not isinstance(saved.get("holds"), list):
            return cls()
        names = {f.name for f in fields(Hold)}
        holds = []
        for d in saved["holds"]:
            try:
                holds.append(Hold(**{k: v for k, v in d.items() if k in names}))
            except (TypeError, AttributeError):
                continue
        as_of = saved.get("as_of")
        return cls(holds, as_of=float(as_of) if isinstance(as_of, (int, float)) else 0.0)

    def group(self, phase: int, workers: int, resources: dict[str, float]) -> GroupHold:
        """What a phase's ``fit()`` thread calls when it starts and returns."""
        return GroupHold(self, phase, workers, float(resources.get("CPU", 0.0)), float(resources.get("GPU", 0.0)))


@dataclass
class GroupHold:
    """One phase's part of :class:`Holds`, for its ``fit()`` thread (orchestrator/run/phases.py)."""

    holds: Holds
    phase: int
    workers: int
    cpus: float
    gpus: float

    def called(self, t: float) -> None:
        self.holds.held(self.phase, self.workers, self.cpus, self.gpus, t)

    def returned(self, t: float) -> None:
        self.holds.released(self.phase, t)
