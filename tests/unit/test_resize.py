"""The worker-count policy: no Ray, milliseconds."""

from __future__ import annotations

import pytest

from trainers.policies.resize import (
    RESIZE_POLICIES,
    NoopDecision,
    ResizeDecision,
    ResizePolicy,
    WorkersForBatch,
    build_resize_policy,
)


def _decide(b: int, m: int, cur: int, lo: int = 1, hi: int = 8) -> ResizeDecision | NoopDecision:
    return WorkersForBatch().decide(
        batch_size=b, max_local_batch=m, current_workers=cur, min_workers=lo, max_workers=hi
    )


@pytest.mark.parametrize(
    "b, m, cur, lo, hi, want",
    [
        (64, 64, 1, 1, 8, None),  # fits one worker
        (128, 64, 1, 1, 8, 2),  # ceil(128/64) = 2
        (130, 64, 1, 1, 8, 3),  # ceil rounds up
        (130, 64, 3, 1, 8, None),  # already there
        (1024, 64, 2, 1, 8, 8),  # capped by max_workers
        (1024, 64, 8, 1, 8, None),  # at the cap
        (64, 64, 1, 2, 8, 2),  # below min_workers: bring up to it
        (3, 1, 1, 4, 8, 3),  # never more workers than samples, even for min_workers
        (128, 64, 4, 1, 8, None),  # grow-only: more workers than needed is kept
        (512, 64, 4, 1, 4, None),  # W asked for is the cap; Ray running fewer is not our business
    ],
)
def test_cases(b: int, m: int, cur: int, lo: int, hi: int, want: int | None) -> None:
    d = _decide(b, m, cur, lo, hi)
    assert d.reason
    if want is None:
        assert isinstance(d, NoopDecision) and not d
    else:
        assert isinstance(d, ResizeDecision) and d and d.workers == want


def test_reason_says_when_capped() -> None:
    d = _decide(1024, 64, 2, 1, 8)
    assert "needs 16" in d.reason and "capped by max_workers" in d.reason


@pytest.mark.parametrize(
    "kw, msg",
    [
        ({"batch_size": 0}, "batch_size must be > 0, got 0"),
        ({"max_local_batch": -1}, "max_local_batch must be > 0, got -1"),
        ({"min_workers": 9}, "min_workers 9 is above max_workers 8"),
    ],
)
def test_bad_arguments_show_the_value(kw: dict[str, int], msg: str) -> None:
    args = {"batch_size": 64, "max_local_batch": 64, "current_workers": 1, "min_workers": 1, "max_workers": 8} | kw
    with pytest.raises(ValueError, match=msg):
        WorkersForBatch().decide(**args)


def test_registry() -> None:
    assert isinstance(build_resize_policy(), WorkersForBatch)
    assert all(issubclass(c, ResizePolicy) for c in RESIZE_POLICIES.values())
    with pytest.raises(ValueError, match="unknown 'pollux'; expected one of workers_for_batch, goodput"):
        build_resize_policy("pollux")


def test_worker_count_is_the_policy_within_the_scaling_bounds() -> None:
    from orchestrator.config.schema import validate
    from trainers.loop.config import LoopConfig
    from trainers.policies.resize import WorkerCount

    cfg = validate({"batch": {"size": 64, "max_local_batch": 32}, "scaling": {"min_workers": 1, "max_workers": 3}})
    wc = WorkerCount.from_config(cfg)
    assert (wc.max_local_batch, wc.min_workers, wc.max_workers, wc.initial(64)) == (32, 1, 3, 2)
    assert wc.decide(128, 2) == WorkersForBatch().decide(128, 32, 2, 1, 3) and wc.decide(128, 2).workers == 3
    assert not wc.decide(64, 2)
    worker_side = WorkerCount.from_config(LoopConfig.model_validate({"batch": {"size": 64, "max_local_batch": 32}}))
    assert (worker_side.min_workers, worker_side.max_workers, worker_side.initial(64)) == (1, 1, 1)
