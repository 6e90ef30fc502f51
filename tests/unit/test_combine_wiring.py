"""Tier 1: combine.method wired into the config, the logged params, the search space and the
loop's side (trainers/combine/combinations.py, one class per method); no processes."""

import copy

import pytest
import torch

from orchestrator.config.prepare import validated
from orchestrator.config.schema import ConfigError, validate
from orchestrator.record.params import flatten, public_config
from search.space import SpaceError, parse_space
from trainers.combine.combinations import build_combination
from trainers.combine.config import CombineConfig
from trainers.combine.methods import LocalSGD
from trainers.loop.config import LoopConfig
from trainers.policies.batching import BatchConfig, build_batch_policy

BASE = {
    "data": {"name": "digits"},
    "model": {"name": "mlp", "norm": "none", "hidden": 16},
    "optimizer": {"name": "sgd", "lr": 0.05, "mf": 0.9, "base_batch_size": 32},
    "batch": {"size": 32, "max_local_batch": 16},
    "scaling": {"min_workers": 2, "max_workers": 2},
    "train": {"epochs": 2},
}


def raw(**sections):
    r = copy.deepcopy(BASE)
    for k, v in sections.items():
        r.setdefault(k, {}).update(v)
    return r


def test_default_is_mean_and_every_method_is_a_logged_param():
    assert validate(raw()).combine.method == "mean"
    cfg = validate(raw(combine={"method": "local_sgd", "local_steps": 4}))
    params = flatten(public_config(cfg))
    assert params["combine.method"] == "local_sgd" and params["combine.local_steps"] == 4
    assert "combine.average_momentum" in params
    # the workers get the section too
    assert LoopConfig.model_validate(cfg.loop_dict()).combine.local_steps == 4


@pytest.mark.parametrize(
    "sections, fragment",
    [
        ({"combine": {"method": "sum"}}, "combine.method: unknown 'sum'; expected one of mean, adasum, local_sgd"),
        ({"combine": {"method": "local_sgd", "local_steps": 0}}, "combine.local_steps: must be >= 1 (got 0)"),
        ({"combine": {"method": "local_sgd"}}, "combine.local_steps: required by combine.method local_sgd"),
        (
            {"combine": {"method": "adasum"}},
            "schedule.scaling_rule: 'linear' cannot be used with combine.method adasum",
        ),
        (
            {"combine": {"method": "adasum"}, "schedule": {"scaling_rule": "none"}, "batch": {"policy": "norm_test"}},
            "batch.policy: 'norm_test' cannot be used with combine.method adasum",
        ),
        (
            {"combine": {"method": "adasum"}, "schedule": {"scaling_rule": "none"}, "scaling": {"min_workers": 1}},
            "scaling.min_workers: 1 differs from scaling.max_workers 2",
        ),
        (
            {"combine": {"method": "local_sgd", "local_steps": 4}, "schedule": {"scaling_rule": "adascale"}},
            "schedule.scaling_rule: 'adascale' cannot be used with combine.method local_sgd",
        ),
        (
            {"combine": {"method": "local_sgd", "local_steps": 4}, "batch": {"policy": "norm_test", "check_every": 6}},
            "batch.check_every: 6 is not a multiple of combine.local_steps 4",
        ),
    ],
)
def test_what_combine_cannot_honour_is_one_line_naming_the_field(sections, fragment):
    with pytest.raises(ConfigError) as e:
        validated(raw(**sections))
    msg = str(e.value)
    assert (
        fragment in msg
        and "\n" not in msg
        and msg.split(":")[0]
        in {
            "combine.method",
            "combine.local_steps",
            "schedule.scaling_rule",
            "batch.policy",
            "scaling.min_workers",
            "batch.check_every",
        }
    )


def test_valid_combinations_pass():
    validated(raw(combine={"method": "adasum"}, schedule={"scaling_rule": "none"}))
    validated(raw(combine={"method": "local_sgd", "local_steps": 4}, batch={"policy": "norm_test", "check_every": 8}))


def test_search_space_explores_combine_method():
    space = parse_space(
        {
            "base": raw(schedule={"scaling_rule": "none"}),
            "objective": {"metric": "val/accuracy", "direction": "maximize"},
            "params": {
                "combine.method": {"choices": ["mean", "adasum", "local_sgd"]},
                "combine.local_steps": {"choices": [2, 8], "when": "combine.method == local_sgd"},
            },
        }
    )
    cfg = space.config({"combine.method": "local_sgd", "combine.local_steps": 8})
    assert (cfg.combine.method, cfg.combine.H) == ("local_sgd", 8)
    assert space.config({"combine.method": "adasum"}).combine.method == "adasum"
    with pytest.raises(SpaceError, match="combine.method"):
        parse_space(
            {
                "base": raw(),
                "objective": {"metric": "val/accuracy", "direction": "maximize"},
                "params": {"combine.method": {"choices": ["mean", "sum"]}},
            }
        )


def test_combination_mean_is_a_no_op():
    c = build_combination(CombineConfig(), world=4)
    assert c.uses_ddp and c.loss_scale(64, 16) == 4 / 64 and c.states() == {} and c.metrics() == {}
    assert c.should_checkpoint(True, 3) and not c.should_checkpoint(False, 4)


def test_local_sgd_loss_scale_and_checkpoints_deferred_to_sync_steps():
    c = build_combination(CombineConfig(method="local_sgd", local_steps=4), world=2)
    assert not c.uses_ddp and c.loss_scale(64, 20) == 1 / 20 and set(c.states()) == {"combine"}
    assert not c.should_checkpoint(True, 6)  # an epoch ended at step 6: taken at step 8
    assert not c.should_checkpoint(False, 7)
    assert c.should_checkpoint(False, 8)
    assert not c.should_checkpoint(False, 12)


def test_local_sgd_before_save_syncs_off_the_sync_points():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    c = build_combination(CombineConfig(method="local_sgd", local_steps=4), world=1)
    c.attach(model, opt)
    model(torch.randn(5, 3)).sum().backward()
    opt.step()
    c.after_step(1, local_count=5)
    assert c.local_sgd.syncs == 0
    c.before_save(1)  # the run ends (or resizes) at step 1: a sync makes it a sync point
    assert c.local_sgd.syncs == 1 and c.local_sgd.last_sync_step == 1
    c.before_save(1)
    assert c.local_sgd.syncs == 1


def test_local_sgd_state_keeps_the_last_norm_test_answer():
    a = LocalSGD(CombineConfig(method="local_sgd", local_steps=2), norm_test_eta=0.5)
    a.suggested, a.syncs = 96, 3
    b = LocalSGD(CombineConfig(method="local_sgd", local_steps=2), norm_test_eta=0.5)
    b.load_state_dict(a.state_dict())
    assert b.suggested == 96 and b.syncs == 3
    policy = build_batch_policy(BatchConfig(size=32, max_local_batch=32, policy="norm_test", check_every=2))
    d = b.decide_batch(policy, step=4, epoch=0.5, current=32)
    assert d and d.size == 96
    b.suggested = None
    assert not b.decide_batch(policy, step=6, epoch=0.5, current=96)
