"""The policy set: the settings of a step and the decisions.  No Ray, milliseconds."""

from __future__ import annotations

import math

import pytest
import torch

from trainers.policies.batching import BatchConfig, BatchStats, noise_probe_runs
from trainers.policies.config import OptimizerConfig
from trainers.policies.decisions import BatchDecision, NoopDecision, ResizeDecision
from trainers.policies.noise import GradientNoiseScale
from trainers.policies.optim import LARS
from trainers.policies.policy_set import PolicySet, StepSettings
from trainers.policies.resize import workers_for_batch
from trainers.policies.schedules import ScheduleConfig

N = 1000


def _policies(
    schedule: dict | None = None,
    optimizer: dict | None = None,
    batch: dict | None = None,
    epochs: float = 4,
    lo: int = 1,
    hi: int = 4,
) -> PolicySet:
    opt = {"lr": 0.1, "base_batch_size": 32, "mf": 0.9, **(optimizer or {})}
    return PolicySet(
        ScheduleConfig(**(schedule or {})),
        OptimizerConfig(**opt),
        BatchConfig(**{"size": 32, "max_local_batch": 32, **(batch or {})}),
        epochs,
        N,
        min_workers=lo,
        max_workers=hi,
    )


def test_settings_gradual_warmup_then_cosine() -> None:
    p = _policies(schedule={"warmup": "gradual", "warmup_epochs": 1, "decay": "cosine"})
    peak = 0.1 * 64 / 32  # linear rule at B = 64
    s = p.settings(0.5, 64, 2)
    assert s == StepSettings(
        lr=pytest.approx(0.1 + (peak - 0.1) * 0.5), mf=0.9, batch=64, workers=2, samples=64, local=32, accum=1
    )
    assert p.settings(1.0, 64, 2).lr == pytest.approx(peak)
    assert p.settings(2.5, 64, 2).lr == pytest.approx(peak * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert p.settings(4.0, 64, 2).lr == pytest.approx(0.0, abs=1e-12)


def test_settings_mf_rule_local_slice_and_accum() -> None:
    p = _policies(
        schedule={"scaling_rule": "sqrt"},
        optimizer={"mf_rule": "per_worker_batch", "mf_ref_batch": 16},
        batch={"size": 128, "max_local_batch": 24},
    )
    s = p.settings(0.0, 128, 2)
    assert s.lr == pytest.approx(0.1 * 2.0)  # sqrt(128/32)
    assert s.mf == pytest.approx(0.9**4)  # b = 64 = 4 x 16
    assert (s.local, s.accum) == (64, 3)  # ceil(64 / 24)
    short = p.settings(0.9, 128, 3, samples=37)  # an epoch's short last batch (13 + 12 + 12 samples)
    # local and accum describe the policy's batch (128 over 3: 43, in 2 micro-batches), not the tail
    assert (short.batch, short.samples, short.local, short.accum) == (128, 37, 43, 2)
    assert short.mf == pytest.approx(0.9 ** (128 / 3 / 16))  # the MF follows B, not the short batch


def test_adascale_reads_the_noise_estimator() -> None:
    p = _policies(schedule={"scaling_rule": "adascale"})
    assert noise_probe_runs("fixed", "adascale", goodput=False, uses_ddp=True)
    gns = GradientNoiseScale(ema=0.0)
    assert p.lr(0.0, 128, gns) == pytest.approx(0.1)  # no estimate yet: gain 1
    trace, g_sq = 640.0, 1.0
    gns.update(g_sq + trace / 8, 8, g_sq + trace / 64, 64)
    assert p.lr(0.0, 128, gns) == pytest.approx(0.1 * (20 + 1) / (20 / 4 + 1))  # k = 4, var at B0 = 640/32
    assert p.lr(0.0, 128) == pytest.approx(0.1)  # a preview has no estimate


def test_batch_and_worker_decisions() -> None:
    p = _policies(batch={"policy": "schedule", "schedule": [[1, 64], [2, 256]]}, hi=4)
    assert p.adapts_batch and not noise_probe_runs("schedule", "linear", goodput=False, uses_ddp=True)
    assert p.workers.initial(32) == 1
    assert isinstance(p.decide_batch(0, 0.0, 32), NoopDecision)
    d = p.decide_batch(10, 1.0, 32)
    assert isinstance(d, BatchDecision) and d.size == 64
    grow = p.workers.decide(64, 1)
    assert isinstance(grow, ResizeDecision) and grow.workers == 2
    assert not p.workers.decide(64, 2)
    big = p.workers.decide(256, 2)
    assert big.workers == 4 and "capped by max_workers" in big.reason  # needs 8, max 4
    assert workers_for_batch(256, 32, 1, 4) == 4 and workers_for_batch(3, 1, 1, 8) == 3
    assert workers_for_batch(16, 32, 2, 4) == 2  # min_workers


def test_norm_test_policy_gets_the_suggested_batch() -> None:
    p = _policies(batch={"policy": "norm_test", "check_every": 1, "norm_test_eta": 0.5, "round_to": 1})
    gns = GradientNoiseScale(ema=0.0)
    assert p.batch_stats(32, None).norm_test is None
    gns.update(2.0 + 50.0 / 8, 8, 2.0 + 50.0 / 64, 64)
    stats = p.batch_stats(32, gns)
    want = math.ceil(50.0 / (0.25 * (2.0 + 50.0 / 64)))
    assert stats.norm_test == want and stats.b_simple == pytest.approx(25.0)
    d = p.decide_batch(1, 0.1, 32, gns)
    assert isinstance(d, BatchDecision) and d.size == want
    # statistics measured elsewhere (local SGD's own norm test) take the noise estimator's place
    assert p.decide_batch(2, 0.1, 32, gns, stats=BatchStats(norm_test=48)).size == 48


def test_auto_warmup_hooks_and_preview_growth() -> None:
    p = _policies(
        schedule={"warmup": "auto", "decay": "cosine", "auto_init_lr": 0.01, "auto_growth": 2.0, "auto_max_lr": 0.05}
    )
    lrs = []
    for _ in range(4):
        lrs.append(p.lr(0.0, 32))
        p.after_step(lrs[-1], None)  # a preview: no loss, the LR grows on
    assert lrs == [0.01, 0.02, 0.04, 0.05]
    assert p.at_epoch_end(1.0, 32) is not None  # a check ran (too few recorded losses to decide)
    assert _policies().at_epoch_end(1.0, 32) is None  # no auto warmup


def test_apply_sets_lr_mf_and_corrects_momentum() -> None:
    w = torch.nn.Parameter(torch.ones(3))
    opt = LARS([w], lr=0.1, momentum=0.9)
    w.grad = torch.ones(3)
    opt.step()
    buf = opt.state[w]["momentum_buffer"].clone()
    s = StepSettings(lr=0.2, mf=0.8, batch=64, workers=2, samples=64, local=32, accum=1)
    PolicySet.apply(opt, s, first=False)
    assert torch.allclose(opt.state[w]["momentum_buffer"], buf * 2.0)  # Goyal et al.: v *= new/old
    assert opt.param_groups[0]["lr"] == 0.2 and opt.param_groups[0]["momentum"] == 0.8
    PolicySet.apply(opt, StepSettings(0.4, 0.8, 64, 2, 64, 32, 1), first=True)  # the run's first step: no rescale
    assert torch.allclose(opt.state[w]["momentum_buffer"], buf * 2.0)


def test_from_config_reads_the_scaling_bounds() -> None:
    from orchestrator.config.schema import validate

    cfg = validate(
        {
            "data": {"name": "digits"},
            "batch": {"size": 128, "max_local_batch": 32},
            "scaling": {"min_workers": 1, "max_workers": 3},
        }
    )
    p = PolicySet.from_config(cfg, dataset_size=N)
    assert (p.workers.min_workers, p.workers.max_workers, p.workers.initial(128)) == (1, 3, 3)
    assert p.workers.max_local_batch == 32 and p.epochs == cfg.train.epochs
    from trainers.loop.trainer import LoopConfig

    worker_side = PolicySet.from_config(LoopConfig.model_validate({"batch": {"size": 128, "max_local_batch": 32}}), N)
    assert (worker_side.workers.min_workers, worker_side.workers.max_workers) == (1, 1)


def test_one_function_says_when_the_noise_probe_runs():
    """The worker builds the probe, the config checks size micro-batches and the params log
    batch.ema by one rule: a policy reads the noise statistics and DDP averages the gradients."""
    for policy in ("noise_scale", "norm_test", "cbs_warmup"):
        assert noise_probe_runs(policy, "linear", goodput=False, uses_ddp=True)
        assert not noise_probe_runs(policy, "linear", goodput=False, uses_ddp=False)
    assert noise_probe_runs("fixed", "linear", goodput=True, uses_ddp=True)
    assert not noise_probe_runs("fixed", "linear", goodput=False, uses_ddp=True)
