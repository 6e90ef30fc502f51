"""A non-finite loss stops the run before the optimizer step: the weights stay finite, the newest
checkpoint is the last finite state, and the driver is told which one (nothing fails silently)."""

from __future__ import annotations

import math

import pytest
import torch

from trainers.link.messages import Diverged
from trainers.link.runtime import Runtime
from trainers.loop.config import LoopConfig
from trainers.loop.trainer import Trainer

CFG = {
    "data": {"name": "digits"},
    "model": {"name": "mlp", "norm": "none", "hidden": 16},
    "optimizer": {"name": "sgd", "lr": 0.05, "mf": 0.9, "base_batch_size": 64},
    "batch": {"size": 64, "max_local_batch": 64},
    "train": {"epochs": 3},
    "checkpoint": {"every_steps": 5, "keep": 2},
}


class Emitted:
    """Stands in for rank 0's channel: keeps what the loop emits."""

    def __init__(self, channel):
        self.events: list = []
        self._channel = channel

    def emit(self, event) -> None:
        self.events.append(event)

    def __getattr__(self, name):
        return getattr(self._channel, name)


def test_a_non_finite_loss_stops_the_run_and_names_the_last_finite_checkpoint(tmp_path):
    runtime = Runtime(storage=str(tmp_path), run_prefix="elastic-x", run_name="elastic-x")
    t = Trainer(LoopConfig.model_validate(CFG), runtime, rank=0, world=1, device=torch.device("cpu"))
    t.report.channel = Emitted(t.report.channel)
    forward = t.learner.model.forward
    calls = []

    def poisoned(x):  # the loss of the 8th global batch is inf
        calls.append(1)
        out = forward(x)
        return out * float("inf") if len(calls) == 8 else out

    t.learner.model.forward = poisoned
    t.run()
    diverged = [e for e in t.report.channel.events if isinstance(e, Diverged)]
    assert len(diverged) == 1 and diverged[0].step == 8 and not math.isfinite(diverged[0].value)
    assert t.state.step == 7, "training stopped at the diverged step"
    assert all(torch.isfinite(p).all() for p in t.learner.model.parameters()), "the inf never reached the weights"
    assert diverged[0].checkpoint is not None and diverged[0].checkpoint.endswith("checkpoint_step00000005")
    assert t.checkpoints.checkpoints()[0] == diverged[0].checkpoint, "no checkpoint of the diverged state"
    assert "diverged at step 8" in diverged[0].message and "checkpoint_step00000005" in diverged[0].message


def _poisoned_trainer(tmp_path, poison_calls, **train):
    from trainers.link.messages import RolledBack  # noqa: F401  (the event the test looks for)

    cfg = {**CFG, "train": {**CFG["train"], **train}}
    runtime = Runtime(storage=str(tmp_path), run_prefix="elastic-x", run_name="elastic-x")
    t = Trainer(LoopConfig.model_validate(cfg), runtime, rank=0, world=1, device=torch.device("cpu"))
    t.report.channel = Emitted(t.report.channel)
    forward, calls = t.learner.model.forward, []

    def poisoned(x):
        calls.append(1)
        out = forward(x)
        return out * float("inf") if poison_calls(len(calls)) else out

    t.learner.model.forward = poisoned
    applied = []
    apply = t.plan.policies.apply

    def spy(opt, s, first=False):
        applied.append((t.state.step + 1, s.lr))
        return apply(opt, s, first=first)

    t.plan.policies.apply = spy
    return t, applied


def test_rollback_reloads_the_last_checkpoint_halves_the_lr_and_finishes(tmp_path):
    from trainers.link.messages import RolledBack

    t, applied = _poisoned_trainer(tmp_path, lambda n: n == 8, on_nonfinite="rollback", max_rollbacks=2, epochs=1)
    t.run()
    events = t.report.channel.events
    assert not [e for e in events if isinstance(e, Diverged)]
    rolled = [e for e in events if isinstance(e, RolledBack)]
    assert len(rolled) == 1
    r = rolled[0]
    assert (r.step, r.to_step, r.rollbacks, r.lr_factor) == (8, 5, 1, 0.5) and not math.isfinite(r.value)
    assert r.checkpoint.endswith("checkpoint_step00000005") and "rolled back to step 5" in r.message
    assert t.state.finished and t.state.step == 23  # 1 epoch of 23 steps: the run went on to the end
    first = dict(applied[:7])  # steps 1..7 before the rollback
    again = dict(applied[7:])  # step 6 onwards after it (the checkpoint of step 5 was reloaded)
    assert min(again) == 6
    for step in (6, 7):  # the same steps replayed at half the learning rate
        assert again[step] == pytest.approx(0.5 * first[step])
    assert all(torch.isfinite(p).all() for p in t.learner.model.parameters())
    # the factor is checkpoint state: a new group restoring the final checkpoint keeps it
    fresh = Trainer(
        LoopConfig.model_validate({**CFG, "train": {**CFG["train"], "epochs": 1}}),
        Runtime(storage=str(tmp_path), run_prefix="elastic-x", run_name="elastic-x"),
        rank=0,
        world=1,
        device=torch.device("cpu"),
    )
    assert fresh.checkpoints.load() and fresh.rollback.rollbacks == 1 and fresh.rollback.lr_factor == 0.5


def test_rollbacks_past_the_limit_stop_the_run_as_stop_does(tmp_path):
    from trainers.link.messages import RolledBack

    # steps 8 and then (after going back to 5) 9 are not finite; one rollback allowed
    t, _ = _poisoned_trainer(tmp_path, lambda n: n in (8, 12), on_nonfinite="rollback", max_rollbacks=1)
    t.run()
    rolled = [e for e in t.report.channel.events if isinstance(e, RolledBack)]
    diverged = [e for e in t.report.channel.events if isinstance(e, Diverged)]
    assert [(e.step, e.to_step, e.rollbacks) for e in rolled] == [(8, 5, 1)]
    assert len(diverged) == 1 and diverged[0].step == 9 and diverged[0].rollbacks == 1
    assert "after 1 rollback(s)" in diverged[0].message and not t.state.finished


def test_the_checkpoint_of_the_step_before_the_bad_loss_is_not_a_good_one(tmp_path):
    """The loss of step 11 comes from the weights of step 10: its checkpoint is passed over for step 5's."""
    from trainers.link.messages import RolledBack

    t, _ = _poisoned_trainer(tmp_path, lambda n: n == 11, on_nonfinite="rollback", epochs=1)
    t.run()
    (rolled,) = [e for e in t.report.channel.events if isinstance(e, RolledBack)]
    assert (rolled.step, rolled.to_step) == (11, 5) and rolled.checkpoint.endswith("checkpoint_step00000005")
    assert t.state.finished and t.state.step == 23


def test_stop_is_the_default_and_a_rollback_needs_a_checkpoint(tmp_path):
    t, _ = _poisoned_trainer(tmp_path, lambda n: n == 3, on_nonfinite="rollback")  # before the first checkpoint
    t.run()
    assert [type(e).__name__ for e in t.report.channel.events if type(e).__name__ in ("Diverged", "RolledBack")] == [
        "Diverged"
    ]
    assert LoopConfig.model_validate(CFG).train.on_nonfinite == "stop"


def test_each_rollback_is_an_mlflow_point_a_tag_and_a_printed_line():
    from orchestrator.record.checkpoint_models import CheckpointModels
    from orchestrator.record.listeners import ProgressListener, TrackingListener
    from trainers.link.messages import RolledBack

    class Client:
        def __init__(self):
            self.points = []

        def log_batch(self, run_id, metrics):
            self.points += [(m.key, m.value, m.step) for m in metrics]

    class Tracker:
        run_id = "r"

        def __init__(self):
            self.client, self.tags = Client(), {}
            self.checkpoints = CheckpointModels(self.client, self.run_id, "0")

        def set_tags(self, tags):
            self.tags.update(tags)

        def log_rows(self, rows):  # RunTracker.log_rows: rows as they are, through the client
            self.client.log_batch(self.run_id, metrics=rows)

    class Progress:
        def __init__(self):
            self.lines = []

        def write(self, line):
            self.lines.append(line)

    tracker, progress = Tracker(), Progress()
    listeners = [TrackingListener(tracker), ProgressListener(progress)]
    for n in (1, 2):  # two rollbacks at the same step are two points
        ev = RolledBack(
            step=6, value=math.nan, checkpoint="/c/checkpoint_step00000004", to_step=4, rollbacks=n, lr_factor=0.5**n
        )
        for listener in listeners:
            listener.on_event(ev)
    assert [p for p in tracker.client.points if p[0] == "rollbacks"] == [("rollbacks", 1.0, 6), ("rollbacks", 2.0, 6)]
    assert [p[1] for p in tracker.client.points if p[0] == "lr_factor"] == [0.5, 0.25]
    assert tracker.tags["elastic.rollbacks"] == 2 and "rolled back to step 4" in tracker.tags["elastic.rollback.2"]
    assert len(progress.lines) == 2 and progress.lines[1].startswith("warning: non-finite loss nan at step 6")
