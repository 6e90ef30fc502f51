"""What the search driver shows on stderr: a progress bar and one line per finished trial.

The bar (tqdm) shows trials done/total with the best value and the running, pruned and failed
counts; lines are written above it (or plainly to stderr when there is no bar).  The driver's
stdout carries only the final summary (``search.commands``).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from search.study_tracking import best_trials
from trainers.errors import first_line

if TYPE_CHECKING:
    from optuna import Study

    from search.records import TrialRecord


class ProgressBar:
    """The driver's progress bar: trials done/total, best value, running, pruned, failed.

    With ``enabled`` false it draws nothing and ``write`` prints to stderr.
    """

    def __init__(self, total: int, enabled: bool) -> None:
        self.bar: Any = None
        self._last: tuple[Any, ...] = ()
        if enabled:
            from tqdm import tqdm  # only a search with a bar imports tqdm

            self.bar = tqdm(
                total=total,
                desc="trials",
                unit="trial",
                dynamic_ncols=True,
                file=sys.stderr,
                bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}] {postfix}",
            )

    def show(self, done: int, best: str, running: int, pruned: int, failed: int) -> None:
        """Redraw only when something changed (the driver polls several times a second)."""
        state = (done, best, running, pruned, failed)
        if self.bar is None or state == self._last:
            return
        self._last = state
        self.bar.n = done
        self.bar.set_postfix({"best": best, "running": running, "pruned": pruned, "failed": failed}, refresh=False)
        self.bar.refresh()

    def write(self, line: str) -> None:
        """One line on stderr, above the bar."""
        write_line(line, self)

    def close(self) -> None:
        """Leave the bar as it is drawn (called once, when the driver ends)."""
        if self.bar is not None:
            self.bar.close()


def write_line(line: str, bar: ProgressBar | None = None) -> None:
    """``line`` on stderr: through the bar's tqdm when one is drawn (so the bar stays below), else printed."""
    if bar is not None and bar.bar is not None:
        bar.bar.write(line, file=sys.stderr)
    else:
        print(line, file=sys.stderr)


def restart_line(number: int, note: dict[str, Any]) -> str:
    """The line for a trial whose group Ray Train restarted (``search.trial.RestartNotes``): why,
    and the step it went on from (its newest checkpoint's; 0 when it had none yet)."""
    cause = f" after a worker failed ({first_line(note['cause'], 160)})" if note.get("cause") else ""
    start = f"its checkpoint at step {note['step']}" if note["step"] else "step 0 (no checkpoint yet)"
    workers = f"{note['workers']} worker{'s' if note['workers'] != 1 else ''}"
    again = f"restart {note['restarts']}"
    return f"trial {number}: its group restarted{cause}; it goes on from {start} with {workers} ({again})"


def best_text(study: Study, multi_objective: bool) -> str:
    """The bar's ``best``: the best value and its trial, the size of the Pareto front, or ``-``."""
    best = best_trials(study)
    if not best:
        return "-"
    if multi_objective:
        return f"{len(best)} on the front"
    return f"{best[0].value:.4g} (#{best[0].number})"


def fmt_values(values: dict[str, Any]) -> str:
    """Sampled values as ``path=value`` pairs (floats to 4 significant digits)."""

    def one(v: Any) -> str:
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    return " ".join(f"{k}={one(v)}" for k, v in values.items())


def trial_line(rec: TrialRecord, metrics: Sequence[str]) -> str:
    """The line written when a trial ends: number, state, its value(s) (``metric=value``), the pruning
    step or the error, steps and seconds (or the trial it repeats), and its sampled values."""
    if rec.state == "COMPLETE" and rec.values:
        what = " ".join(f"{m}={v:.4g}" for m, v in zip(metrics, rec.values))
    elif rec.state == "PRUNED":
        what = f"pruned at step {rec.pruned_at}" + (f" ({metrics[0]}={rec.values[0]:.4g})" if rec.values else "")
    else:
        what = f"error: {rec.error}"
    extra = f"  {rec.steps} steps, {rec.wall_s:.0f} s" if rec.steps or rec.wall_s else ""
    if rec.duplicate_of is not None:
        extra = f"  same config as trial {rec.duplicate_of}: its value, not run again"
    return f"trial {rec.number} {rec.state}  {what}{extra}  [{fmt_values(rec.params)}]"
