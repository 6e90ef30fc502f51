"""Bad input: one clear line naming the field, exit status 2, nothing started."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from orchestrator.cli import main
from orchestrator.config import ConfigError, apply_overrides, flatten, load_config

GOOD = textwrap.dedent("""
    data: {name: digits}
    model: {name: mlp, norm: none}
    batch: {size: 32, max_local_batch: 16}
    scaling: {min_workers: 1, max_workers: 2}
""")

# (yaml text or None for GOOD, overrides, expected message fragment)
CASES = {
    "unknown_key": (None, ["batch.sizee=3"], "batch.sizee: unknown key; allowed keys here: size, max_local_batch"),
    "unknown_section": (None, ["optimiser.lr=1"], "optimiser: unknown key"),
    "wrong_type": (None, ["batch.size=abc"], "batch.size: expects an integer, got the string"),
    "zero_batch": (None, ["batch.size=0"], "batch.size: must be > 0 (got 0)"),
    "negative_batch": (None, ["batch.size=-4"], "batch.size: must be > 0 (got -4)"),
    "max_local_above_batch": (None, ["batch.max_local_batch=64"],
                              "batch.max_local_batch: 64 is above batch.size 32"),
    "min_above_max_workers": (None, ["scaling.min_workers=3"],
                              "scaling.min_workers: 3 is above scaling.max_workers 2"),
    "unknown_model": (None, ["model.name=vgg"], "model.name: unknown 'vgg'; expected one of mlp, cnn, resnet18, resnet50"),
    "unknown_dataset": (None, ["data.name=mnist"], "data.name: unknown 'mnist'; expected one of digits, synthetic, cifar10"),
    "unknown_optimizer": (None, ["optimizer.name=rmsprop"], "optimizer.name: unknown 'rmsprop'"),
    "missing_cifar_root": (None, ["data.name=cifar10", "data.root=/nonexistent/cifar"],
                           "data.root: no CIFAR-10 at '/nonexistent/cifar/cifar-10-batches-py'"),
    "cifar_without_root": (None, ["data.name=cifar10"], "data.root: required for cifar10"),
    "unreadable_yaml": ("data: {name: digits\nmodel: [", [], "is not valid YAML at line"),
    "not_a_mapping": ("- 1\n- 2\n", [], "must be a mapping of sections"),
    "sync_bn_on_cpu": (None, ["model.sync_bn=true"], "model.sync_bn: PyTorch's SyncBatchNorm runs on GPUs only"),
    "bad_override_syntax": (None, ["batch.size"], "--set batch.size: expected section.key=value"),
    "storage_uri": (None, ["checkpoint.storage_path=s3://bucket/runs"],
                    "checkpoint.storage_path: URIs are not supported (got 's3://bucket/runs'); give a directory path"),
}


def _write(tmp_path, text):
    p = tmp_path / "cfg.yaml"
    p.write_text(GOOD if text is None else text)
    return str(p)


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
    raw = apply_overrides({"batch": {"size": 8}}, ["batch.size=128", "model.norm=none", "train.epochs=0.5",
                                                   "scaling.use_gpu=true"])
    assert raw == {"batch": {"size": 128}, "model": {"norm": "none"}, "train": {"epochs": 0.5},
                   "scaling": {"use_gpu": True}}


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
