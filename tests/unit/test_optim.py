"""Optimizers, the MF rule and momentum correction against hand-computed updates.  No Ray."""

from __future__ import annotations

import io
import math
from typing import get_args

import pytest
import torch
from pydantic import ValidationError

from trainers.policies.config import MFRuleName, OptimizerConfig, OptimizerName
from trainers.policies.optim import (
    LAMB,
    LARS,
    MF_RULES,
    OPTIMIZERS,
    apply_momentum_correction,
    build_optimizer,
    mf_for,
    needs_momentum_correction,
    set_lr,
    set_mf,
)

F64 = torch.float64


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2)).double()


# --------------------------------------------------------------------------- registry, config


def test_registries_match_the_config_literals():
    assert set(get_args(OptimizerName)) == set(OPTIMIZERS)
    assert set(get_args(MFRuleName)) == set(MF_RULES)


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_every_optimizer_builds_steps_and_takes_set_lr_set_mf(name):
    model = _model()
    opt = build_optimizer(model, OptimizerConfig(name=name, lr=0.05, mf=0.8, weight_decay=1e-4))
    set_lr(opt, 0.02)
    set_mf(opt, 0.7)
    for g in opt.param_groups:
        assert g["lr"] == 0.02
        assert (g["betas"][0] if "betas" in g else g["momentum"]) == 0.7
    before = [p.detach().clone() for p in model.parameters()]
    model(torch.randn(5, 3, dtype=F64)).square().mean().backward()
    opt.step()
    assert any(not torch.equal(a, p) for a, p in zip(before, model.parameters()))
    assert needs_momentum_correction(opt) == (name == "lars")


def test_lars_and_lamb_keep_their_mf_key():
    model = _model()
    lamb = build_optimizer(model, OptimizerConfig(name="lamb", mf=0.9, beta2=0.99))
    assert lamb.param_groups[0]["betas"] == (0.9, 0.99)
    set_mf(lamb, 0.5)
    assert lamb.param_groups[0]["betas"] == (0.5, 0.99)
    lars = build_optimizer(model, OptimizerConfig(name="lars", mf=0.9, trust_coefficient=0.02))
    assert lars.param_groups[0]["momentum"] == 0.9 and lars.param_groups[0]["trust_coefficient"] == 0.02


@pytest.mark.parametrize(
    "cfg, field",
    [
        ({"name": "larz"}, "name"),
        ({"mf_rule": "per_worker"}, "mf_rule"),
        ({"mf_ref_batch": 0}, "mf_ref_batch"),
        ({"trust_coefficient": 0}, "trust_coefficient"),
    ],
)
def test_bad_config_names_the_field(cfg, field):
    with pytest.raises(ValidationError) as e:
        OptimizerConfig(**cfg)
    assert field in str(e.value)


# --------------------------------------------------------------------------- MF rule


def test_mf_rule_fixed():
    assert mf_for(OptimizerConfig(mf=0.9), 7.0) == 0.9


@pytest.mark.parametrize(
    "mf, ref, base, b, expected",
    [
        (0.9, 64, 256, 32, 0.9**0.5),  # half the per-worker batch: larger mu
        (0.9, 64, 256, 64, 0.9),
        (0.9, 64, 256, 128, 0.81),
        (0.9, None, 64, 32, 0.9**0.5),  # b_ref defaults to base_batch_size
        (0.0, None, 64, 32, 0.0),
    ],
)
def test_mf_rule_per_worker_batch(mf, ref, base, b, expected):
    cfg = OptimizerConfig(mf=mf, mf_rule="per_worker_batch", mf_ref_batch=ref, base_batch_size=base)
    assert mf_for(cfg, b) == pytest.approx(expected)


def test_mf_rule_rejects_a_non_positive_batch():
    with pytest.raises(ValueError, match="per_worker_batch"):
        mf_for(OptimizerConfig(mf_rule="per_worker_batch"), 0.0)


# --------------------------------------------------------------------------- momentum correction

A = torch.tensor([[2.0, 0.5], [0.5, 1.0]], dtype=F64)
C = torch.tensor([[1.0, -1.0], [0.5, 2.0]], dtype=F64)
LRS = [0.1] * 4 + [0.5] * 4 + [0.02] * 4  # two LR jumps, up and down


def _grad(w: torch.Tensor) -> torch.Tensor:
    """Gradient of 0.5 * tr(W^T A W) - tr(C^T W): A W - C."""
    return A @ w - C


def _trajectory(opt_factory, correct: bool) -> list[torch.Tensor]:
    w = torch.nn.Parameter(torch.tensor([[0.3, -0.2], [0.1, 0.4]], dtype=F64))
    opt = opt_factory([w])
    out, prev = [], LRS[0]
    for lr in LRS:
        if correct:
            apply_momentum_correction(opt, prev, lr)
        set_lr(opt, lr)
        prev = lr
        w.grad = _grad(w.detach())
        opt.step()
        out.append(w.detach().clone())
    return out


def _sgd(params):
    return torch.optim.SGD(params, lr=LRS[0], momentum=0.9, weight_decay=0.01)


def _velocity_sgd(params):  # LARS without the trust ratio: v = mu*v + lr*(g + wd*w); w -= v
    return LARS(params, lr=LRS[0], momentum=0.9, weight_decay=0.01, trust_coefficient=None, exclude_1d=False)


def test_velocity_form_with_correction_follows_torch_sgd_across_lr_jumps():
    reference = _trajectory(_sgd, correct=False)
    corrected = _trajectory(_velocity_sgd, correct=True)
    for ref, got in zip(reference, corrected):
        torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-12)


def test_velocity_form_without_correction_drifts_from_torch_sgd():
    reference = _trajectory(_sgd, correct=False)
    uncorrected = _trajectory(_velocity_sgd, correct=False)
    for ref, got in zip(reference[:4], uncorrected[:4]):  # identical while the LR is constant
        torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-12)
    assert (uncorrected[4] - reference[4]).abs().max() > 1e-3  # the first step after the jump differs


def test_correction_leaves_optimizers_that_do_not_need_it_alone():
    w = torch.nn.Parameter(torch.ones(2, 2, dtype=F64))
    sgd = torch.optim.SGD([w], lr=0.1, momentum=0.9)
    w.grad = torch.ones_like(w)
    sgd.step()
    buf = sgd.state[w]["momentum_buffer"].clone()
    assert not needs_momentum_correction(sgd)
    assert apply_momentum_correction(sgd, 0.1, 1.0) is False
    assert torch.equal(sgd.state[w]["momentum_buffer"], buf)
    for opt in (torch.optim.Adam([w]), torch.optim.AdamW([w]), LAMB([w], lr=0.1)):
        assert not needs_momentum_correction(opt)
    lars = LARS([w], lr=0.1)
    assert needs_momentum_correction(lars)
    assert apply_momentum_correction(lars, 0.1, 0.1) is False  # no change
    assert apply_momentum_correction(lars, 0.0, 0.1) is False  # nothing to rescale from


# --------------------------------------------------------------------------- LARS by hand


def _norm(xs: list[float]) -> float:
    return math.sqrt(sum(x * x for x in xs))


def test_lars_two_steps_by_hand():
    lr, mu, wd, tc = 2.0, 0.9, 0.1, 0.001
    w = torch.nn.Parameter(torch.tensor([[3.0, 4.0]], dtype=F64))  # ||w|| = 5
    b = torch.nn.Parameter(torch.tensor([1.0], dtype=F64))  # 1-D: no trust ratio, no weight decay
    opt = LARS([w, b], lr=lr, momentum=mu, weight_decay=wd, trust_coefficient=tc)

    # step 1: g = (0.6, 0.8), ||g|| = 1; trust = 0.001 * 5 / (1 + 0.1 * 5) = 1/300
    # d = g + wd*w = (0.9, 1.2); v = 2 * (1/300) * d = (0.006, 0.008); w = (2.994, 3.992)
    w.grad = torch.tensor([[0.6, 0.8]], dtype=F64)
    b.grad = torch.tensor([0.5], dtype=F64)
    opt.step()
    torch.testing.assert_close(w.detach(), torch.tensor([[2.994, 3.992]], dtype=F64))
    torch.testing.assert_close(b.detach(), torch.tensor([0.0], dtype=F64))  # v = 2 * 0.5 = 1

    # step 2: g = (0, 1)
    w1 = [2.994, 3.992]
    g2 = [0.0, 1.0]
    trust = tc * _norm(w1) / (_norm(g2) + wd * _norm(w1))
    v2 = [mu * v + lr * trust * (g + wd * x) for v, g, x in zip([0.006, 0.008], g2, w1)]
    w2 = [x - v for x, v in zip(w1, v2)]
    w.grad = torch.tensor([g2], dtype=F64)
    b.grad = torch.tensor([0.5], dtype=F64)
    opt.step()
    torch.testing.assert_close(w.detach(), torch.tensor([w2], dtype=F64))
    torch.testing.assert_close(b.detach(), torch.tensor([-1.9], dtype=F64))  # v = 0.9 * 1 + 1


def test_lars_trust_ratio_is_one_for_zero_weights():
    w = torch.nn.Parameter(torch.zeros(2, 2, dtype=F64))
    opt = LARS([w], lr=0.5, momentum=0.0, trust_coefficient=0.001)
    w.grad = torch.ones(2, 2, dtype=F64)
    opt.step()
    torch.testing.assert_close(w.detach(), torch.full((2, 2), -0.5, dtype=F64))


# --------------------------------------------------------------------------- LAMB by hand


def _lamb_reference(
    w: list[float], grads: list[list[float]], lr: float, b1: float, b2: float, eps: float, wd: float
) -> list[float]:
    m, v = [0.0] * len(w), [0.0] * len(w)
    for t, g in enumerate(grads, start=1):
        m = [b1 * mi + (1 - b1) * gi for mi, gi in zip(m, g)]
        v = [b2 * vi + (1 - b2) * gi * gi for vi, gi in zip(v, g)]
        r = [(mi / (1 - b1**t)) / (math.sqrt(vi / (1 - b2**t)) + eps) + wd * wi for mi, vi, wi in zip(m, v, w)]
        ratio = _norm(w) / _norm(r) if _norm(w) > 0 and _norm(r) > 0 else 1.0
        w = [wi - lr * ratio * ri for wi, ri in zip(w, r)]
    return w


def test_lamb_one_step_by_hand():
    # t = 1: m_hat = g, v_hat = g^2, so r = g / (|g| + eps) + wd*w ~ (1, 1) + 0.1 * (3, 4) = (1.3, 1.4)
    # ratio = ||w|| / ||r|| = 5 / sqrt(3.65); w = (3, 4) - 0.01 * ratio * (1.3, 1.4)
    w = torch.nn.Parameter(torch.tensor([[3.0, 4.0]], dtype=F64))
    opt = LAMB([w], lr=0.01, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.1)
    w.grad = torch.tensor([[0.6, 0.8]], dtype=F64)
    opt.step()
    ratio = 5 / math.sqrt(3.65)
    expected = torch.tensor([[3 - 0.01 * ratio * 1.3, 4 - 0.01 * ratio * 1.4]], dtype=F64)
    torch.testing.assert_close(w.detach(), expected, rtol=1e-5, atol=1e-7)  # eps ignored by hand


def test_lamb_two_steps_by_hand():
    lr, b1, b2, eps, wd = 0.05, 0.8, 0.99, 1e-6, 0.02
    grads = [[0.6, -0.8, 0.1], [0.2, 0.3, -0.5]]
    w = torch.nn.Parameter(torch.tensor([[1.0, 2.0, -2.0]], dtype=F64))
    opt = LAMB([w], lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd)
    for g in grads:
        w.grad = torch.tensor([g], dtype=F64)
        opt.step()
    expected = _lamb_reference([1.0, 2.0, -2.0], grads, lr, b1, b2, eps, wd)
    torch.testing.assert_close(w.detach(), torch.tensor([expected], dtype=F64), rtol=1e-12, atol=1e-12)


def test_lamb_on_1d_params_is_adam_and_zero_weights_get_ratio_one():
    b = torch.nn.Parameter(torch.tensor([0.5, -1.0], dtype=F64))
    b_ref = torch.nn.Parameter(b.detach().clone())
    lamb = LAMB([b], lr=0.1, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.5)  # 1-D: no wd, no ratio
    adam = torch.optim.Adam([b_ref], lr=0.1, betas=(0.9, 0.999), eps=1e-8)
    for g in ([0.3, 0.1], [-0.2, 0.4]):
        b.grad = torch.tensor(g, dtype=F64)
        b_ref.grad = torch.tensor(g, dtype=F64)
        lamb.step()
        adam.step()
    torch.testing.assert_close(b.detach(), b_ref.detach(), rtol=1e-12, atol=1e-12)

    z = torch.nn.Parameter(torch.zeros(1, 2, dtype=F64))
    opt = LAMB([z], lr=0.1, eps=1e-12)
    z.grad = torch.tensor([[2.0, -3.0]], dtype=F64)
    opt.step()
    torch.testing.assert_close(z.detach(), torch.tensor([[-0.1, 0.1]], dtype=F64))  # r = sign(g), ratio 1


# --------------------------------------------------------------------------- checkpoints


@pytest.mark.parametrize("name", ["lars", "lamb"])
def test_state_dict_round_trip_with_weights_only(name):
    cfg = OptimizerConfig(name=name, lr=0.05, mf=0.9, weight_decay=1e-3)
    x = torch.randn(8, 3, dtype=F64)

    def steps(model, opt, n):
        for _ in range(n):
            opt.zero_grad()
            model(x).square().mean().backward()
            opt.step()

    whole_model = _model()
    whole = build_optimizer(whole_model, cfg)
    steps(whole_model, whole, 4)

    model = _model()
    opt = build_optimizer(model, cfg)
    steps(model, opt, 2)
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, buf)
    buf.seek(0)
    payload = torch.load(buf, weights_only=True)
    resumed_model = _model()
    resumed_model.load_state_dict(payload["model"])
    resumed = build_optimizer(resumed_model, cfg)
    resumed.load_state_dict(payload["optimizer"])
    steps(resumed_model, resumed, 2)
    for a, b in zip(whole_model.parameters(), resumed_model.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


# --------------------------------------------------------------------------- weight-decay rule


def test_adamw_timescale_by_hand():
    from trainers.policies.optim import adamw_timescale

    # tau = B / (eta * lambda * D) = 64 / (1e-3 * 0.1 * 50_000) = 12.8 epochs
    assert adamw_timescale(64, 1e-3, 0.1, 50_000) == pytest.approx(12.8)
    with pytest.raises(ValueError, match="adamw_timescale"):
        adamw_timescale(64, 0.0, 0.1, 50_000)


@pytest.mark.parametrize(
    "rule, scale, expected",
    [
        ("linear", 4.0, 0.1),  # eta x 4 and B x 4: lambda stays
        ("sqrt", 2.0, 0.2),  # eta x 2, B x 4: lambda x 2
        ("none", 1.0, 0.4),  # eta fixed, B x 4: lambda x 4 (Power Lines: linear in B)
    ],
)
def test_timescale_rule_keeps_tau_at_its_tuned_value(rule, scale, expected):
    from trainers.policies.optim import adamw_timescale, weight_decay_for

    cfg = OptimizerConfig(name="adamw", lr=1e-3, base_batch_size=64, weight_decay=0.1, wd_rule="timescale")
    wd = weight_decay_for(cfg, 256, scale)
    assert wd == pytest.approx(expected)
    assert adamw_timescale(256, 1e-3 * scale, wd, 50_000) == pytest.approx(adamw_timescale(64, 1e-3, 0.1, 50_000))
    assert weight_decay_for(OptimizerConfig(weight_decay=0.1), 256, scale) == 0.1  # rule none: as configured


@pytest.mark.parametrize(
    "cfg, start",
    [
        (
            {"name": "adam", "weight_decay": 0.1, "wd_rule": "timescale"},
            "optimizer.wd_rule: timescale is defined for AdamW",
        ),
        ({"name": "adamw", "wd_rule": "timescale"}, "optimizer.weight_decay: wd_rule timescale scales it"),
        ({"wd_rule": "power"}, "wd_rule"),
    ],
)
def test_wd_rule_config_errors(cfg, start):
    from orchestrator.config.prepare import validated
    from orchestrator.config.schema import ConfigError

    with pytest.raises(ConfigError) as e:
        validated({"optimizer": cfg})
    assert start in str(e.value)


def test_wd_rule_refuses_adascale_in_one_line():
    from orchestrator.config.prepare import validated
    from orchestrator.config.schema import ConfigError

    with pytest.raises(ConfigError, match=r"^optimizer\.wd_rule: timescale needs the LR a batch gets ahead of time"):
        validated(
            {
                "optimizer": {"name": "adamw", "weight_decay": 0.1, "wd_rule": "timescale"},
                "schedule": {"scaling_rule": "adascale"},
            }
        )


def test_policy_set_applies_the_timescale_weight_decay():
    from trainers.policies.batching import BatchConfig
    from trainers.policies.optim import set_weight_decay
    from trainers.policies.policy_set import PolicySet
    from trainers.policies.schedules import ScheduleConfig

    cfg = OptimizerConfig(name="adamw", lr=1e-3, base_batch_size=64, weight_decay=0.1, wd_rule="timescale")
    p = PolicySet(ScheduleConfig(scaling_rule="sqrt"), cfg, BatchConfig(size=64), epochs=1, dataset_size=1000)
    assert p.settings(0.0, 64, 1).weight_decay == pytest.approx(0.1)
    s = p.settings(0.0, 256, 2)
    assert s.weight_decay == pytest.approx(0.2) and s.lr == pytest.approx(2e-3)
    opt = build_optimizer(_model(), cfg)
    p.apply(opt, s, first=True)
    assert [g["weight_decay"] for g in opt.param_groups] == [pytest.approx(0.2)]
    # without a rule the optimizer keeps its own weight decay
    plain = PolicySet(ScheduleConfig(), OptimizerConfig(name="adamw", weight_decay=0.1), BatchConfig(), 1, 1000)
    assert plain.settings(0.0, 256, 1).weight_decay is None
    set_weight_decay(opt, 0.3)
    plain.apply(opt, plain.settings(0.0, 256, 1), first=True)
    assert opt.param_groups[0]["weight_decay"] == 0.3
