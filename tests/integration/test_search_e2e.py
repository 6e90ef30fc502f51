"""``python -m search`` end to end on a real local Ray (2 CPUs): parallel trials, pruning that stops
multi-worker runs, failed trials, continuing a study, MLflow parent/child runs; and bad space files
that stop before anything starts.

Trials are tiny (digits, an MLP of width 32, 1-2 workers of 0.5 CPU): what a trial costs here is
mostly Ray Train starting and stopping its worker group (~20 s), so each test runs its trials in
one to three rounds of two."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

import optuna
import pytest
import yaml
from mlflow.tracking import MlflowClient

from search.commands import main
from search.study_storage import open_storage
from tests.helpers import metric_series, migrated_store
from tests.search_helpers import base_config, write_space

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_cli(space: str, storage: str, uri: str, *extra: str) -> int:
    return main(["run", space, "--storage", storage, "--tracking-uri", uri, "--no-progress", *extra])


def load(storage: str, name: str) -> optuna.Study:
    return optuna.load_study(study_name=name, storage=open_storage(storage))


def runs_of(uri: str, parent_id: str) -> list:
    client = MlflowClient(uri)
    parent = client.get_run(parent_id)
    return client.search_runs([parent.info.experiment_id], filter_string=f"tags.`mlflow.parentRunId` = '{parent_id}'")


# --------------------------------------------------------------------------- (a) + (d): parallel trials, continue


@pytest.fixture(scope="module")
def study_a(ray_cluster, tmp_path_factory):
    """4 trials, 2 at a time, then the same command again with --trials 2."""
    tmp = tmp_path_factory.mktemp("study_a")
    uri, storage = migrated_store(f"sqlite:///{tmp}/mlflow.db"), str(tmp / "optuna.journal")
    space = write_space(
        tmp,
        "study_a",
        base=base_config(tmp),
        objective={"metric": "val/accuracy", "direction": "maximize"},
        sampler={"name": "random", "seed": 0},
        pruner="none",
        params={
            "optimizer.lr": {"low": 0.02, "high": 0.3, "log": True},
            "optimizer.mf": {"low": 0.5, "high": 0.95},
            "batch.size": {"choices": [32, 64]},
        },
    )
    first = run_cli(space, storage, uri, "--trials", "4", "--parallel", "2")
    after_first = [t.number for t in load(storage, "study_a").trials]
    parent_first = load(storage, "study_a").user_attrs["mlflow_parent_run_id"]
    second = run_cli(space, storage, uri, "--trials", "2", "--parallel", "2")
    return {
        "tmp": tmp,
        "uri": uri,
        "storage": storage,
        "rc": (first, second),
        "after_first": after_first,
        "parent_first": parent_first,
    }


@pytest.mark.integration
def test_parallel_study_completes_and_storage_holds_every_trial(study_a):
    assert study_a["rc"] == (0, 0)
    assert study_a["after_first"] == list(range(4))
    study = load(study_a["storage"], "study_a")
    assert len(study.trials) == 6
    for t in study.trials:
        assert t.state == optuna.trial.TrialState.COMPLETE, (t.number, t.state, t.user_attrs.get("error"))
        assert 0.0 < t.value <= 1.0
        assert set(t.params) == {"optimizer.lr", "optimizer.mf", "batch.size"}
        assert t.user_attrs["steps"] in (23, 45)  # one epoch of 1438 samples at B = 64 or 32
        assert t.user_attrs["mlflow_run_id"]
    starts = sorted((t.datetime_start, t.datetime_complete) for t in study.trials[:4])
    overlaps = sum(1 for (s0, e0), (s1, _) in zip(starts, starts[1:]) if s1 < e0)
    assert overlaps >= 2, "trials ran two at a time"
    assert study.best_value == max(t.value for t in study.trials)


@pytest.mark.integration
def test_mlflow_holds_parent_and_one_child_per_trial(study_a):
    uri = study_a["uri"]
    study = load(study_a["storage"], "study_a")
    parent_id = study.user_attrs["mlflow_parent_run_id"]
    client = MlflowClient(uri)
    parent = client.get_run(parent_id)
    assert parent.info.status == "FINISHED"
    assert parent.data.params["study_name"] == "study_a" and parent.data.params["sampler"] == "random(seed=0)"
    assert parent.data.params["pruner"] == "none"
    assert parent.data.tags["search.storage"] == study_a["storage"]
    assert parent.data.metrics["best/value"] == pytest.approx(study.best_value)
    assert parent.data.metrics["trials/total"] == 6 and parent.data.metrics["trials/complete"] == 6
    assert parent.data.metrics["search/total_steps"] == sum(t.user_attrs["steps"] for t in study.trials)
    assert float(parent.data.tags["best.optimizer.lr"]) == pytest.approx(study.best_params["optimizer.lr"])
    arts = {a.path for a in client.list_artifacts(parent_id)} | {
        a.path for a in client.list_artifacts(parent_id, "plots")
    }
    for a in (
        "space.yaml",
        "best_config.yaml",
        "plots/optimization_history.png",
        "plots/param_importances.png",
        "plots/parallel_coordinate.png",
    ):
        assert a in arts, arts
    children = runs_of(uri, parent_id)
    assert len(children) == 6
    by_number = {int(r.data.tags["search.trial"]): r for r in children}
    assert sorted(by_number) == list(range(6))
    for t in study.trials:
        run = by_number[t.number]
        assert run.info.run_id == t.user_attrs["mlflow_run_id"]
        assert run.info.status == "FINISHED" and run.data.tags["search.state"] == "COMPLETE"
        assert float(run.data.params["optimizer.lr"]) == pytest.approx(t.params["optimizer.lr"])
        loss = metric_series(uri, run.info.run_id, "train/loss")
        assert loss[-1][0] == t.user_attrs["steps"]
        assert metric_series(uri, run.info.run_id, "val/accuracy")[-1][1] == pytest.approx(t.value)


@pytest.mark.integration
def test_the_parent_shows_the_history_the_best_trial_as_a_link_and_every_trial(study_a):
    """Over both invocations (4 trials two at a time, then 2 more): trials named trial-N, the
    objective at step = trial number and the best so far (each step once), the best trial's run
    as a tag and a link in the description, the table of trials, the plots."""
    uri = study_a["uri"]
    study = load(study_a["storage"], "study_a")
    parent_id = study.user_attrs["mlflow_parent_run_id"]
    client = MlflowClient(uri)
    parent = client.get_run(parent_id)
    exp = parent.info.experiment_id
    assert sorted(r.info.run_name for r in runs_of(uri, parent_id)) == sorted(f"trial-{n}" for n in range(6))
    values = [t.value for t in study.trials]
    history = metric_series(uri, parent_id, "trials/val_accuracy")
    assert [s for s, _ in history] == list(range(6))
    assert [v for _, v in history] == pytest.approx(values)
    best = metric_series(uri, parent_id, "trials/best_val_accuracy")
    assert [s for s, _ in best] == list(range(6))
    assert [v for _, v in best] == pytest.approx([max(values[: n + 1]) for n in range(6)])
    best_run = study.best_trial.user_attrs["mlflow_run_id"]
    assert parent.data.tags["search.best_trial"] == str(study.best_trial.number)
    assert parent.data.tags["search.best_run_id"] == best_run
    assert client.get_run(best_run).info.run_name == f"trial-{study.best_trial.number}"
    assert f"(#/experiments/{exp}/runs/{best_run})" in parent.data.tags["mlflow.note.content"]
    table = client.load_table(exp, "trials.json", run_ids=[parent_id])
    assert list(table["number"]) == list(range(6)) and set(table["state"]) == {"COMPLETE"}
    assert list(table["run_id"]) == [t.user_attrs["mlflow_run_id"] for t in study.trials]
    assert list(table["val/accuracy"]) == pytest.approx(values)
    assert list(table["batch.size"]) == [t.params["batch.size"] for t in study.trials]
    arts = {a.path for folder in (None, "plots") for a in client.list_artifacts(parent_id, folder)}
    assert {"trials.csv", "trials.json", "best_trials.json", "plots/timeline.png"} <= arts, arts
    assert "plots/interactive.html" in arts  # plotly is a dependency (pyproject.toml)
    page = client.download_artifacts(parent_id, "plots/interactive.html")
    with open(page) as f:
        html = f.read()
    assert "optimization history" in html and "plotly" in html.lower()


@pytest.mark.integration
def test_rerun_adds_trials_to_the_same_study_and_parent(study_a):
    study = load(study_a["storage"], "study_a")
    assert [t.number for t in study.trials] == list(range(6))
    assert study.user_attrs["mlflow_parent_run_id"] == study_a["parent_first"]
    parents = MlflowClient(study_a["uri"]).search_runs(
        [MlflowClient(study_a["uri"]).get_run(study_a["parent_first"]).info.experiment_id],
        filter_string="tags.`search.role` = 'study'",
    )
    assert len(parents) == 1


@pytest.mark.integration
def test_show_prints_trials_and_a_ready_to_train_config(study_a, capsys, tmp_path):
    out_file = tmp_path / "best.yaml"
    assert main(["show", "study_a", "--storage", study_a["storage"], "--output", str(out_file)]) == 0
    out = capsys.readouterr().out
    assert "study study_a" in out and "6 trials (6 complete)" in out
    rows = [line for line in out.splitlines() if line.split(" ")[0].isdigit() and "COMPLETE" in line]
    assert len(rows) == 6
    from orchestrator.config.schema import validate

    study = load(study_a["storage"], "study_a")
    cfg = validate(yaml.safe_load(out_file.read_text()))
    assert cfg.optimizer.lr == pytest.approx(study.best_params["optimizer.lr"])
    assert cfg.batch.size == study.best_params["batch.size"]


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
DASHBOARD = importlib.util.find_spec("optuna_dashboard") is not None


def _text(url: str) -> str:
    """The page's text as headless Chromium renders it (scripts run, tags dropped)."""
    dom = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1400,2000"]
        + ["--virtual-time-budget=20000", "--dump-dom", url],
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    dom = re.sub(r"<(script|style).*?</\1>", " ", dom, flags=re.S)
    return " ".join(re.sub(r"<[^>]+>", " ", dom).split())


@pytest.mark.integration
@pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH (.ci/run installs Debian's 'chromium' package)")
@pytest.mark.skipif(not DASHBOARD, reason="optuna-dashboard is not installed (pip install -e '.[dashboard]')")
def test_optuna_dashboard_shows_the_studys_trials_and_intermediate_values(study_a, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(tmp_path / "dashboard.log", "w")
    # the documented command (README): the study's journal file as the storage
    proc = subprocess.Popen(
        [sys.executable, "-c", "from optuna_dashboard._cli import main; main()", study_a["storage"]]
        + ["--host", "127.0.0.1", "--port", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        studies = None
        for _ in range(120):  # until it answers (bounded)
            try:
                with urllib.request.urlopen(f"{base}/api/studies", timeout=5) as r:
                    studies = json.load(r)["study_summaries"]
                break
            except OSError:
                assert proc.poll() is None, (tmp_path / "dashboard.log").read_text()
                time.sleep(0.5)
        (sid,) = [x["study_id"] for x in studies if x["study_name"] == "study_a"]
        trials = load(study_a["storage"], "study_a").trials
        reported = [t for t in trials if t.intermediate_values]
        assert reported, "the trials report their validation metric as intermediate values"
        page = _text(f"{base}/dashboard/studies/{sid}")
        assert "study_a" in page and "Intermediate values" in page, page[:2000]
        for t in reported:  # each trial's curve in the intermediate values chart's legend
            assert f"trial #{t.number}" in page
        listing = _text(f"{base}/dashboard/studies/{sid}/trials")
        assert f"{len(trials)} Trials" in listing, listing[:2000]
        for t in trials:
            assert f"Trial {t.number} Complete" in listing
        first = trials[0]  # the trial shown first: its intermediate values, step then value
        step = min(first.intermediate_values)
        assert "Intermediate Values" in listing and f" {step} " in listing.split("Intermediate Values", 1)[1]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


# --------------------------------------------------------------------------- (b) pruning stops hopeless trials


# 20 epochs: the condemned trial stops by its next evaluation (tests/integration/test_search_pruned_trials.py
# pins that bound), far before half of them.
FULL_STEPS = 20 * 45  # 20 epochs of 1438 samples at B = 32


@pytest.mark.integration
def test_pruning_stops_hopeless_multi_worker_trials_early(ray_cluster, tmp_path, tracking_uri):
    """lr = 50 diverges at once: the threshold pruner stops it (both workers at the same step) while
    the lr = 0.05 trial runs its 20 epochs."""
    storage = str(tmp_path / "optuna.journal")
    base = base_config(
        tmp_path,
        train={"epochs": 20, "eval_every": 10, "log_every": 5},
        batch={"size": 32, "max_local_batch": 16},
        scaling={"min_workers": 2, "max_workers": 2, "cpus_per_worker": 0.5},
    )
    space = write_space(
        tmp_path,
        "prune",
        base=base,
        objective={"metric": "val/accuracy"},
        sampler={"name": "grid", "seed": 0},
        pruner={"name": "threshold", "lower": 0.3, "n_warmup_steps": 20},
        params={"optimizer.lr": {"choices": [0.05, 50.0]}},
    )
    assert run_cli(space, storage, tracking_uri, "--parallel", "2") == 0
    study = load(storage, "prune")
    states = {t.params["optimizer.lr"]: t for t in study.trials}
    assert sorted(states) == [0.05, 50.0]
    good, bad = states[0.05], states[50.0]
    assert good.state == optuna.trial.TrialState.COMPLETE and good.user_attrs["steps"] == FULL_STEPS
    assert bad.state == optuna.trial.TrialState.PRUNED
    pruned_at, stopped_at = bad.user_attrs["pruned_at_step"], bad.user_attrs["steps"]
    assert 20 <= pruned_at <= stopped_at < FULL_STEPS / 2, (pruned_at, stopped_at)
    assert max(bad.intermediate_values) <= stopped_at
    client = MlflowClient(tracking_uri)
    run = client.get_run(bad.user_attrs["mlflow_run_id"])
    assert run.data.tags["search.state"] == "PRUNED" and run.info.status == "KILLED"
    assert metric_series(tracking_uri, run.info.run_id, "train/loss")[-1][0] == stopped_at
    assert metric_series(tracking_uri, run.info.run_id, "workers")[-1][1] == 2.0
    good_run = client.get_run(good.user_attrs["mlflow_run_id"])
    assert good_run.data.tags["search.state"] == "COMPLETE" and good_run.info.status == "FINISHED"
    assert metric_series(tracking_uri, good_run.info.run_id, "train/loss")[-1][0] == FULL_STEPS


# --------------------------------------------------------------------------- (c) failed trials


@pytest.mark.integration
def test_failed_trials_are_recorded_and_the_study_finishes(ray_cluster, tmp_path, tracking_uri):
    """Trial 0: legw with linear scaling (an invalid combination: fails before training).
    Trial 1: a sample log under /dev/null (every worker fails at start: the run raises).
    Trial 2: a good config.  Trial 3: trial 2's config again.  Enqueued so that the order is known."""
    storage = str(tmp_path / "optuna.journal")
    base = base_config(tmp_path, schedule={"warmup_epochs": 0.5})
    space = write_space(
        tmp_path,
        "fail",
        base=base,
        objective={"metric": "val/accuracy"},
        sampler={"name": "random", "seed": 0},
        pruner="none",
        params={
            "schedule.warmup": {"choices": ["none", "legw"]},
            "schedule.scaling_rule": {"choices": ["linear", "sqrt"]},
            "train.sample_log_dir": {"choices": [None, "/dev/null/not-a-folder"]},
        },
    )
    study = optuna.create_study(study_name="fail", storage=open_storage(storage), direction="maximize")
    for warmup, rule, log_dir in (
        ("legw", "linear", None),
        ("none", "linear", "/dev/null/not-a-folder"),
        ("legw", "sqrt", None),
        ("legw", "sqrt", None),
    ):
        study.enqueue_trial({"schedule.warmup": warmup, "schedule.scaling_rule": rule, "train.sample_log_dir": log_dir})
    assert run_cli(space, storage, tracking_uri, "--trials", "4", "--parallel", "2") == 0
    trials = load(storage, "fail").trials
    assert [t.state.name for t in trials] == ["FAIL", "FAIL", "COMPLETE", "COMPLETE"]
    # trial 3 drew trial 2's config: it takes trial 2's value without training again
    assert trials[3].user_attrs["duplicate_of"] == 2 and trials[3].value == trials[2].value
    assert trials[3].user_attrs["steps"] == 0
    assert "invalid config" in trials[0].user_attrs["error"] and "legw" in trials[0].user_attrs["error"]
    assert "Not a directory" in trials[1].user_attrs["error"] or "NotADirectory" in trials[1].user_attrs["error"]
    client = MlflowClient(tracking_uri)
    for t in trials[:2]:
        run = client.get_run(t.user_attrs["mlflow_run_id"])
        assert run.info.status == "FAILED" and run.data.tags["search.state"] == "FAIL"
        assert run.data.tags["search.error"] == t.user_attrs["error"]
    assert client.get_run(trials[2].user_attrs["mlflow_run_id"]).data.tags["search.state"] == "COMPLETE"
    # every trial's run is named by its number; the parent's history holds the two COMPLETE ones
    assert [client.get_run(t.user_attrs["mlflow_run_id"]).info.run_name for t in trials] == [
        f"trial-{n}" for n in range(4)
    ]
    parent = load(storage, "fail").user_attrs["mlflow_parent_run_id"]
    assert metric_series(tracking_uri, parent, "trials/val_accuracy") == [(2, trials[2].value), (3, trials[2].value)]
    assert [s for s, _ in metric_series(tracking_uri, parent, "trials/best_val_accuracy")] == [2, 3]
    assert client.get_run(parent).data.tags["search.best_run_id"] == trials[2].user_attrs["mlflow_run_id"]


# ----------------------------------------------------------- (e) bad space files: exit 2, nothing started


def _good_space(tmp) -> dict:
    return {
        "base": base_config(tmp),
        "objective": {"metric": "val/accuracy"},
        "params": {"optimizer.lr": {"low": 0.01, "high": 0.5, "log": True}},
    }


def test_bad_space_in_a_subprocess(tmp_path):
    space = write_space(
        tmp_path, "bad", **{**_good_space(tmp_path), "params": {"schedule.warmup": {"choices": ["lgew"]}}}
    )
    p = subprocess.run(
        [sys.executable, "-m", "search", "run", space],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": ROOT},
    )
    assert p.returncode == 2, p.stderr
    assert p.stderr.strip().startswith(
        "error: params.schedule.warmup.choices[0]: lgew gives no valid training config (schedule.warmup: unknown 'lgew'"
    ), p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "optuna.journal").exists()
