"""What the earlier drivers of a resumed run left in MLflow, read back so that the timeline, the
``elastic.resizes`` tag and the summary cover the whole run, not only the last driver.

The stretches of constant B and W come from the logged step metrics (every step's ``train/loss``
with when it ran; ``batch/global``, ``workers``, ``batch/samples`` where they change), the
measured resizes from the artifact :data:`RESIZES_ARTIFACT`, which the driver rewrites at each
measured resize (a killed driver loses nothing it measured), the drained nodes it left from
:data:`DRAINS_ARTIFACT`, rewritten at each notice acted on, and what each worker group held (the
run's cost, orchestrator/record/cost.py) from :data:`HOLDS_ARTIFACT`, rewritten at each change of
a hold and at the driver's end.  See orchestrator/record/timeline.py.
"""

from __future__ import annotations

import json
import os
import tempfile
from bisect import bisect_right
from collections.abc import Callable
from typing import Any

from orchestrator.record.cost import Holds
from orchestrator.record.timeline import Timeline
from trainers.link import metrics as M

RESIZES_ARTIFACT = "timeline/resizes.json"
HOLDS_ARTIFACT = "timeline/holds.json"
DRAINS_ARTIFACT = "timeline/drains.json"


def logged_history(client: Any, run_id: str) -> dict[str, list[Any]]:
    """Every metric a resumed run's earlier drivers logged: its MLflow rows (``Metric``), by key."""
    run = client.get_run(run_id)
    return {key: client.get_metric_history(run_id, key) for key in run.data.metrics}


def _value_at(points: list[tuple[int, float]], step: int) -> float | None:
    """The value at ``step`` of a step-wise series logged where it changes (its first and last
    step at each value): that of its newest point at or before ``step``; None before its first."""
    i = bisect_right([s for s, _ in points], step)
    return points[i - 1][1] if i else None


def _series(client: Any, run_id: str, key: str) -> list[tuple[int, float, float]]:
    """``(step, value, time in seconds)`` of a metric, by step (the first row of a step)."""
    rows: dict[int, tuple[int, float, float]] = {}
    for m in client.get_metric_history(run_id, key):
        rows.setdefault(m.step, (m.step, m.value, m.timestamp / 1000.0))
    return [rows[s] for s in sorted(rows)]


def _read_json(client: Any, run_id: str, artifact: str) -> Any:
    """The JSON artifact of the run; None when it is not there."""
    names = {f.path for f in client.list_artifacts(run_id, os.path.dirname(artifact))}
    if artifact not in names:
        return None
    with tempfile.TemporaryDirectory() as d:
        with open(client.download_artifacts(run_id, artifact, d)) as f:
            return json.load(f)


def earlier_resizes(client: Any, run_id: str) -> list[dict[str, Any]]:
    """The resizes the run's earlier drivers measured (``ResizeRecord.as_dict`` each); [] when
    there were none (or the artifact cannot be read: the timeline then lacks them, nothing else)."""
    resizes = _read_json(client, run_id, RESIZES_ARTIFACT)
    return [r for r in resizes if isinstance(r, dict)] if isinstance(resizes, list) else []


def earlier_drains(client: Any, run_id: str) -> list[dict[str, Any]]:
    """The drained nodes the run's earlier drivers left (``Timeline.add_drain``'s dicts); [] when
    there were none (or the artifact cannot be read)."""
    drains = _read_json(client, run_id, DRAINS_ARTIFACT)
    return [d for d in drains if isinstance(d, dict)] if isinstance(drains, list) else []


def earlier_holds(client: Any, run_id: str) -> Holds:
    """What the run's earlier drivers' groups held (:meth:`Holds.as_dict`); none when the artifact
    is not there (a run recorded before it was written: its cost counts the later drivers only)."""
    return Holds.from_dict(_read_json(client, run_id, HOLDS_ARTIFACT))


def earlier_timeline(client: Any, run_id: str) -> Timeline:
    """The timeline of what the run's earlier drivers trained and measured, marked so that the
    next step added is a new driver's (:meth:`Timeline.resume`)."""
    timeline = Timeline()
    timeline.holds = earlier_holds(client, run_id)
    for r in earlier_resizes(client, run_id):
        timeline.add_resize(r)
    for d in earlier_drains(client, run_id):
        timeline.add_drain(d)
    steps = _series(client, run_id, M.TRAIN_LOSS)
    bends = {
        k: [(s, v) for s, v, _ in _series(client, run_id, k)] for k in (M.BATCH_GLOBAL, M.WORKERS, M.BATCH_SAMPLES)
    }
    records = []
    for step, _, t in steps:
        b, w = _value_at(bends[M.BATCH_GLOBAL], step), _value_at(bends[M.WORKERS], step)
        if b is None or w is None:
            continue
        n = _value_at(bends[M.BATCH_SAMPLES], step)
        records.append(
            (
                step,
                {M.BATCH_GLOBAL: round(b), M.WORKERS: round(w), M.BATCH_SAMPLES: round(n if n is not None else b)},
                t,
            )
        )
    timeline.add_records(records)
    timeline.resume()
    return timeline


def _saver(log_text: Callable[[str, str], None], warn: Callable[[str], None], artifact: str, what: str) -> Callable:
    def save(value: Any) -> None:
        try:
            log_text(json.dumps(value), artifact)
        except Exception as e:  # only a later resume's timeline would miss it
            warn(
                f"warning: the {what} were not saved to MLflow ({type(e).__name__}); a resume's timeline may lack them"
            )

    return save


def resize_saver(log_text: Callable[[str, str], None], warn: Callable[[str], None]) -> Callable[[list], None]:
    """What the timeline listener calls with the run's resizes after each measured one: they are
    written to :data:`RESIZES_ARTIFACT` (a store that does not take it now: a warning, the run goes on)."""
    return _saver(log_text, warn, RESIZES_ARTIFACT, "resizes")


def drain_saver(log_text: Callable[[str, str], None], warn: Callable[[str], None]) -> Callable[[list], None]:
    """What the timeline listener calls with the drained nodes the run left after each one: written to
    :data:`DRAINS_ARTIFACT` (a store that does not take it now: a warning, the run goes on)."""
    return _saver(log_text, warn, DRAINS_ARTIFACT, "drained nodes")


def holds_saver(log_text: Callable[[str, str], None], warn: Callable[[str], None]) -> Callable[[dict], None]:
    """What the timeline listener calls with the run's holds (:meth:`Holds.as_dict`) after they
    changed: written to :data:`HOLDS_ARTIFACT` (a store that does not take it now: a warning)."""
    return _saver(log_text, warn, HOLDS_ARTIFACT, "worker groups' holds (the run's cost)")
