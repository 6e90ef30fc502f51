"""Tier 2: the loop's DDP numerics in real gloo process groups (no Ray): the same step at
W=1 and W=2, and the noise-scale inputs that the DDP communication hook measures."""

import numpy as np
import pytest
import torch

from tests.helpers import spawn_gloo
from trainers.loop.config import LoopConfig
from trainers.loop.trainer import Runtime, Trainer

CFG = {
    "data": {"name": "digits"},
    "model": {"name": "mlp", "norm": "none", "hidden": 16},
    "optimizer": {"name": "sgd", "lr": 0.1, "mf": 0.9, "base_batch_size": 24},
    "batch": {"size": 24, "max_local_batch": 24, "policy": "noise_scale", "check_every": 1000},
    "train": {"epochs": 1},
}


def _worker(rank: int, world: int, out: dict) -> None:
    t = Trainer(LoopConfig.model_validate(CFG), Runtime(), rank=rank, world=world, device=torch.device("cpu"))
    ids = np.arange(24)
    losses = [t.train_step(ids) for _ in range(3)]
    if rank == 0:
        out["losses"] = losses
        out["params"] = [p.detach().clone() for p in t.learner.params]
        out["gns"] = t.learner.gns.state_dict()


def _run(world: int) -> dict:
    return spawn_gloo(_worker, world)


@pytest.fixture(scope="module")
def runs():
    return {w: _run(w) for w in (1, 2)}


def test_same_steps_at_w1_and_w2(runs):
    np.testing.assert_allclose(runs[1]["losses"], runs[2]["losses"], rtol=1e-5)
    for a, b in zip(runs[1]["params"], runs[2]["params"]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def _manual_small_big(ids_halves):
    """Per-half mean gradients and the full mean gradient, computed directly at the initial weights."""
    import torch.nn.functional as F

    from trainers.data.datasets import load_data
    from trainers.workload.config import ModelConfig
    from trainers.workload.models import build_model

    cfg = LoopConfig.model_validate(CFG)
    torch.manual_seed(cfg.train.seed)
    data = load_data(cfg.data, cfg.train.seed)
    model = build_model(data.info, ModelConfig(**CFG["model"]))

    def grad(ids):
        model.zero_grad()
        F.cross_entropy(model(data.train_x[ids]), data.train_y[ids]).backward()
        return torch.cat([p.grad.flatten() for p in model.parameters()]).double()

    small = [float(grad(h).pow(2).sum()) for h in ids_halves]
    big = float(grad(np.concatenate(ids_halves)).pow(2).sum())
    return small, big


def test_noise_scale_inputs_match_a_direct_computation():
    """One step: the W=2 hook's per-worker gradients equal the per-half gradients computed by hand,
    and the W=1 split-in-two path measures the same halves."""
    from trainers.policies.noise import GradientNoiseScale

    small, big = _manual_small_big([np.arange(12), np.arange(12, 24)])
    g_sq, tr = GradientNoiseScale.estimate(float(np.mean(small)), 12.0, big, 24.0)
    for world in (1, 2):
        st = spawn_gloo(_one_step, world, dict(CFG, train={"epochs": 1}))["gns"]
        gns = GradientNoiseScale(0.95)
        gns.load_state_dict(st)
        assert gns.g_sq == pytest.approx(g_sq, rel=1e-4), world
        assert gns.trace_sigma == pytest.approx(tr, rel=1e-4), world


def _one_step(rank: int, world: int, out: dict, cfg: dict) -> None:
    t = Trainer(LoopConfig.model_validate(cfg), Runtime(), rank=rank, world=world, device=torch.device("cpu"))
    t.train_step(np.arange(24))
    if rank == 0:
        out["gns"] = t.learner.gns.state_dict()
