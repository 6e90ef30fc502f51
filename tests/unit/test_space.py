"""Search spaces without Ray: parsing, every kind of bad input, conditions, sampling, samplers, pruners."""

from __future__ import annotations

import copy
import importlib.util
import os

import optuna
import pytest
import yaml

from search.registry import PRUNERS, SAMPLERS, AlgorithmSpec, check_options
from search.space import Condition, SpaceError, load_space, parse_space, parse_when

optuna.logging.set_verbosity(optuna.logging.WARNING)

BASE = {
    "data": {"name": "digits"},
    "model": {"name": "mlp", "norm": "none", "hidden": 32},
    "optimizer": {"name": "sgd", "lr": 0.05, "mf": 0.9, "base_batch_size": 32},
    "batch": {"size": 32, "max_local_batch": 16},
    "train": {"epochs": 2},
}


def space(**changes) -> dict:
    """A valid space; keyword arguments replace (or with None, remove) top-level keys."""
    raw = {
        "base": copy.deepcopy(BASE),
        "objective": {"metric": "val/accuracy", "direction": "maximize"},
        "params": {
            "optimizer.lr": {"low": 0.01, "high": 1.0, "log": True},
            "batch.size": {"choices": [32, 64]},
            "schedule.warmup": {"choices": ["none", "gradual"]},
            "schedule.warmup_epochs": {"low": 0.1, "high": 1.0, "when": "schedule.warmup != none"},
        },
    }
    for k, v in changes.items():
        if v is None:
            raw.pop(k, None)
        else:
            raw[k] = v
    return raw


def with_params(**params) -> dict:
    """The default space with some params replaced (keys use __ for dots)."""
    raw = space()
    for k, v in params.items():
        path = k.replace("__", ".")
        if v is None:
            raw["params"].pop(path, None)
        else:
            raw["params"][path] = v
    return raw


def error_of(raw: dict) -> str:
    with pytest.raises(SpaceError) as e:
        parse_space(raw)
    msg = str(e.value)
    assert "\n" not in msg, "errors are one line"
    return msg


# --------------------------------------------------------------------------- a good space


def test_quickstart_space_parses():
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    s = load_space(os.path.join(here, "configs", "search_quickstart.yaml"))
    assert s.sampler.name == "tpe" and s.pruner.name == "median" and s.prunes
    assert s.objectives[0].metric == "val/accuracy" and s.directions == ["maximize"]
    paths = [p.path for p in s.params]
    assert paths.index("schedule.warmup") < paths.index("schedule.warmup_epochs")
    cfg = s.config(s.resolve(lambda p: p.candidates()[0][1]))
    assert cfg.scaling.cpus_per_worker == 0.5 and cfg.scaling.max_workers == 1


@pytest.mark.parametrize("name", ["search_lm.yaml", "search_lm_adaptive.yaml"])
def test_language_model_spaces_parse(name):
    """The text corpus's size is known only once it is loaded: a space over the LM must parse (the trial's
    workload probe checks the batch against it), every choice of the adaptive LM space giving a valid config."""
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    s = load_space(os.path.join(here, "configs", name))
    assert s.objectives[0].metric == "val/perplexity" and s.prunes
    for pick in (0, -1):
        cfg = s.config(s.resolve(lambda p: p.candidates()[pick][1]))
        assert cfg.data.name == "text"
    if name == "search_lm_adaptive.yaml":
        assert {p.path for p in s.params} >= {
            "batch.size",
            "batch.policy",
            "batch.noise_scale_factor",
            "batch.max_size",
            "optimizer.lr",
            "schedule.warmup_epochs",
        }


def test_defaults_and_kinds():
    s = parse_space(space())
    assert s.sampler.name == "tpe" and s.pruner.name == "median"
    kinds = {p.path: p.kind for p in s.params}
    assert kinds == {
        "optimizer.lr": "float",
        "batch.size": "categorical",
        "schedule.warmup": "categorical",
        "schedule.warmup_epochs": "float",
    }
    s = parse_space(with_params(batch__size={"low": 16, "high": 64, "step": 16}))
    assert s.param("batch.size").kind == "int"
    assert s.param("batch.size").grid_values() == [16, 32, 48, 64]


def test_base_from_file_and_overrides(tmp_path):
    (tmp_path / "train.yaml").write_text(yaml.safe_dump(BASE))
    raw = space(base="train.yaml", overrides={"train.epochs": 3, "model.hidden": 16})
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(raw))
    s = load_space(str(tmp_path / "s.yaml"))
    assert s.base["train"]["epochs"] == 3 and s.base["model"]["hidden"] == 16
    s = parse_space(space(overrides=["train.epochs=4", "batch.max_local_batch=8"]))
    assert s.base["train"]["epochs"] == 4 and s.base["batch"]["max_local_batch"] == 8


def test_objective_forms():
    assert parse_space(space(objective="val/loss")).objectives[0].direction == "minimize"
    assert parse_space(space(objective={"metric": "val/accuracy"})).objectives[0].direction == "maximize"
    two = parse_space(
        space(
            objective=[
                {"metric": "val/accuracy", "direction": "maximize"},
                {"metric": "worker_seconds", "direction": "minimize"},
            ]
        )
    )
    assert two.multi_objective and two.pruner.name == "none" and not two.prunes
    assert two.directions == ["maximize", "minimize"]


# --------------------------------------------------------------------------- bad input, each named


BAD = [
    (space(samplr="tpe"), "samplr: unknown key; allowed keys: base,"),
    (space(params={}), "params: required"),
    (space(base=None), "base: required"),
    (space(base="no/such/train.yaml"), "base: file"),
    (space(base={**BASE, "optimizer": {"lr": -1}}), "base.optimizer.lr: must be > 0"),
    (
        space(overrides={"optimizer.lrr": 1}),
        "overrides.optimizer.lrr: unknown config field; did you mean optimizer.lr? optimizer has: name, lr",
    ),
    (
        with_params(optimizer__lrr={"low": 0.1, "high": 1}),
        "params.optimizer.lrr: unknown config field; did you mean optimizer.lr? optimizer has:",
    ),
    (
        with_params(optimizerr__lr={"low": 0.1, "high": 1}),
        "params.optimizerr.lr: unknown config field; did you mean optimizer? the config has:",
    ),
    (with_params(optimizer={"low": 0.1, "high": 1}), "params.optimizer: is a section; name one of its fields"),
    (
        with_params(optimizer__lr__x={"low": 0.1, "high": 1}),
        "params.optimizer.lr.x: optimizer.lr is a value, not a section",
    ),
    (with_params(tracking__uri={"choices": ["a"]}), "params.tracking.uri: tracking is where results go"),
    (with_params(optimizer__lr={"low": 1.0, "high": 0.1}), "params.optimizer.lr.low: 1.0 is above high 0.1"),
    (with_params(optimizer__lr={"low": 0.1, "high": 0.1}), "params.optimizer.lr: empty range"),
    (
        with_params(optimizer__lr={"low": 0.0, "high": 1.0, "log": True}),
        "params.optimizer.lr.low: a log range needs low > 0",
    ),
    (
        with_params(optimizer__lr={"low": 0.01, "high": 1.0, "log": True, "step": 0.1}),
        "params.optimizer.lr.step: cannot be combined with log",
    ),
    (with_params(optimizer__lr={"low": 0.01, "high": 1.0, "step": -1}), "params.optimizer.lr.step: must be a positive"),
    (with_params(optimizer__lr={"low": 0.01}), "params.optimizer.lr.high: required"),
    (
        with_params(optimizer__lr={"lo": 0.01, "high": 1}),
        "params.optimizer.lr.lo: unknown key; allowed keys: low, high",
    ),
    (with_params(optimizer__lr={"low": "a", "high": 1}), "params.optimizer.lr.low: must be a number"),
    (
        with_params(optimizer__lr={"low": 0.1, "high": 1, "choices": [1]}),
        "params.optimizer.lr.low: give either choices",
    ),
    (with_params(optimizer__lr=0.1), "params.optimizer.lr: expected a mapping"),
    (with_params(batch__size={"choices": []}), "params.batch.size.choices: empty"),
    (with_params(batch__size={"choices": 32}), "params.batch.size.choices: expected a list"),
    (with_params(batch__size={"low": 16.5, "high": 64}), "params.batch.size.low: batch.size is an integer field"),
    (
        with_params(schedule__decay={"low": 0, "high": 1}),
        "params.schedule.decay: schedule.decay is not a number (cosine",
    ),
    (
        with_params(schedule__decay={}),
        "params.schedule.decay: schedule.decay takes one of a set of values; give choices",
    ),
    # values that can never make a valid config
    (
        with_params(optimizer__lr={"low": 0.0, "high": 1.0}),
        "params.optimizer.lr.low: 0.0 gives no valid training config (optimizer.lr: must be > 0",
    ),
    (
        with_params(optimizer__mf={"low": 0.5, "high": 1.5}),
        "params.optimizer.mf.high: 1.5 gives no valid training config",
    ),
    (
        with_params(schedule__warmup={"choices": ["none", "lgew"]}),
        "params.schedule.warmup.choices[1]: lgew gives no valid training config (schedule.warmup: unknown 'lgew'",
    ),
    (
        with_params(batch__size={"choices": [4096, 32]}),
        "params.batch.size.choices[0]: 4096 gives no valid training config (batch.size: 4096 is above the "
        "1438 training samples",
    ),
    (
        with_params(schedule__warmup={"choices": ["none", "legw"]}),
        "params.schedule.warmup.choices[1]: legw gives no valid training config (schedule.scaling_rule",
    ),
    (
        with_params(schedule__warmup_epochs={"low": 0.5, "high": 3.0, "when": "schedule.warmup == gradual"}),
        "params.schedule.warmup_epochs.high: 3.0 gives no valid training config (schedule.warmup_epochs: 3.0 "
        "leaves no epoch",
    ),
    # conditions
    (
        with_params(schedule__warmup_epochs={"low": 0.1, "high": 1, "when": "schedule.warmup >= 2"}),
        "params.schedule.warmup_epochs.when: cannot read",
    ),
    (
        with_params(schedule__warmup_epochs={"low": 0.1, "high": 1, "when": "schedule.wramup != none"}),
        "params.schedule.warmup_epochs.when: schedule.wramup: unknown config field",
    ),
    (
        with_params(schedule__warmup_epochs={"low": 0.1, "high": 1, "when": "schedule.warmup == lgew"}),
        "params.schedule.warmup_epochs.when: never true: no choice of schedule.warmup",
    ),
    (
        with_params(schedule__warmup_epochs={"low": 0.1, "high": 1, "when": {"schedule.warmup": ["gradual", "lgew"]}}),
        "params.schedule.warmup_epochs.when: 'lgew' is not among schedule.warmup's choices",
    ),
    (
        with_params(schedule__warmup_epochs={"low": 0.1, "high": 1, "when": "schedule.decay == cosine"}),
        "params.schedule.warmup_epochs.when: never true (schedule.decay is none in the base",
    ),
    (
        with_params(schedule__warmup_epochs={"low": 0.1, "high": 1, "when": 3}),
        "params.schedule.warmup_epochs.when: expected a mapping",
    ),
    (
        with_params(
            schedule__decay={"choices": ["none", "cosine"], "when": "schedule.scaling_rule == sqrt"},
            schedule__scaling_rule={"choices": ["linear", "sqrt"], "when": "schedule.decay == cosine"},
        ),
        "params.schedule.decay.when: conditions go in a circle",
    ),
    # objective, sampler, pruner
    (space(objective={"metric": "val/acc"}), "objective.metric: unknown 'val/acc'; expected one of val/accuracy"),
    (space(objective={"metric": "val/accuracy", "direction": "up"}), "objective.direction: unknown 'up'"),
    (space(objective={"metric": "val/accuracy", "goal": "max"}), "objective.goal: unknown key"),
    (space(objective=[{"metric": "val/accuracy"}, {"metric": "val/accuracy"}]), "objective: the same metric twice"),
    (
        space(objective=[{"metric": "val/accuracy"}, {"metric": "worker_seconds"}], pruner="median"),
        "pruner: Optuna cannot prune a multi-objective study",
    ),
    (space(sampler="tpee"), "sampler: unknown 'tpee'; expected one of tpe, gp, cmaes, random, grid"),
    (space(pruner="mediann"), "pruner: unknown 'mediann'; expected one of median, percentile, hyperband"),
    (space(sampler={"name": "tpe", "n_startup": 3}), "sampler.n_startup: not an option of tpe (TPESampler); allowed:"),
    (space(pruner={"name": "median", "n_startup_trials": -1}), "pruner.n_startup_trials: median rejects its options"),
    (space(pruner={"name": "threshold"}), "pruner: threshold rejects its options"),
    (
        space(sampler={"name": "grid"}),
        "params.optimizer.lr: the grid sampler needs a finite set; give step, or choices",
    ),
    (space(keep_checkpoints="yes"), "keep_checkpoints: must be true or false"),
]


@pytest.mark.parametrize("raw,expected", BAD, ids=[e.split(":")[0] + f"-{i}" for i, (_, e) in enumerate(BAD)])
def test_bad_space_names_the_field(raw, expected):
    assert error_of(raw).startswith(expected), error_of(raw)


@pytest.mark.skipif(importlib.util.find_spec("cmaes") is not None, reason="cmaes is installed")
def test_cmaes_without_its_package_is_a_clear_error():
    assert error_of(space(sampler="cmaes")).startswith("sampler: cmaes needs the Python package 'cmaes'")


def test_invalid_combinations_are_left_to_the_trials():
    """legw needs sqrt scaling: a space offering both rules is valid; the linear+legw trial will FAIL."""
    raw = with_params(
        schedule__warmup={"choices": ["none", "legw"]}, schedule__scaling_rule={"choices": ["linear", "sqrt"]}
    )
    s = parse_space(raw)
    from orchestrator.config.schema import ConfigError

    with pytest.raises(ConfigError, match="legw"):
        s.config({"schedule.warmup": "legw", "schedule.warmup_epochs": 0.5, "schedule.scaling_rule": "linear"})
    s.config({"schedule.warmup": "legw", "schedule.warmup_epochs": 0.5, "schedule.scaling_rule": "sqrt"})


# --------------------------------------------------------------------------- conditions and sampling


@pytest.mark.parametrize(
    "text,cond",
    [
        ("schedule.warmup != none", [Condition("schedule.warmup", ("none",), negate=True)]),
        ("schedule.warmup == gradual", [Condition("schedule.warmup", ("gradual",))]),
        ("schedule.warmup in [gradual, legw]", [Condition("schedule.warmup", ("gradual", "legw"))]),
        ("schedule.warmup not in [none]", [Condition("schedule.warmup", ("none",), negate=True)]),
        (
            "batch.size == 64 and schedule.warmup != none",
            [Condition("batch.size", (64,)), Condition("schedule.warmup", ("none",), negate=True)],
        ),
    ],
)
def test_condition_strings(text, cond):
    assert list(parse_when(text, "w")) == cond


def test_condition_mapping_equals_string():
    a = parse_when({"schedule.warmup": ["gradual", "constant"]}, "w")
    b = parse_when("schedule.warmup in [gradual, constant]", "w")
    assert a == b


def _fixed(s, params):
    return s.sample(optuna.trial.FixedTrial(params))


def test_conditional_param_sampled_only_when_its_condition_holds():
    s = parse_space(space())
    off = _fixed(s, {"optimizer.lr": 0.1, "batch.size": 32, "schedule.warmup": "none"})
    assert "schedule.warmup_epochs" not in off
    on = _fixed(s, {"optimizer.lr": 0.1, "batch.size": 32, "schedule.warmup": "gradual", "schedule.warmup_epochs": 0.5})
    assert on["schedule.warmup_epochs"] == 0.5
    assert s.config(on).schedule.warmup_epochs == 0.5
    assert s.config(off).schedule.warmup_epochs == 0.0


def test_parent_param_sampled_first_whatever_the_file_order():
    raw = space()
    params = raw["params"]
    raw["params"] = {"schedule.warmup_epochs": params["schedule.warmup_epochs"], **params}
    s = parse_space(raw)
    order = [p.path for p in s.params]
    assert order.index("schedule.warmup") < order.index("schedule.warmup_epochs")


def test_list_valued_choices_go_by_label():
    """batch.schedule takes lists: Optuna sees their JSON text, the config gets the list back."""
    raw = with_params(
        batch__policy={"choices": ["fixed", "schedule"]},
        batch__schedule={"choices": [[[1, 64]], [[1, 128]]], "when": {"batch.policy": "schedule"}},
    )
    s = parse_space(raw)
    p = s.param("batch.schedule")
    assert p.encoded and p.labels() == ["[[1, 64]]", "[[1, 128]]"]
    values = _fixed(
        s,
        {
            "optimizer.lr": 0.1,
            "batch.size": 32,
            "schedule.warmup": "none",
            "batch.policy": "schedule",
            "batch.schedule": "[[1, 128]]",
        },
    )
    assert values["batch.schedule"] == [[1, 128]]
    assert s.config(values).batch.schedule == [(1.0, 128)]


def test_study_samples_valid_configs():
    s = parse_space(space(sampler={"name": "tpe", "seed": 0, "n_startup_trials": 2}))
    study = optuna.create_study(direction="maximize", sampler=s.build_sampler(), pruner=s.build_pruner())
    for i in range(8):
        t = study.ask()
        values = s.sample(t)
        cfg = s.config(values)
        assert 0.01 <= cfg.optimizer.lr <= 1.0 and cfg.batch.size in (32, 64)
        assert ("schedule.warmup_epochs" in values) == (values["schedule.warmup"] != "none")
        study.tell(t, float(i))


def test_grid_covers_every_point_once():
    raw = with_params(optimizer__lr={"choices": [0.05, 0.1]}, schedule__warmup=None, schedule__warmup_epochs=None)
    s = parse_space({**raw, "sampler": {"name": "grid", "seed": 0}, "pruner": "none"})
    assert s.grid_size() == 4
    study = optuna.create_study(direction="maximize", sampler=s.build_sampler())
    seen = set()
    for _ in range(4):
        t = study.ask()
        v = s.sample(t)
        seen.add((v["optimizer.lr"], v["batch.size"]))
        study.tell(t, 0.0)
    assert seen == {(0.05, 32), (0.05, 64), (0.1, 32), (0.1, 64)}


# --------------------------------------------------------------------------- registries: one contract for all


def _available(name: str) -> bool:
    return all(importlib.util.find_spec(p) for p in SAMPLERS[name].requires)


@pytest.mark.parametrize("name", [n for n in SAMPLERS if _available(n)])
def test_every_sampler_drives_a_study(name):
    raw = with_params(
        optimizer__lr={"low": 0.01, "high": 0.1, "step": 0.01}, schedule__warmup_epochs=None, schedule__warmup=None
    )
    s = parse_space({**raw, "sampler": {"name": name, "seed": 0}, "pruner": "none"})
    sampler = s.build_sampler()
    assert isinstance(sampler, optuna.samplers.BaseSampler)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    for _ in range(3):
        t = study.ask()
        study.tell(t, s.config(s.sample(t)).optimizer.lr)
    assert len(study.trials) == 3


PRUNER_OPTIONS = {"threshold": {"lower": 0.5}, "percentile": {"percentile": 25.0}}


@pytest.mark.parametrize("name", list(PRUNERS))
def test_every_pruner_builds_and_answers(name):
    spec = AlgorithmSpec("pruner", name, PRUNER_OPTIONS.get(name, {}))
    assert check_options(spec) is None
    pruner = spec.build()
    assert isinstance(pruner, optuna.pruners.BasePruner)
    study = optuna.create_study(direction="maximize", pruner=pruner)
    t = study.ask()
    t.report(0.1, 1)
    assert isinstance(t.should_prune(), bool)


def test_threshold_pruner_prunes_below_its_bar():
    study = optuna.create_study(
        direction="maximize", pruner=AlgorithmSpec("pruner", "threshold", {"lower": 0.5}).build()
    )
    t = study.ask()
    t.report(0.1, 10)
    assert t.should_prune()


# --------------------------------------------------------------------------- continued studies


def test_continued_study_does_not_redraw_the_first_points(tmp_path):
    """A seeded sampler is built again on each invocation: the continued study offsets its seed."""
    from search.study import create_or_load_study
    from search.study_storage import open_storage

    s = parse_space(space(sampler={"name": "random", "seed": 0}, pruner="none"))
    storage = open_storage(str(tmp_path / "j.journal"))
    first = create_or_load_study(s, "st", storage)
    drawn = []
    for _ in range(2):
        t = first.ask()
        drawn.append(s.sample(t))
        first.tell(t, 0.5)
    again = create_or_load_study(s, "st", storage)
    t = again.ask()
    assert s.sample(t) not in drawn
    assert len(again.trials) == 3


def test_continued_study_must_keep_its_objective(tmp_path):
    from search.study import create_or_load_study
    from search.study_storage import open_storage

    storage = open_storage(str(tmp_path / "j.journal"))
    create_or_load_study(parse_space(space()), "st", storage)
    with pytest.raises(SpaceError, match="objective: study 'st' already exists and optimizes maximize"):
        create_or_load_study(parse_space(space(objective={"metric": "val/loss"})), "st", storage)


def test_report_against_defaults_to_samples_and_refuses_other_words():
    assert parse_space(space()).report_against == "samples"
    assert parse_space(space(report_against="steps")).report_against == "steps"
    with pytest.raises(SpaceError, match=r"^report_against: must be samples or steps \(got 'epochs'\)"):
        parse_space(space(report_against="epochs"))
