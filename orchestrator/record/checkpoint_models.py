"""Each checkpoint a run writes, as an MLflow 3 LoggedModel that refers to the checkpoint where it lives.

MLflow's deep-learning workflow: the model's step (the run's model outputs), the checkpoint's metrics
linked to its ``model_id`` (the validation metrics of that step and its training loss), and its
weights referenced where the checkpoint already is (a folder or an object-store URI), never copied.

Such a model is an *external* LoggedModel (``mlflow.model.isExternal``): its artifacts are one small
``MLmodel`` file naming the checkpoint.  ``mlflow.search_logged_models(order_by=...)`` ranks them by a
validation metric (:func:`ranked_models`).  The final model of a run, loadable with
``mlflow.pytorch.load_model``, is logged at the end (orchestrator/record/model_log.py)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from typing import Any

from mlflow.entities import LoggedModelOutput, Metric
from mlflow.models import Model
from mlflow.utils.mlflow_tags import MLFLOW_MODEL_IS_EXTERNAL

from orchestrator.config.uris import redact_uri
from orchestrator.interrupts import deferred_interrupts
from trainers.link import metrics as M
from trainers.link.tags import CHECKPOINT_PRUNED, CHECKPOINT_STEP, CHECKPOINT_URI

MODEL_TYPE = "checkpoint"  # the LoggedModels' model_type (search: model_type = 'checkpoint')
# at least this many newest records keep their metrics for a checkpoint event that follows them: a
# checkpoint written beside the loop (checkpoint.background) is announced once written, possibly many
# fast steps later
RECENT = 4096


def model_name(step: int) -> str:
    """``checkpoint-step45``: the name the MLflow UI's Models tab shows."""
    return f"checkpoint-step{step}"


def linked_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """The metrics of a step that describe its checkpoint: every ``val/*`` and the training loss."""
    return {k: v for k, v in metrics.items() if k.startswith("val/") or k == M.TRAIN_LOSS}


class CheckpointModels:
    """The LoggedModels of one run's checkpoints, logged as the driver hears of each.

    ``client``, ``run_id``, ``experiment_id``: the run's (its
    :class:`~orchestrator.record.run_tracker.RunTracker` builds this); ``flush``: writes the run's
    buffered rows (its writer's), called before a checkpoint's linked rows; ``earlier``: a resumed
    run's logged rows, by metric.  :meth:`seen` keeps the newest steps' metrics (a checkpoint's event
    follows its step's record); :meth:`saved` logs a checkpoint.  A store that does not answer leaves
    it pending: tried again at the next checkpoint and at :meth:`close`."""

    def __init__(
        self,
        client: Any,
        run_id: str,
        experiment_id: str,
        flush: Callable[[], Any] = lambda: None,
        earlier: dict[str, list[Any]] | None = None,
    ) -> None:
        self.client, self.run_id, self.experiment_id = client, run_id, experiment_id
        self.flush_rows = flush
        # (metric, step) -> (value, ms) of the rows an earlier driver of a resumed run logged
        # (``earlier``: its MLflow rows by metric) that a checkpoint's LoggedModel links to: the same rows
        self.earlier_rows: dict[tuple[str, int], tuple[float, int]] = {}
        rows = earlier or {}
        for key in linked_metrics(dict.fromkeys(rows, 0.0)):
            for m in rows[key]:
                self.earlier_rows.setdefault((key, m.step), (m.value, m.timestamp))
        self.recent: dict[int, tuple[dict[str, float], float]] = {}  # step -> (linked metrics, time)
        self.pruned_upto = -1  # steps up to this one left recent: one seen again links nothing
        self.pending: list[tuple[int, str]] = []  # (step, path) not logged yet
        self.logged: dict[int, tuple[str, str]] = {}  # step -> (model_id, path)

    def seen(self, records: list[tuple]) -> None:
        """Step records ``(step, metrics, time)`` as they reach the driver: a step's first record
        (the one whose rows the run logged) is the one its checkpoint links."""
        recent = self.recent
        for step, metrics, *when in records:
            # a step trained again (a group restarted from an earlier checkpoint, a rollback): the run
            # logged its first record's rows (one row per (metric, step)), which its checkpoint links
            if step not in recent and step > self.pruned_upto:
                recent[step] = (linked_metrics(metrics), float(when[0]) if when else 0.0)
        if len(recent) > 2 * RECENT:  # pruned now and then, not at every record (a sort of the steps)
            steps = sorted(recent)
            for old in steps[:-RECENT]:
                del recent[old]
            self.pruned_upto = steps[-RECENT - 1]

    def saved(self, step: int, path: str) -> None:
        """Rank 0 wrote the checkpoint of ``step`` at ``path``: log it (and any still pending)."""
        if path and step not in self.logged and all(s != step for s, _ in self.pending):
            self.pending.append((step, path))
        self.flush()

    def flush(self) -> bool:
        """Log the pending checkpoints; False where the store did not take one (kept for later)."""
        while self.pending:
            step, path = self.pending[0]
            try:
                with deferred_interrupts():  # a LoggedModel cut between creation and READY stays PENDING
                    self.logged[step] = (self._log(step, path), path)
            except Exception:  # the store is away: the run's writer says so; tried again later
                return False
            self.pending.pop(0)
        return True

    def _log(self, step: int, path: str) -> str:
        client, run_id, uri = self.client, self.run_id, redact_uri(path)
        model = client.create_logged_model(
            self.experiment_id,
            name=model_name(step),
            source_run_id=run_id,
            tags={MLFLOW_MODEL_IS_EXTERNAL: "true", CHECKPOINT_URI: uri, CHECKPOINT_STEP: str(step)},
            model_type=MODEL_TYPE,
        )
        mid = model.model_id
        spec = Model(
            artifact_path=model.artifact_location,
            model_uuid=mid,
            model_id=mid,
            run_id=run_id,
            metadata={MLFLOW_MODEL_IS_EXTERNAL: True, "checkpoint_uri": uri, "step": step},
        )
        with tempfile.TemporaryDirectory() as d:  # the MLmodel file only: the weights stay in the checkpoint
            spec.save(os.path.join(d, "MLmodel"))
            client.log_model_artifacts(mid, d)
        client.finalize_logged_model(mid, "READY")
        client.log_outputs(run_id, [LoggedModelOutput(mid, step)])
        metrics, when = self.recent.get(step, ({}, 0.0))
        if metrics:
            # the very rows the run's writer logs for this step (same key, value, time, step): the
            # store keeps one row per (metric, step) in the run and links it to the model.  A step an
            # earlier driver of a resumed run logged (and this one trained again from a checkpoint)
            # keeps that driver's row: its time, not the retrained step's
            ms, earlier = int(1000 * when), self.earlier_rows
            rows = [Metric(k, *earlier.get((k, step), (v, ms)), step, model_id=mid) for k, v in sorted(metrics.items())]
            # the run's buffered rows first: a linked row written ahead of the steps before it would
            # leave a gap in the run's history that a resumed driver's timeline reads as trained
            self.flush_rows()
            client.log_batch(run_id, metrics=rows)
        return mid

    def close(self, exists: Any = None) -> None:
        """The run is over: what is pending is tried once more; with ``exists`` (``path -> bool``),
        a checkpoint that ``checkpoint.keep`` pruned since is tagged ``elastic.checkpoint.pruned``."""
        if not self.flush() or exists is None:
            return
        for mid, path in self.logged.values():
            try:
                if not exists(path):
                    self.client.set_logged_model_tags(mid, {CHECKPOINT_PRUNED: "true"})
            except Exception:  # a store that does not answer: the tag is a courtesy
                return


def ranked_models(client: Any, experiment_id: str, run_id: str, metric: str = M.VAL_LOSS, lowest: bool = True):
    """The run's LoggedModels (its checkpoints and its final model) that carry ``metric``, best
    first: ``search_logged_models`` ordered by it."""
    found = client.search_logged_models(
        experiment_ids=[experiment_id],
        filter_string=f"source_run_id = '{run_id}'",
        order_by=[{"field_name": f"metrics.{metric}", "ascending": lowest}],
        max_results=50,
    )
    return [m for m in found if any(x.key == metric for x in m.metrics or [])]


def model_step(model: Any) -> int | None:
    """The step a LoggedModel holds: a checkpoint's tag, else the step of its linked metrics."""
    tag = (model.tags or {}).get(CHECKPOINT_STEP)
    if tag is not None:
        return int(tag)
    steps = [m.step for m in model.metrics or []]
    return max(steps) if steps else None
