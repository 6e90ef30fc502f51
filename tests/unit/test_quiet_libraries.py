"""orchestrator.run.ray_env.quiet_libraries: MLflow's and Ray's chatter off unless asked (no processes)."""

import json
import logging
import os

from orchestrator.run.ray_env import quiet_libraries

QUIET = ("MLFLOW_LOGGING_LEVEL", "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR")


def test_quiet_turns_off_mlflows_download_bars_and_info_lines(monkeypatch, tmp_path, capsys):
    for k in QUIET:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setattr(logging.getLogger("mlflow"), "level", logging.NOTSET)
    quiet_libraries(False)
    assert os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] == "false"
    assert logging.getLogger("mlflow").level == logging.WARNING

    # what the driver does on resume (orchestrator/record/history.py): read an artifact back
    import mlflow
    from mlflow.tracking import MlflowClient

    from orchestrator.record.history import _read_json

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    mlflow.set_tracking_uri(uri)
    with mlflow.start_run() as run:
        mlflow.log_text(json.dumps({"a": 1}), "timeline/x.json")
    capsys.readouterr()
    assert _read_json(MlflowClient(uri), run.info.run_id, "timeline/x.json") == {"a": 1}
    assert "Downloading artifacts" not in capsys.readouterr().err


def test_verbose_leaves_them_as_they_are(monkeypatch):
    for k in QUIET:
        monkeypatch.delenv(k, raising=False)
    quiet_libraries(True)
    assert not any(k in os.environ for k in QUIET)
