"""Whole classes of bad input: each fails in the CLI with exit status 2 and one
line naming the field and a fix, before Ray or MLflow start (``run_training`` is never reached and
no ``mlflow.db`` appears).  The cases are generated from the config classes where a class covers
every field (non-finite floats, booleans for numbers, ...), so a new field is covered unasked."""

from __future__ import annotations

import os
import sqlite3
import sys
import textwrap
import types
from typing import Any

import pytest
from pydantic import BaseModel

from orchestrator.cli import main
from orchestrator.config.environment import check_environment
from orchestrator.config.preflight import IGNORED_UNLESS, check_config
from orchestrator.config.schema import RootConfig, read_yaml, to_yaml, validate
from orchestrator.config.workload_checks import train_samples
from trainers.section import _options

BASE = textwrap.dedent("""
    data: {name: digits, val_fraction: 0.2}
    model: {name: cnn, norm: none, hidden: 16}
    batch: {size: 32, max_local_batch: 16}
    scaling: {min_workers: 1, max_workers: 2}
    train: {epochs: 1}
""")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def cli(tmp_path, monkeypatch, capsys):
    """``cli(overrides, text=BASE, extra_args=())``: run ``train`` in-process in an empty folder and
    return ``(exit status, stderr)``; training itself must never be reached."""
    monkeypatch.chdir(tmp_path)
    fake_runner = types.ModuleType("orchestrator.run.runner")

    def _must_not_run(*a, **k):
        raise AssertionError("run_training was reached: the bad input was not caught before the start")

    fake_runner.run_training = _must_not_run
    monkeypatch.setitem(sys.modules, "orchestrator.run.runner", fake_runner)

    def run(overrides: list[str] = (), text: str = BASE, args: list[str] = ()) -> tuple[int, str]:
        path = tmp_path / "cfg.yaml"
        path.write_text(text)
        argv = ["train", str(path), *[a for o in overrides for a in ("--set", o)], *args]
        rc = main(argv)
        out = capsys.readouterr()
        assert not os.path.exists(tmp_path / "mlflow.db"), "an MLflow database was created"
        return rc, out.err.strip()

    return run


def assert_one_line(rc: int, err: str, field: str, fragment: str = "") -> None:
    assert rc == 2, err
    assert "\n" not in err and "Traceback" not in err, err
    assert err.startswith(f"error: {field}"), err
    assert fragment in err, err
    assert ";" in err, f"no fix given: {err}"


# --------------------------------------------------------------------------- fields by kind


def _fields(kind: Any) -> list[str]:
    """Every ``section.key`` of the root config whose annotation (or a union member) is ``kind``."""
    out = []
    for sname, sfield in RootConfig.model_fields.items():
        section = sfield.annotation
        if not (isinstance(section, type) and issubclass(section, BaseModel)):
            continue
        for key, f in section.model_fields.items():
            if kind in _options(f.annotation):
                out.append(f"{sname}.{key}")
    return out


FLOATS, INTS, BOOLS = _fields(float), _fields(int), _fields(bool)


def test_the_kinds_cover_the_config():
    assert len(FLOATS) > 20 and len(INTS) > 15 and len(BOOLS) >= 3
    assert "batch.size" in INTS and "optimizer.lr" in FLOATS and "scaling.use_gpu" in BOOLS


@pytest.mark.parametrize("value", [".inf", "-.inf", ".nan", ".NaN"])
@pytest.mark.parametrize("field", FLOATS)
def test_non_finite_float_anywhere(cli, field, value):
    rc, err = cli([f"{field}={value}"])
    assert_one_line(rc, err, f"{field}:", "must be a finite number")


@pytest.mark.parametrize(
    "text",
    [
        "batch: {size: 32, max_local_batch: 16, policy: schedule, schedule: [[0, 32], [.inf, 64]]}\n",
        "batch: {size: 32, max_local_batch: 16, policy: schedule, schedule: [[0, 32], [.nan, 64]]}\n",
    ],
)
def test_non_finite_inside_a_list(cli, text):
    rc, err = cli(text=text)
    assert_one_line(rc, err, "batch.schedule", "finite")


@pytest.mark.parametrize("value", ["true", "false"])
@pytest.mark.parametrize("field", INTS + FLOATS)
def test_boolean_where_a_number_is_expected(cli, field, value):
    rc, err = cli([f"{field}={value}"])
    assert_one_line(rc, err, f"{field}:", f"got the boolean {value}")


@pytest.mark.parametrize("value", ["1", "0", "'true'", "'yes'", "on_demand"])
@pytest.mark.parametrize("field", BOOLS)
def test_number_or_string_where_a_boolean_is_expected(cli, field, value):
    rc, err = cli([f"{field}={value}"])
    assert_one_line(rc, err, f"{field}:", "expects true or false")


@pytest.mark.parametrize("value", ["1e3", "'64'", "sixty"])
@pytest.mark.parametrize("field", INTS)
def test_string_where_an_integer_is_expected(cli, field, value):
    rc, err = cli([f"{field}={value}"])
    assert_one_line(rc, err, f"{field}:", "expects an integer, got the string")


def test_wrong_kinds_inside_lists(cli):
    rc, err = cli(["data.name=synthetic", "data.shape=[1, true, 8]"])
    assert_one_line(rc, err, "data.shape:", "got the boolean true")
    rc, err = cli(text=BASE + "schedule: {decay: step, milestones: [false]}\n")
    assert_one_line(rc, err, "schedule.milestones:", "got the boolean false")


def test_numeric_strings_stay_accepted_for_floats(tmp_path):
    # YAML 1.1 reads 1e-3 as the string "1e-3": that is how users write learning rates
    (tmp_path / "c.yaml").write_text(BASE + "optimizer: {lr: 1e-3}\n")
    assert validate(read_yaml(str(tmp_path / "c.yaml"))).optimizer.lr == pytest.approx(1e-3)


# --------------------------------------------------------------------------- duplicate keys


@pytest.mark.parametrize(
    "text, field, lines",
    [
        (BASE + "data: {name: synthetic}\n", "data", "lines 2 and 7"),
        ("batch:\n  size: 32\n  max_local_batch: 16\n  size: 64\n", "batch.size", "lines 2 and 4"),
        ("model: {name: mlp, norm: none, name: cnn}\n", "model.name", "lines 1 and 1"),
        ("batch:\n  policy: schedule\n  schedule:\n    - {a: 1, a: 2}\n", "batch.schedule[0].a", "lines 4 and 4"),
    ],
)
def test_duplicate_keys(cli, text, field, lines):
    rc, err = cli(text=text)
    assert_one_line(rc, err, f"{field}: given twice", lines)


def test_duplicate_keys_in_a_search_space(tmp_path, capsys):
    from search.commands import main as search_main

    space = tmp_path / "space.yaml"
    space.write_text(
        f"base: {ROOT}/configs/quickstart.yaml\nparams:\n  optimizer.lr: {{low: 0.01, high: 1}}\nparams: {{}}\n"
    )
    assert search_main(["run", str(space), "--storage", str(tmp_path / "j.journal")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: params: given twice") and "lines 2 and 4" in err, err
    assert not os.path.exists(tmp_path / "j.journal")


# --------------------------------------------------------------------------- samples vs batch


@pytest.mark.parametrize(
    "overrides, field, fragment",
    [
        (["data.val_fraction=0.99", "batch.size=32"], "batch.size:", "above the 18 training samples"),
        (["batch.size=2048", "batch.max_local_batch=16"], "batch.size:", "lower batch.size to at most 1438"),
        (
            ["data.name=synthetic", "data.shape=[1, 8, 8]", "data.size=40", "batch.size=64"],
            "batch.size:",
            "above the 32 training samples (data.size 40 minus 8",
        ),
        (
            ["data.name=cifar10", "batch.size=60000", "batch.max_local_batch=64"],
            "batch.size:",
            "above the 40000 training samples (cifar10 50000 minus 10000",
        ),
        (
            ["batch.policy=schedule", "batch.schedule=[[0, 32], [1, 4096]]"],
            "batch.schedule[1]:",
            "would be cut to 1438",
        ),
    ],
)
def test_too_few_training_samples(cli, overrides, field, fragment):
    rc, err = cli(overrides)
    assert_one_line(rc, err, field, fragment)


def test_a_user_split_is_named_as_a_fix(cli):
    rc, err = cli(["data.val_fraction=0.99"])
    assert "or lower data.val_fraction" in err


def test_train_samples_match_the_loader():
    from trainers.data.datasets import load_data

    cfg = validate(
        {
            "data": {"name": "synthetic", "size": 37, "shape": [4], "val_fraction": 0.3},
            "model": {"name": "mlp"},
            "batch": {"size": 8, "max_local_batch": 8},
        }
    )
    assert train_samples(cfg)[0] == load_data(cfg.data, split_seed=0).num_train


# --------------------------------------------------------------------------- paths


def test_empty_storage_path(cli):
    rc, err = cli(["checkpoint.storage_path=''"])
    assert_one_line(rc, err, "checkpoint.storage_path:", "empty")


def test_storage_path_under_a_file(cli, tmp_path):
    (tmp_path / "afile").write_text("x")
    rc, err = cli([f"checkpoint.storage_path={tmp_path}/afile/runs"])
    assert_one_line(rc, err, "checkpoint.storage_path:", "is under the file")
    rc, err = cli([f"checkpoint.storage_path={tmp_path}/afile"])
    assert_one_line(rc, err, "checkpoint.storage_path:", "is a file")


def test_storage_path_in_an_unwritable_folder(cli, tmp_path, monkeypatch):
    locked = tmp_path / "locked"
    locked.mkdir()
    real = os.access
    # as root every folder is writable; simulate the permission bits
    monkeypatch.setattr(
        "orchestrator.config.environment.os.access",
        lambda p, mode: False if os.fspath(p) == str(locked) else real(p, mode),
    )
    rc, err = cli([f"checkpoint.storage_path={locked}/deeper/runs"])
    assert_one_line(rc, err, "checkpoint.storage_path:", f"cannot write in '{locked}'")
    assert not os.path.exists(locked / "deeper")


@pytest.mark.parametrize(
    "uri, fragment",
    [
        ("sqlite:///{tmp}/missing/mlflow.db", "does not exist"),
        ("sqlite:///{tmp}/afile/mlflow.db", "is a file, not a folder"),
        ("sqlite:///{tmp}", "is a folder, not a database file"),
        ("{tmp}/afile/mlruns", "is under the file"),
    ],
)
def test_tracking_store_folder(cli, tmp_path, uri, fragment):
    (tmp_path / "afile").write_text("x")
    uri = uri.format(tmp=tmp_path)
    rc, err = cli(args=["--tracking-uri", uri])
    assert_one_line(rc, err, "tracking.uri:", fragment)
    assert not os.path.exists(tmp_path / "missing")


# --------------------------------------------------------------------------- experiment names


@pytest.mark.parametrize("name, fragment", [("''", "empty"), ("'   '", "empty"), ("x" * 501, "at most 500")])
def test_experiment_name_mlflow_refuses(cli, name, fragment):
    rc, err = cli([f"tracking.experiment={name}"])
    assert_one_line(rc, err, "tracking.experiment:", fragment)


def test_deleted_experiment_in_an_existing_store(cli, tmp_path, capsys):
    from mlflow import MlflowClient

    db = tmp_path / "store" / "mlflow.db"
    db.parent.mkdir()
    client = MlflowClient(f"sqlite:///{db}")
    client.delete_experiment(client.create_experiment("gone"))
    client.create_experiment("alive")
    uri = f"sqlite:///{db}"
    capsys.readouterr()  # MLflow's own lines making the store above (run alone, its logger is not quieted yet)
    rc, err = cli(["tracking.experiment=gone"], args=["--tracking-uri", uri])
    assert_one_line(rc, err, "tracking.experiment:", "'gone' was deleted")
    # an existing experiment and a new name pass the checks (training itself is not run here)
    for name in ("alive", "new"):
        cfg = validate({**read_yaml_text(BASE), "tracking": {"uri": uri, "experiment": name}})
        check_environment(cfg)


def test_the_store_is_not_created_to_check(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    check_environment(
        validate(
            {**read_yaml_text(BASE), "tracking": {"uri": uri}, "checkpoint": {"storage_path": str(tmp_path / "runs")}}
        )
    )
    assert os.listdir(tmp_path) == []


def read_yaml_text(text: str) -> dict:
    from orchestrator.config.schema import load_yaml_text

    return load_yaml_text(text)


# --------------------------------------------------------------------------- settings that do nothing

# field -> (value the user writes, settings under which the field acts, settings under which it does not)
IGNORED_CASES: dict[str, tuple[Any, dict[str, Any], dict[str, Any]]] = {
    "schedule.milestones": ([0.5], {"schedule.decay": "step"}, {}),
    "schedule.decay_factor": (0.5, {"schedule.decay": "step", "schedule.milestones": [0.5]}, {}),
    "schedule.poly_power": (3.0, {"schedule.decay": "poly"}, {"schedule.decay": "cosine"}),
    "schedule.min_lr": (0.001, {"schedule.decay": "cosine"}, {}),
    "schedule.warmup_epochs": (0.5, {"schedule.warmup": "gradual"}, {}),
    **{
        f"schedule.{f}": (v, {"schedule.warmup": "auto", "schedule.decay": "cosine"}, {"schedule.decay": "cosine"})
        for f, v in (
            ("auto_init_lr", 1e-4),
            ("auto_growth", 1.05),
            ("auto_max_lr", 5.0),
            ("auto_patience", 3),
            ("auto_confidence", 0.9),
            ("auto_min_steps", 30),
            ("auto_max_points", 100),
            ("auto_seed", 1),
        )
    },
    "batch.noise_scale_factor": (2.0, {"batch.policy": "noise_scale"}, {"batch.policy": "norm_test"}),
    "batch.norm_test_eta": (0.3, {"batch.policy": "norm_test"}, {"batch.policy": "noise_scale"}),
    "batch.check_every": (5, {"batch.policy": "norm_test"}, {}),
    "batch.min_growth": (2.0, {"batch.policy": "noise_scale"}, {}),
    "batch.round_to": (16, {"batch.policy": "noise_scale"}, {}),
    "batch.cbs_window": (5, {"batch.policy": "cbs_warmup"}, {"batch.policy": "noise_scale"}),
    "batch.cbs_growth": (1.5, {"batch.policy": "cbs_warmup"}, {}),
    "optimizer.mf_ref_batch": (16, {"optimizer.mf_rule": "per_worker_batch"}, {}),
    "optimizer.trust_coefficient": (0.01, {"optimizer.name": "lars"}, {"optimizer.name": "lamb"}),
    "optimizer.beta2": (0.99, {"optimizer.name": "adamw"}, {"optimizer.name": "nesterov"}),
    "optimizer.eps": (1e-6, {"optimizer.name": "lamb"}, {}),
    "model.hidden": (32, {"model.name": "mlp"}, {"model.name": "resnet18"}),
    "model.zero_init_residual": (True, {"model.name": "resnet18", "model.norm": "batch"}, {"model.name": "resnet18"}),
    "model.sync_bn": (
        True,
        {"model.norm": "batch", "scaling.use_gpu": True},
        {"model.norm": "group", "scaling.use_gpu": True},
    ),
    "data.root": ("/data", {"data.name": "cifar10"}, {"data.name": "synthetic"}),
    "data.size": (500, {"data.name": "synthetic"}, {}),
    "data.shape": ([2, 4, 4], {"data.name": "synthetic"}, {}),
    "data.num_classes": (3, {"data.name": "synthetic"}, {}),
    "scaling.gpus_per_worker": (0.5, {"scaling.use_gpu": True}, {}),
    # the GPU fast path's fields
    "data.val_fraction": (0.1, {}, {"data.name": "cifar10", "data.root": "/data", "data.val_split": "test"}),
    "data.crop_padding": (2, {"data.augment": ["random_crop"]}, {"data.augment": ["hflip"]}),
    "data.shard_block": (2, {"data.name": "token_shards"}, {}),
    "data.cache_bytes": (1 << 20, {"data.name": "token_shards"}, {}),
    "train.loss_scale_init": (1024.0, {"train.precision": "fp16", "scaling.use_gpu": True}, {}),
    "train.loss_scale_growth_interval": (100, {"train.precision": "fp16", "scaling.use_gpu": True}, {}),
    "train.compile_backend": ("aot_eager", {"train.compile": True}, {}),
    # a factory's keyword arguments: nothing of a built-in image model or dataset reads them
    "model.params": ({"width": 8}, {"model.factory": "pkg.mod:model"}, {}),
    "data.params": ({"n": 64}, {"data.factory": "pkg.mod:data"}, {}),
}


def _raw(settings: dict[str, Any]) -> dict[str, Any]:
    raw = read_yaml_text(BASE)
    for dotted, v in settings.items():
        section, key = dotted.split(".")
        raw.setdefault(section, {})[key] = v
    for section, builtin_only in (("model", ("name", "hidden", "norm")), ("data", ("name", "val_fraction"))):
        if f"{section}.factory" in settings:  # a factory replaces the built-in and what only it reads
            for key in builtin_only:
                raw[section].pop(key, None)
    if str(raw["model"].get("name")).startswith("resnet") and "model.hidden" not in settings:
        del raw["model"]["hidden"]  # BASE's cnn width has no effect on a resnet
    return raw


def test_every_rule_has_a_case():
    assert sorted(IGNORED_CASES) == sorted(r.field for r in IGNORED_UNLESS)


@pytest.mark.parametrize("field", sorted(IGNORED_CASES))
def test_setting_with_no_effect_is_refused(cli, field):
    value, _, off = IGNORED_CASES[field]
    import yaml

    text = yaml.safe_dump(_raw({**off, field: value}))
    rc, err = cli(text=text)
    assert_one_line(rc, err, f"{field}: has no effect unless", "; remove it or set")


@pytest.mark.parametrize("field", sorted(IGNORED_CASES))
def test_the_same_setting_is_accepted_where_it_acts(field):
    value, on, _ = IGNORED_CASES[field]
    check_config(validate(_raw({**on, field: value})))


def test_defaults_are_never_reported():
    # every field at its default, whatever the other settings: only what the user wrote counts
    check_config(validate(_raw({"optimizer.name": "sgd", "schedule.decay": "none", "model.name": "resnet18"})))
    # and a worker's full dump re-validates (it sets every field; the driver checks, not the worker)
    cfg = validate(_raw({}))
    assert validate(cfg.model_dump(mode="json")) == cfg


TRAINING_CONFIGS = sorted(  # every shipped training config (the search specs and cluster files aside)
    f"configs/{name}"
    for name in os.listdir(os.path.join(ROOT, "configs"))
    if name.endswith(".yaml") and not name.startswith(("search_", "cluster"))
)


def test_the_shipped_training_configs_are_all_checked():
    assert {"configs/quickstart.yaml", "configs/lm_shards.yaml", "configs/cifar10_resnet50.yaml"} <= set(
        TRAINING_CONFIGS
    )


@pytest.mark.parametrize("path", TRAINING_CONFIGS)
def test_shipped_configs_pass(path):
    cfg = validate(read_yaml(os.path.join(ROOT, path)))
    check_config(cfg)
    # and so does their full dump (the config.yaml a run logs; `search show --full`): every field is
    # written, the inactive ones at their defaults
    check_config(validate(read_yaml_text(to_yaml(cfg))))


def test_a_default_written_out_is_not_refused():
    check_config(
        validate(
            _raw(
                {
                    "schedule.poly_power": 2.0,
                    "optimizer.trust_coefficient": 0.001,
                    "data.shape": [1, 8, 8],
                    "scaling.gpus_per_worker": 1.0,
                }
            )
        )
    )


# --------------------------------------------------------------------------- model input shapes


@pytest.mark.parametrize(
    "model, shape", [("cnn", [64]), ("cnn", [3, 32]), ("resnet18", [64]), ("resnet50", [3, 32]), ("cnn", [1, 1, 8, 8])]
)
def test_shape_the_model_cannot_take(cli, model, shape):
    text = BASE.replace(", hidden: 16", "")  # model.hidden would be refused first for a resnet
    rc, err = cli(["data.name=synthetic", f"data.shape={shape}", f"model.name={model}"], text=text)
    assert_one_line(rc, err, "data.shape:", f"model {model} cannot take inputs of shape {shape}")


@pytest.mark.parametrize(
    "model, shape", [("mlp", [64]), ("mlp", [2, 3, 4, 5]), ("cnn", [3, 5, 5]), ("resnet18", [3, 8, 8])]
)
def test_shape_the_model_can_take(model, shape):
    raw = _raw({"data.name": "synthetic", "data.shape": shape, "model.name": model})
    check_config(validate(raw))


# --------------------------------------------------------------------------- search storage strings


@pytest.mark.parametrize(
    "storage, fragment",
    [
        ("http://127.0.0.1:5000", "is a server URL"),
        ("https://mlflow.example.com", "is a server URL"),
        ("file:///tmp/mlruns", "is not a database URL"),
        ("databricks://profile", "is not a database URL"),
        ("{tmp}", "is a folder"),
        ("sqlite:///{tmp}", "is a folder"),
        ("{tmp}/mlflow.db", "is an MLflow tracking database"),
        ("sqlite:///{tmp}/mlflow.db", "is an MLflow tracking database"),
        ("{tmp}/nope/optuna.journal", "does not exist"),
        ("sqlite:///{tmp}/nope/optuna.db", "does not exist"),
        ("''", "empty"),
    ],
)
def test_search_storage_of_the_wrong_kind(tmp_path, monkeypatch, capsys, storage, fragment):
    from search.commands import main as search_main

    con = sqlite3.connect(tmp_path / "mlflow.db")  # the tables an MLflow store has
    for t in ("experiments", "runs", "metrics"):
        con.execute(f"CREATE TABLE {t} (x INTEGER)")
    con.commit()
    con.close()
    monkeypatch.chdir(tmp_path)
    before = sorted(os.listdir(tmp_path))
    storage = "" if storage == "''" else storage.format(tmp=tmp_path)
    rc = search_main(["run", os.path.join(ROOT, "configs/search_quickstart.yaml"), "--storage", storage])
    err = capsys.readouterr().err.strip()
    assert_one_line(rc, err, "--storage:", fragment)
    assert sorted(os.listdir(tmp_path)) == before, "something was created"


def test_search_checks_the_tracking_store_and_folders(tmp_path, monkeypatch, capsys):
    from search.commands import main as search_main

    monkeypatch.chdir(tmp_path)
    rc = search_main(
        [
            "run",
            os.path.join(ROOT, "configs/search_quickstart.yaml"),
            "--storage",
            str(tmp_path / "j.journal"),
            "--tracking-uri",
            f"sqlite:///{tmp_path}/missing/mlflow.db",
        ]
    )
    assert_one_line(rc, capsys.readouterr().err.strip(), "tracking.uri:", "does not exist")
    assert os.listdir(tmp_path) == []


def test_search_refuses_a_batch_the_training_set_cannot_fill(tmp_path, capsys):
    from search.commands import main as search_main

    space = tmp_path / "space.yaml"
    space.write_text(
        f"base: {ROOT}/configs/quickstart.yaml\noverrides: {{batch.max_size: null}}\n"
        f"params:\n  batch.size: {{choices: [64, 4096]}}\n"
    )
    rc = search_main(["run", str(space), "--storage", str(tmp_path / "j.journal")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.startswith("error: params.batch.size"), err
    assert "4096 is above the 1438 training samples" in err and "\n" not in err
    assert not os.path.exists(tmp_path / "j.journal")
