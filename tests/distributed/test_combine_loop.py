"""Tier 2: combine.method wired into the worker loop (trainers/loop/trainer.py), in real gloo process
groups (no Ray): one Adasum step equals the hand computation from the workers' slice gradients;
local SGD with H = 1 and no momentum is per-step averaging (the mean method) exactly; local SGD
with H = 2 syncs every second step, leaves the ranks apart in between and identical after, and
its local norm test grows the batch at a check step; decentlam keeps the ranks apart and a
checkpoint of every rank resumes each exactly."""

import copy

import numpy as np
import torch

from tests.helpers import spawn_gloo
from trainers.combine.methods import adasum_layers
from trainers.data.order import slice_bounds
from trainers.loop.config import LoopConfig
from trainers.loop.trainer import Runtime, Trainer
from trainers.workload.build import summed_loss

BASE = {
    "data": {"name": "digits"},
    "model": {"name": "mlp", "norm": "none", "hidden": 16},
    "optimizer": {"name": "sgd", "lr": 0.1, "mf": 0.0, "base_batch_size": 24},
    "batch": {"size": 24, "max_local_batch": 8},
    "train": {"epochs": 1},
}
IDS = np.arange(24)


def _cfg(**sections) -> dict:
    cfg = copy.deepcopy(BASE)
    for k, v in sections.items():
        cfg.setdefault(k, {}).update(v)
    return cfg


def _worker(rank: int, world: int, out: dict, cfg: dict, steps: int) -> None:
    t = Trainer(LoopConfig.model_validate(cfg), Runtime(), rank=rank, world=world, device=torch.device("cpu"))
    rows = []
    for s in range(steps):
        batch = IDS + 24 * s
        loss = t.train_step(batch)
        t.state.step += 1
        rows.append(
            {
                "loss": loss,
                "params": [p.detach().clone() for p in t.learner.params],
                "metrics": t.learner.combine.metrics(),
            }
        )
    out[rank] = rows
    stats = t.learner.combine.batch_stats()
    if stats is not None:  # local SGD's own norm test
        suggested = stats.norm_test
        decision = t.plan.next_batch(agree=t.group.agree_int)  # every rank: a broadcast
        if rank == 0:
            out["suggested"], out["decision"] = suggested, decision


def _run(cfg: dict, world: int = 2, steps: int = 1) -> dict:
    return spawn_gloo(_worker, world, cfg, steps)


def test_adasum_step_is_the_tree_of_the_slice_gradients():
    cfg = _cfg(combine={"method": "adasum"}, schedule={"scaling_rule": "none"})
    got = _run(cfg)
    # by hand: each worker's mean gradient over its slice of the first global batch, then Adasum
    t = Trainer(LoopConfig.model_validate(cfg), Runtime(), rank=0, world=1, device=torch.device("cpu"))
    p0 = [p.detach().clone() for p in t.learner.params]
    grads = []
    for r in range(2):
        lo, hi = slice_bounds(24, r, 2)
        t.learner.model.zero_grad()
        for xs, ys in t.learner.batches.batch(IDS[lo:hi]).micro:  # W = 1: this slice's samples
            (summed_loss(t.work.loss_fn, t.learner.model(xs), ys) / (hi - lo)).backward()
        grads.append([p.grad.detach().clone() for p in t.learner.params])
    combined = adasum_layers(grads)
    for r in (0, 1):
        for p, a, g in zip(got[r][0]["params"], p0, combined):
            torch.testing.assert_close(p, a - 0.1 * g, rtol=1e-5, atol=1e-6)
        for p, q in zip(got[r][0]["params"], got[0][0]["params"]):
            assert torch.equal(p, q)  # every rank took the same step


def test_local_sgd_h1_without_momentum_is_per_step_averaging():
    mean = _run(_cfg(), steps=3)
    local = _run(_cfg(combine={"method": "local_sgd", "local_steps": 1}), steps=3)
    np.testing.assert_allclose([r["loss"] for r in local[0]], [r["loss"] for r in mean[0]], rtol=1e-6)
    for p, q in zip(local[0][-1]["params"], mean[0][-1]["params"]):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    assert local[0][-1]["metrics"]["combine/syncs"] == 3.0
    assert local[0][-1]["metrics"]["combine/bytes_saved"] == 0.0  # H = 1 sends what per-step averaging does


def test_local_sgd_syncs_every_h_steps_and_grows_the_batch_by_its_norm_test():
    cfg = _cfg(
        optimizer={"mf": 0.9},
        combine={"method": "local_sgd", "local_steps": 2},
        batch={"policy": "norm_test", "check_every": 2, "norm_test_eta": 0.05, "max_size": 96},
    )
    got = _run(cfg, steps=4)
    for step, row in enumerate(got[0], start=1):
        same = all(torch.equal(p, q) for p, q in zip(row["params"], got[1][step - 1]["params"]))
        assert same == (step % 2 == 0), f"step {step}: ranks {'differ' if same else 'agree'}"
        assert row["metrics"]["combine/syncs"] == step // 2
    m = got[0][-1]["metrics"]
    P = sum(p.numel() for p in got[0][-1]["params"])
    # each sync: parameters and momentum in float32, and the norm test's float64 vector (P + 3)
    assert m["combine/bytes_sent"] == 2 * (2 * 4 * P + 8 * (P + 3))
    assert m["combine/bytes_saved"] == 4 * (4 * P) - m["combine/bytes_sent"]  # H = 2 with all that: negative
    # a small eta asks for a bigger batch: the policy grows B at the check step after the sync
    assert got["suggested"] is not None and got["suggested"] > 24
    assert got["decision"] is not None and got["decision"].old == 24


def _decentral_worker(rank: int, world: int, out: dict, cfg: dict) -> None:
    """decentlam through the real Trainer: two steps, a checkpoint of every rank (through the
    checkpoint manager's payload and a weights-only load), a fresh Trainer restored from it, then one
    more step on both: bitwise the same; then the run's end, which sets every worker to the average."""
    import io  # noqa: PLC0415 - only this worker

    import torch.distributed as dist  # noqa: PLC0415 - only this worker

    t = Trainer(LoopConfig.model_validate(cfg), Runtime(), rank=rank, world=world, device=torch.device("cpu"))
    for s in range(2):
        t.train_step(IDS + 24 * s)
        t.state.step += 1
    metrics = t.learner.combine.metrics()
    t.learner.combine.before_save(t.state.step)
    payload = [None]
    if rank == 0:
        buf = io.BytesIO()
        torch.save(t.checkpoints.state_dict(), buf)
        payload = [buf.getvalue()]
    dist.broadcast_object_list(payload, src=0)
    fresh = Trainer(LoopConfig.model_validate(cfg), Runtime(), rank=rank, world=world, device=torch.device("cpu"))
    fresh.checkpoints.load_state_dict(torch.load(io.BytesIO(payload[0]), weights_only=True))
    for tr in (t, fresh):
        tr.train_step(IDS + 48)
    params = torch.cat([p.detach().reshape(-1) for p in t.learner.params])
    t.learner.combine.before_save(t.state.step, final=True)  # the run's end
    out[rank] = {
        "metrics": metrics,
        "params": params,
        "resumed": torch.cat([p.detach().reshape(-1) for p in fresh.learner.params]),
        "final": torch.cat([p.detach().reshape(-1) for p in t.learner.params]),
        "P": sum(p.numel() for p in t.learner.params),
    }


def test_decentlam_in_the_loop_keeps_ranks_apart_and_resumes_every_rank_exactly():
    cfg = _cfg(
        combine={"method": "decentlam", "topology": "ring"},
        optimizer={"mf": 0.9},
    )
    res = spawn_gloo(_decentral_worker, 2, cfg)
    assert not torch.equal(res[0]["params"], res[1]["params"])  # each worker its own parameters
    for r in (0, 1):
        torch.testing.assert_close(res[r]["resumed"], res[r]["params"], rtol=0, atol=0)
        m = res[r]["metrics"]
        assert m["combine/bytes_per_step"] == 4 * res[r]["P"]  # W = 2: one neighbour
        assert m["combine/allreduce_bytes_per_step"] == 4 * res[r]["P"]  # 2 (W-1)/W = 1
        assert m["combine/consensus_distance"] > 0
        # the run's end: every worker the average, so the final model (rank 0's) is the average
        torch.testing.assert_close(res[r]["final"], (res[0]["params"] + res[1]["params"]) / 2)
