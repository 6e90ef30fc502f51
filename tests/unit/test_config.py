"""Bad input: one clear line naming the field, exit status 2, nothing started."""

import os

import pytest

from orchestrator.cli import main
from orchestrator.config.prepare import load_config
from orchestrator.config.schema import ConfigError, apply_overrides
from orchestrator.record.params import flatten
from tests.config_cases import CASES, _write


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_config_is_one_line_exit_2(case, tmp_path, monkeypatch, capsys):
    text, overrides, fragment = CASES[case]
    monkeypatch.chdir(tmp_path)
    path = _write(tmp_path, text)
    argv = ["train", path] + [a for o in overrides for a in ("--set", o)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert fragment in err, err
    assert len(err.splitlines()) == 1, err
    assert err.startswith("error: ")
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "ray_runs").exists()


def test_missing_config_file(tmp_path, capsys):
    assert main(["train", str(tmp_path / "nope.yaml")]) == 2
    assert "not found" in capsys.readouterr().err


def test_overrides_parse_yaml_values_and_nest():
    raw = apply_overrides(
        {"batch": {"size": 8}}, ["batch.size=128", "model.norm=none", "train.epochs=0.5", "scaling.use_gpu=true"]
    )
    assert raw == {
        "batch": {"size": 128},
        "model": {"norm": "none"},
        "train": {"epochs": 0.5},
        "scaling": {"use_gpu": True},
    }


def test_good_config_resolves_and_flattens(tmp_path):
    cfg = load_config(_write(tmp_path, None), ["optimizer.lr=0.05"])
    flat = flatten(cfg.model_dump(mode="json"))
    assert flat["optimizer.lr"] == 0.05 and flat["batch.size"] == 32 and flat["model.name"] == "mlp"
    assert "tracking.experiment" in flat


def test_quickstart_config_is_valid():
    cfg = load_config(os.path.join(os.path.dirname(__file__), "..", "..", "configs", "quickstart.yaml"))
    assert cfg.scaling.max_workers == 2 and cfg.data.name == "digits"


def test_config_error_is_a_value_error():
    with pytest.raises(ConfigError):
        load_config(None, ["batch.size=-1"])
