"""``scaling.policy: goodput`` wired into a run, without Ray: the config field, rank 0's feed of step
times (what is left out, when it asks), the monitor's answer with the resize costs measured here (grow,
shrink, a batch change, overlap or restart), the loop's side (the noise estimator on, the feed in the
checkpoint, B adopted with the LR following), the log lines and ``plan``'s note."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from orchestrator.config.prepare import validated
from orchestrator.config.schema import ConfigError, apply_overrides, validate
from orchestrator.run.monitor import MonitorState
from trainers.link.messages import GoodputDecided, ResizeDecided
from trainers.policies.goodput import StepTimeFeed, StepTimeFit
from trainers.policies.resize import GoodputResize, WorkerCount

BASE = {
    "data": {"name": "digits"},
    "model": {"name": "mlp", "norm": "none", "hidden": 16},
    "optimizer": {"name": "sgd", "lr": 0.1, "mf": 0.9, "base_batch_size": 64},
    "batch": {"size": 64, "max_local_batch": 64},
    "scaling": {"min_workers": 1, "max_workers": 4},
    "train": {"epochs": 1},
}
SYNC_BOUND = StepTimeFit(alpha=0.1, beta=0.01, gamma=0.5, points=3)  # a 0.5 s all-reduce per extra worker
CHEAP_SYNC = StepTimeFit(alpha=0.1, beta=0.01, gamma=0.001, points=3)


def _cfg(**sections):
    raw = {k: dict(v) for k, v in BASE.items()}
    for k, v in sections.items():
        raw[k] = {**raw.get(k, {}), **v}
    return validated(raw)


# --------------------------------------------------------------------------- the config field


def test_scaling_policy_defaults_to_workers_for_batch_and_takes_goodput_from_set():
    assert _cfg().scaling.policy == "workers_for_batch"
    raw = apply_overrides({k: dict(v) for k, v in BASE.items()}, ["scaling.policy=goodput"])
    cfg = validate(raw)
    assert cfg.scaling.policy == "goodput"
    assert isinstance(WorkerCount.from_config(cfg).policy, GoodputResize)


def test_a_bad_scaling_policy_is_one_line_naming_the_field_and_the_choices():
    with pytest.raises(ConfigError) as e:
        _cfg(scaling={"policy": "polux"})
    assert str(e.value) == "scaling.policy: unknown 'polux'; expected one of workers_for_batch, goodput"


def test_goodput_needs_the_noise_scale_that_only_mean_measures():
    with pytest.raises(
        ConfigError,
        match=r"^scaling.policy: goodput reads the gradient noise scale, which "
        r"combine.method adasum does not measure; use combine.method: mean",
    ):
        _cfg(
            scaling={"policy": "goodput", "max_workers": 2},
            combine={"method": "adasum"},
            schedule={"scaling_rule": "none"},
        )


def test_check_every_and_round_to_act_under_goodput():
    from orchestrator.config.preflight import check_ignored

    check_ignored(_cfg(scaling={"policy": "goodput"}, batch={"check_every": 7, "max_size": 256, "round_to": 16}))
    with pytest.raises(ConfigError, match="batch.check_every: has no effect"):
        check_ignored(_cfg(batch={"check_every": 7}))


# --------------------------------------------------------------------------- rank 0's feed


def test_the_feed_leaves_out_a_groups_first_steps_and_short_batches():
    f = StepTimeFeed(every=10, skip=2, min_steps=3)
    kept = [f.observe(32, 2, 0.5) for _ in range(4)]
    assert kept == [False, False, True, True]
    assert not f.observe(20, 2, 0.3, whole=False)  # an epoch's short tail: not the policy's local batch
    assert not f.ready(32, 2)  # two kept steps, three needed
    f.observe(32, 2, 0.8)
    assert f.ready(32, 2) and f.model.configurations == {(32, 2): (3, pytest.approx(0.6))}
    f.restart()  # a new group or a new batch: its first steps are left out again
    assert [f.observe(16, 4, 0.2) for _ in range(3)] == [False, False, True]


def test_the_feed_asks_every_check_every_steps():
    f = StepTimeFeed(every=10)
    assert [s for s in range(0, 35) if f.due(s)] == [10, 20, 30]


def test_the_feed_sends_an_unusable_noise_estimate_as_unknown():
    f = StepTimeFeed(every=10)
    assert f.inputs(None, 64, 64).b_noise is None
    assert f.inputs(-3.0, 64, 64).b_noise is None  # an early, noisy estimate
    assert f.inputs(math.inf, 64, 64).b_noise is None
    assert f.inputs(250.0, 64, 512, round_to=8).b_noise == 250.0


def test_the_feed_round_trips_through_a_checkpoint():
    f = StepTimeFeed(every=10, skip=0)
    for b, w, t in ((64, 1, 0.7), (32, 2, 0.9), (32, 2, 1.1)):
        f.observe(b, w, t)
    g = StepTimeFeed(every=10)
    g.load_state_dict(torch.load(_saved(f.state_dict()), weights_only=True))
    assert g.model.configurations == f.model.configurations and g.model.fit() == f.model.fit()


def _saved(obj):
    import io

    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return buf


# --------------------------------------------------------------------------- the monitor's answer


def _feed(fit: StepTimeFit, points) -> StepTimeFeed:
    f = StepTimeFeed(every=10, skip=0)
    for b, w in points:
        for _ in range(3):
            f.observe(b, w, fit.step_time(b, w))
    return f


def _monitor(free: float | None = None, only_if_pays: bool = False) -> MonitorState:
    return MonitorState(
        WorkerCount(GoodputResize(), 64, 1, 4),
        overlap_resources=None if free is None else {"CPU": 0.5},
        available=lambda: {"CPU": free or 0.0},
        only_if_pays=only_if_pays,
    )


def test_the_monitor_shrinks_the_group_when_measured_sync_dominates_and_says_why():
    m = _monitor()
    f = _feed(SYNC_BOUND, [(64, 1), (32, 1), (16, 4), (32, 4)])
    answer = m.on_batch_change(20, 64, 4, remaining_samples=64 * 1000, inputs=f.inputs(None, 64, 64))
    assert (answer.workers, answer.mode, answer.batch) == (1, "restart", 0)
    _, events = m.drain()
    decided = [e for e in events if isinstance(e, GoodputDecided)]
    assert len(decided) == 1 and decided[0].changes
    d = decided[0]
    assert (d.batch, d.workers, d.to_batch, d.to_workers) == (64, 4, 64, 1)
    assert d.reason.startswith("shrinking W 4 -> 1, at B=64")
    assert [w for _, w, _ in d.alternatives] == [1, 2, 3, 4]
    assert d.chosen_goodput == pytest.approx(64 / 0.74) and d.goodput == pytest.approx(64 / 1.76)
    assert any(isinstance(e, ResizeDecided) and e.workers == 1 for e in events)  # the driver's resize path
    # decided: a question before the handover gets the same answer
    assert m.on_batch_change(25, 64, 4, 1e6, inputs=f.inputs(None, 64, 64)).workers == 1


def test_the_monitor_keeps_the_group_when_the_measured_start_does_not_pay():
    m = _monitor(only_if_pays=True)
    m.set_costs(start_s=30.0)  # a group's start measured on this cluster
    f = _feed(SYNC_BOUND, [(64, 1), (32, 1), (16, 4), (32, 4)])
    answer = m.on_batch_change(20, 64, 4, remaining_samples=64 * 10, inputs=f.inputs(None, 64, 64))
    assert answer.workers == 0 and m.handovers.resize is None
    (d,) = [e for e in m.drain()[1] if isinstance(e, GoodputDecided)]
    assert not d.changes and d.cost_s == 30.0 and "less than its ~30.0 s cost" in d.reason


def test_an_overlap_is_judged_by_its_pause_after_the_new_groups_start():
    """Overlap (room for both groups): cost = the pause (1 s), and the saving counts only after the new
    group's start (lead 30 s): 100 steps left at 1.76 s on W=4 vs 0.74 on W=1 save (176 - 30)(1 - 0.74 /
    1.76) = 84.6 s."""
    m = _monitor(free=4.0, only_if_pays=True)
    m.set_costs(start_s=30.0, pause_s=1.0)
    f = _feed(SYNC_BOUND, [(64, 1), (32, 1), (16, 4), (32, 4)])
    answer = m.on_batch_change(20, 64, 4, remaining_samples=64 * 100, inputs=f.inputs(None, 64, 64))
    assert (answer.workers, answer.mode) == (1, "overlap")
    (d,) = [e for e in m.drain()[1] if isinstance(e, GoodputDecided)]
    assert d.cost_s == 1.0 and d.gain_s == pytest.approx((176 - 30) * (1 - 0.74 / 1.76))


def test_no_room_for_an_overlap_is_judged_as_a_restart():
    m = _monitor(free=0.0, only_if_pays=True)
    m.set_costs(start_s=500.0, pause_s=1.0)  # a restart costs more than the shrink saves
    f = _feed(SYNC_BOUND, [(64, 1), (32, 1), (16, 4), (32, 4)])
    answer = m.on_batch_change(20, 64, 4, remaining_samples=64 * 100, inputs=f.inputs(None, 64, 64))
    assert answer.workers == 0 and m.handovers.resize is None


def test_the_monitor_grows_on_the_prior_of_one_measured_worker_count():
    """One W measured: no sync cost known (gamma = 0), so spreading the batch looks faster: Pollux's
    exploration, taken whenever asked to (resize_when: always)."""
    m = _monitor()
    f = _feed(CHEAP_SYNC, [(64, 1)])
    answer = m.on_batch_change(10, 64, 1, remaining_samples=1e6, inputs=f.inputs(100.0, 64, 64))
    assert answer.workers == 4 and answer.batch == 0


def test_goodput_may_choose_the_batch_too():
    """W fixed at 1 (max_workers 1), T = 1 + 0.01 b, B_noise = 100: goodput peaks at B = 100, within
    the bounds the loop sends (B..max_batch, multiples of round_to); the batch changes without a resize."""
    m = MonitorState(WorkerCount(GoodputResize(), 1000, 1, 1), available=lambda: {})
    fit = StepTimeFit(alpha=1.0, beta=0.01, gamma=0.0, points=2)
    f = _feed(fit, [(10, 1), (20, 1)])
    answer = m.on_batch_change(10, 10, 1, remaining_samples=1e6, inputs=f.inputs(100.0, 10, 1000, round_to=10))
    assert (answer.workers, answer.batch) == (0, 100)
    (d,) = [e for e in m.drain()[1] if isinstance(e, GoodputDecided)]
    assert d.to_batch == 100 and d.reason.startswith("B 10 -> 100 at W=1")


def test_without_step_times_goodput_answers_what_the_batch_needs():
    m = _monitor()
    answer = m.on_batch_change(0, 256, 1, remaining_samples=1e6, inputs=StepTimeFeed(10).inputs(None, 64, 256))
    assert answer.workers == 4
    assert not [e for e in m.drain()[1] if isinstance(e, GoodputDecided)]


# --------------------------------------------------------------------------- the loop's side


def _trainer(tmp_path, goodput=True, **sections):
    from trainers.link.runtime import Runtime
    from trainers.loop.config import LoopConfig
    from trainers.loop.trainer import Trainer

    cfg = _cfg(scaling={"policy": "goodput" if goodput else "workers_for_batch"}, **sections)
    runtime = Runtime(storage=str(tmp_path), run_prefix="elastic-g", run_name="elastic-g", goodput=goodput)
    return Trainer(LoopConfig.model_validate(cfg.loop_dict()), runtime, rank=0, world=1, device=torch.device("cpu"))


def test_goodput_turns_the_noise_estimator_on_and_checkpoints_the_step_times(tmp_path):
    t = _trainer(tmp_path, batch={"check_every": 4})
    assert t.learner.gns is not None  # B_noise is measured for goodput (a fixed batch alone would not)
    assert "goodput" in t.checkpoint_states()
    for _ in range(6):
        t.advance()
    assert t.goodput.model.configurations[(64, 1)][0] == 4  # six steps, the first two left out
    t.state.finished = False
    t.save_checkpoint()
    fresh = _trainer(tmp_path, batch={"check_every": 4})
    assert fresh.restore() is True
    assert fresh.goodput.model.configurations == t.goodput.model.configurations
    plain = _trainer(tmp_path / "plain", goodput=False)
    assert plain.learner.gns is None and "goodput" not in plain.checkpoint_states()


def test_when_the_loop_asks(tmp_path):
    t = _trainer(tmp_path, batch={"check_every": 4})
    t.state.step = 8
    assert t.goodput_due(first_step=0, overlap_to=0)
    assert not t.goodput_due(first_step=8, overlap_to=0)  # a group's first step: nothing measured yet
    assert not t.goodput_due(first_step=0, overlap_to=3)  # a new group is starting beside this one
    t.state.step = 9
    assert not t.goodput_due(first_step=0, overlap_to=0)


def test_goodput_chooses_the_batch_only_under_a_fixed_policy_with_a_cap(tmp_path):
    assert _trainer(tmp_path, batch={"max_size": 256}).goodput_max_batch() == 256
    assert _trainer(tmp_path).goodput_max_batch() == 64  # no cap: B stays
    ramp = _trainer(tmp_path, batch={"policy": "ramp", "ramp_to": 128, "ramp_epochs": 0.5, "max_size": 256})
    assert ramp.goodput_max_batch() == 64  # the batch policy owns B


def test_an_adopted_batch_moves_the_lr_by_the_scaling_rule(tmp_path):
    t = _trainer(tmp_path, batch={"max_size": 256}, schedule={"scaling_rule": "linear"})
    lr0 = t.plan.step_settings().lr
    change = t.plan.adopt(128, "goodput")
    assert (change.old, change.new) == (64, 128)
    assert t.plan.step_settings().lr == pytest.approx(2 * lr0)
    assert t.plan.adopt(128, "goodput") is None


def test_the_weight_decay_in_effect_is_logged_next_to_the_lr(tmp_path):
    t = _trainer(
        tmp_path,
        goodput=False,
        optimizer={"name": "adamw", "lr": 0.001, "weight_decay": 0.1, "wd_rule": "timescale", "mf": 0.9},
    )
    t.train_step(np.arange(64))
    m = t.metrics_for_step(1.0)
    assert m["train/weight_decay"] == pytest.approx(t.plan.current.weight_decay)
    assert t.learner.opt.param_groups[0]["weight_decay"] == pytest.approx(m["train/weight_decay"])
    plain = _trainer(tmp_path / "sgd", goodput=False, optimizer={"weight_decay": 5e-4})
    plain.train_step(np.arange(64))
    assert plain.metrics_for_step(1.0)["train/weight_decay"] == pytest.approx(5e-4)


# --------------------------------------------------------------------------- what a person reads


def test_a_goodput_change_is_a_line_on_the_drivers_terminal(capsys):
    from orchestrator.record.listeners import ProgressListener
    from orchestrator.record.progress_bar import Progress

    listener = ProgressListener(Progress(10, enabled=False))
    common = dict(
        step=10,
        batch=64,
        workers=1,
        mode="",
        goodput=1.0,
        chosen_goodput=2.0,
        b_noise=None,
        gain_s=0.0,
        cost_s=0.0,
        alternatives=((64, 1, 1.0), (64, 3, 2.0)),
    )
    listener.on_event(GoodputDecided(to_batch=64, to_workers=1, reason="keeping B=64 W=1: ...", **common))
    listener.on_event(GoodputDecided(to_batch=64, to_workers=3, reason="growing W 1 -> 3, at B=64: ...", **common))
    assert capsys.readouterr().err.splitlines() == ["goodput at step 10: growing W 1 -> 3, at B=64: ..."]


def test_plan_says_goodput_is_decided_online_within_its_bounds():
    from orchestrator.preview import make_plan

    plan = make_plan(
        _cfg(
            scaling={"policy": "goodput", "min_workers": 1, "max_workers": 3},
            batch={"max_size": 256, "round_to": 16, "check_every": 7},
        )
    )
    (note,) = [n for n in plan.notes if "goodput" in n]
    assert "W in 1..3 and B in 64..256 (multiples of 16) online, every 7 steps" in note
    assert "step times measured" in note and "B_noise" in note and "not plannable" in note
    assert {r["workers"] for r in plan.rows} == {1}  # shown: the workers the batch needs


def test_before_any_step_time_the_batchs_need_must_still_pay():
    """Nothing measured yet: goodput answers what the batch needs, and resize_when: pays judges it as
    for workers_for_batch (a short remainder does not pay for a group's start)."""
    m = _monitor(only_if_pays=True)
    m.set_costs(start_s=30.0)
    answer = m.on_batch_change(
        0, 256, 1, remaining_samples=256 * 2, samples_per_s=1000.0, inputs=StepTimeFeed(10).inputs(None, 64, 256)
    )
    assert answer.workers == 0 and m.handovers.resize is None


def test_the_decisions_reach_mlflow_as_metrics_and_tags(tmp_path):
    from orchestrator.record.listeners import TrackingListener
    from tests.unit.test_phases import FakeTracker

    tracker = FakeTracker()
    listener = TrackingListener(tracker)  # type: ignore[arg-type]
    common = dict(
        batch=64,
        workers=3,
        mode="",
        goodput=50.0,
        b_noise=120.0,
        gain_s=0.0,
        cost_s=0.0,
        alternatives=((64, 1, 80.0), (64, 3, 50.0)),
    )
    listener.on_event(
        GoodputDecided(
            step=10, to_batch=64, to_workers=1, chosen_goodput=80.0, reason="shrinking W 3 -> 1, at B=64: ...", **common
        )
    )
    listener.on_event(
        GoodputDecided(
            step=20, to_batch=64, to_workers=3, chosen_goodput=50.0, reason="keeping B=64 W=3: ...", **common
        )
    )
    listener.close()
    assert tracker.metrics == [
        (10, {"goodput/current": 50.0, "goodput/chosen": 80.0, "goodput/b_noise": 120.0}),
        (20, {"goodput/current": 50.0, "goodput/chosen": 50.0, "goodput/b_noise": 120.0}),
    ]
    assert tracker.tags["elastic.goodput.change.1"] == "step 10: shrinking W 3 -> 1, at B=64: ..."
    assert "elastic.goodput.change.2" not in tracker.tags  # a decision that keeps B and W is no change
    assert tracker.tags["elastic.goodput.reason"] == "step 20: keeping B=64 W=3: ..."
    assert tracker.tags["elastic.goodput.decisions"] == 2


def test_a_resumed_goodput_run_goes_on_at_the_w_it_had(tmp_path):
    """goodput may have shrunk the group below what the batch needs: a resume starts at the W the run
    logged last, not at the batch's need (workers_for_batch's runs only ever grew)."""
    from orchestrator.run.run_books import RunStart
    from tests.helpers import make_config
    from tests.unit.test_phases import FakeTracker, make_runner

    for policy, expected in (("goodput", 1), ("workers_for_batch", 2)):
        cfg = make_config(
            tmp_path,
            "mem://",
            batch={"size": 32, "max_local_batch": 16},
            scaling={"min_workers": 1, "max_workers": 3, "policy": policy},
        )
        assert make_runner(cfg, FakeTracker(), RunStart(resumes=1, workers=1)).initial_workers() == expected
