"""search.study_tracking helpers that need no MLflow server: tracking URIs as trials in other processes see them."""

from __future__ import annotations

import os

from orchestrator.config.uris import absolute_tracking_uri


def test_relative_local_stores_are_pinned_to_absolute_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert absolute_tracking_uri("sqlite:///mlflow.db") == f"sqlite:///{tmp_path}/mlflow.db"
    assert absolute_tracking_uri("sqlite:////abs/m.db") == "sqlite:////abs/m.db"
    assert absolute_tracking_uri("http://mlflow:5000") == "http://mlflow:5000"
    assert absolute_tracking_uri("file:mlruns") == f"file:{tmp_path}/mlruns"
    assert absolute_tracking_uri("mlruns") == f"{tmp_path}/mlruns"


# --------------------------------------------------------------------------- the parent run's view of the trials

import optuna  # noqa: E402
import pytest  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402
from optuna.distributions import CategoricalDistribution, FloatDistribution  # noqa: E402

from search.space import parse_space  # noqa: E402
from search.study_tracking import StudyTracker  # noqa: E402
from tests.search_helpers import base_config  # noqa: E402
from trainers.link.tags import NOTE as NOTE_TAG  # noqa: E402

optuna.logging.set_verbosity(optuna.logging.WARNING)
DISTS = {
    "optimizer.lr": FloatDistribution(0.001, 1.0, log=True),
    "schedule.warmup": CategoricalDistribution(["none", "constant"]),
}


def _space(tmp_path):
    return parse_space(
        {
            "base": base_config(tmp_path),
            "objective": {"metric": "val/accuracy"},
            "sampler": {"name": "random", "seed": 0},
            "pruner": "none",
            "params": {
                "optimizer.lr": {"low": 0.001, "high": 1.0, "log": True},
                "schedule.warmup": {"choices": ["none", "constant"]},
                "schedule.warmup_epochs": {"low": 0.25, "high": 0.5, "when": "schedule.warmup != none"},
            },
        }
    )


def _ask(study, values):
    t = study.ask({k: DISTS[k] for k in values if k in DISTS})
    t.set_user_attr("config_values", values)
    t.set_user_attr("mlflow_run_id", f"run{t.number}")
    return t


def _history(client, run_id, key):
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """One MLflow store and space for this module's tests (creating a store takes seconds)."""
    tmp = tmp_path_factory.mktemp("view")
    return f"sqlite:///{tmp}/mlflow.db", _space(tmp)


@pytest.fixture()
def tracked(store, request):
    uri, space = store
    name = request.node.name[:40]  # a study (and parent run) per test
    study = optuna.create_study(direction="maximize", study_name=name)
    return uri, space, study, StudyTracker(uri, "view", name, "memory", space)


def test_the_parent_follows_trials_as_they_end(tracked):
    """Two trials run side by side and end out of order, then a third with other params: the
    objective is logged per trial number at once, best-so-far only for settled steps, the best
    link and its params move with the best, and the table lists every trial."""
    uri, space, study, tracker = tracked
    client = MlflowClient(uri)
    t0 = _ask(study, {"optimizer.lr": 0.1, "schedule.warmup": "constant", "schedule.warmup_epochs": 0.5})
    t1 = _ask(study, {"optimizer.lr": 0.2, "schedule.warmup": "none"})
    study.tell(t1, 0.8)
    assert tracker.trial_done(study) is None
    assert _history(client, tracker.run_id, "trials/val_accuracy") == [(1, 0.8)]
    assert _history(client, tracker.run_id, "trials/best_val_accuracy") == []  # trial 0 may still beat it
    tags = client.get_run(tracker.run_id).data.tags
    assert (tags["search.best_trial"], tags["search.best_run_id"]) == ("1", "run1")
    exp = tracker.experiment_id
    assert f"[trial-1](#/experiments/{exp}/runs/run1)" in tags[NOTE_TAG]

    study.tell(t0, 0.6)
    tracker.trial_done(study)
    assert _history(client, tracker.run_id, "trials/val_accuracy") == [(0, 0.6), (1, 0.8)]
    assert _history(client, tracker.run_id, "trials/best_val_accuracy") == [(0, 0.6), (1, 0.8)]

    t2 = _ask(study, {"optimizer.lr": 0.3, "schedule.warmup": "constant", "schedule.warmup_epochs": 0.25})
    study.tell(t2, 0.9)
    tracker.trial_done(study)
    assert _history(client, tracker.run_id, "trials/best_val_accuracy") == [(0, 0.6), (1, 0.8), (2, 0.9)]
    tags = client.get_run(tracker.run_id).data.tags
    assert (tags["search.best_trial"], tags["search.best_run_id"]) == ("2", "run2")
    assert tags["best.schedule.warmup_epochs"] == "0.25" and tags["best.optimizer.lr"] == "0.3"
    assert f"[trial-2](#/experiments/{exp}/runs/run2)" in tags[NOTE_TAG] and "trial-1" not in tags[NOTE_TAG]

    t3 = _ask(study, {"optimizer.lr": 0.4, "schedule.warmup": "none"})
    study.tell(t3, state=optuna.trial.TrialState.PRUNED)
    t4 = _ask(study, {"optimizer.lr": 0.5, "schedule.warmup": "none"})
    study.tell(t4, 0.95)
    tracker.trial_done(study)
    tags = client.get_run(tracker.run_id).data.tags
    assert tags["search.best_trial"] == "4" and "best.schedule.warmup_epochs" not in tags  # not a param of trial 4
    table = client.load_table(exp, "trials.json", run_ids=[tracker.run_id])
    assert list(table["number"]) == [0, 1, 2, 3, 4]
    assert list(table["state"]) == ["COMPLETE", "COMPLETE", "COMPLETE", "PRUNED", "COMPLETE"]
    assert list(table["run_id"]) == ["run0", "run1", "run2", "run3", "run4"]
    assert table["val/accuracy"].tolist()[:3] == pytest.approx([0.6, 0.8, 0.9])
    assert table["optimizer.lr"].tolist() == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.5])

    tracker.finish(study, "FINISHED", 1.0, None)
    run = client.get_run(tracker.run_id)
    assert run.info.status == "FINISHED" and run.data.metrics["best/value"] == 0.95
    assert _history(client, tracker.run_id, "trials/val_accuracy") == [(0, 0.6), (1, 0.8), (2, 0.9), (4, 0.95)]
    assert _history(client, tracker.run_id, "trials/best_val_accuracy")[-2:] == [(3, 0.9), (4, 0.95)]
    arts = {a.path for a in client.list_artifacts(tracker.run_id)}
    arts |= {a.path for a in client.list_artifacts(tracker.run_id, "plots")}
    assert {"trials.csv", "trials.json", "plots/optimization_history.png"} <= arts
    if not optuna.visualization.is_available():
        assert "interactive.html: plotly is not installed" in run.data.tags["search.plots_skipped"]


def test_a_continued_parent_logs_no_point_twice(tracked):
    uri, space, study, tracker = tracked
    client = MlflowClient(uri)
    for lr, v in ((0.1, 0.5), (0.2, 0.7)):
        study.tell(_ask(study, {"optimizer.lr": lr, "schedule.warmup": "none"}), v)
    tracker.trial_done(study)
    tracker.sync(study, final=True)  # what finish() does first
    again = StudyTracker(uri, "view", study.study_name, "memory", space, existing_run_id=tracker.run_id)
    assert again.run_id == tracker.run_id
    study.tell(_ask(study, {"optimizer.lr": 0.3, "schedule.warmup": "none"}), 0.6)
    again.trial_done(study)
    again.sync(study, final=True)
    assert _history(client, tracker.run_id, "trials/val_accuracy") == [(0, 0.5), (1, 0.7), (2, 0.6)]
    assert _history(client, tracker.run_id, "trials/best_val_accuracy") == [(0, 0.5), (1, 0.7), (2, 0.7)]


class FakeFigure:
    def __init__(self, name: str) -> None:
        self.name = name

    def to_html(self, full_html: bool, include_plotlyjs: bool) -> str:
        assert full_html is False
        return f"<div id='{self.name}'>{'<script>plotly.js</script>' if include_plotlyjs else ''}</div>"


def test_interactive_plots_are_one_page_with_plotly_embedded_once(tracked, monkeypatch):
    """plotly is not a dependency: its figures are faked, to check what the page holds."""
    import optuna.visualization as ov

    uri, space, study, tracker = tracked
    monkeypatch.setattr(ov, "is_available", lambda: True)
    for name in ("optimization_history", "param_importances", "parallel_coordinate", "timeline", "intermediate_values"):
        monkeypatch.setattr(ov, f"plot_{name}", lambda s, _n=name, **kw: FakeFigure(_n))

    def broken(study, **kw):
        raise ValueError("cannot draw this\nmore")

    monkeypatch.setattr(ov, "plot_timeline", broken)
    study.tell(_ask(study, {"optimizer.lr": 0.1, "schedule.warmup": "none"}), 0.5)
    skipped = tracker.log_html_plots(study)
    assert skipped == ["timeline (html): ValueError: cannot draw this"]
    page = MlflowClient(uri).download_artifacts(tracker.run_id, "plots/interactive.html")
    text = open(page).read()
    assert text.count("plotly.js") == 1  # embedded once, in the first figure
    assert "<div id='optimization_history'><script>" in text and "<div id='intermediate_values'></div>" in text
    assert "param_importances" not in text  # needs two complete trials
    assert f"<title>study {study.study_name}: Optuna plots</title>" in text


def test_a_studys_parent_run_keeps_its_artifacts_beside_the_store(tmp_path, monkeypatch):
    """A study started from another folder: the space file (an artifact of the parent run) lands
    under the store's folder, and nothing under ./mlruns of the command's folder."""
    (tmp_path / "store").mkdir()
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    uri = f"sqlite:///{tmp_path}/store/mlflow.db"
    tracker = StudyTracker(uri, "studies", "s1", "optuna.journal", _space(tmp_path))
    run = MlflowClient(uri).get_run(tracker.run_id)
    assert run.info.artifact_uri.startswith(str(tmp_path / "store" / "mlartifacts"))
    assert (tmp_path / "store" / "mlartifacts" / "studies" / tracker.run_id / "artifacts" / "space.yaml").is_file()
    assert os.listdir(tmp_path / "cwd") == []
