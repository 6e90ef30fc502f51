"""The driver's progress bar (tqdm on stderr).

It counts training samples, not steps: the total (``train.epochs`` x the training set) stays right
when the batch grows (a step count at the initial batch would end far short of its total).  The
driver never loads the data to size it: a built-in set's size is known from the config
(:func:`total_samples`); a factory's or a text's is the one rank 0 reports when its group starts
(``PhaseStart.train_samples``, :meth:`Progress.sized`), and until then the bar shows a count and a
rate without a total.  The postfix shows the step, epoch, loss, the batch the policy has in
force (``B``), the workers actually training (``W``) and the latest validation accuracy (perplexity,
for a language model).

The time left (:class:`Eta`) is the samples left over the training rate of the stretch of constant
B and W under way (measured on the workers' step times, so a resize's start-up is not counted as
training), and the previous stretch's rate until the new one has been measured long enough; while
a group restarts the bar says ``restarting`` and shows no rate at all.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass

from orchestrator.config.schema import RootConfig
from orchestrator.config.workload_checks import known_size, train_samples
from trainers.link import metrics as M
from trainers.link.messages import Record

MIN_WINDOW_S = 2.0  # a stretch's own rate is trusted once its steps span this long (worker time)


# the bar before its total is known: a count and the rate, no bar ({desc} ends in ": ")
UNSIZED_FORMAT = "{desc}{n_fmt} samples [{elapsed}{postfix}]"
SIZED_FORMAT = "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]"


def total_samples(cfg: RootConfig) -> int | None:
    """Samples a run of ``train.epochs`` trains on (the bar's total), where the config alone says
    it: a built-in training set's size comes from ``trainers.catalog`` (a generated one's from
    ``data.size``) less the validation split.  None for data only the workers load (a factory's, a
    text): its size arrives with their ``PhaseStart``."""
    if known_size(cfg) is None:
        return None
    return epochs_samples(cfg.train.epochs, train_samples(cfg)[0])


def epochs_samples(epochs: float, train_size: int) -> int:
    """Samples ``epochs`` epochs of a training set of ``train_size`` samples take."""
    return math.ceil(epochs * train_size)


@dataclass
class _Window:
    key: tuple[int, int]  # (B, W)
    t0: float
    s0: float
    t1: float
    s1: float

    def rate(self, min_span: float) -> float | None:
        if self.t1 - self.t0 < min_span or self.s1 <= self.s0:
            return None
        return (self.s1 - self.s0) / (self.t1 - self.t0)


class Eta:
    """Samples per second of the stretch of constant (B, W) under way, and the time left at that rate.

    A new stretch (a batch change, a resize, a group restarted) starts a new window; until it spans
    ``min_span`` seconds of steps the last measured rate stands in (never a rate from a handful of
    steps, nor one that counts a group's start-up as training).  :meth:`pause` (a group restarts)
    hides the estimate until the next step arrives."""

    def __init__(self, total: float | None, min_span: float = MIN_WINDOW_S) -> None:
        self.total = None if total is None else float(total)  # None: not known yet (no time left)
        self.min_span = min_span
        self.window: _Window | None = None
        self.known: float | None = None  # the last rate measured over at least min_span
        self.seen = 0.0
        self.paused = False

    def observe(self, t: float, seen: float, batch: int, workers: int) -> None:
        """A step record: its time (when the step ran), samples seen after it, its B and W."""
        self.paused = False
        self.seen = max(self.seen, float(seen))
        key = (int(batch), int(workers))
        w = self.window
        if w is None or w.key != key or t < w.t1:
            self.window = _Window(key, t, seen, t, seen)
            return
        w.t1, w.s1 = t, seen
        r = w.rate(self.min_span)
        if r is not None:
            self.known = r

    def pause(self) -> None:
        """The group restarts: no rate holds until its next step."""
        self.paused = True
        self.window = None

    @property
    def rate(self) -> float | None:
        return None if self.paused else self.known

    @property
    def remaining_s(self) -> float | None:
        r = self.rate
        if r is None or r <= 0 or self.total is None:
            return None
        return max(0.0, self.total - self.seen) / r

    def text(self) -> str:
        """``eta 1:23 at 456 samples/s``, ``eta ?`` before any rate (or while restarting), ``at 456
        samples/s`` while the total is not known."""
        if self.total is None and self.rate is not None:
            return f"at {_rate(self.rate)} samples/s"
        left = self.remaining_s
        if left is None:
            return "eta ?"
        return f"eta {_clock(left)} at {_rate(self.rate)} samples/s"


def _clock(seconds: float) -> str:
    s = int(round(seconds))
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def _rate(r: float | None) -> str:
    if r is None:
        return "?"
    if r >= 1e6:
        return f"{r / 1e6:.1f}M"
    if r >= 1e4:
        return f"{r / 1e3:.0f}k"
    return f"{r:.3g}" if r < 100 else f"{r:.0f}"


class Progress:
    """A tqdm bar on the driver: samples trained of the run's total, with step, epoch, loss, B, W.
    ``total`` None: not known until the workers report their training set (:meth:`sized`)."""

    def __init__(self, total: int | None, enabled: bool):
        self.bar = None
        self.eta = Eta(total)
        self.status = "starting workers"
        if enabled:
            from tqdm import tqdm  # only a run with a bar imports tqdm

            self.bar = tqdm(
                total=total,
                unit="sample",
                unit_scale=True,
                dynamic_ncols=True,
                file=sys.stderr,
                bar_format=UNSIZED_FORMAT if total is None else SIZED_FORMAT,
            )
            self.bar.set_description(self.status)
            self.bar.set_postfix_str(self.eta.text(), refresh=False)
        self.last: dict[str, float] = {}
        self.step = 0

    def update(self, records: list[Record]) -> None:
        if not records:
            return
        for _step, m, *when in records:
            self.last.update(m)
            if when and M.SAMPLES_SEEN in m:
                self.eta.observe(
                    float(when[0]), m[M.SAMPLES_SEEN], int(m.get(M.BATCH_GLOBAL, 0)), int(m.get(M.WORKERS, 0))
                )
        self.step = records[-1][0]
        self.status = "training"
        if self.bar is None:
            return
        seen = int(self.last.get(M.SAMPLES_SEEN, 0))
        if self.bar.total is not None and seen > self.bar.total:
            self.bar.total = seen
        self.bar.n = seen
        self.bar.set_description(self.status)
        self._postfix()
        self.bar.refresh()

    def _postfix(self) -> None:
        post = [
            self.eta.text(),
            f"step={self.step}",
            f"epoch={self.last.get(M.EPOCH, 0):.2f}",
            f"loss={self.last.get(M.TRAIN_LOSS, float('nan')):.4f}",
            f"B={int(self.last.get(M.BATCH_GLOBAL, 0))}",
            f"W={int(self.last.get(M.WORKERS, 0))}",
        ]
        if M.VAL_PERPLEXITY in self.last:  # a language model: perplexity is what its users read
            post.append(f"val_ppl={self.last[M.VAL_PERPLEXITY]:.2f}")
        elif M.VAL_ACCURACY in self.last:
            post.append(f"val_acc={self.last[M.VAL_ACCURACY]:.3f}")
        self.bar.set_postfix_str(", ".join(post), refresh=False)

    def sized(self, total: int) -> None:
        """The run's total as the workers counted it (their ``PhaseStart``): the bar's total from now
        on (for a built-in set, the one the config gave it)."""
        self.eta.total = float(total)
        if self.bar is None or self.bar.total == total:
            return
        self.bar.total = max(total, self.bar.n)
        self.bar.bar_format = SIZED_FORMAT
        if self.step:  # the time left, now that there is a total
            self._postfix()
        self.bar.refresh()

    def restarting(self, what: str = "") -> None:
        """The worker group restarts (a resize by restart, or after a failure): the bar says so and
        shows no rate until the new group's first step."""
        self.status = "restarting" + (f" ({what})" if what else "")
        self.eta.pause()
        if self.bar is not None:
            self.bar.set_description(self.status)
            self._postfix()
            self.bar.refresh()

    def write(self, line: str) -> None:
        if self.bar is not None:
            self.bar.write(line, file=sys.stderr)
        else:
            print(line, file=sys.stderr)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
