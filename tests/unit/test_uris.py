"""orchestrator/config/uris.py: what MLflow is handed (never a password), what is printed (links without
credentials, free text redacted), and where a store keeps its artifacts."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from orchestrator.config.uris import (
    artifacts_destination,
    experiment_artifact_location,
    mlflow_uri,
    public_url,
    redact_text,
)
from orchestrator.record import ui

SECRET = "s3cret"
CRED_VARS = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT")


@pytest.fixture()
def no_mlflow_credentials(monkeypatch):
    for var in CRED_VARS:
        monkeypatch.delenv(var, raising=False)


def test_a_servers_user_and_password_move_from_the_uri_to_mlflows_credential_variables(no_mlflow_credentials):
    assert mlflow_uri(f"https://alice:{SECRET}%40x@mlflow.example:5000/base") == "https://mlflow.example:5000/base"
    assert (os.environ["MLFLOW_TRACKING_USERNAME"], os.environ["MLFLOW_TRACKING_PASSWORD"]) == ("alice", f"{SECRET}@x")


def test_credentials_already_in_the_environment_win_as_they_did_over_the_uri(no_mlflow_credentials, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "bob")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "theirs")
    assert mlflow_uri(f"http://alice:{SECRET}@h:1") == "http://h:1"
    assert os.environ["MLFLOW_TRACKING_PASSWORD"] == "theirs"


def test_a_token_as_user_stays_in_the_uri_and_mlflow_is_told_not_to_print_it(no_mlflow_credentials):
    assert mlflow_uri("https://tok@h") == "https://tok@h"
    assert os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] == "true"


@pytest.mark.parametrize("uri", ["http://h:5000", "sqlite:////abs/m.db", f"postgresql://a:{SECRET}@db/m", "mlruns"])
def test_other_uris_reach_mlflow_unchanged(no_mlflow_credentials, uri):
    assert mlflow_uri(uri) == uri
    assert not any(os.environ.get(v) for v in CRED_VARS)


def test_links_and_messages_show_no_credentials():
    assert public_url(f"http://alice:{SECRET}@h:5000/") == "http://h:5000/"
    assert public_url("https://h/?token=abc") == "https://h/?token=***"
    assert ui.ui_base(f"http://alice:{SECRET}@h:5000/") == "http://h:5000"
    hint = ui.open_hint(f"http://alice:{SECRET}@h:5000", "1", "r")
    assert SECRET not in hint and "alice" not in hint and "http://h:5000/#/experiments/1/runs/r" in hint
    text = f"API request to http://alice:{SECRET}@h:5000/api/2.0/x failed; storage 'postgresql://a:{SECRET}@db/m'"
    assert redact_text(text) == (
        "API request to http://alice:***@h:5000/api/2.0/x failed; storage 'postgresql://a:***@db/m'"
    )


def test_a_studys_summary_shows_no_storage_password():
    from search.commands import _run_summary

    s = SimpleNamespace(
        study_name="s",
        records=[],
        trials_in_study=0,
        total_steps=0,
        wall_s=1.0,
        best=[],
        objectives=["val/loss"],
        storage="postgresql://a:***@db/optuna",
        parent_run_id="p",
        experiment_id="1",
        tracking_uri=f"http://alice:{SECRET}@h:5000",
        count=lambda state: 0,
    )
    out = _run_summary(s, f"postgresql://a:{SECRET}@db/optuna")
    assert SECRET not in out and "--storage postgresql://a:***@db/optuna" in out


def test_artifacts_follow_the_store(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert artifacts_destination("sqlite:////srv/runs/mlflow.db") == "/srv/runs/mlartifacts"
    assert artifacts_destination("sqlite:///sub/mlflow.db") == str(tmp_path / "sub" / "mlartifacts")
    assert artifacts_destination("file:///srv/mlruns") == "/srv/mlruns"  # a file store keeps them inside
    assert artifacts_destination("http://h:5000") is None  # the server's proxied artifacts
    assert artifacts_destination(f"postgresql://a:{SECRET}@db/m") is None
    assert experiment_artifact_location("sqlite:////srv/m.db", "my exp/v2") == "/srv/mlartifacts/my_exp_v2"
    assert experiment_artifact_location("file:///srv/mlruns", "e") is None


def test_a_new_experiment_of_a_sqlite_store_keeps_its_artifacts_beside_it(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    uri = f"sqlite:///{tmp_path}/store/mlflow.db"
    (tmp_path / "store").mkdir()
    client = MlflowClient(uri)
    exp_id = ui.experiment_id(client, uri, "e1")
    assert ui.experiment_id(client, uri, "e1") == exp_id  # found again, not created twice
    location = client.get_experiment(exp_id).artifact_location
    assert location == str(tmp_path / "store" / "mlartifacts" / "e1")
    assert client.get_experiment(exp_id).tags[ui.EXPERIMENT_KIND_TAG] == ui.MODEL_TRAINING_KIND
