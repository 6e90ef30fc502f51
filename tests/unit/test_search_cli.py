"""``python -m search``'s bad input, in-process: bad space files and CLI values stop with exit 2 and
one line before any study, MLflow run or Ray exists (the end-to-end search tests are in
tests/integration/test_search_e2e.py)."""

from __future__ import annotations

import pytest

from search.commands import main
from tests.search_helpers import base_config, write_space

# ----------------------------------------------------------- (e) bad space files: exit 2, nothing started


def _good_space(tmp) -> dict:
    return {
        "base": base_config(tmp),
        "objective": {"metric": "val/accuracy"},
        "params": {"optimizer.lr": {"low": 0.01, "high": 0.5, "log": True}},
    }


@pytest.mark.parametrize(
    "change,field",
    [
        ({"params": {"optimizer.lrr": {"low": 0.01, "high": 0.5}}}, "params.optimizer.lrr: unknown config field"),
        ({"params": {"optimizer.lr": {"low": 0.5, "high": 0.01}}}, "params.optimizer.lr.low: 0.5 is above high"),
        ({"params": {"optimizer.lr": {"low": 0.0, "high": 0.5, "log": True}}}, "params.optimizer.lr.low: a log range"),
        ({"params": {"batch.size": {"choices": []}}}, "params.batch.size.choices: empty"),
        ({"sampler": "annealing"}, "sampler: unknown 'annealing'"),
        ({"pruner": "early"}, "pruner: unknown 'early'"),
    ],
)
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
    assert (
        capsys.readouterr().err.strip()
        == "error: --trials: must be > 0 (got 0); write a whole number > 0, e.g. --trials 20"
    )
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
