"""Tier 2: augmentation in the real loop is the same at W=1 and W=3 (gloo process groups, no Ray):
every sample of a global batch gets the same augmented input whichever rank and micro-batch draw
it, because its randomness is a function of (seed, epoch, sample id) only (trainers/data/augment.py)."""

import numpy as np
import torch

from tests.helpers import spawn_gloo
from trainers.loop.config import LoopConfig
from trainers.loop.trainer import Runtime, Trainer

CFG = {
    "data": {"name": "digits", "augment": ["random_crop", "hflip"], "crop_padding": 2},
    "model": {"name": "mlp", "norm": "none", "hidden": 16},
    "optimizer": {"name": "sgd", "lr": 0.1, "mf": 0.9, "base_batch_size": 40},
    "batch": {"size": 40, "max_local_batch": 6},
    "train": {"epochs": 2, "seed": 11},
}


def _worker(rank: int, world: int, out: dict) -> None:
    t = Trainer(LoopConfig.model_validate(CFG), Runtime(), rank=rank, world=world, device=torch.device("cpu"))
    inner, seen = t.learner.inputs, {}

    def record(x, ids=None, epoch=0):
        y = inner(x, ids, epoch)
        if ids is not None:
            for i, raw, row in zip(np.asarray(ids).tolist(), x, y):
                seen[(epoch, i)] = (raw.numpy().copy(), row.numpy().copy())
        return y

    t.learner.inputs = record
    for epoch, cursor in ((0, 0), (0, 40), (1, 0)):
        t.state.epoch, t.state.cursor = epoch, cursor
        t.train_step(t.learner.batches.next(epoch, cursor, t.plan.batch))
    out[rank] = seen


def _run(world: int) -> dict:
    out = spawn_gloo(_worker, world)
    merged: dict = {}
    for rank in range(world):
        part = out[rank]
        assert not set(part) & set(merged), "each sample is drawn by one rank"
        merged.update(part)
    return merged


def test_augmented_inputs_are_the_same_at_w1_and_w3():
    one, three = _run(1), _run(3)
    assert len(one) == 3 * 40 and set(one) == set(three)
    for key, (_raw, x) in one.items():
        np.testing.assert_array_equal(three[key][1], x, err_msg=str(key))
    changed = sum(not np.array_equal(raw, x) for raw, x in one.values())
    assert changed > len(one) // 2, "the inputs were augmented"
