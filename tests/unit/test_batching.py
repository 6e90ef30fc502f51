"""Batch policies and the ``batch`` section's validation: no Ray, milliseconds."""

from __future__ import annotations

import io
import math
from typing import Any

import pytest
import torch
from pydantic import ValidationError

from trainers.policies.batching import (BATCH_POLICIES, BatchConfig, BatchDecision, BatchPolicy, BatchStats, NoopDecision, NoiseScaleBatch, NormTestBatch, ScheduleBatch, batch_at_epoch_for_schedule, build_batch_policy, round_up)


def _cfg(**kw: Any) -> BatchConfig:
    return BatchConfig(**kw)


def _error(**kw: Any) -> str:
    with pytest.raises(ValidationError) as e:
        BatchConfig(**kw)
    return str(e.value.errors(include_url=False)[0]["ctx"]["error"])


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


@pytest.mark.parametrize("kw, start", [
    ({"size": 64, "max_size": 32}, "batch.max_size: 32 is below batch.size 64"),
    ({"policy": "schedule"}, "batch.schedule: required by batch.policy schedule"),
    ({"schedule": [[1, 128]]}, "batch.schedule: given but batch.policy is 'fixed'"),
    ({"policy": "schedule", "schedule": [[2, 128], [1, 256]]}, "batch.schedule[1]: epoch 1"),
    ({"policy": "schedule", "schedule": [[1, 128], [1, 256]]}, "batch.schedule[1]: epoch 1"),
    ({"policy": "schedule", "schedule": [[1, 256], [2, 128]]}, "batch.schedule[1]: batch 128 is below"),
    ({"policy": "schedule", "size": 64, "schedule": [[1, 32]]}, "batch.schedule[0]: batch 32 is below batch.size 64"),
    ({"policy": "schedule", "schedule": [[-1, 128]]}, "batch.schedule[0]: epoch -1"),
    ({"policy": "schedule", "schedule": [[1, 0]]}, "batch.schedule[0]: batch 0 must be > 0"),
    ({"policy": "schedule", "max_size": 128, "schedule": [[1, 256]]},
     "batch.schedule[0]: batch 256 is above batch.max_size 128"),
])
def test_cross_field_errors_name_the_field(kw: dict[str, Any], start: str) -> None:
    assert _error(**kw).startswith(start)


@pytest.mark.parametrize("kw", [{"min_growth": 0.9}, {"check_every": 0}, {"round_to": 0}, {"norm_test_eta": 1.0},
                                {"noise_scale_factor": 0}, {"ema": 1.0}, {"policy": "adaptive"}, {"colour": 1}])
def test_field_bounds(kw: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        BatchConfig(**kw)


def test_root_config_reports_the_field_in_one_line() -> None:
    from orchestrator.config import ConfigError, validate

    with pytest.raises(ConfigError, match=r"^batch\.max_size: 32 is below batch\.size 64; raise it"):
        validate({"batch": {"size": 64, "max_local_batch": 32, "max_size": 32}})
    with pytest.raises(ConfigError, match=r"^batch\.policy: unknown 'grow'"):
        validate({"batch": {"policy": "grow"}})
    cfg = validate({"batch": {"policy": "schedule", "schedule": [[0, 64], [2.5, 256]]}})
    assert cfg.batch.schedule == [(0.0, 64), (2.5, 256)]


# --------------------------------------------------------------------------- the contract, every policy


def _policy_inputs(name: str) -> tuple[BatchConfig, list[tuple[int, float, BatchStats]]]:
    """A config for policy ``name`` and a stream of (step, epoch, stats) that asks for growth now and then."""
    extra: dict[str, Any] = {"schedule": [[0.5, 96], [1.0, 200], [2.0, 1000]]} if name == "schedule" else {}
    cfg = BatchConfig(size=64, max_local_batch=32, policy=name, max_size=1000, check_every=5, **extra)
    stream = []
    for step in range(0, 200):
        wanted = 40.0 * (1.0 + step / 4.0)  # rises from below B to far above max_size
        stats = BatchStats(b_simple=wanted if step % 7 else None, norm_test=int(wanted) if step % 3 else None)
        stream.append((step, step / 60.0, stats))
    return cfg, stream


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
    a = _drive(build_batch_policy(cfg), stream, cfg.size)
    b = _drive(build_batch_policy(cfg), stream, cfg.size)
    assert a == b
    assert all(size <= 1000 for _, size in a)
    if name != "fixed":
        assert a[-1][1] == 1000  # reached the cap
    else:
        assert {s for _, s in a} == {64}


@pytest.mark.parametrize("name", sorted(BATCH_POLICIES))
def test_contract_state_round_trip_resumes_identically(name: str) -> None:
    cfg, stream = _policy_inputs(name)
    full = build_batch_policy(cfg)
    first = _drive(full, stream, cfg.size)
    half = len(stream) // 2
    p = build_batch_policy(cfg)
    head = _drive(p, stream[:half], cfg.size)
    buf = io.BytesIO()
    torch.save({"batch_policy": p.state_dict()}, buf)
    buf.seek(0)
    resumed = build_batch_policy(cfg)
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
    assert [batch_at_epoch_for_schedule(s, 64, e) for e in (0.0, 0.99, 1.0, 2.0, 2.5, 10.0)] == \
        [64, 64, 128, 128, 256, 256]
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
