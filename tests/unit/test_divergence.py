"""A non-finite loss stops the run before the optimizer step: the weights stay finite, the newest
checkpoint is the last finite state, and the driver is told which one (issue: nothing silent)."""

from __future__ import annotations

import math

import torch

from trainers.config import LoopConfig
from trainers.link.messages import Diverged
from trainers.link.runtime import Runtime
from trainers.loop import Trainer

CFG = {"data": {"name": "digits"}, "model": {"name": "mlp", "norm": "none", "hidden": 16},
       "optimizer": {"name": "sgd", "lr": 0.05, "mf": 0.9, "base_batch_size": 64},
       "batch": {"size": 64, "max_local_batch": 64}, "train": {"epochs": 3},
       "checkpoint": {"every_steps": 5, "keep": 2}}


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
    t.channel = Emitted(t.channel)
    forward = t.model.forward
    calls = []

    def poisoned(x):  # the loss of the 8th global batch is inf
        calls.append(1)
        out = forward(x)
        return out * float("inf") if len(calls) == 8 else out

    t.model.forward = poisoned
    t.run()
    diverged = [e for e in t.channel.events if isinstance(e, Diverged)]
    assert len(diverged) == 1 and diverged[0].step == 8 and not math.isfinite(diverged[0].value)
    assert t.state.step == 7, "training stopped at the diverged step"
    assert all(torch.isfinite(p).all() for p in t.model.parameters()), "the inf never reached the weights"
    assert diverged[0].checkpoint is not None and diverged[0].checkpoint.endswith("checkpoint_step00000005")
    assert t.checkpoints.checkpoints()[0] == diverged[0].checkpoint, "no checkpoint of the diverged state"
    assert "diverged at step 8" in diverged[0].message and "checkpoint_step00000005" in diverged[0].message
