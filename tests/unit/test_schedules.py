"""LR policies against hand-computed values: scaling rules, warmups, decays, auto warmup.  No Ray."""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from typing import get_args

import numpy as np
import pytest
import torch

from trainers.policies.schedules import (
    DECAYS,
    SCALING_RULES,
    WARMUPS,
    AutoWarmup,
    DecayName,
    ScalingRuleName,
    Schedule,
    ScheduleConfig,
    WarmupName,
)

ETA0, B0 = 0.1, 64


def schedule(total_epochs: float = 90, **cfg) -> Schedule:
    return Schedule(ScheduleConfig(**cfg), base_lr=ETA0, base_batch=B0, total_epochs=total_epochs)


# --------------------------------------------------------------------------- registries


def test_registries_match_the_config_literals():
    assert set(get_args(ScalingRuleName)) == set(SCALING_RULES)
    assert set(get_args(DecayName)) == set(DECAYS)
    assert set(get_args(WarmupName)) == set(WARMUPS) | {"auto"}


# --------------------------------------------------------------------------- scaling rules


@pytest.mark.parametrize(
    "rule, batch, expected",
    [
        ("linear", 256, 0.4),
        ("linear", 32, 0.05),
        ("linear", 64, 0.1),
        ("sqrt", 256, 0.2),
        ("sqrt", 1024, 0.4),
        ("sqrt", 16, 0.05),
        ("none", 4096, 0.1),
    ],
)
def test_scaling_rules(rule, batch, expected):
    s = schedule(scaling_rule=rule)
    assert s.lr(10.0, batch) == pytest.approx(expected)
    assert s.lr(0.0, batch) == pytest.approx(expected)  # no warmup, no decay: flat


def test_a_registered_rule_receives_the_noise_signal(monkeypatch):
    """How AdaScale plugs in: a rule (k, noise) -> s, r = (var + sqr) / (var/k + sqr)."""

    @dataclass
    class Signal:
        var: float
        sqr: float

    def adascale(k, noise):
        return (noise.var + noise.sqr) / (noise.var / k + noise.sqr)

    monkeypatch.setitem(SCALING_RULES, "sqrt", adascale)
    s = schedule(scaling_rule="sqrt")
    # k = 4, var = 3, sqr = 1: r = 4 / (0.75 + 1) = 16/7
    assert s.lr(1.0, 256, noise=Signal(var=3.0, sqr=1.0)) == pytest.approx(ETA0 * 16 / 7)


# --------------------------------------------------------------------------- warmups


def test_gradual_warmup_ramps_from_eta0_to_the_scaled_lr():
    s = schedule(warmup="gradual", warmup_epochs=5)  # linear scaling, B = 512: k = 8, peak 0.8
    assert s.warmup_end(512) == 5.0
    assert s.lr(0.0, 512) == pytest.approx(0.1)
    assert s.lr(2.5, 512) == pytest.approx(0.45)
    assert s.lr(5.0 - 1e-9, 512) == pytest.approx(0.8)
    assert s.lr(5.0, 512) == pytest.approx(0.8)
    assert s.lr(50.0, 512) == pytest.approx(0.8)  # decay none


def test_linear_warmup_ramps_from_zero_to_the_scaled_lr_even_at_the_base_batch():
    s = schedule(warmup="linear", warmup_epochs=5)  # linear scaling, B = 512: k = 8, peak 0.8
    assert s.warmup_end(512) == 5.0
    assert s.lr(0.0, 512) == 0.0
    assert s.lr(2.5, 512) == pytest.approx(0.4)
    assert s.lr(5.0, 512) == pytest.approx(0.8)
    # at B = B0 gradual has nothing to ramp (eta0 = peak from the first step); linear still warms up
    assert schedule(warmup="gradual", warmup_epochs=5).lr(0.0, 64) == pytest.approx(ETA0)
    assert s.lr(1.0, 64) == pytest.approx(ETA0 / 5)


def test_constant_warmup_holds_the_unscaled_lr_then_jumps():
    s = schedule(warmup="constant", warmup_epochs=5)
    assert s.lr(0.0, 512) == pytest.approx(0.1)
    assert s.lr(4.99, 512) == pytest.approx(0.1)
    assert s.lr(5.0, 512) == pytest.approx(0.8)


@pytest.mark.parametrize("k, end, peak", [(1, 0.5, 0.1), (4, 2.0, 0.2), (16, 8.0, 0.4)])
def test_legw_warmup_length_grows_linearly_with_k(k, end, peak):
    s = schedule(scaling_rule="sqrt", warmup="legw", warmup_epochs=0.5)
    assert s.warmup_end(B0 * k) == pytest.approx(end)
    assert s.lr(0.0, B0 * k) == pytest.approx(ETA0)
    assert s.lr(end / 2, B0 * k) == pytest.approx((ETA0 + peak) / 2)
    assert s.lr(end, B0 * k) == pytest.approx(peak)


def test_no_warmup_starts_at_the_scaled_lr():
    assert schedule(warmup="none").warmup_end(512) == 0.0
    assert schedule(warmup="none").lr(0.0, 512) == pytest.approx(0.8)


# --------------------------------------------------------------------------- decays


def test_cosine_decay_after_warmup():
    # peak 0.4 at k = 4; warmup ends at 5, training ends at 105: p = (e - 5) / 100
    s = schedule(total_epochs=105, warmup="gradual", warmup_epochs=5, decay="cosine")
    assert s.lr(5.0, 256) == pytest.approx(0.4)
    assert s.lr(30.0, 256) == pytest.approx(0.4 * (1 + math.cos(math.pi / 4)) / 2)
    assert s.lr(55.0, 256) == pytest.approx(0.2)
    assert s.lr(105.0, 256) == pytest.approx(0.0, abs=1e-15)
    floor = schedule(total_epochs=105, warmup="gradual", warmup_epochs=5, decay="cosine", min_lr=0.01)
    assert floor.lr(55.0, 256) == pytest.approx(0.01 + 0.39 * 0.5)
    assert floor.lr(105.0, 256) == pytest.approx(0.01)
    assert floor.lr(200.0, 256) == pytest.approx(0.01)  # progress is clipped


def test_step_decay_at_absolute_milestones():
    s = schedule(warmup="gradual", warmup_epochs=5, decay="step", milestones=[30, 60, 80], decay_factor=0.1)
    assert s.lr(29.99, 256) == pytest.approx(0.4)
    assert s.lr(30.0, 256) == pytest.approx(0.04)
    assert s.lr(65.0, 256) == pytest.approx(0.004)
    assert s.lr(85.0, 256) == pytest.approx(0.0004)
    floored = schedule(decay="step", milestones=[1, 2, 3], min_lr=0.002)
    assert floored.lr(2.5, 64) == pytest.approx(0.002)  # 0.1 * 0.01 = 0.001 < floor


def test_poly_and_linear_decay():
    poly = schedule(total_epochs=10, decay="poly", poly_power=2.0)
    assert poly.lr(5.0, 64) == pytest.approx(0.1 * 0.25)
    lin = schedule(total_epochs=10, decay="linear")
    assert lin.lr(2.5, 64) == pytest.approx(0.075)
    assert lin.lr(10.0, 64) == pytest.approx(0.0, abs=1e-15)


def test_batch_change_mid_run_just_recomputes():
    s = schedule(total_epochs=20, warmup="gradual", warmup_epochs=2, decay="linear")
    assert s.lr(11.0, 128) == pytest.approx(2 * s.lr(11.0, 64))


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    "cfg, field",
    [
        ({"warmup": "lgew"}, "warmup"),
        ({"warmup": "gradual"}, "schedule.warmup_epochs: must be > 0 when schedule.warmup is 'gradual'"),
        ({"warmup": "constant", "warmup_epochs": 0}, "schedule.warmup_epochs"),
        ({"warmup": "legw", "warmup_epochs": 1}, "schedule.scaling_rule"),
        ({"warmup": "auto"}, "schedule.decay"),
        ({"decay": "step"}, "schedule.milestones"),
        ({"decay": "step", "milestones": [30, 20]}, "schedule.milestones"),
        ({"scaling_rule": "cubic"}, "scaling_rule"),
        ({"decay_factor": 0}, "decay_factor"),
        ({"warmup_epochs": -1}, "warmup_epochs"),
        ({"auto_growth": 1.0}, "auto_growth"),
        ({"auto_init_lr": 1.0, "auto_max_lr": 0.5}, "schedule.auto_max_lr"),
        ({"warmpu": "gradual"}, "warmpu"),
    ],
)
def test_bad_config_names_the_field(cfg, field):
    assert field in _error(cfg)


def _error(schedule: dict, epochs: float = 90, **sections: dict) -> str:
    """The one-line error of a config with this ``schedule`` section (its own fields: pydantic; its
    fields together and with the others: orchestrator/config/rules.py)."""
    from orchestrator.config.prepare import validated
    from orchestrator.config.schema import ConfigError

    with pytest.raises(ConfigError) as e:
        validated({"schedule": schedule, "train": {"epochs": epochs}, **sections})
    return str(e.value)


def test_validator_message_starts_with_the_field_path():
    assert _error({"warmup": "gradual"}) == (
        "schedule.warmup_epochs: must be > 0 when schedule.warmup is 'gradual'; set it, e.g. 5"
    )
    ScheduleConfig(warmup="gradual")  # a rule between two fields: not the section's own check


def test_a_schedule_must_fit_in_train_epochs():
    from orchestrator.config.prepare import validated

    validated({"schedule": {"warmup": "gradual", "warmup_epochs": 5}, "train": {"epochs": 90}})
    assert _error({"warmup": "gradual", "warmup_epochs": 5}, epochs=5).startswith("schedule.warmup_epochs: 5")
    assert _error({"decay": "step", "milestones": [30, 100]}).startswith("schedule.milestones: [100.0] at or after")


def test_schedule_rejects_bad_arguments():
    with pytest.raises(ValueError, match="optimizer.lr"):
        Schedule(ScheduleConfig(), base_lr=0.0, base_batch=64, total_epochs=1)
    with pytest.raises(ValueError, match="auto"):
        schedule(warmup="auto", decay="cosine").lr(0.0, 64)  # auto state missing
    with pytest.raises(ValueError, match="batch_size"):
        schedule().lr(0.0, 0)


# --------------------------------------------------------------------------- auto warmup

LR_STAR = 0.01


def _auto_cfg(**kw) -> ScheduleConfig:
    base = dict(warmup="auto", decay="cosine", auto_init_lr=1e-4, auto_growth=1.03, auto_patience=2)
    return ScheduleConfig(**(base | kw))


def _run_auto(
    s: Schedule,
    auto: AutoWarmup,
    seed: int,
    steps_per_epoch: int = 25,
    max_epochs: int = 40,
    start_epoch: int = 0,
    stop_epoch: int | None = None,
    rng: np.random.Generator | None = None,
):
    """Feed loss(lr) = (log lr - log lr*)^2 + N(0, 0.3^2); check at each epoch end."""
    rng = rng or np.random.default_rng(seed)
    decisions = []
    for epoch in range(start_epoch, max_epochs if stop_epoch is None else stop_epoch):
        if auto.done:
            break
        for i in range(steps_per_epoch):
            lr = s.lr(epoch + i / steps_per_epoch, B0, auto)
            auto.record(lr, (math.log(lr) - math.log(LR_STAR)) ** 2 + rng.normal(0.0, 0.3))
        decisions.append(auto.check(epoch + 1, B0))
    return decisions, rng


def test_auto_warmup_grows_geometrically_per_step():
    s = schedule(**_auto_cfg().model_dump())
    a = s.new_auto()
    assert a is not None and s.warmup_end(B0, a) is None
    assert s.lr(0.0, B0, a) == pytest.approx(1e-4)
    for _ in range(10):
        a.record(s.lr(0.0, B0, a), 1.0)
    assert s.lr(0.3, B0, a) == pytest.approx(1e-4 * 1.03**10)  # depends on steps, not on epoch


@pytest.mark.parametrize("seed", [0, 1])
def test_auto_warmup_stops_near_the_loss_minimum(seed):
    s = schedule(total_epochs=60, **_auto_cfg().model_dump())
    a = s.new_auto()
    decisions, _ = _run_auto(s, a, seed)
    assert a.done and decisions[-1].stopped_now, decisions[-1]
    assert LR_STAR / 2 <= a.peak_lr <= LR_STAR * 2, a.peak_lr
    # It stopped soon after passing lr*: log(100) / log(1.03) = 156 steps to get there.
    assert 156 <= a.steps <= 156 + 4 * 25
    # After the warmup: cosine from the peak (at batch B0) to min_lr over the remaining epochs.
    end = a.end_epoch
    assert s.warmup_end(B0, a) == end
    assert s.lr(end, B0, a) == pytest.approx(a.peak_lr)
    assert s.lr((end + 60) / 2, B0, a) == pytest.approx(a.peak_lr / 2)
    assert s.lr(end, 2 * B0, a) == pytest.approx(2 * a.peak_lr)  # linear rule rescales the found peak
    before = a.state_dict()
    a.record(123.0, 5.0)  # a no-op once done
    assert a.state_dict() == before


def test_auto_warmup_is_deterministic():
    s = schedule(total_epochs=60, **_auto_cfg().model_dump())
    a1, a2 = s.new_auto(), s.new_auto()
    d1, _ = _run_auto(s, a1, seed=3)
    d2, _ = _run_auto(s, a2, seed=3)
    assert d1 == d2
    assert a1.state_dict() == a2.state_dict()


def test_auto_warmup_resume_from_state_dict_equals_uninterrupted():
    s = schedule(total_epochs=60, **_auto_cfg().model_dump())
    whole = s.new_auto()
    _run_auto(s, whole, seed=5)

    first = s.new_auto()
    _, rng = _run_auto(s, first, seed=5, stop_epoch=3)
    buf = io.BytesIO()
    torch.save({"auto": first.state_dict()}, buf)
    buf.seek(0)
    resumed = s.new_auto()
    resumed.load_state_dict(torch.load(buf, weights_only=True)["auto"])
    assert resumed.state_dict() == first.state_dict()
    _run_auto(s, resumed, seed=5, start_epoch=3, rng=rng)
    assert resumed.state_dict() == whole.state_dict()


def test_auto_state_is_plain_python():
    a = AutoWarmup(_auto_cfg())
    a.record(1e-4, 2.0)

    def plain(x):
        if isinstance(x, list):
            return all(plain(v) for v in x)
        return x is None or type(x) in (int, float, bool, str)

    assert all(plain(v) for v in a.state_dict().values())
    with pytest.raises(ValueError, match="misses"):
        a.load_state_dict({"steps": 3})


def test_auto_checks_more_often_than_per_epoch():
    """Checking every 5 steps (patience raised to 6 checks) also stops near lr*."""
    cfg = _auto_cfg(auto_patience=6, auto_max_points=60)
    s = schedule(total_epochs=60, **cfg.model_dump())
    a = s.new_auto()
    rng = np.random.default_rng(7)
    t = 0
    while not a.done and t < 1000:
        lr = s.lr(t / 25, B0, a)
        a.record(lr, (math.log(lr) - math.log(LR_STAR)) ** 2 + rng.normal(0.0, 0.3))
        t += 1
        if t % 5 == 0:
            a.check(t / 25, B0)
    assert a.done and LR_STAR / 2 <= a.peak_lr <= LR_STAR * 2
    # A check with no new step does not count towards patience.
    b = AutoWarmup(cfg)
    for _ in range(30):
        b.record(b.current_lr(), 1.0)
    b.check(1.0, B0)
    checks = b.checks
    decision = b.check(1.0, B0)
    assert b.checks == checks and not decision.done and "no new step" in decision.reason


def test_auto_needs_min_steps_before_deciding():
    a = AutoWarmup(_auto_cfg(auto_min_steps=20))
    for _ in range(5):
        a.record(a.current_lr(), 10.0 + a.steps)  # rising loss, but too few points
    d = a.check(0.1, B0)
    assert not d.done and "5 of 20" in d.reason


def test_auto_stops_on_nonfinite_loss_and_at_max_lr():
    a = AutoWarmup(_auto_cfg())
    for loss in (3.0, 2.0, float("nan")):
        a.record(a.current_lr(), loss)
    d = a.check(0.5, B0)
    assert d.done and d.stopped_now and a.peak_lr == pytest.approx(1e-4 * 1.03)  # last finite LR
    assert a.end_epoch == 0.5 and a.peak_batch == B0

    capped = AutoWarmup(_auto_cfg(auto_max_lr=2e-4, auto_min_steps=5))
    for i in range(30):
        capped.record(capped.current_lr(), 10.0 - i * 0.1)  # still falling
    assert capped.current_lr() == pytest.approx(2e-4)
    d = capped.check(1.0, B0)
    assert d.done and "auto_max_lr" in d.reason and capped.peak_lr <= 2e-4 * (1 + 1e-9)


# --------------------------------------------------------------------------- seesaw


def test_milestones_passed_is_the_step_decays_count():
    from trainers.policies.schedules import milestones_passed

    assert [milestones_passed([1.0, 2.5], e) for e in (0.0, 0.999, 1.0, 2.49, 2.5, 9.0)] == [0, 0, 1, 1, 2, 2]


def test_seesaw_lr_and_batch_change_together_by_hand():
    """Seesaw with decay_factor 0.5 at epochs 1 and 2, B0 = batch.size = 64, eta0 = 0.1: each milestone
    gives B x 2 and LR x 1/sqrt(2) (Meterez et al. 2025), where the step schedule would halve the LR."""
    from trainers.policies.batching import BatchConfig
    from trainers.policies.config import OptimizerConfig
    from trainers.policies.policy_set import PolicySet

    sched = ScheduleConfig(scaling_rule="sqrt", decay="seesaw", milestones=[1.0, 2.0], decay_factor=0.5)
    p = PolicySet(
        sched,
        OptimizerConfig(lr=ETA0, base_batch_size=B0),
        BatchConfig(size=64, policy="seesaw"),
        epochs=3,
        dataset_size=1000,
    )
    batch, seen = 64, []
    for step, e in enumerate((0.0, 0.5, 0.999, 1.0, 1.5, 2.0, 2.9)):
        d = p.decide_batch(step, e, batch)
        batch = d.size if d else batch
        seen.append((batch, p.settings(e, batch, 1).lr))
    want = [
        (64, 0.1),
        (64, 0.1),
        (64, 0.1),
        (128, 0.1 / math.sqrt(2)),
        (128, 0.1 / math.sqrt(2)),
        (256, 0.05),
        (256, 0.05),
    ]
    assert [b for b, _ in seen] == [b for b, _ in want]
    np.testing.assert_allclose([lr for _, lr in seen], [lr for _, lr in want], rtol=1e-12)
    # lr / sqrt(B) is what the step schedule (LR halved at each milestone, B fixed) would have
    step = schedule(total_epochs=3, scaling_rule="sqrt", decay="step", milestones=[1.0, 2.0], decay_factor=0.5)
    for (b, lr), e in zip(seen, (0.0, 0.5, 0.999, 1.0, 1.5, 2.0, 2.9)):
        assert lr / math.sqrt(b) == pytest.approx(step.lr(e, 64) / math.sqrt(64))


def test_seesaw_with_a_capped_batch_takes_the_full_cut():
    """B capped at 128: the second milestone cannot double B, so the LR is halved there (what the
    step schedule does): the schedule reads the B in force."""
    s = schedule(total_epochs=3, scaling_rule="sqrt", decay="seesaw", milestones=[1.0, 2.0], decay_factor=0.5)
    assert s.lr(1.5, 128) == pytest.approx(0.1 / math.sqrt(2))
    assert s.lr(2.5, 128) == pytest.approx(0.1 / math.sqrt(2) / 2)


def test_seesaw_config_errors():
    seesaw = {"batch": {"policy": "seesaw"}}
    assert _error({"decay": "seesaw", "milestones": [1]}, **seesaw).startswith("schedule.scaling_rule: decay 'seesaw'")
    assert _error({"decay": "seesaw", "scaling_rule": "sqrt"}, **seesaw).startswith(
        "schedule.milestones: required when schedule.decay is 'seesaw'"
    )
    assert _error({"decay": "seesaw", "scaling_rule": "sqrt", "milestones": [1, 3]}, epochs=3, **seesaw).startswith(
        "schedule.milestones: [3.0] at or after"
    )
