"""search.tracking helpers that need no MLflow server: tracking URIs as trials in other processes see them."""

from __future__ import annotations

from orchestrator.uris import absolute_tracking_uri


def test_relative_local_stores_are_pinned_to_absolute_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert absolute_tracking_uri("sqlite:///mlflow.db") == f"sqlite:///{tmp_path}/mlflow.db"
    assert absolute_tracking_uri("sqlite:////abs/m.db") == "sqlite:////abs/m.db"
    assert absolute_tracking_uri("http://mlflow:5000") == "http://mlflow:5000"
    assert absolute_tracking_uri("file:mlruns") == f"file:{tmp_path}/mlruns"
    assert absolute_tracking_uri("mlruns") == f"{tmp_path}/mlruns"
