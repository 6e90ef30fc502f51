"""Each checkpoint as an MLflow 3 LoggedModel (orchestrator/record/checkpoint_models.py), on a real SQLite
MLflow store through the driver's TrackingListener: its step, its metrics linked to its model_id (each
(metric, step) still once in the run), the checkpoint referenced where it lives, the best found by
search_logged_models, a pruned one tagged, and a store that does not answer leaving it for later."""

from __future__ import annotations

import os
from functools import partial

from mlflow.tracking import MlflowClient

from orchestrator.config.schema import validate
from orchestrator.record.checkpoint_models import MODEL_TYPE, ranked_models
from orchestrator.record.listeners import TrackingListener
from orchestrator.record.model_log import seeded_workload
from orchestrator.record.params import ConfigRecord
from orchestrator.record.run_tracker import RunTracker
from trainers.link.messages import CheckpointSaved
from trainers.link.tags import CHECKPOINT_PRUNED, CHECKPOINT_STEP, CHECKPOINT_URI

VAL = {5: 0.9, 10: 0.4, 15: 0.6}  # val/loss at the checkpoints' steps: step 10 is the best


def _record(step: int) -> tuple:
    metrics = {"train/loss": 2.0 / step, "lr": 0.1}
    if step in VAL:
        metrics.update({"val/loss": VAL[step], "val/accuracy": 1.0 - VAL[step]})
    return step, metrics, 1000.0 + step


def _run(tmp_path):
    cfg = validate({"tracking": {"uri": f"sqlite:///{tmp_path}/mlflow.db", "experiment": "ckpt"}})
    tracker = RunTracker(ConfigRecord.from_config(cfg))
    listener = TrackingListener(tracker)
    paths = {}
    for step in range(1, 16):
        listener.on_records([_record(step)])
        if step in VAL:
            paths[step] = str(tmp_path / "runs" / f"checkpoint_step{step:08d}")
            if step != 5:  # checkpoint.keep pruned the first one before the run ended
                os.makedirs(paths[step])
            listener.on_event(CheckpointSaved(step=step, path=paths[step]))
    listener.close()
    tracker.end()
    return tracker, paths


def test_each_checkpoint_is_a_logged_model_with_its_step_metrics_and_location(tmp_path):
    tracker, paths = _run(tmp_path)
    client = MlflowClient(tracker.client.tracking_uri)
    models = client.search_logged_models([tracker.experiment_id], filter_string=f"model_type = '{MODEL_TYPE}'")
    by_step = {int(m.tags[CHECKPOINT_STEP]): m for m in models}
    assert sorted(by_step) == [5, 10, 15]
    for step, m in by_step.items():
        assert m.source_run_id == tracker.run_id and m.name == f"checkpoint-step{step}"
        assert m.tags[CHECKPOINT_URI] == paths[step] and m.tags["mlflow.model.isExternal"] == "true"
        linked = {x.key: (x.step, x.value) for x in m.metrics}
        assert linked["val/loss"] == (step, VAL[step]) and linked["train/loss"] == (step, 2.0 / step)
        assert "lr" not in linked  # only what describes the checkpoint
        # the artifacts: an MLmodel file naming the checkpoint, no weights
        assert [a.path for a in client.list_logged_model_artifacts(m.model_id)] == ["MLmodel"]
    assert by_step[5].tags.get(CHECKPOINT_PRUNED) == "true" and CHECKPOINT_PRUNED not in by_step[10].tags
    # the run's outputs carry each model with its step
    outputs = client.get_run(tracker.run_id).outputs.model_outputs
    assert sorted((o.step, o.model_id) for o in outputs) == sorted((s, m.model_id) for s, m in by_step.items())
    # the run's series keep one row per (metric, step): the linked rows are the run's own
    history = client.get_metric_history(tracker.run_id, "val/loss")
    assert sorted((h.step, h.value) for h in history) == sorted(VAL.items())
    assert len(client.get_metric_history(tracker.run_id, "train/loss")) == 15


def test_the_best_checkpoint_by_a_validation_metric(tmp_path):
    tracker, _ = _run(tmp_path)
    ranked = ranked_models(tracker.client, tracker.experiment_id, tracker.run_id)
    assert [int(m.tags[CHECKPOINT_STEP]) for m in ranked] == [10, 15, 5]
    by_accuracy = ranked_models(tracker.client, tracker.experiment_id, tracker.run_id, "val/accuracy", lowest=False)
    assert int(by_accuracy[0].tags[CHECKPOINT_STEP]) == 10


def test_a_checkpoint_of_a_step_trained_again_after_a_restart_links_the_row_the_run_logged(tmp_path):
    """A group lost before step 15's checkpoint restarts from step 10 and trains 11-15 again (later,
    the same values): the run keeps one train/loss row per step, and step 15's checkpoint links that
    row (its first time), not a second row at the retrained step's time."""
    cfg = validate({"tracking": {"uri": f"sqlite:///{tmp_path}/mlflow.db", "experiment": "ckpt"}})
    tracker = RunTracker(ConfigRecord.from_config(cfg))
    listener = TrackingListener(tracker)
    for step in range(1, 16):  # the first group: its checkpoint at 15 never announced (its node was lost)
        listener.on_records([_record(step)])
        if step in (5, 10):
            listener.on_event(CheckpointSaved(step=step, path=str(tmp_path / f"c{step}")))
    for step in range(11, 16):  # the restarted group, 11 s later
        step_, metrics, when = _record(step)
        listener.on_records([(step_, metrics, when + 11.0)])
    listener.on_event(CheckpointSaved(step=15, path=str(tmp_path / "c15")))
    listener.close()
    tracker.end()
    client = MlflowClient(tracker.client.tracking_uri)
    for key in ("train/loss", "val/loss"):
        rows = [(h.step, h.timestamp) for h in client.get_metric_history(tracker.run_id, key)]
        assert len(rows) == len({s for s, _ in rows}), f"{key} logged twice at a step: {sorted(rows)}"
    at15 = [h for h in client.get_metric_history(tracker.run_id, "train/loss") if h.step == 15]
    assert [h.timestamp for h in at15] == [1_015_000]  # the first group's time
    (model,) = [m for m in client.search_logged_models([tracker.experiment_id]) if m.tags[CHECKPOINT_STEP] == "15"]
    assert {(m.key, m.timestamp) for m in model.metrics} == {
        ("train/loss", 1_015_000),
        ("val/loss", 1_015_000),
        ("val/accuracy", 1_015_000),
    }


def test_a_store_that_does_not_answer_leaves_the_checkpoint_for_later(tmp_path):
    cfg = validate({"tracking": {"uri": f"sqlite:///{tmp_path}/mlflow.db", "experiment": "ckpt"}})
    tracker = RunTracker(ConfigRecord.from_config(cfg))
    models = tracker.checkpoints  # the run's, as its TrackingListener holds it
    models.seen([_record(5)])
    real = models.client

    class Away:
        def __getattr__(self, name):
            raise ConnectionError("the tracking server does not answer")

    models.client = Away()
    models.saved(5, str(tmp_path / "c5"))
    assert models.pending == [(5, str(tmp_path / "c5"))] and not models.logged
    models.client = real
    models.seen([_record(10)])
    models.saved(10, str(tmp_path / "c10"))  # back: both logged, each once
    assert not models.pending and sorted(models.logged) == [5, 10]
    models.saved(10, str(tmp_path / "c10"))  # the same checkpoint told twice: one model
    assert len(real.search_logged_models([tracker.experiment_id])) == 2


def test_register_best_logs_the_best_checkpoints_weights_and_registers_them(tmp_path):
    import mlflow.pytorch
    import torch

    from trainers.loop.checkpoint import write_checkpoint
    from trainers.workload.build import build_workload

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cfg = validate(
        {
            "data": {"name": "digits"},
            "model": {"name": "mlp", "norm": "none", "hidden": 8},
            "tracking": {"uri": uri, "experiment": "best", "register_pick": "best"},
        }
    )
    tracker = RunTracker(ConfigRecord.from_config(cfg))
    listener = TrackingListener(tracker)
    states = {}
    for step in (5, 10, 15):
        torch.manual_seed(step)
        states[step] = build_workload(cfg).model.state_dict()
        path = str(tmp_path / f"checkpoint_step{step:08d}")
        write_checkpoint(path, {"model": states[step]})
        listener.on_records([_record(step)])
        listener.on_event(CheckpointSaved(step=step, path=path))
    listener.on_records([(16, {"train/loss": 0.1, "val/loss": 0.7}, 1016.0)])  # the final model: worse than step 10
    listener.close()
    model_uri, version = tracker.log_final_model(
        states[15], partial(seeded_workload, cfg), 0, "digits-best", warn=print
    )
    tracker.end()
    assert version == "digits-best/1"
    registered = MlflowClient(uri).get_model_version("digits-best", "1")
    best = tracker.client.get_logged_model(registered.source.removeprefix("models:/"))
    assert best.name == "best_model" and {m.step for m in best.metrics} == {10}
    assert registered.source != model_uri  # not the final model
    loaded = mlflow.pytorch.load_model(registered.source)
    for key, value in states[10].items():  # the weights of step 10's checkpoint, read where it lives
        torch.testing.assert_close(loaded.state_dict()[key], value)
