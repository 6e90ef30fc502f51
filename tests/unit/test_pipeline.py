"""The config pipeline (orchestrator/config/prepare.py) and the input it refuses: binary and empty files,
unknown keys with the nearest valid one, ``--set KEY VALUE``, caps that never bind, numeric flags of
every command, messages that say how to fix, and BatchNorm layers fed a micro-batch of one sample.
The same bad config through every entry point as real processes: tests/integration/test_entry_points.py."""

from __future__ import annotations

import argparse
import os
import sys
import types

import numpy as np
import pytest
import torch
from pydantic import BaseModel
from torch import nn

from orchestrator.cli import _parser as orchestrator_parser
from orchestrator.cli import main
from orchestrator.config.prepare import prepare
from orchestrator.config.schema import ConfigError, RootConfig, apply_overrides, validate
from search.commands import _parser as search_parser
from search.commands import main as search_main
from tests.config_cases import _write

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
QUICKSTART = os.path.join(ROOT, "configs", "quickstart.yaml")


@pytest.fixture
def no_training(monkeypatch):
    """``run_training`` and ``run_search`` fail the test if reached: bad input must stop before."""
    fake = types.ModuleType("orchestrator.run.runner")

    def _must_not_run(*a, **k):
        raise AssertionError("training was reached: the bad input was not caught before the start")

    fake.run_training = _must_not_run
    fake.find_run = _must_not_run
    monkeypatch.setitem(sys.modules, "orchestrator.run.runner", fake)
    import search.driver

    monkeypatch.setattr(search.driver, "run_search", _must_not_run)


def _one_line_exit_2(rc, capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err, err
    return err


# --------------------------------------------------------------------------- files


def test_binary_config_file_is_one_line(tmp_path, capsys, monkeypatch, no_training):
    monkeypatch.chdir(tmp_path)
    p = tmp_path / "model.pt"
    p.write_bytes(b"PK\x03\x04\x89\xfe\xff binary \x00\x01")
    err = _one_line_exit_2(main(["train", str(p)]), capsys)
    assert err == (
        f"error: config: '{p}' is not a text file (byte 4 is not UTF-8); pass the YAML config, "
        f"such as configs/quickstart.yaml"
    )


def test_nul_bytes_in_utf8_are_not_a_config(tmp_path, capsys, no_training):
    p = tmp_path / "x.yaml"
    p.write_bytes(b"data: {name: digits}\n\x00\x00")
    assert "is not a text file (it holds NUL bytes" in _one_line_exit_2(main(["plan", str(p)]), capsys)


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n# and another\n", "---\n"])
def test_empty_config_file_is_refused_not_trained_with_defaults(tmp_path, capsys, monkeypatch, no_training, text):
    monkeypatch.chdir(tmp_path)
    p = tmp_path / "cfg.yaml"
    p.write_text(text)
    err = _one_line_exit_2(main(["train", str(p)]), capsys)
    assert err.startswith(f"error: config: '{p}' is empty (no settings); write the sections to train"), err


def test_an_explicit_empty_mapping_asks_for_the_defaults(tmp_path):
    p = tmp_path / "cfg.yaml"
    p.write_text("{}\n")
    assert prepare(str(p), environment=False) == validate({})


def test_a_folder_is_not_a_config(tmp_path, capsys, no_training):
    err = _one_line_exit_2(main(["plan", str(tmp_path)]), capsys)
    assert err == f"error: config: '{tmp_path}' is a folder; pass a YAML file such as configs/quickstart.yaml"


# --------------------------------------------------------------------------- keys and --set


@pytest.mark.parametrize(
    "override, expected",
    [
        ("optimizer.learning_rate=0.1", "optimizer.learning_rate: unknown key; did you mean optimizer.lr?"),
        ("scaling.max_worker=2", "scaling.max_worker: unknown key; did you mean scaling.max_workers?"),
        ("shedule.decay=none", "shedule: unknown key; did you mean schedule?"),
        ("data.loader.worker=2", "data.loader.worker: unknown key; did you mean data.loader.workers?"),
        (
            "schedule.warmup=lgew",
            "schedule.warmup: unknown 'lgew'; expected one of none, constant, gradual, linear, "
            "legw, auto; did you mean legw?",
        ),
    ],
)
def test_unknown_names_get_the_nearest_valid_one(tmp_path, capsys, no_training, override, expected):
    err = _one_line_exit_2(main(["train", _write(tmp_path, None), "--set", override]), capsys)
    assert err.startswith(f"error: {expected}"), err


@pytest.mark.parametrize(
    "argv, expected",
    [
        (
            ["--set", "batch.size", "128"],
            "error: --set batch.size 128: write the key and its value as one word joined by =: --set batch.size=128",
        ),
        (
            ["--set", "batch.size"],
            "error: --set batch.size: expected KEY=VALUE; write --set batch.size=VALUE, e.g. --set batch.size=128",
        ),
    ],
)
def test_set_with_a_space_instead_of_equals_gets_the_right_form(tmp_path, capsys, no_training, argv, expected):
    cfg = _write(tmp_path, None)
    for command in (["train", cfg, *argv], ["plan", *argv, cfg] if len(argv) == 2 else ["plan", cfg, *argv]):
        assert _one_line_exit_2(main(command), capsys) == expected


def test_a_cap_that_never_binds_is_not_an_error(capsys):
    """configs/quickstart.yaml with the fixed policy: max_local_batch 64 above B 32, max_size 128 that
    only an adaptive policy reads; both caps simply never bind."""
    assert main(["plan", QUICKSTART, "--set", "batch.policy=fixed", "--format", "csv"]) == 0
    rows = capsys.readouterr().out.strip().splitlines()[1:]
    assert rows and {r.split(",")[4] for r in rows} == {"32"}  # batch_global stays 32
    cfg = prepare(QUICKSTART, ["batch.policy=fixed", "batch.max_local_batch=100000"], environment=False)
    assert cfg.batch.max_local_batch == 100000
    prepare(QUICKSTART, ["batch.max_size=100000"], environment=False)  # above the 1438 samples: n caps B anyway


# --------------------------------------------------------------------------- messages say how to fix


def _fields(model: type[BaseModel], prefix: str = ""):
    for name, f in model.model_fields.items():
        ann = f.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            yield from _fields(ann, prefix + name + ".")
        else:
            yield prefix + name


BAD_VALUES = ["abc", "{a: 1}", "[1, 2]", "3.5", "-1", "0", ".nan", "true", "''", "[[1]]", "2", "[1, 2, 3]"]


def test_every_schema_error_names_the_field_and_a_fix():
    """Each field of every section, given values of the wrong kind or range: the message starts with
    the field and has a fix after ``; ``."""
    seen = 0
    for path in _fields(RootConfig):
        for value in BAD_VALUES:
            try:
                validate(apply_overrides({}, [f"{path}={value}"]))
            except ConfigError as e:
                msg = str(e)
                seen += 1
                assert "\n" not in msg, msg
                head, _, fix = msg.partition("; ")
                assert fix.strip(), f"--set {path}={value}: no fix in {msg!r}"
                field = head.split(":", 1)[0]
                assert field.split("[")[0].startswith(path.split(".")[0]), msg
    assert seen > 300


@pytest.mark.parametrize(
    "override, expected",
    [
        (
            "model.params=3",
            "model.params: expects a mapping (got 3); write key: value pairs in braces, e.g. {name: value}",
        ),
        ("batch.size=3.5", "batch.size: expects a whole number (got 3.5); write an integer such as 64"),
        ("optimizer.lr=abc", "optimizer.lr: expects a number (got 'abc'); write a number"),
        ("batch.schedule=[[1]]", "batch.schedule[0][1]: required but missing; add it"),
        ("checkpoint.keep=1", "checkpoint.keep: 1 leaves no older checkpoint to fall back to"),
        ("optimizer.mf=1.5", "optimizer.mf: must be < 1.0 (got 1.5); set a value < 1.0 such as 0.9"),
    ],
)
def test_schema_messages(override, expected):
    with pytest.raises(ConfigError) as e:
        validate(apply_overrides({}, [override]))
    assert str(e.value).startswith(expected), str(e.value)


def test_model_params_of_a_language_model_name_the_field_and_the_fix():
    with pytest.raises(ConfigError) as e:
        prepare(
            {
                "data": {"name": "text", "context": 16},
                "model": {"name": "gpt", "params": {"nheads": 2}},
                "batch": {"size": 8, "max_local_batch": 8},
            },
            environment=False,
        )
    assert str(e.value).startswith("model.params: gpt() takes no argument 'nheads'; did you mean n_head? (it takes "), (
        str(e.value)
    )


def test_model_params_on_a_builtin_image_model_is_refused():
    with pytest.raises(
        ConfigError,
        match=r"^model.params: has no effect unless model.factory is given .*; remove it "
        r"or set model.factory: package.module:function$",
    ):
        prepare(GOOD_RAW | {"model": {"name": "mlp", "norm": "none", "params": {"hidden": 8}}}, environment=False)


GOOD_RAW = {
    "data": {"name": "digits"},
    "model": {"name": "mlp", "norm": "none"},
    "batch": {"size": 32, "max_local_batch": 16},
    "scaling": {"min_workers": 1, "max_workers": 2},
}


# --------------------------------------------------------------------------- numeric flags


def _numeric_flags():
    """Every (command, flag, action) whose value is a number, in both CLIs."""
    out = []
    for prog, parser in (("orchestrator", orchestrator_parser()), ("search", search_parser())):
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        for command, p in sub.choices.items():
            for action in p._actions:
                if action.option_strings and action.type is not None and action.type not in (str,):
                    out.append((prog, command, action.option_strings[0], action))
    return out


def test_every_numeric_flag_uses_the_shared_checked_type():
    flags = _numeric_flags()
    names = {(p, c, f) for p, c, f, _ in flags}
    assert {
        ("orchestrator", "plan", "--every"),
        ("orchestrator", "ui", "--port"),
        ("search", "run", "--trials"),
        ("search", "run", "--parallel"),
        ("search", "run", "--timeout"),
        ("search", "run", "--heartbeat"),
        ("search", "show", "--trial"),
    } <= names
    for prog, command, flag, action in flags:
        assert action.type.__module__ == "orchestrator.config.flags", f"{prog} {command} {flag}: type={action.type!r}"
        for bad in ("nan", "inf", "-inf", "abc"):
            with pytest.raises(argparse.ArgumentTypeError):
                action.type(bad)


@pytest.fixture
def space_file(tmp_path):
    from tests.search_helpers import base_config, write_space

    return write_space(
        tmp_path,
        "ok",
        base=base_config(tmp_path),
        objective={"metric": "val/accuracy"},
        params={"optimizer.lr": {"low": 0.01, "high": 0.5, "log": True}},
    )


@pytest.mark.parametrize(
    "argv, expected",
    [
        (
            ["run", "{space}", "--timeout", "nan"],
            "error: --timeout: must be a finite number (got 'nan'); inf and nan "
            "are not allowed, write a number > 0, e.g. --timeout 3600",
        ),
        (
            ["run", "{space}", "--timeout", "-5"],
            "error: --timeout: must be > 0 (got -5); write a number > 0, e.g. --timeout 3600",
        ),
        (["run", "{space}", "--timeout", "inf"], "error: --timeout: must be a finite number"),
        (["run", "{space}", "--trials", "1e3"], "error: --trials: expects a whole number > 0 (got '1e3')"),
        (["run", "{space}", "--parallel", "0"], "error: --parallel: must be > 0 (got 0)"),
        (["run", "{space}", "--heartbeat", "-1"], "error: --heartbeat: must be > 0 (got -1)"),
        (["show", "s", "--trial", "-1"], "error: --trial: must be >= 0 (got -1)"),
        (["run"], "error: python -m search run: the following arguments are required: space"),
    ],
)
def test_search_flags_are_checked_like_config_fields(
    tmp_path, capsys, monkeypatch, no_training, space_file, argv, expected
):
    monkeypatch.chdir(tmp_path)
    err = _one_line_exit_2(search_main([a.replace("{space}", space_file) for a in argv]), capsys)
    assert err.startswith(expected), err
    assert not (tmp_path / "optuna.journal").exists()


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["plan", "{cfg}", "--every", "nan"], "error: --every: must be a finite number (got 'nan')"),
        (["plan", "{cfg}", "--every", "-1"], "error: --every: must be >= 0 (got -1); write a whole number >= 0"),
        (["plan", "{cfg}", "--every", "2.5"], "error: --every: expects a whole number >= 0 (got '2.5')"),
        (["ui", "--port", "nan"], "error: --port: must be a finite number (got 'nan')"),
        (["ui", "--port", "0"], "error: --port: must be between 1 and 65535 (got 0)"),
        (["plan", "{cfg}", "--format", "xml"], "error: --format: invalid choice: 'xml'"),
        (["trian", "{cfg}"], "error: COMMAND: invalid choice: 'trian' (choose from"),
    ],
)
def test_orchestrator_flags_are_checked_like_config_fields(tmp_path, capsys, no_training, argv, expected):
    cfg = _write(tmp_path, None)
    err = _one_line_exit_2(main([a.replace("{cfg}", cfg) for a in argv]), capsys)
    assert err.startswith(expected), err


# --------------------------------------------------------------------------- BatchNorm and one sample


def test_smallest_micro_batch_is_what_the_loop_cuts():
    from trainers.data.order import smallest_micro_batch
    from trainers.data.sampler import rank_micro_batches

    for n in range(1, 40):
        ids = np.arange(n)
        for world in range(1, 7):
            for mlb in range(1, 9):
                for split in (False, True):
                    sizes = []
                    for rank in range(world):
                        micros = rank_micro_batches(ids, rank, world, mlb, split_single=split)
                        sizes += [len(m) for m in micros] if micros else [0]
                    assert smallest_micro_batch(n, world, mlb, split) == min(sizes), (n, world, mlb, split)


def _bn_mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))


def test_bn_layers_that_cannot_take_one_sample_are_found():
    from trainers.workload.batchnorm import single_sample_layers

    m = _bn_mlp()
    before = m[1].running_mean.clone()
    assert single_sample_layers(m, torch.zeros(1, 4)) == ["1"]
    assert torch.equal(m[1].running_mean, before) and m.training
    conv = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4))  # 8x8 values per channel: fine
    assert single_sample_layers(conv, torch.zeros(1, 1, 8, 8)) == []
    with torch.device("meta"):  # shapes only
        assert single_sample_layers(_bn_mlp(), torch.zeros(1, 4)) == ["1"]


def test_a_single_sample_trains_through_guarded_batchnorm_with_running_statistics():
    """The epoch's short tail (one sample on a worker): without the guard PyTorch raises inside
    training; with it that forward uses the running statistics, the model stays in training mode
    and the running statistics skip the sample; other batches use batch statistics as before."""
    from trainers.workload.batchnorm import guard_single_samples

    m = _bn_mlp().train()
    with pytest.raises(ValueError, match="Expected more than 1 value per channel"):
        m(torch.randn(1, 4))
    guard_single_samples(guard_single_samples(m))  # idempotent
    m(torch.randn(16, 4))
    stats = m[1].running_mean.clone()
    x = torch.randn(1, 4)
    out = m(x)
    out.sum().backward()
    assert m.training and m[1].training and torch.equal(m[1].running_mean, stats)
    assert m[0].weight.grad is not None and m[1].weight.grad is not None
    expected = m[3](
        torch.relu(
            nn.functional.batch_norm(
                m[0](x), m[1].running_mean, m[1].running_var, m[1].weight, m[1].bias, training=False
            )
        )
    )
    torch.testing.assert_close(out, expected)
    m(torch.randn(16, 4))
    assert not torch.equal(m[1].running_mean, stats)


def test_the_guard_hooks_its_layers_only_for_a_forward_of_one_sample():
    """A batch of several samples runs through layers without hooks (PyTorch's fast call path);
    during a one-sample forward the layers carry the guard, after it they do not."""
    from trainers.workload.batchnorm import guard_single_samples

    m = guard_single_samples(_bn_mlp().train())
    seen: list[int] = []
    m[2].register_forward_pre_hook(lambda mod, args: seen.append(len(m[1]._forward_pre_hooks)))
    m(torch.randn(8, 4))
    m(torch.randn(1, 4))
    assert seen == [0, 1]
    assert not m[1]._forward_pre_hooks and not m[1]._forward_hooks
    bn = guard_single_samples(nn.BatchNorm1d(4).train())  # the model is the layer itself
    bn(torch.randn(1, 4)).sum().backward()
    assert bn.training


def test_the_workers_model_is_guarded_and_a_model_to_log_is_not():
    from trainers.workload.build import build_workload

    cfg = validate(
        {
            "data": {"name": "synthetic", "size": 40, "shape": [6]},
            "model": {"name": "mlp", "norm": "batch"},
            "batch": {"size": 8, "max_local_batch": 8},
        }
    )
    work = build_workload(cfg, single_sample_guard=True)  # as the worker loop builds it
    work.model.train()
    work.model(torch.zeros(1, 6))  # an epoch's one-sample tail: no ValueError
    plain = build_workload(cfg).model  # as the driver builds the final model to log: no hooks of ours
    assert not any(m._forward_pre_hooks for m in plain.modules())


def _bn(max_workers: int = 1, min_workers: int = 1, **batch) -> dict:
    """An mlp with BatchNorm1d on 53 synthetic training samples (66 minus 13 held out)."""
    return {
        "data": {"name": "synthetic", "size": 66, "shape": [6]},
        "model": {"name": "mlp", "norm": "batch"},
        "batch": {"size": 12, "max_local_batch": 16, **batch},
        "scaling": {"min_workers": min_workers, "max_workers": max_workers},
    }


ONE_SAMPLE = "and model mlp's BatchNorm cannot train on one sample (layer 2 would see one value per channel)"


@pytest.mark.parametrize(
    "raw, expected",
    [
        (
            _bn(max_local_batch=1),
            f"batch.max_local_batch: 1 puts one sample through the model at a time, {ONE_SAMPLE}; "
            f"set batch.max_local_batch to at least 2, or model.norm: group",
        ),
        (
            _bn(size=6, max_local_batch=2, max_workers=2),
            f"batch.max_local_batch: 2 cuts a worker's slice of 3 samples (batch.size 6 over 2 workers) into "
            f"micro-batches of 2 and 1, {ONE_SAMPLE}; set batch.max_local_batch to at least 3, or model.norm: group",
        ),
        (
            _bn(size=8, max_local_batch=2, max_workers=4, policy="schedule", schedule=[[1, 10]]),
            "batch.max_local_batch: 2 cuts a worker's slice of 3 samples (batch.schedule[0] 10 over 4 workers)",
        ),
        (
            _bn(size=2, policy="noise_scale"),
            "batch.size: 2 on one worker is cut in two halves for the gradient-noise "
            "estimate (batch.policy noise_scale), so a micro-batch holds one sample",
        ),
        (
            _bn(size=3) | {"schedule": {"scaling_rule": "adascale"}},
            "batch.size: 3 on one worker is cut in two halves for "
            "the gradient-noise estimate (schedule.scaling_rule "
            "adascale)",
        ),
        (
            _bn(size=32, min_workers=32, max_workers=64),
            "scaling.min_workers: 32 workers share a batch of 32 (batch.size), so a worker trains on one "
            "sample, and model mlp's BatchNorm cannot (layer 2 would see one value per channel); raise "
            "batch.size to at least 64 or lower scaling.min_workers to at most 16, or model.norm: group",
        ),
    ],
)
def test_every_step_with_a_one_sample_micro_batch_is_refused_before_ray(raw, expected):
    with pytest.raises(ConfigError) as e:
        prepare(raw, environment=False)
    assert str(e.value).startswith(expected), str(e.value)


def test_an_epochs_one_sample_tail_is_not_refused():
    """53 training samples in batches of 13: the epoch's last batch has 1 sample.  Only that step
    meets it, and the guard lets it through: the config is accepted."""
    raw = _bn(size=13)
    cfg = prepare(raw, environment=False)
    from orchestrator.config.workload_checks import train_samples

    n, _ = train_samples(cfg)
    assert n == 53 and n % 13 == 1


def test_groupnorm_or_no_batchnorm_is_never_refused():
    prepare(_bn(max_local_batch=1) | {"model": {"name": "mlp", "norm": "group"}}, environment=False)
    prepare(
        _bn(max_local_batch=1)
        | {"model": {"name": "cnn", "norm": "batch"}, "data": {"name": "synthetic", "size": 66, "shape": [1, 8, 8]}},
        environment=False,
    )  # BatchNorm2d over 8x8 maps: 64 values per channel even for one sample
