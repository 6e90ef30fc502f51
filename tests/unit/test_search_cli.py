"""``python -m search`` end to end on a real local Ray (2 CPUs): parallel trials, pruning that stops
multi-worker runs, failed trials, continuing a study, MLflow parent/child runs; and bad space files
that stop before anything starts.

Trials are tiny (digits, an MLP of width 32, 1-2 workers of 0.5 CPU): what a trial costs here is
mostly Ray Train starting and stopping its worker group (~20 s), so each test runs its trials in
one to three rounds of two."""

from __future__ import annotations

import os
import subprocess
import sys

import optuna
import pytest
import yaml
from mlflow.tracking import MlflowClient

from search.cli import main
from search.storage import open_storage
from tests.helpers import metric_series

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def base_config(tmp, **sections) -> dict:
    raw = {
        "data": {"name": "digits"},
        "model": {"name": "mlp", "norm": "none", "hidden": 32},
        "optimizer": {"name": "sgd", "lr": 0.05, "mf": 0.9, "base_batch_size": 32},
        "batch": {"size": 32, "max_local_batch": 32},
        "scaling": {"min_workers": 1, "max_workers": 1, "cpus_per_worker": 0.5, "max_failures": 0},
        "train": {"epochs": 1, "seed": 0, "log_every": 5, "eval_every": 10},
        "checkpoint": {"storage_path": str(tmp / "ray_runs")},
        "tracking": {"experiment": "search-tests"},
    }
    for name, values in sections.items():
        raw.setdefault(name, {}).update(values)
    return raw


def write_space(tmp, name: str, **space) -> str:
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(space, sort_keys=False))
    return str(path)


def run_cli(space: str, storage: str, uri: str, *extra: str) -> int:
    return main(["run", space, "--storage", storage, "--tracking-uri", uri, "--no-progress", *extra])


def load(storage: str, name: str) -> optuna.Study:
    return optuna.load_study(study_name=name, storage=open_storage(storage))


def runs_of(uri: str, parent_id: str) -> list:
    client = MlflowClient(uri)
    parent = client.get_run(parent_id)
    return client.search_runs([parent.info.experiment_id],
                              filter_string=f"tags.`mlflow.parentRunId` = '{parent_id}'")


# --------------------------------------------------------------------------- (a) + (d): parallel trials, continue


@pytest.fixture(scope="module")
def study_a(ray_cluster, tmp_path_factory):
    """6 trials, 2 at a time, then the same command again with --trials 2."""
    tmp = tmp_path_factory.mktemp("study_a")
    uri, storage = f"sqlite:///{tmp}/mlflow.db", str(tmp / "optuna.journal")
    space = write_space(tmp, "study_a", base=base_config(tmp),
                        objective={"metric": "val/accuracy", "direction": "maximize"},
                        sampler={"name": "random", "seed": 0}, pruner="none",
                        params={"optimizer.lr": {"low": 0.02, "high": 0.3, "log": True},
                                "optimizer.mf": {"low": 0.5, "high": 0.95},
                                "batch.size": {"choices": [32, 64]}})
    first = run_cli(space, storage, uri, "--trials", "6", "--parallel", "2")
    after_first = [t.number for t in load(storage, "study_a").trials]
    parent_first = load(storage, "study_a").user_attrs["mlflow_parent_run_id"]
    second = run_cli(space, storage, uri, "--trials", "2", "--parallel", "2")
    return {"tmp": tmp, "uri": uri, "storage": storage, "rc": (first, second), "after_first": after_first,
            "parent_first": parent_first}


# --------------------------------------------------------------------------- (b) pruning stops hopeless trials


# Long enough that the stop's way (the pruner's value reaches the driver at a push, the stop goes
# back at the next push: ~2 x train.push_every_s, hundreds of fast steps here) is a small part.
FULL_STEPS = 20 * 45  # 20 epochs of 1438 samples at B = 32


# --------------------------------------------------------------------------- (c) failed trials


# --------------------------------------------------------------------------- (e) bad space files: exit 2, nothing started


def _good_space(tmp) -> dict:
    return {"base": base_config(tmp), "objective": {"metric": "val/accuracy"},
            "params": {"optimizer.lr": {"low": 0.01, "high": 0.5, "log": True}}}


@pytest.mark.parametrize("change,field", [
    ({"params": {"optimizer.lrr": {"low": 0.01, "high": 0.5}}}, "params.optimizer.lrr: unknown config field"),
    ({"params": {"optimizer.lr": {"low": 0.5, "high": 0.01}}}, "params.optimizer.lr.low: 0.5 is above high"),
    ({"params": {"optimizer.lr": {"low": 0.0, "high": 0.5, "log": True}}}, "params.optimizer.lr.low: a log range"),
    ({"params": {"batch.size": {"choices": []}}}, "params.batch.size.choices: empty"),
    ({"sampler": "annealing"}, "sampler: unknown 'annealing'"),
    ({"pruner": "early"}, "pruner: unknown 'early'"),
])
def test_bad_space_exits_2_naming_the_field_before_anything_starts(tmp_path, capsys, monkeypatch, change, field):
    monkeypatch.chdir(tmp_path)
    space = write_space(tmp_path, "bad", **{**_good_space(tmp_path), **change})
    assert main(["run", space, "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {field}") and "\n" not in err, err
    assert not (tmp_path / "optuna.journal").exists(), "no study may be created"
    assert not (tmp_path / "mlflow.db").exists(), "no MLflow run may be created"


def test_bad_cli_values_exit_2(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    space = write_space(tmp_path, "ok", **_good_space(tmp_path))
    assert main(["run", space, "--trials", "0"]) == 2
    assert capsys.readouterr().err.strip() == "error: --trials: must be > 0 (got 0)"
    assert main(["run", space, "--storage", str(tmp_path / "no" / "such" / "x.journal")]) == 2
    assert capsys.readouterr().err.startswith("error: --storage: folder")
    assert main(["show", "nope", "--storage", str(tmp_path / "j.journal")]) == 2
    assert "error: study: no study 'nope'" in capsys.readouterr().err


def test_help(capsys):
    for argv in (["--help"], ["run", "--help"], ["show", "--help"]):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 0
    assert "--storage" in capsys.readouterr().out
