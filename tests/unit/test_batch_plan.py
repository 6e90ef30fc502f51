"""The batch plan (trainers/policies/plan.py): stepping, decisions, measurements, checkpoint state.
No Ray, milliseconds."""

from __future__ import annotations

import io
import math

import pytest
import torch

from trainers.policies.batching import BatchConfig, BatchStats
from trainers.policies.config import OptimizerConfig
from trainers.policies.decisions import ResizeDecision
from trainers.policies.noise import GradientNoiseScale
from trainers.policies.plan import BatchPlan, NewBatch, TrainState
from trainers.policies.policy_set import PolicySet
from trainers.policies.schedules import ScheduleConfig

N = 100


def _plan(
    schedule: dict | None = None,
    optimizer: dict | None = None,
    batch: dict | None = None,
    epochs: float = 2,
    workers: int = 1,
    hi: int = 4,
    **kw,
) -> BatchPlan:
    opt = {"lr": 0.1, "base_batch_size": 32, "mf": 0.9, **(optimizer or {})}
    policies = PolicySet(
        ScheduleConfig(**(schedule or {})),
        OptimizerConfig(**opt),
        BatchConfig(**{"size": 32, "max_local_batch": 32, **(batch or {})}),
        epochs,
        N,
        min_workers=1,
        max_workers=hi,
    )
    return BatchPlan(policies, workers, **kw)


def _walk(plan: BatchPlan, **advance) -> list[tuple]:
    """Step a plan to its end as ``plan`` does; (step, epoch, B, W, samples, lr) of each step."""
    out = []
    while not plan.done:
        if plan.next_batch():
            d = plan.decide_workers()
            if d:
                plan.workers = d.workers
        s = plan.step_settings()
        plan.advance(**advance)
        out.append((plan.state.step, plan.epoch_float, s.batch, s.workers, s.samples, s.lr))
    return out


def test_steps_follow_the_data_order_the_schedule_and_the_worker_count():
    plan = _plan(batch={"policy": "schedule", "schedule": [[1, 64]]})
    steps = _walk(plan)
    # epoch 0: 32, 32, 32, 4 (the short last batch); epoch 1 at B = 64 on 2 workers: 64, 36
    assert [(b, w, n) for _, _, b, w, n, _ in steps] == [(32, 1, 32)] * 3 + [(32, 1, 4), (64, 2, 64), (64, 2, 36)]
    assert [e for _, e, *_ in steps] == pytest.approx([0.32, 0.64, 0.96, 1.0, 1.64, 2.0])
    assert (plan.state.step, plan.state.epoch, plan.state.cursor, plan.state.samples_seen) == (6, 2, 0, 200)
    assert steps[4][5] == pytest.approx(0.2) and plan.remaining_samples == 0.0  # linear rule at B = 64


def test_a_fractional_planned_end_stops_at_the_first_step_past_it():
    plan = _plan(epochs=0.5)
    assert [n for *_, n, _ in _walk(plan)] == [32, 32]  # 64 samples: past 0.5 epochs of 100
    assert plan.done and plan.epoch_float == pytest.approx(0.64)


def test_next_batch_is_what_every_rank_agrees_on():
    plan = _plan(batch={"policy": "schedule", "schedule": [[1, 64]]})
    assert plan.next_batch() is None  # the schedule keeps 32 at epoch 0
    change = plan.next_batch(agree=lambda mine: 48)  # rank 0 answered 48
    assert change == NewBatch(step=0, old=32, new=48, reason="rank 0's decision") and plan.batch == 48
    assert plan.next_batch(agree=lambda mine: 48) is None
    assert _plan().next_batch(agree=lambda mine: 1 / 0) is None  # a fixed batch asks nobody


def test_decide_workers_asks_the_run_s_worker_count():
    plan = _plan(batch={"size": 96}, hi=2)
    d = plan.decide_workers()
    assert isinstance(d, ResizeDecision) and d.workers == 2 and "capped by max_workers" in d.reason
    assert d == plan.policies.workers.decide(96, 1)
    assert not plan.decide_workers(current=2)


def test_measurements_feed_the_lr_and_the_batch():
    gns = GradientNoiseScale(ema=0.0)
    plan = _plan(schedule={"scaling_rule": "adascale"}, batch={"size": 128}, noise=gns)
    assert plan.step_settings().lr == pytest.approx(0.1)  # no estimate yet: gain 1
    gns.update(1.0 + 640.0 / 8, 8, 1.0 + 640.0 / 64, 64)  # B_simple = 640
    assert plan.step_settings().lr == pytest.approx(0.1 * (20 + 1) / (20 / 4 + 1))
    gns = GradientNoiseScale(ema=0.0)
    plan = _plan(batch={"policy": "noise_scale", "check_every": 1, "round_to": 1}, noise=gns)
    gns.update(1.0 + 64.0 / 8, 8, 1.0 + 64.0 / 64, 64)  # B_simple = 64
    plan.step_settings()
    plan.advance()
    assert plan.next_batch().new == 64 and plan.batch == 64
    local = _plan(
        batch={"policy": "norm_test", "check_every": 1, "round_to": 1}, batch_stats=lambda: BatchStats(norm_test=80)
    )  # local SGD's norm test, not a probe
    local.step_settings()
    local.advance()
    assert local.next_batch() == NewBatch(1, 32, 80, "norm test wants 80")


def test_lr_factor_and_skipped_steps():
    plan = _plan()
    full = plan.step_settings().lr
    assert plan.step_settings(lr_factor=0.25).lr == pytest.approx(full * 0.25)
    plan.advance(loss=1.0, trained=0)  # an fp16 step skipped: the order moves on, no samples count
    assert (plan.state.step, plan.state.cursor, plan.state.samples_seen) == (1, 32, 0)
    assert plan.step_settings(samples=7).samples == 7


def test_auto_warmup_ends_at_an_epoch_end_with_losses_and_grows_on_without():
    auto = {
        "warmup": "auto",
        "decay": "cosine",
        "auto_min_steps": 3,
        "auto_init_lr": 0.01,
        "auto_growth": 2.0,
        "auto_max_lr": 0.05,
    }
    run = _plan(schedule=auto)
    ends = []
    while not run.done:
        run.step_settings()
        moved = run.advance(loss=1.0)
        if moved.epoch_ended:
            ends.append(moved.warmup_end)
    assert ends[0] is not None and ends[0].stopped_now and "auto_max_lr" in ends[0].reason and ends[1] is None
    preview = _plan(schedule=auto)
    lrs = [lr for *_, lr in _walk(preview)]
    assert lrs[:4] == pytest.approx([0.01, 0.02, 0.04, 0.05]) and not preview.policies.auto.done


def test_state_round_trips_through_a_weights_only_checkpoint():
    auto = {"warmup": "auto", "decay": "cosine", "auto_min_steps": 3}
    sched = {"policy": "schedule", "schedule": [[0.5, 64]]}
    plan = _plan(schedule=auto, batch=sched)
    for _ in range(3):
        plan.next_batch()
        plan.step_settings()
        plan.advance(loss=2.0)
    assert set(plan.components()) == {"train", "batch", "auto_warmup"}
    buf = io.BytesIO()
    torch.save(plan.state_dict(), buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)
    assert state["batch"] == {"size": 64, "policy": {"name": "schedule", "changes": 1, "last_change_step": 2}}
    assert state["train"] == {"step": 3, "epoch": 1, "cursor": 0, "samples_seen": 100, "finished": False}
    fresh = _plan(schedule=auto, batch=sched, workers=2)
    fresh.load_state_dict(state)
    assert fresh.state_dict() == plan.state_dict() and fresh.workers == 2  # W is the group's, not saved
    assert fresh.step_settings().lr == plan.step_settings().lr
    assert set(_plan().state_dict()) == {"train", "batch"}
    with pytest.raises(ValueError, match="batch policy"):
        _plan().load_state_dict(state)


def test_from_config_starts_on_the_workers_the_first_batch_needs():
    from orchestrator.config.schema import validate

    cfg = validate({"batch": {"size": 96, "max_local_batch": 32}, "scaling": {"max_workers": 4}})
    plan = BatchPlan.from_config(cfg, dataset_size=1000)
    assert (plan.workers, plan.batch, plan.n, plan.state.step) == (3, 96, 1000, 0)
    assert math.isclose(plan.remaining_samples, cfg.train.epochs * 1000)


# --------------------------------------------------------------------------- the counters


def test_train_state_round_trip_in_place():
    s = TrainState(step=7, epoch=1, cursor=96, samples_seen=1200, finished=True)
    t = TrainState()
    t.load_state_dict(s.state_dict())
    assert t == s


def test_train_state_of_an_old_checkpoint_loads_without_its_retired_keys():
    t = TrainState()
    t.load_state_dict(
        {
            "step": 7,
            "epoch": 1,
            "cursor": 96,
            "samples_seen": 1200,
            "restarts": 3,
            "finished": False,
            "extra": {"gns": {"ema": 0.5}},
        }
    )
    assert t == TrainState(step=7, epoch=1, cursor=96, samples_seen=1200)
    assert "restarts" not in t.state_dict() and "extra" not in t.state_dict()


def test_train_state_refuses_unknown_keys():
    with pytest.raises(KeyError, match="stepz"):
        TrainState().load_state_dict({"stepz": 1})
