"""Every rule between config fields has one home (``orchestrator/config/rules.py``, :data:`COMBINATIONS`)
and one error type (``ConfigError``, one line): each section accepts its fields alone, and every
way in (``prepare`` for train, resume, plan and fit(); ``validated`` for a search's trials) reports
the same message."""

from __future__ import annotations

import copy

import pytest

from orchestrator.config import preflight, rules
from orchestrator.config.prepare import prepare, validated
from orchestrator.config.schema import ConfigError, validate
from trainers.loop.config import LoopConfig

BASE = {
    "data": {"name": "digits"},
    "model": {"name": "mlp", "norm": "none"},
    "batch": {"size": 32, "max_local_batch": 16},
}

# (the rule, sections over BASE that break it and no rule before it, how its message starts)
CASES = [
    (
        rules._choice,
        {"data": {"name": "digits", "factory": "pkg.data:build"}},
        "data.factory: give either data.name ('digits') or data.factory ('pkg.data:build'), not both",
    ),
    (
        rules._weight_decay_rule,
        {"optimizer": {"name": "adam", "weight_decay": 0.1, "wd_rule": "timescale"}},
        "optimizer.wd_rule: timescale is defined for AdamW's decoupled weight decay",
    ),
    (
        rules._batch_sizes,
        {"batch": {"size": 32, "max_local_batch": 16, "max_size": 16}},
        "batch.max_size: 16 is below batch.size 32; raise it to at least 32",
    ),
    (
        rules._batch_policy_fields,
        {"batch": {"size": 32, "max_local_batch": 16, "policy": "schedule"}},
        "batch.schedule: required by batch.policy schedule",
    ),
    (
        rules._warmup_and_decay,
        {"schedule": {"warmup": "gradual"}},
        "schedule.warmup_epochs: must be > 0 when schedule.warmup is 'gradual'; set it, e.g. 5",
    ),
    (
        rules._combine_section,
        {"combine": {"method": "local_sgd"}},
        "combine.local_steps: required by combine.method local_sgd",
    ),
    (
        rules._worker_range,
        {"scaling": {"min_workers": 3, "max_workers": 2}},
        "scaling.min_workers: 3 is above scaling.max_workers 2; lower min_workers or raise max_workers",
    ),
    (
        rules._within_training,
        {"schedule": {"decay": "step", "milestones": [2, 9]}, "train": {"epochs": 5}},
        "schedule.milestones: [9.0] at or after train.epochs 5",
    ),
    (
        rules._batch_with_schedule,
        {"batch": {"size": 32, "max_local_batch": 16, "policy": "seesaw"}},
        "schedule.decay: batch.policy seesaw grows B where the LR schedule's milestones cut the LR",
    ),
    (
        rules._weight_decay_with_scaling,
        {
            "optimizer": {"name": "adamw", "weight_decay": 0.1, "wd_rule": "timescale"},
            "schedule": {"scaling_rule": "adascale"},
        },
        "optimizer.wd_rule: timescale needs the LR a batch gets ahead of time",
    ),
    (
        rules._sync_bn,
        {"model": {"name": "mlp", "sync_bn": True}},
        "model.sync_bn: PyTorch's SyncBatchNorm runs on GPUs only",
    ),
    (
        rules.check_fast_path,
        {"data": {"name": "digits", "device": "accelerator"}},
        "data.device: accelerator keeps the dataset on the GPU and needs scaling.use_gpu: true",
    ),
    (
        rules.check_combine,
        {
            "scaling": {"policy": "goodput", "min_workers": 2, "max_workers": 2},
            "combine": {"method": "adasum"},
            "schedule": {"scaling_rule": "none"},
        },
        "scaling.policy: goodput reads the gradient noise scale, which combine.method adasum does not measure",
    ),
    (
        rules.check_adversarial,
        {"train": {"adversarial": {"method": "conadv", "epsilon": 0}}},
        "train.adversarial.epsilon: 0 perturbs nothing",
    ),
]


def _raw(sections: dict) -> dict:
    raw = copy.deepcopy(BASE)
    raw.update(copy.deepcopy(sections))
    return raw


def test_every_rule_has_a_case():
    assert [rule for rule, _, _ in CASES] == list(rules.COMBINATIONS)


@pytest.mark.parametrize("rule, sections, start", CASES, ids=[r.__name__ for r, _, _ in CASES])
def test_a_rule_is_checked_once_after_the_schema_with_one_message_everywhere(
    rule, sections, start, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    cfg = validate(_raw(sections))  # each section's own fields are fine: the schema lets it through
    LoopConfig.model_validate(cfg.loop_dict())  # and so does a worker's re-validation of the dump
    with pytest.raises(ConfigError) as e:
        rule(cfg)
    message = str(e.value)
    assert message.startswith(start) and "\n" not in message
    for way_in in (
        lambda: preflight.check_config(cfg),  # the one call of the pipeline
        lambda: validated(_raw(sections)),  # a search's trial, a stored trial
        lambda: prepare(_raw(sections), environment=False),
    ):  # train, resume, plan, fit()
        with pytest.raises(ConfigError) as e:
            way_in()
        assert str(e.value) == message


def test_the_base_config_breaks_no_rule():
    rules.check_combinations(validate(_raw({})))
