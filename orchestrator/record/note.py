"""The run's description in MLflow (the ``mlflow.note.content`` tag, shown at the top of the run's
overview): what was trained, its final training metrics, and how B and W changed over the run."""

from __future__ import annotations

from typing import Any

from orchestrator.record.cost import Cost
from trainers.link import metrics as M

# the training metrics the overview leads with (MLflow lists system metrics above the others in its table)
HEADLINE = (M.VAL_ACCURACY, M.VAL_PERPLEXITY, M.VAL_LOSS, M.TRAIN_LOSS)


def _what(section: dict[str, Any], kind: str) -> str:
    name = section.get("name") or section.get("factory") or kind
    return str(name).removeprefix("python:")


def changes(points: list[tuple[int, float]]) -> list[tuple[int, int]]:
    """``[(step, value), ...]`` where a series takes a new value (its first point included), from
    the points MLflow holds of it (a piecewise metric: orchestrator/record/run_tracker.py logs where it bends)."""
    out: list[tuple[int, int]] = []
    for step, value in sorted(points):
        if not out or int(value) != out[-1][1]:
            out.append((int(step), int(value)))
    return out


def series_line(name: str, points: list[tuple[int, float]]) -> str | None:
    """``B 32 -> 64 -> 128 at steps 46, 221``; ``B 32`` when it never changed; None without points."""
    ch = changes(points)
    if not ch:
        return None
    line = f"{name} " + " -> ".join(str(v) for _, v in ch)
    if len(ch) > 1:
        line += f" at step{'s' if len(ch) > 2 else ''} " + ", ".join(str(s) for s, _ in ch[1:])
    return line


def describe(
    config: dict[str, Any],
    history: dict[str, list[tuple[int, float]]],
    status: str,
    resizes: int = 0,
    resumes: int = 0,
    cost: Cost | None = None,
) -> str:
    """The description (Markdown) of the run of ``config`` (the public config, plain data:
    orchestrator/record/params.py ConfigRecord): the model and data trained, epochs and steps, the final training
    metrics, the global batch B and workers W over the run (from every point MLflow holds, so a
    resumed run's description covers its earlier drivers too), and what the run cost (``cost``:
    every driver's worker groups, orchestrator/record/cost.py)."""
    steps = max((s for s, _ in history.get(M.TRAIN_LOSS, [])), default=0)
    epoch = max(history.get(M.EPOCH, []), default=(0, 0.0))[1]
    planned = f"{config['train']['epochs']:g}"
    head = (
        f"**{_what(config['model'], 'model')}** on **{_what(config['data'], 'data')}**: {steps} steps, "
        f"{epoch:.3g} of {planned} epochs ({status.lower()}"
    )
    head += f", resumed {resumes} time{'s' if resumes != 1 else ''})" if resumes else ")"
    # a short list: MLflow shows the first lines of a description and folds the rest under "Show more"
    lines = [head, ""]
    final = [(k, max(history[k])[1]) for k in HEADLINE if history.get(k)]
    if final:
        lines.append(
            "- " + ", ".join(f"{k} **{v:.4g}**" if i == 0 else f"{k} {v:.4g}" for i, (k, v) in enumerate(final))
        )
    b = series_line("B", history.get(M.BATCH_GLOBAL, []))
    w = series_line("W", history.get(M.WORKERS, []))
    shape = "; ".join(x for x in (b, w) if x)
    if shape:
        lines.append(
            "- " + shape + (f" ({resizes} resize{'s' if resizes != 1 else ''} of the worker group)" if resizes else "")
        )
    lr = history.get(M.LR)
    if lr:
        lines.append(
            f"- LR {min(v for _, v in lr):.4g} to {max(v for _, v in lr):.4g} ({config['optimizer']['name']}, "
            f"scaling rule {config['schedule']['scaling_rule']})"
        )
    if cost is not None and cost.worker_s > 0:
        lines.append(f"- cost: {cost.line()}")
    return "\n".join(lines).strip() + "\n"
