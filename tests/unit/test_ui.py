"""orchestrator/record/ui.py and `python -m orchestrator ui`'s bad input (no server is started here)."""

from __future__ import annotations

import socket

import pytest

from orchestrator.cli import main
from orchestrator.record import ui


def test_links_open_the_run_in_the_model_training_view():
    url = ui.run_url("http://127.0.0.1:5000/", "3", "abc")
    assert url == "http://127.0.0.1:5000/#/experiments/3/runs/abc?workflowType=machine_learning"


def test_a_server_uri_is_linked_directly_and_a_local_store_through_orchestrator_ui():
    assert ui.ui_base("http://mlflow:5000/") == "http://mlflow:5000"
    assert ui.ui_base("sqlite:///mlflow.db", 5001) == "http://127.0.0.1:5001"
    hint = ui.open_hint("sqlite:///mlflow.db", "1", "r1")
    assert "http://127.0.0.1:5000/#/experiments/1/runs/r1?workflowType=machine_learning" in hint
    from orchestrator.config.command import cli

    assert f"{cli()} ui --tracking-uri sqlite:///mlflow.db" in hint
    assert "orchestrator ui" not in ui.open_hint("https://mlflow.example", "1", "r1")


def test_free_port_avoids_a_port_in_use():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        taken = s.getsockname()[1]
        assert ui.free_port(taken) != taken


def test_experiments_are_marked_as_model_training(tmp_path):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path}/m.db")
    exp = client.create_experiment("e")
    ui.mark_experiment(client, exp)
    assert client.get_experiment(exp).tags[ui.EXPERIMENT_KIND_TAG] == ui.MODEL_TRAINING_KIND


def test_recent_runs_lists_top_level_runs_newest_first(tmp_path):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path}/m.db"
    client = MlflowClient(uri)
    exp = client.create_experiment("e")
    first = client.create_run(exp, run_name="first").info.run_id
    second = client.create_run(exp, run_name="second").info.run_id
    client.create_run(exp, run_name="child", tags={"mlflow.parentRunId": second})
    assert [r.info.run_id for r in ui.recent_runs(uri, "e", None)] == [second, first]
    assert [r.info.run_id for r in ui.recent_runs(uri, None, first)] == [first]


@pytest.mark.parametrize(
    "argv, start",
    [
        (["--port", "0"], "error: --port: must be between 1 and 65535"),
        (["--port", "70000"], "error: --port: must be between 1 and 65535"),
        (["--tracking-uri", "sqlite:///{tmp}/none.db"], "error: --tracking-uri: sqlite:///"),
        (["--tracking-uri", "sqlite:///{tmp}/m.db", "--run", "nope"], "error: --run: no run 'nope'"),
    ],
)
def test_bad_ui_input_is_one_line_and_exit_2(tmp_path, capsys, argv, start):
    from mlflow.tracking import MlflowClient

    MlflowClient(f"sqlite:///{tmp_path}/m.db").search_experiments()  # an existing, empty store
    capsys.readouterr()  # MLflow's own lines about creating that store
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    assert main(["ui", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(start) and "\n" not in err, err
    assert not (tmp_path / "none.db").exists(), "a missing store is never created"
