"""A run's artifacts follow its tracking store (orchestrator/config/uris.py ``artifacts_destination``):
with the SQLite store in one folder and the command run from another, the config, plots, model
files and the registered MLflow model land beside the store, and no ``./mlruns`` appears where
the command ran."""

from __future__ import annotations

import os

import pytest

from orchestrator.run.runner import run_training
from tests.helpers import make_config

pytestmark = pytest.mark.integration


def test_a_runs_artifacts_land_beside_its_store_not_in_the_working_folder(ray_cluster, tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    store, cwd = tmp_path / "store", tmp_path / "cwd"
    store.mkdir()
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    uri = f"sqlite:///{store}/mlflow.db"
    cfg = make_config(tmp_path, uri, tracking={"uri": uri, "experiment": "follow"})
    s = run_training(cfg, progress=False, register_model="follow-model")
    assert s.status == "FINISHED", s

    assert os.listdir(cwd) == []  # no ./mlruns, no ./mlartifacts
    artifacts = store / "mlartifacts" / "follow"
    run = MlflowClient(uri).get_run(s.run_id)
    assert run.info.artifact_uri == str(artifacts / s.run_id / "artifacts")
    files = {os.path.relpath(os.path.join(root, f), artifacts) for root, _, names in os.walk(artifacts) for f in names}
    assert {f"{s.run_id}/artifacts/config.yaml", f"{s.run_id}/artifacts/model/model.pt"} <= files, sorted(files)
    assert [f for f in files if f.startswith("models/") and f.endswith("MLmodel")], sorted(files)  # the logged model
