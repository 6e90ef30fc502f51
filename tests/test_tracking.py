"""The MLflow tracker on a real SQLite store (no Ray): stepwise metrics are logged where they
change, with the step before each change and the last step, so the per-step series is exact."""

from orchestrator.config import validate
from orchestrator.tracking import RunTracker
from tests.helpers import dense_series, metric_series


def _tracker(tmp_path):
    cfg = validate({"tracking": {"uri": f"sqlite:///{tmp_path}/mlflow.db", "experiment": "t"}})
    return RunTracker(cfg), cfg.tracking.uri


def test_stepwise_metrics_are_logged_at_changes_and_plateau_ends(tmp_path):
    tr, uri = _tracker(tmp_path)
    lr = [0.1] * 5 + [0.2] * 3 + [0.05] * 4  # steps 1..12
    records = [(s, {"lr": v, "train/loss": 1.0 / s}) for s, v in enumerate(lr, start=1)]
    tr.log_metrics(records[:6])  # a push ends inside the second plateau
    tr.log_metrics(records[6:])
    tr.end()
    assert metric_series(uri, tr.run_id, "lr") == [(1, 0.1), (5, 0.1), (6, 0.2), (8, 0.2), (9, 0.05), (12, 0.05)]
    assert dense_series(uri, tr.run_id, "lr") == [(s, v) for s, v in enumerate(lr, start=1)]
    assert [s for s, _ in metric_series(uri, tr.run_id, "train/loss")] == list(range(1, 13))  # every step
    assert [s for s, _ in tr.history["lr"]] == [1, 5, 6, 8, 9, 12]  # what the plots draw


def test_a_resumed_tracker_logs_nothing_twice(tmp_path):
    tr, uri = _tracker(tmp_path)
    tr.log_metrics([(s, {"workers": 2.0, "train/loss": 0.5}) for s in range(1, 5)])
    tr.end()
    cfg = validate({"tracking": {"uri": uri, "experiment": "t"}})
    again = RunTracker(cfg, run_id=tr.run_id)
    again.log_metrics([(s, {"workers": 2.0 if s < 6 else 4.0, "train/loss": 0.5}) for s in range(3, 8)])
    again.end()
    assert metric_series(uri, tr.run_id, "workers") == [(1, 2.0), (4, 2.0), (5, 2.0), (6, 4.0), (7, 4.0)]
    assert [s for s, _ in metric_series(uri, tr.run_id, "train/loss")] == list(range(1, 8))
