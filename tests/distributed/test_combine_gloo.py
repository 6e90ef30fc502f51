"""Tier 2: gradient combination (trainers/combine/methods.py) in real gloo process groups (no Ray):
Adasum's collective against the tree of the gathered inputs, and local SGD's sync, local norm
test and resume at a sync point."""

import copy

import pytest
import torch
import torch.nn.functional as F

from tests.helpers import spawn_gloo
from trainers.combine.config import CombineConfig
from trainers.combine.methods import AdasumCombiner, LocalSGD, adasum_allreduce, adasum_layers, local_variance
from trainers.data.order import slice_bounds

SHAPES = [(3, 4), (4,), (1,), (2, 2)]


def _inputs(rank: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(100 + rank)
    layers = [torch.randn(s, generator=g) for s in SHAPES]
    if rank == 1:
        layers[2] = torch.zeros(1)  # a zero layer on one rank: the identity
    return layers


# --------------------------------------------------------------------------- Adasum


def _adasum_worker(rank: int, world: int, out: dict) -> None:
    out[rank] = [t.clone() for t in adasum_allreduce(_inputs(rank))]


@pytest.mark.parametrize("world", [2, 3])
def test_adasum_allreduce_equals_the_tree_on_every_rank(world):
    res = spawn_gloo(_adasum_worker, world)
    expected = adasum_layers([_inputs(r) for r in range(world)])
    for r in range(world):
        for got, exp, shape in zip(res[r], expected, SHAPES):
            assert got.shape == shape
            torch.testing.assert_close(got, exp)
            torch.testing.assert_close(got, res[0][SHAPES.index(shape)], rtol=0, atol=0)  # bitwise same


def _net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(5, 6), torch.nn.Tanh(), torch.nn.Linear(6, 3))


def _data(n: int = 40):
    g = torch.Generator().manual_seed(7)
    return torch.randn(n, 5, generator=g), torch.randint(0, 3, (n,), generator=g)


def _mean_grad(model: torch.nn.Module, x, y) -> list[torch.Tensor]:
    model.zero_grad()
    F.cross_entropy(model(x), y, reduction="mean").backward()
    return [p.grad.clone() for p in model.parameters()]


def _combiner_worker(rank: int, world: int, out: dict, batch: int, micro: int) -> None:
    """One step as the loop would run it: DDP, every micro-batch under no_sync(), loss * W/B, then Adasum."""
    base = _net()
    ddp = torch.nn.parallel.DistributedDataParallel(base)
    x, y = _data()
    lo, hi = slice_bounds(batch, rank, world)
    scale = world / batch
    with ddp.no_sync():
        for s in range(lo, hi, micro):
            e = min(s + micro, hi)
            (F.cross_entropy(ddp(x[s:e]), y[s:e], reduction="sum") * scale).backward()
    AdasumCombiner(base.parameters()).combine(local_count=hi - lo, loss_scale=scale)
    out[rank] = [p.grad.clone() for p in base.parameters()]


@pytest.mark.parametrize("world,batch", [(2, 11), (3, 2)])
def test_adasum_input_is_each_workers_mean_gradient_with_accumulation_and_uneven_slices(world, batch):
    """Uneven slices (11 over 2) and empty ones (2 over 3), micro-batches of 3: the combined gradient is
    the Adasum tree of each worker's mean gradient over its own slice (empty slice = 0)."""
    res = spawn_gloo(_combiner_worker, world, batch, 3)
    x, y = _data()
    model = _net()
    inputs = []
    for r in range(world):
        lo, hi = slice_bounds(batch, r, world)
        inputs.append(
            _mean_grad(model, x[lo:hi], y[lo:hi]) if hi > lo else [torch.zeros_like(p) for p in model.parameters()]
        )
    expected = adasum_layers(inputs)
    for r in range(world):
        for got, exp in zip(res[r], expected):
            torch.testing.assert_close(got, exp, rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------- local SGD


def _sync_worker(rank: int, world: int, out: dict) -> None:
    torch.manual_seed(rank)  # different parameters per rank
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3), torch.nn.Linear(3, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(6 + rank, 4)  # uneven local batches
    y = torch.randint(0, 2, (6 + rank,))
    F.cross_entropy(model(x), y).backward()  # local mean gradient over 6 + rank samples
    opt.step()
    before = {
        "params": [p.detach().clone() for p in model.parameters()],
        "momentum": [opt.state[p]["momentum_buffer"].clone() for p in model.parameters()],
        "buffers": [b.clone() for b in model.buffers() if b.is_floating_point()],
        "grad_sq": float(sum(p.grad.double().pow(2).sum() for p in model.parameters())),
        "grad": torch.cat([p.grad.double().reshape(-1) for p in model.parameters()]),
        "b": 6 + rank,
    }
    loc = LocalSGD(CombineConfig(method="local_sgd", local_steps=3), norm_test_eta=0.5)
    r = loc.sync(model, opt, step=3, local_count=6 + rank)
    out[rank] = {
        "before": before,
        "params": [p.detach().clone() for p in model.parameters()],
        "momentum": [opt.state[p]["momentum_buffer"].clone() for p in model.parameters()],
        "buffers": [b.clone() for b in model.buffers() if b.is_floating_point()],
        "variance": r.variance,
        "suggested": r.norm_test.suggested,
        "required": r.norm_test.required,
        "syncs": loc.syncs,
        "bytes_saved": loc.bytes_saved,
    }


@pytest.mark.parametrize("world", [2, 3])
def test_after_a_sync_all_ranks_hold_the_mean(world):
    res = spawn_gloo(_sync_worker, world)
    for key in ("params", "momentum", "buffers"):
        n = len(res[0][key])
        for i in range(n):
            mean = torch.stack([res[r]["before"][key][i] for r in range(world)]).mean(0)
            for r in range(world):
                torch.testing.assert_close(res[r][key][i], mean)
                torch.testing.assert_close(res[r][key][i], res[0][key][i], rtol=0, atol=0)
    # the local norm test: eq. (3) from the workers' own gradients, the same answer on every rank
    b = [res[r]["before"]["b"] for r in range(world)]
    g_big = sum(bi * res[r]["before"]["grad"] for r, bi in enumerate(b)) / sum(b)
    var = local_variance(b, [res[r]["before"]["grad_sq"] for r in range(world)], float(g_big.dot(g_big)))
    for r in range(world):
        assert res[r]["variance"] == pytest.approx(var, rel=1e-9)
        assert res[r]["required"] == pytest.approx(var / (0.25 * float(g_big.dot(g_big))), rel=1e-9)
        assert res[r]["syncs"] == 1
        assert res[r]["suggested"] == res[0]["suggested"]


def _local_sgd_worker(rank: int, world: int, out: dict, steps: int, start: dict | None, ckpt_at: int | None) -> None:
    """Local SGD as the loop will run it: global batches of 8 from one permutation, each rank its slice,
    its own optimizer step on its own mean gradient, a sync every H = 3 steps; rank 0 checkpoints at a sync."""
    x, y = _data(48)
    model = _net()
    opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    loc = LocalSGD(CombineConfig(method="local_sgd", local_steps=3))
    step = 0
    if start is not None:
        # tensors that came through the Manager live in shared memory, the same on both ranks: copy
        start = copy.deepcopy(start)
        model.load_state_dict(start["model"])
        opt.load_state_dict(start["opt"])
        loc.load_state_dict(start["local"])
        step = start["step"]
    perm = torch.randperm(48, generator=torch.Generator().manual_seed(3))
    while step < steps:
        ids = perm[(step * 8) % 48 : (step * 8) % 48 + 8]
        lo, hi = slice_bounds(len(ids), rank, world)
        mine = ids[lo:hi]
        opt.zero_grad()
        F.cross_entropy(model(x[mine]), y[mine], reduction="mean").backward()
        opt.step()
        step += 1
        if loc.should_sync(step):
            loc.sync(model, opt, step=step)
            if ckpt_at == step and rank == 0:
                out["ckpt"] = {
                    "model": {k: v.clone() for k, v in model.state_dict().items()},
                    "opt": copy.deepcopy(opt.state_dict()),
                    "local": loc.state_dict(),
                    "step": step,
                }
    out[rank] = {"params": [p.detach().clone() for p in model.parameters()], "local": loc.state_dict()}


def test_local_sgd_resume_at_a_sync_continues_exactly():
    full = spawn_gloo(_local_sgd_worker, 2, 9, None, 6)
    torch.testing.assert_close(full[0]["params"], full[1]["params"], rtol=0, atol=0)  # step 9 is a sync
    resumed = spawn_gloo(_local_sgd_worker, 2, 9, full["ckpt"], None)
    for a, b in zip(full[0]["params"], resumed[0]["params"]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert resumed[0]["local"] == full[0]["local"]
    assert full[0]["local"]["syncs"] == 3
    P = sum(p.numel() for p in _net().parameters())
    assert full[0]["local"]["bytes_baseline"] == 9 * P * 4
    # local SGD really trains differently from one model per step: the parameters moved from the start
    assert any(not torch.equal(a, b) for a, b in zip(full[0]["params"], _net().parameters()))
