"""Batch policies and the ``batch`` section's validation: no Ray, milliseconds."""

from __future__ import annotations

import io
import math
from typing import Any

import pytest
import torch
from pydantic import ValidationError

from trainers.policies.batching import (
    BATCH_POLICIES,
    BatchConfig,
    BatchDecision,
    BatchPolicy,
    BatchStats,
    CbsWarmupBatch,
    NoiseScaleBatch,
    NoopDecision,
    NormTestBatch,
    RampBatch,
    ScheduleBatch,
    SeesawBatch,
    batch_at_epoch_for_schedule,
    build_batch_policy,
    cbs_warmup_batch,
    ramp_batch,
    round_up,
    seesaw_batch,
)
from trainers.policies.schedules import ScheduleConfig


def _cfg(**kw: Any) -> BatchConfig:
    return BatchConfig(**kw)


def _error(**kw: Any) -> str:
    """The one-line error of a ``batch`` section: its own fields (pydantic) or their rules together
    (``orchestrator/config/rules.py``), as every entry point reports it."""
    from orchestrator.config.prepare import validated
    from orchestrator.config.schema import ConfigError

    with pytest.raises(ConfigError) as e:
        validated({"batch": kw})
    return str(e.value)


# --------------------------------------------------------------------------- config


def test_defaults_keep_the_old_meaning() -> None:
    cfg = BatchConfig()
    assert (cfg.size, cfg.max_local_batch, cfg.policy) == (64, 64, "fixed")
    assert isinstance(build_batch_policy(cfg), BATCH_POLICIES["fixed"])


def test_every_policy_name_is_registered() -> None:
    names = set(BatchConfig.model_fields["policy"].annotation.__args__)
    assert names == set(BATCH_POLICIES)
    for name, cls in BATCH_POLICIES.items():
        assert cls.name == name


@pytest.mark.parametrize(
    "kw, start",
    [
        ({"size": 64, "max_size": 32}, "batch.max_size: 32 is below batch.size 64"),
        ({"policy": "schedule"}, "batch.schedule: required by batch.policy schedule"),
        ({"schedule": [[1, 128]]}, "batch.schedule: given but batch.policy is 'fixed'"),
        ({"policy": "schedule", "schedule": [[2, 128], [1, 256]]}, "batch.schedule[1]: epoch 1"),
        ({"policy": "schedule", "schedule": [[1, 128], [1, 256]]}, "batch.schedule[1]: epoch 1"),
        ({"policy": "schedule", "schedule": [[1, 256], [2, 128]]}, "batch.schedule[1]: batch 128 is below"),
        (
            {"policy": "schedule", "size": 64, "schedule": [[1, 32]]},
            "batch.schedule[0]: batch 32 is below batch.size 64",
        ),
        ({"policy": "schedule", "schedule": [[-1, 128]]}, "batch.schedule[0]: epoch -1"),
        ({"policy": "schedule", "schedule": [[1, 0]]}, "batch.schedule[0]: batch 0 must be > 0"),
        (
            {"policy": "schedule", "max_size": 128, "schedule": [[1, 256]]},
            "batch.schedule[0]: batch 256 is above batch.max_size 128",
        ),
    ],
)
def test_cross_field_errors_name_the_field(kw: dict[str, Any], start: str) -> None:
    assert _error(**kw).startswith(start)


def test_the_section_alone_checks_each_schedule_entry_against_the_one_before() -> None:
    """The entries' own order is the section's (a worker re-validating the dump checks it too); an
    entry against batch.size or batch.max_size is a rule between fields, checked on the driver."""
    with pytest.raises(ValidationError, match=r"batch\.schedule\[1\]: batch 128 is below the previous entry's"):
        BatchConfig(policy="schedule", schedule=[[1, 256], [2, 128]])
    BatchConfig(policy="schedule", size=64, schedule=[[1, 32]])  # below batch.size: preflight's rule


@pytest.mark.parametrize(
    "kw",
    [
        {"min_growth": 0.9},
        {"check_every": 0},
        {"round_to": 0},
        {"norm_test_eta": 1.0},
        {"noise_scale_factor": 0},
        {"ema": 1.0},
        {"policy": "adaptive"},
        {"colour": 1},
    ],
)
def test_field_bounds(kw: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        BatchConfig(**kw)


def test_root_config_reports_the_field_in_one_line() -> None:
    from orchestrator.config.prepare import validated
    from orchestrator.config.schema import ConfigError, validate

    with pytest.raises(ConfigError, match=r"^batch\.max_size: 32 is below batch\.size 64; raise it"):
        validated({"batch": {"size": 64, "max_local_batch": 32, "max_size": 32}})
    with pytest.raises(ConfigError, match=r"^batch\.policy: unknown 'grow'"):
        validate({"batch": {"policy": "grow"}})
    cfg = validate({"batch": {"policy": "schedule", "schedule": [[0, 64], [2.5, 256]]}})
    assert cfg.batch.schedule == [(0.0, 64), (2.5, 256)]


# --------------------------------------------------------------------------- the contract, every policy


SEESAW = ScheduleConfig(scaling_rule="sqrt", decay="seesaw", milestones=[0.5, 1.0, 2.0], decay_factor=0.25)


def _policy_inputs(name: str) -> tuple[BatchConfig, list[tuple[int, float, BatchStats]]]:
    """A config for policy ``name`` and a stream of (step, epoch, stats) that asks for growth now and then."""
    extra: dict[str, Any] = {"schedule": [[0.5, 96], [1.0, 200], [2.0, 1000]]} if name == "schedule" else {}
    if name == "ramp":
        extra = {"ramp_to": 1000, "ramp_epochs": 2.0}
    cfg = BatchConfig(size=64, max_local_batch=32, policy=name, max_size=1000, check_every=5, **extra)
    stream = []
    for step in range(0, 200):
        wanted = 40.0 * (1.0 + step / 4.0)  # rises from below B to far above max_size
        stats = BatchStats(b_simple=wanted if step % 7 else None, norm_test=int(wanted) if step % 3 else None)
        stream.append((step, step / 60.0, stats))
    return cfg, stream


def _build(cfg: BatchConfig, dataset_size: int | None = None) -> BatchPolicy:
    return build_batch_policy(cfg, dataset_size=dataset_size, schedule=SEESAW)


def _drive(policy: BatchPolicy, stream: list[tuple[int, float, BatchStats]], current: int) -> list[tuple[int, int]]:
    sizes = []
    for step, epoch, stats in stream:
        d = policy.decide(step, epoch, current, stats)
        assert isinstance(d, (BatchDecision, NoopDecision)) and d.reason
        if d:
            assert isinstance(d, BatchDecision)
            assert d.size > current, "grow only"
            current = d.size
        sizes.append((step, current))
    return sizes


@pytest.mark.parametrize("name", sorted(BATCH_POLICIES))
def test_contract_grow_only_clamped_deterministic(name: str) -> None:
    cfg, stream = _policy_inputs(name)
    a = _drive(_build(cfg), stream, cfg.size)
    b = _drive(_build(cfg), stream, cfg.size)
    assert a == b
    assert all(size <= 1000 for _, size in a)
    if name != "fixed":
        assert a[-1][1] == 1000  # reached the cap
    else:
        assert {s for _, s in a} == {64}


@pytest.mark.parametrize("name", sorted(BATCH_POLICIES))
def test_contract_state_round_trip_resumes_identically(name: str) -> None:
    cfg, stream = _policy_inputs(name)
    full = _build(cfg)
    first = _drive(full, stream, cfg.size)
    half = len(stream) // 2
    p = _build(cfg)
    head = _drive(p, stream[:half], cfg.size)
    buf = io.BytesIO()
    torch.save({"batch_policy": p.state_dict()}, buf)
    buf.seek(0)
    resumed = _build(cfg)
    resumed.load_state_dict(torch.load(buf, weights_only=True)["batch_policy"])
    tail = _drive(resumed, stream[half:], head[-1][1])
    assert head + tail == first
    assert resumed.state_dict() == full.state_dict()


def test_state_of_another_policy_is_refused() -> None:
    fixed = build_batch_policy(BatchConfig())
    with pytest.raises(ValueError, match="noise_scale"):
        fixed.load_state_dict(NoiseScaleBatch(BatchConfig(policy="noise_scale")).state_dict())


# --------------------------------------------------------------------------- adaptive policies


def _noise(**kw: Any) -> NoiseScaleBatch:
    base: dict[str, Any] = {"size": 64, "max_local_batch": 64, "policy": "noise_scale", "check_every": 10}
    return NoiseScaleBatch(BatchConfig(**(base | kw)))


def test_noise_scale_checks_only_every_check_every_steps() -> None:
    p = _noise()
    stats = BatchStats(b_simple=400.0)
    assert not p.decide(0, 0.0, 64, stats)  # step 0: nothing measured yet
    assert not p.decide(9, 0.1, 64, stats)
    assert not p.decide(11, 0.1, 64, stats)
    d = p.decide(10, 0.1, 64, stats)
    assert d and d.size == 400
    assert not p.decide(20, 0.1, 64, BatchStats())  # no estimate: keep


def test_noise_scale_min_growth_threshold() -> None:
    p = _noise(round_to=1, min_growth=1.25)
    assert not p.decide(10, 0.0, 64, BatchStats(b_simple=79.0))  # 79 < 80 = 1.25 * 64
    d = p.decide(10, 0.0, 64, BatchStats(b_simple=80.0))
    assert d and d.size == 80
    assert not p.decide(10, 0.0, 64, BatchStats(b_simple=30.0))  # never shrinks


def test_noise_scale_factor_and_rounding() -> None:
    p = _noise(noise_scale_factor=2.0, round_to=8)
    d = p.decide(10, 0.0, 64, BatchStats(b_simple=100.3))  # 200.6 -> 208
    assert d and d.size == 208
    assert round_up(200.0, 8) == 200 and round_up(200.0000000001, 8) == 200 and round_up(3, 8) == 8


def test_clamp_to_max_size_and_dataset() -> None:
    p = _noise(max_size=200)
    d = p.decide(10, 0.0, 64, BatchStats(b_simple=5000.0))
    assert d and d.size == 200 and "clamped" in d.reason
    # the cap is reached even when it is less than min_growth above B ...
    d = p.decide(20, 0.0, 180, BatchStats(b_simple=5000.0))
    assert d and d.size == 200
    # ... but a target within min_growth of B still does not move it
    assert not p.decide(20, 0.0, 180, BatchStats(b_simple=200.0))
    assert not p.decide(30, 0.0, 200, BatchStats(b_simple=5000.0))
    capped = build_batch_policy(BatchConfig(policy="noise_scale", check_every=10), dataset_size=150)
    d = capped.decide(10, 0.0, 64, BatchStats(b_simple=5000.0))
    assert d and d.size == 150


def test_norm_test_policy() -> None:
    p = NormTestBatch(BatchConfig(policy="norm_test", size=64, check_every=4, round_to=8, min_growth=1.25))
    assert not p.decide(3, 0.0, 64, BatchStats(norm_test=500))
    assert not p.decide(4, 0.0, 64, BatchStats(norm_test=None))
    assert not p.decide(4, 0.0, 64, BatchStats(norm_test=64))  # the test passes
    assert not p.decide(4, 0.0, 64, BatchStats(norm_test=72))  # below min_growth
    d = p.decide(4, 0.0, 64, BatchStats(norm_test=342))
    assert d and d.size == 344  # rounded up to a multiple of 8
    assert not p.decide(8, 0.0, 344, BatchStats(b_simple=5000.0))  # reads the norm test only


# --------------------------------------------------------------------------- schedule


def test_batch_at_epoch_for_schedule() -> None:
    s = [(1.0, 128), (2.5, 256)]
    assert [batch_at_epoch_for_schedule(s, 64, e) for e in (0.0, 0.99, 1.0, 2.0, 2.5, 10.0)] == [
        64,
        64,
        128,
        128,
        256,
        256,
    ]
    assert batch_at_epoch_for_schedule(s, 64, 0.1 + 0.2 + 0.7) == 128  # float noise at the boundary
    assert batch_at_epoch_for_schedule([], 64, 5.0) == 64


def test_schedule_switches_at_the_first_step_starting_at_or_after_the_epoch() -> None:
    # Simulate the loop's epoch bookkeeping: n samples, B from the policy, epoch = e + cursor / n.
    n = 1000
    cfg = BatchConfig(policy="schedule", size=64, check_every=7, schedule=[[0.5, 96], [1, 200], [2.25, 512]])
    p = ScheduleBatch(cfg)
    epoch, cursor, size, step = 0, 0, cfg.size, 0
    switches: list[tuple[float, int]] = []
    while epoch < 3:
        start = epoch + cursor / n
        d = p.decide(step, start, size, BatchStats())
        if d:
            switches.append((start, d.size))
            size = d.size
        assert size == batch_at_epoch_for_schedule(cfg.schedule, cfg.size, start)
        cursor += min(size, n - cursor)
        step += 1
        if cursor >= n:
            epoch, cursor = epoch + 1, 0
    assert [b for _, b in switches] == [96, 200, 512]
    # each switch happens at the first step whose starting epoch reaches the entry, not on a check step
    assert switches[0][0] == pytest.approx(8 * 64 / n) and switches[0][0] >= 0.5 > 7 * 64 / n
    assert switches[1][0] == 1.0
    assert switches[2][0] >= 2.25 and switches[2][0] - 200 / n < 2.25
    assert p.changes == 3


def test_schedule_applies_at_step_zero_and_never_shrinks() -> None:
    p = build_batch_policy(BatchConfig(policy="schedule", size=64, schedule=[[0, 128], [1, 256]]))
    d = p.decide(0, 0.0, 64, BatchStats())
    assert d and d.size == 128
    assert not p.decide(5, 0.5, 128, BatchStats())
    assert not p.decide(5, 0.5, 256, BatchStats())  # resumed past it with a bigger B: keep
    capped = build_batch_policy(BatchConfig(policy="schedule", size=64, schedule=[[1, 4096]]), dataset_size=1000)
    d = capped.decide(3, 1.0, 64, BatchStats())
    assert d and d.size == 1000


def test_decisions_are_truthy_only_when_the_batch_changes() -> None:
    assert BatchDecision(128, "x") and not NoopDecision("y")
    assert math.isclose(BatchConfig().min_growth, 1.25)


# --------------------------------------------------------------------------- ramp


def test_ramp_batch_by_hand() -> None:
    """64 -> 512 in steps of 64 over 2 epochs: 7 increments, one every 2/7 epoch (Megatron's ramp)."""
    at = [ramp_batch(64, 512, 2.0, 64, e) for e in (0.0, 0.28, 2 / 7, 0.58, 1.0, 1.99, 2.0, 5.0)]
    assert at == [64, 64, 128, 192, 256, 448, 512, 512]
    assert ramp_batch(100, 200, 1.0, 25, 0.5) == 150  # 4 increments of 25, two done at half-way


def test_ramp_policy_follows_the_formula_at_every_step_grow_only_and_clamped() -> None:
    cfg = BatchConfig(policy="ramp", size=64, max_local_batch=64, round_to=64, ramp_to=512, ramp_epochs=2.0)
    p = RampBatch(cfg)
    d = p.decide(7, 0.3, 64, BatchStats())  # not a check-step policy: any step
    assert d and d.size == 128 and "ramp gives 128" in d.reason
    assert not p.decide(8, 0.31, 128, BatchStats())
    assert not p.decide(9, 0.31, 256, BatchStats())  # resumed past it with a bigger B: keep
    capped = build_batch_policy(cfg, dataset_size=300)
    d = capped.decide(0, 2.0, 64, BatchStats())
    assert d and d.size == 300


@pytest.mark.parametrize(
    "kw, start",
    [
        ({"policy": "ramp", "ramp_epochs": 1.0}, "batch.ramp_to: required by batch.policy ramp"),
        ({"policy": "ramp", "ramp_to": 128}, "batch.ramp_epochs: required by batch.policy ramp"),
        ({"policy": "ramp", "ramp_to": 64, "ramp_epochs": 1.0}, "batch.ramp_to: 64 is not above batch.size 64"),
        (
            {"policy": "ramp", "ramp_to": 100, "ramp_epochs": 1.0},
            "batch.ramp_to: 100 - batch.size 64 is not a multiple "
            "of batch.round_to 8 (the ramp's increment); use "
            "ramp_to 104",
        ),
        (
            {"policy": "ramp", "ramp_to": 256, "ramp_epochs": 1.0, "max_size": 128},
            "batch.ramp_to: 256 is above batch.max_size 128",
        ),
        ({"ramp_to": 128}, "batch.ramp_to: given but batch.policy is 'fixed'"),
        ({"policy": "noise_scale", "ramp_epochs": 1.0}, "batch.ramp_epochs: given but batch.policy is 'noise_scale'"),
    ],
)
def test_ramp_config_errors_name_the_field(kw: dict[str, Any], start: str) -> None:
    assert _error(**kw).startswith(start)


@pytest.mark.parametrize("kw", [{"ramp_to": 0}, {"ramp_epochs": 0.0}, {"cbs_window": 0}, {"cbs_growth": 1.0}])
def test_new_field_bounds(kw: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        BatchConfig(**kw)


def test_ramp_longer_than_training_is_refused() -> None:
    from orchestrator.config.prepare import validated
    from orchestrator.config.schema import ConfigError

    with pytest.raises(ConfigError, match=r"^batch\.ramp_epochs: 3 is not below train\.epochs 2"):
        validated({"batch": {"policy": "ramp", "ramp_to": 128, "ramp_epochs": 3}, "train": {"epochs": 2}})


# --------------------------------------------------------------------------- seesaw


def test_seesaw_batch_by_hand() -> None:
    assert [seesaw_batch(64, [1.0, 2.0, 3.0], 0.5, e) for e in (0.0, 0.99, 1.0, 2.5, 3.0)] == [64, 64, 128, 256, 512]
    assert [seesaw_batch(32, [1.0, 2.0], 0.1, e) for e in (0.0, 1.0, 2.0)] == [32, 320, 3200]  # no float drift


def test_seesaw_policy_reads_the_schedule_milestones_and_is_clamped() -> None:
    sched = ScheduleConfig(scaling_rule="sqrt", decay="seesaw", milestones=[1.0, 2.0], decay_factor=0.5)
    p = SeesawBatch(BatchConfig(policy="seesaw", size=64, max_size=200), schedule=sched)
    assert not p.decide(3, 0.99, 64, BatchStats())
    d = p.decide(4, 1.0, 64, BatchStats())
    assert d and d.size == 128 and "milestone 1 of 2" in d.reason and "LR x 0.7071" in d.reason
    d = p.decide(9, 2.0, 128, BatchStats())
    assert d and d.size == 200  # 256 clamped to max_size
    with pytest.raises(ValueError, match="^batch.policy: seesaw reads schedule.milestones"):
        build_batch_policy(BatchConfig(policy="seesaw"))


@pytest.mark.parametrize(
    "batch, schedule, start",
    [
        ({"policy": "seesaw"}, {"decay": "step", "milestones": [1]}, "schedule.decay: batch.policy seesaw grows B"),
        (
            {"policy": "fixed"},
            {"decay": "seesaw", "scaling_rule": "sqrt", "milestones": [1]},
            "batch.policy: schedule.decay seesaw cuts the LR",
        ),
        (
            {"policy": "seesaw"},
            {"decay": "seesaw", "scaling_rule": "linear", "milestones": [1]},
            "schedule.scaling_rule: decay 'seesaw' keeps lr / sqrt(B)",
        ),
        (
            {"policy": "seesaw"},
            {"decay": "seesaw", "scaling_rule": "sqrt"},
            "schedule.milestones: required when schedule.decay is 'seesaw'",
        ),
        (
            {"policy": "seesaw"},
            {"decay": "seesaw", "scaling_rule": "sqrt", "milestones": [1], "decay_factor": 1.0},
            "schedule.decay_factor: 1 makes seesaw",
        ),
    ],
)
def test_seesaw_cross_checks_in_one_line(batch: dict[str, Any], schedule: dict[str, Any], start: str) -> None:
    from orchestrator.config.prepare import validated
    from orchestrator.config.schema import ConfigError

    with pytest.raises(ConfigError) as e:
        validated({"batch": {"max_local_batch": 64, **batch}, "schedule": schedule, "train": {"epochs": 3}})
    assert str(e.value).startswith(start) and "\n" not in str(e.value)


# --------------------------------------------------------------------------- cbs_warmup


@pytest.mark.parametrize(
    "current, critical, growth, round_to, want",
    [
        (64, 300.0, 2.0, 8, 256),  # 64 x 2^2 = 256 <= 300 < 512
        (64, 100.0, 2.0, 8, None),  # not yet 2 x B
        (64, 128.0, 2.0, 8, 128),  # exactly 2 x B grows
        (64, 150.0, 1.5, 8, 144),  # 64 x 1.5^2 = 144
        (60, 130.0, 2.0, 8, 120),  # rounded up to round_to: 120 already is
        (60, 300.0, 2.0, 16, 240),  # 240 = 15 x 16
        (64, 0.0, 2.0, 8, None),
        (64, math.nan, 2.0, 8, None),
    ],
)
def test_cbs_warmup_batch_by_hand(
    current: int, critical: float, growth: float, round_to: int, want: int | None
) -> None:
    assert cbs_warmup_batch(current, critical, growth, round_to) == want


def _cbs(**kw: Any) -> CbsWarmupBatch:
    base: dict[str, Any] = {
        "size": 64,
        "max_local_batch": 64,
        "policy": "cbs_warmup",
        "check_every": 10,
        "cbs_window": 3,
        "round_to": 8,
    }
    return CbsWarmupBatch(BatchConfig(**(base | kw)))


def test_cbs_warmup_waits_for_a_full_window_and_grows_with_its_mean() -> None:
    p = _cbs()
    assert not p.decide(10, 0.0, 64, BatchStats(b_simple=1000.0))  # window 1/3
    assert not p.decide(15, 0.0, 64, BatchStats(b_simple=1000.0))  # not a check step: not recorded
    assert not p.decide(20, 0.0, 64, BatchStats(b_simple=None))  # no estimate: not recorded
    assert not p.decide(20, 0.0, 64, BatchStats(b_simple=100.0))  # window 2/3
    assert p.window == [1000.0, 100.0]
    d = p.decide(30, 0.0, 64, BatchStats(b_simple=100.0))  # mean 400 -> 64 x 2^2 = 256
    assert d and d.size == 256 and "mean B_simple 400" in d.reason
    # the next estimate drops the oldest: mean(100, 100, 100) = 100 < 2 x 256: keep
    assert not p.decide(40, 0.0, 256, BatchStats(b_simple=100.0))
    assert p.window == [100.0, 100.0, 100.0]


def test_cbs_warmup_factor_and_cap() -> None:
    p = _cbs(noise_scale_factor=0.5, cbs_window=1, max_size=200)
    assert not p.decide(10, 0.0, 64, BatchStats(b_simple=250.0))  # critical 125 < 128
    d = p.decide(20, 0.0, 64, BatchStats(b_simple=4000.0))  # critical 2000 -> 1024, clamped
    assert d and d.size == 200 and "clamped to 200" in d.reason
    assert not p.decide(30, 0.0, 200, BatchStats(b_simple=4000.0))


def test_cbs_warmup_window_survives_a_checkpoint() -> None:
    p = _cbs()
    p.decide(10, 0.0, 64, BatchStats(b_simple=500.0))
    p.decide(20, 0.0, 64, BatchStats(b_simple=300.0))
    q = _cbs()
    buf = io.BytesIO()
    torch.save(p.state_dict(), buf)
    buf.seek(0)
    q.load_state_dict(torch.load(buf, weights_only=True))
    assert q.window == [500.0, 300.0]
    a, b = p.decide(30, 0.0, 64, BatchStats(b_simple=100.0)), q.decide(30, 0.0, 64, BatchStats(b_simple=100.0))
    assert a == b and a.size == 256


def test_cbs_warmup_is_refused_with_local_sgd() -> None:
    """Local SGD computes no per-step combined gradient, so cbs_warmup would never see a B_simple."""
    from orchestrator.config.prepare import validated
    from orchestrator.config.schema import ConfigError

    with pytest.raises(
        ConfigError,
        match=r"^batch\.policy: 'cbs_warmup' cannot be used with combine\.method "
        r"local_sgd",
    ):
        validated(
            {
                "batch": {"policy": "cbs_warmup"},
                "combine": {"method": "local_sgd", "local_steps": 4},
                "scaling": {"max_workers": 2},
            }
        )
