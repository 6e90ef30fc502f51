"""What a study's MLflow parent run shows of its trials, computed from the study alone (no MLflow).

* **History**: each COMPLETE trial's objective value as metric ``trials/<metric>`` at
  ``step = trial number``, and (one objective) the best value so far as ``trials/best_<metric>``
  at the same steps, so MLflow draws the optimization history itself (``/`` in the metric's name
  becomes ``_``: MLflow groups charts by the name up to its last ``/``, so both land in the
  ``trials`` group beside the trial counts).  Best-so-far at step N is the best
  over the COMPLETE trials numbered <= N (Optuna's ``plot_optimization_history``); it is logged only
  once every trial numbered <= N has ended (``settled_upto``), since parallel trials end out of
  order and a metric point, once logged, cannot change.
* **The best trial** as a link to its run: ``best_note`` is the markdown of the parent run's
  description (tag ``mlflow.note.content``), with the link ``#/experiments/<exp>/runs/<run>``.
* **The table** of every trial (number, state, objective, params, run id): ``trials_table``.

Child runs are named ``trial-N`` (``trial_run_name``): short enough for MLflow's run list, and
unique under their parent.  ``search.study_tracking`` writes all of this; see ``docs/architecture.md``.
"""

from __future__ import annotations

import csv
import io
import json
import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

ENDED = ("COMPLETE", "PRUNED", "FAIL")
"""Optuna trial states that are final: a trial in one of these will not change its value again."""


def trial_run_name(number: int) -> str:
    """The MLflow run name of trial ``number``."""
    return f"trial-{number}"


def objective_key(metric: str) -> str:
    """The parent run's metric holding each trial's value of objective ``metric`` (step = trial number)."""
    return f"trials/{metric.replace('/', '_')}"


def best_key(metric: str) -> str:
    """The parent run's metric holding the best value of ``metric`` so far (step = trial number)."""
    return f"trials/best_{metric.replace('/', '_')}"


def run_link(experiment_id: str, run_id: str) -> str:
    """A link to a run relative to MLflow's UI (its pages are ``#/...`` routes of one app)."""
    return f"#/experiments/{experiment_id}/runs/{run_id}"


@dataclass(frozen=True)
class Point:
    """One metric point for the parent run."""

    key: str
    value: float
    step: int
    timestamp_ms: int


def _state(t: Any) -> str:
    return t.state.name


def _ms(t: Any) -> int:
    when = getattr(t, "datetime_complete", None)
    return int(when.timestamp() * 1000) if when is not None else int(time.time() * 1000)


def settled_upto(trials: Iterable[Any]) -> int:
    """The largest N such that every trial numbered <= N has ended (-1 if trial 0 has not)."""
    ended = {t.number for t in trials if _state(t) in ENDED}
    n = -1
    while n + 1 in ended:
        n += 1
    return n


def objective_points(trials: Iterable[Any], metrics: Sequence[str], skip: set[int]) -> list[Point]:
    """``objective_key(metric)`` at step = number for each COMPLETE trial not in ``skip``."""
    points = []
    for t in sorted(trials, key=lambda t: t.number):
        if _state(t) != "COMPLETE" or t.number in skip or t.values is None:
            continue
        for m, v in zip(metrics, t.values):
            if v is not None and math.isfinite(v):
                points.append(Point(objective_key(m), float(v), t.number, _ms(t)))
    return points


def best_points(trials: Iterable[Any], metric: str, direction: str, after: int, upto: int) -> list[Point]:
    """``best_key(metric)`` at each trial number in ``(after, upto]``: the best value of the COMPLETE
    trials numbered <= that step (``direction`` is ``maximize`` or ``minimize``); no point before
    the first COMPLETE trial."""
    better = max if direction == "maximize" else min
    best: float | None = None
    points = []
    for t in sorted(trials, key=lambda t: t.number):
        if t.number > upto:
            break
        if _state(t) == "COMPLETE" and t.values and t.values[0] is not None and math.isfinite(t.values[0]):
            best = float(t.values[0]) if best is None else better(best, float(t.values[0]))
        if t.number > after and best is not None:
            points.append(Point(best_key(metric), best, t.number, _ms(t)))
    return points


# -- the best trial as a link -----------------------------------------------------------------------


def _cell(v: Any) -> str:
    s = json.dumps(v) if isinstance(v, (list, dict)) else f"{v:.6g}" if isinstance(v, float) else str(v)
    return s.replace("|", "\\|").replace("\n", " ")


def best_note(
    study_name: str,
    experiment_id: str,
    metrics: Sequence[str],
    directions: Sequence[str],
    best: Sequence[Any],
    counts: dict[str, int],
) -> str:
    """The parent run's description (markdown): the study, its objective, the best trial (or the
    Pareto front) as links to their runs with values and params, the trial counts, and where the
    history, the table and the plots are."""
    objective = ", ".join(f"`{m}` ({d})" for m, d in zip(metrics, directions))
    total = sum(counts.values())
    state = ", ".join(f"{v} {k.lower()}" for k, v in counts.items() if v)
    lines = []
    if not best:
        lines.append(f"No complete trial yet ({total} trials: {state or 'none ended'}).")
    for t in best:
        run_id = t.user_attrs.get("mlflow_run_id")
        name = trial_run_name(t.number)
        link = f"[{name}]({run_link(experiment_id, run_id)})" if run_id else name
        values = ", ".join(f"`{m}` = {v:.6g}" for m, v in zip(metrics, t.values))
        lines.append(f"**{'Best trial' if len(best) == 1 else 'Pareto front'}: {link}**, {values}  ")
    lines += [f"Study `{study_name}`: {objective}" + (f"; {total} trials ({state})." if best else "."), ""]
    params = dict(best[0].user_attrs.get("config_values") or best[0].params) if len(best) == 1 else {}
    if params:
        lines += ["| best trial's param | value |", "|---|---|"]
        lines += [f"| `{k}` | {_cell(v)} |" for k, v in params.items()]
        lines.append("")
    keys = ", ".join(f"`{objective_key(m)}`" for m in metrics)
    if len(metrics) == 1:
        keys += f" and `{best_key(metrics[0])}` (best so far)"
    lines.append(f"History: metrics {keys} at step = trial number. Every trial: `trials.csv`; plots under `plots/`.")
    return "\n".join(lines)


# -- the table of trials ----------------------------------------------------------------------------


def trials_table(trials: Iterable[Any], metrics: Sequence[str]) -> tuple[list[str], list[list[Any]]]:
    """Columns and rows, one row per trial by number: number, run name, state, the objectives'
    values (COMPLETE trials only), the sampled params (config paths, in the order first seen),
    steps, wall_s, duplicate_of, pruned_at_step, error and the MLflow run id."""
    trials = sorted(trials, key=lambda t: t.number)
    params: dict[str, None] = {}
    for t in trials:
        for k in t.user_attrs.get("config_values") or t.params:
            params.setdefault(k, None)
    extra = ("steps", "wall_s", "duplicate_of", "pruned_at_step", "error")
    columns = ["number", "run_name", "state", *metrics, *params, *extra, "run_id"]
    rows = []
    for t in trials:
        values = dict(t.user_attrs.get("config_values") or t.params)
        objective = list(t.values) if _state(t) == "COMPLETE" and t.values else [None] * len(metrics)
        row: list[Any] = [t.number, trial_run_name(t.number), _state(t), *objective]
        row += [values.get(k) for k in params]
        row += [t.user_attrs.get(k) for k in extra]
        row.append(t.user_attrs.get("mlflow_run_id"))
        rows.append([json.dumps(v) if isinstance(v, (list, dict)) else v for v in row])
    return columns, rows


def table_csv(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """The table as CSV text (empty cells for missing values)."""
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(columns)
    for r in rows:
        w.writerow(["" if v is None else v for v in r])
    return out.getvalue()


def table_json(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """The table in the form ``MlflowClient.log_table`` writes (pandas' ``orient="split"``), so
    ``MlflowClient.load_table`` reads it back; NaN as null."""
    clean = [[None if isinstance(v, float) and not math.isfinite(v) else v for v in r] for r in rows]
    return json.dumps({"columns": list(columns), "data": clean}, default=str)


def work_to_target(intermediate: dict[int, float], target: float, direction: str) -> int | None:
    """The first report of a trial whose value reaches ``target`` (``<=`` when minimizing, ``>=`` when
    maximizing), as Optuna's step: the work done by then, in base steps (``search.records.ReportUnit``:
    samples or tokens seen over the base config's batch), so trials of different batches compare at
    equal work; None when no report reaches it."""
    better = (lambda v: v <= target) if direction == "minimize" else (lambda v: v >= target)
    for step in sorted(intermediate):
        value = intermediate[step]
        if math.isfinite(value) and better(value):
            return int(step)
    return None
