"""A run's timeline: its stretches of constant global batch ``B`` and workers ``W``, and the resizes
between them, as the driver saw them.

Built from the step records (every step carries ``batch/global``, ``workers``, ``batch/samples``
and the time it ran) and the measured resizes (orchestrator/record/events.py ``ResizeRecord``).  It gives
the end-of-run summary table (:func:`format_table`), the MLflow table artifact ``timeline.json``
(:meth:`Timeline.table`) and the chart ``plots/timeline.png`` (:func:`plot`).  Pure Python: no
Ray, no MLflow.  A resumed run's timeline covers the whole run: the earlier drivers' stretches,
resizes and drained nodes are read back from MLflow (orchestrator/record/history.py) before this
driver adds its own, and the time the run stood still between two drivers is not counted in any stretch's ``wall_s``.

What the run cost (orchestrator/record/cost.py): the worker groups' holds, shared out over the
stretches (``worker_s``, ``gpu_s`` of each row; :meth:`Timeline.cost` for the whole run).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import matplotlib
import matplotlib.pyplot as plt

from orchestrator.record.cost import Cost, Holds, cost_of, split
from trainers.link import metrics as M
from trainers.link.messages import Record

PARTS = ("overlap_s", "teardown_s", "start_s", "setup_s")  # orchestrator/record/events.py ResizeRecord.measure


@dataclass
class Stretch:
    """Steps ``first_step..last_step`` trained at global batch ``batch`` on ``workers`` workers.

    ``start``: when the previous stretch's last step ran (for the first stretch: when its first step
    ran), so ``wall_s`` includes the resize that opened the stretch; ``resize_latency_s``: that
    resize's latency (training stood still), None when the stretch began without a resize."""

    batch: int
    workers: int
    first_step: int
    last_step: int
    samples: int
    start: float
    end: float
    resize_latency_s: float | None = None
    paused_s: float = 0.0  # between two drivers of the run (a resume inside the stretch): not trained

    @property
    def steps(self) -> int:
        return self.last_step - self.first_step + 1

    @property
    def wall_s(self) -> float:
        return self.end - self.start - self.paused_s


class Timeline:
    """Collects stretches from step records and resizes from their measurements (steps seen before
    are ignored, as MLflow logs each step once)."""

    def __init__(self) -> None:
        self.stretches: list[Stretch] = []
        self.resizes: list[dict[str, Any]] = []  # ResizeRecord.as_dict() each
        self.called_off: list[int] = []  # the workers of each resize that was called off
        self.drains: list[dict[str, Any]] = []  # each drained node the run left (orchestrator/run/drains.py)
        self.t0: float | None = None  # the first step's time
        self.resumed = False  # the next step is the first a new driver of the run adds (:meth:`resume`)
        self.holds = Holds()  # what each worker group held, and how long (orchestrator/record/cost.py)

    def resume(self) -> None:
        """What comes next is a new driver's (a resume): the time until its first new step is
        not counted as training in the stretch it continues or opens, and the earlier drivers'
        groups held their resources until their last logged step at least."""
        self.resumed = bool(self.stretches)
        self.holds.resume(self.stretches[-1].end if self.stretches else 0.0)

    def add_records(self, records: list[Record]) -> None:
        for step, metrics, *when in records:
            if M.BATCH_GLOBAL not in metrics or M.WORKERS not in metrics:
                continue
            last = self.stretches[-1] if self.stretches else None
            if last is not None and step <= last.last_step:
                continue
            t = float(when[0]) if when else (last.end if last else 0.0)
            b, w = int(metrics[M.BATCH_GLOBAL]), int(metrics[M.WORKERS])
            n = int(metrics.get(M.BATCH_SAMPLES, b))
            # a new driver's first step (its checkpoint's records, which the killed driver had not
            # written, come first, with the times they ran: they are the earlier driver's)
            resumed = self.resumed and self.holds.is_new(t)
            self.resumed = self.resumed and not resumed
            self.holds.ran(t)
            if last is not None and (last.batch, last.workers) == (b, w):
                if resumed:
                    last.paused_s += max(t - last.end, 0.0)
                last.last_step, last.end, last.samples = step, t, last.samples + n
                continue
            if self.t0 is None:
                self.t0 = t
            start = t if last is None or resumed else last.end
            self.stretches.append(
                Stretch(b, w, step, step, n, start=start, end=t, resize_latency_s=self._latency_before(step, w))
            )

    def _latency_before(self, first_step: int, workers: int) -> float | None:
        return next((r["latency_s"] for r in self.resizes if r["step"] + 1 == first_step and r["to"] == workers), None)

    def add_resize(self, resize: dict[str, Any]) -> None:
        """A measured resize (``ResizeRecord.as_dict``): measured once its new group made its first
        step, so the stretch it opened may already be there."""
        self.resizes.append(resize)
        for s in self.stretches:
            if s.first_step == resize["step"] + 1 and s.workers == resize["to"]:
                s.resize_latency_s = resize["latency_s"]

    def add_drain(self, drain: dict[str, Any]) -> None:
        """A drained node's notice the run acted on (keys ``step``, ``time``, ``node``, ``deadline``,
        ``from``, ``to``, ``mode``): a row of its own kind in :meth:`table`, from the notice to the
        node's deadline."""
        self.drains.append(drain)

    def costs(self, now: float | None = None) -> list[Cost]:
        """What each stretch cost: the groups' holds from the previous stretch's last step to its
        own (the first stretch: from the run's start; the last: to its end; :func:`split`); a
        hold still open counts until ``now``."""
        return split(self.holds.snapshot(), [s.end for s in self.stretches], now)

    def cost(self, now: float | None = None) -> Cost:
        """What the whole run cost (every driver's groups; the sum of :meth:`costs`)."""
        total = cost_of(self.holds.snapshot(), now=now)
        return Cost(total.worker_s, total.gpu_s, len(self.stretches))

    def rows(self, now: float | None = None) -> list[dict[str, Any]]:
        """The stretches as plain rows (what ``RunSummary.phases`` and the summary table show),
        with what each cost (``worker_s``, ``gpu_s``)."""
        return [
            {**asdict(s), "steps": s.steps, "wall_s": s.wall_s, "worker_s": c.worker_s, "gpu_s": c.gpu_s}
            for s, c in zip(self.stretches, self.costs(now))
        ]

    def table(self, now: float | None = None) -> dict[str, list[Any]]:
        """The timeline as columns, one row per stretch and per resize in step order, times in
        seconds from the first step, each stretch's cost (``worker_s``, ``gpu_s``): what MLflow's
        ``log_table`` stores as ``timeline.json``."""
        t0 = self.t0 or 0.0
        rows: list[dict[str, Any]] = []
        for s, c in zip(self.stretches, self.costs(now)):
            rows.append(
                {
                    "kind": "train",
                    "begin_s": s.start - t0,
                    "end_s": s.end - t0,
                    "first_step": s.first_step,
                    "last_step": s.last_step,
                    "batch": s.batch,
                    "workers": s.workers,
                    "samples": s.samples,
                    "mode": "",
                    "latency_s": None,
                    **{p: None for p in PARTS},
                    "worker_s": c.worker_s,
                    "gpu_s": c.gpu_s,
                }
            )
        for r in self.resizes:
            latency = r.get("latency_s") or 0.0
            rows.append(
                {
                    "kind": "resize",
                    "begin_s": r["time"] - t0,
                    "end_s": r["time"] + latency - t0,
                    "first_step": r["step"],
                    "last_step": r["step"],
                    "batch": None,
                    "workers": r["to"],
                    "samples": 0,
                    "mode": r["mode"],
                    "latency_s": r.get("latency_s"),
                    **{p: r.get(p) for p in PARTS},
                    "worker_s": None,
                    "gpu_s": None,
                }
            )
        for d in self.drains:
            rows.append(
                {
                    "kind": "drain",
                    "begin_s": d["time"] - t0,
                    "end_s": (d["deadline"] if d.get("deadline") is not None else d["time"]) - t0,
                    "first_step": d["step"],
                    "last_step": d["step"],
                    "batch": None,
                    "workers": d["to"],
                    "samples": 0,
                    "mode": d["mode"],
                    "latency_s": None,
                    **{p: None for p in PARTS},
                    "worker_s": None,
                    "gpu_s": None,
                }
            )
        rows.sort(key=lambda row: row["first_step"])  # a resize at step s: after the stretch ending at s
        return {k: [row[k] for row in rows] for k in (rows[0] if rows else {})}


def format_table(rows: list[dict[str, Any]]) -> str:
    """The summary's phase table: one line per stretch of constant B and W, with what it cost
    (``worker-s``; ``gpu-s`` where its workers held GPUs)."""
    gpus = any(r.get("gpu_s") for r in rows)
    head = ["steps", "B", "W", "samples", "wall_s", "worker-s", *(["gpu-s"] if gpus else []), "resize_latency_s"]
    body = [
        [
            f"{r['first_step']}-{r['last_step']}",
            str(r["batch"]),
            str(r["workers"]),
            str(r["samples"]),
            f"{r['wall_s']:.1f}",
            f"{r.get('worker_s', 0.0):.1f}",
            *([f"{r.get('gpu_s', 0.0):.1f}"] if gpus else []),
            "" if r["resize_latency_s"] is None else f"{r['resize_latency_s']:.1f}",
        ]
        for r in rows
    ]
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(head)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(head, widths)), "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.rjust(w) for c, w in zip(b, widths)) for b in body]
    return "\n".join(lines)


def resize_label(n: int, r: dict[str, Any]) -> str:
    """One line of the chart's key: ``1: W 1 -> 2 at step 45 (restart): stood still 29.9 s (teardown 0.5 s, ...)``."""
    latency = r.get("latency_s") or 0.0
    parts = ", ".join(f"{p[:-2]} {r[p]:.1f} s" for p in PARTS if r.get(p))
    return f"{n}: W {r['from']} -> {r['to']} at step {r['step']} ({r['mode']}): stood still {latency:.1f} s" + (
        f" ({parts})" if parts else ""
    )


def _stagger(fig: Any, ax: Any, marks: list[Any]) -> None:
    """Raise each resize's number above the previous ones it would overlap (they sit in the margin
    above the axes, so they never cover the lines or the axis)."""
    renderer = fig.canvas.get_renderer()
    placed: list[Any] = []
    for mark in marks:
        row = 0
        while True:
            mark.xyann = (0, 3 + row * 12)  # points above the axes' top
            box = mark.get_window_extent(renderer)
            if not any(box.overlaps(other) for other in placed):
                break
            row += 1
        placed.append(mark.get_window_extent(renderer))


def figure(timeline: Timeline) -> Any:
    """The chart as a matplotlib figure (see :func:`plot`); None when there is nothing to draw.

    Each resize is a gray span (training stood still) numbered above the axes, staggered where
    resizes are close; what each number stands for is a line of the key under the chart, so no
    label covers a line, an axis or another label however many resizes there were."""
    if not timeline.stretches:
        return None

    matplotlib.use("Agg")

    t0 = timeline.t0 or 0.0
    key = [resize_label(i + 1, r) for i, r in enumerate(timeline.resizes)]
    # room for the staggered numbers above the axes and a line of the key per resize below them
    top_in, key_in, axes_in = 0.45 + 0.17 * min(max(len(key) - 1, 0), 3), 0.2 * len(key) + 0.15, 2.2
    height = top_in + axes_in + 0.6 + key_in
    fig, ax = plt.subplots(figsize=(9, height))
    fig.subplots_adjust(left=0.08, right=0.92, top=1 - top_in / height, bottom=(0.6 + key_in) / height)
    xs = [s.start - t0 for s in timeline.stretches] + [timeline.stretches[-1].end - t0]
    bs = [s.batch for s in timeline.stretches]
    ws = [s.workers for s in timeline.stretches]
    ax.step(xs, bs + bs[-1:], where="post", label="global batch B", color="tab:blue")
    ax.set_xlabel("seconds since the first step")
    ax.set_ylabel("B", color="tab:blue")
    ax2 = ax.twinx()
    ax2.step(xs, ws + ws[-1:], where="post", label="workers W", color="tab:orange")
    ax2.set_ylabel("W", color="tab:orange")
    ax2.set_ylim(0, max(ws) + 1)
    marks = []
    for i, r in enumerate(timeline.resizes):
        start, latency = r["time"] - t0, r.get("latency_s") or 0.0
        ax.axvspan(start, start + latency, color="gray", alpha=0.3)
        marks.append(
            ax.annotate(
                str(i + 1),
                xy=(start + latency / 2, 1.0),
                xycoords=("data", "axes fraction"),
                xytext=(0, 3),
                textcoords="offset points",
                ha="center",
                va="bottom",
                fontsize=8,
                annotation_clip=False,
            )
        )
    fig.suptitle(
        "batch and workers over the run (gray: training stood still for a resize)",
        fontsize=10,
        y=1 - 0.08 / height,
        va="top",
    )
    ax.grid(alpha=0.3)
    for i, line in enumerate(key):
        fig.text(0.08, (key_in - 0.2 * (i + 1)) / height + 0.02 / height, line, fontsize=8, ha="left", va="bottom")
    _stagger(fig, ax, marks)
    return fig


def plot(timeline: Timeline, path: str) -> bool:
    """One chart: B and W against seconds since the first step, each resize's stand-still shaded
    and numbered, its parts in the key below (:func:`figure`).  False when there is nothing to draw."""
    fig = figure(timeline)
    if fig is None:
        return False

    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True
