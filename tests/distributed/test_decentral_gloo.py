"""Tier 2: DmSGD and DecentLaM (trainers/combine/decentral.py) on 4 gloo processes (no Ray), run
through the loop's hooks (the method's ``Combination``): after each step every worker's parameters and momentum
equal the recursion applied to all workers' previous ones (gathered), the consensus distance stays
bounded, the byte counts are the graph's, and a checkpoint of every rank resumes exactly."""

import copy

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from tests.helpers import spawn_gloo
from trainers.combine.combinations import build_combination
from trainers.combine.config import CombineConfig
from trainers.combine.decentral import consensus_distance, decentlam_step, dmsgd_step, mixing_matrix

WORLD, STEPS, LR, BETA = 4, 12, 0.05, 0.9
STEP_FN = {"decentlam": decentlam_step, "dmsgd": dmsgd_step}


def _setup(method: str, topology: str, rank: int):
    torch.manual_seed(10 + rank)  # different parameters per worker
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=BETA)
    comb = build_combination(CombineConfig(method=method, topology=topology), world=WORLD)
    comb.attach(model, opt)
    return model, opt, comb


def _flat(ts) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1) for t in ts]).double()


def _momentum(opt, p) -> torch.Tensor:
    return opt.state[p]["momentum_buffer"] if p in opt.state else torch.zeros_like(p)


def _gather(v: torch.Tensor) -> torch.Tensor:
    rows = [torch.empty_like(v) for _ in range(WORLD)]
    dist.all_gather(rows, v)
    return torch.stack(rows)


def _step(model, opt, comb, rank: int, step: int) -> torch.Tensor:
    """One loop step on this worker's own data; returns its gradient (before DecentLaM's correction)."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    x, y = torch.randn(8, 3, generator=g), torch.randn(8, 2, generator=g) + rank  # different optima
    opt.zero_grad()
    F.mse_loss(model(x), y).backward()
    grad = _flat(p.grad for p in model.parameters())
    comb.before_step(local_count=8, batch_size=8 * WORLD)
    opt.step()
    comb.after_step(step, local_count=8)
    return grad


def _run(rank: int, world: int, method: str, topology: str) -> dict:
    model, opt, comb = _setup(method, topology, rank)
    mix = mixing_matrix(topology, world)
    errors, resumed = [], None
    distances = [consensus_distance(_gather(_flat(model.parameters())))]  # before the first step
    for step in range(1, STEPS + 1):
        xs = _gather(_flat(model.parameters()))
        ms = _gather(
            _flat(
                opt.state[p]["momentum_buffer"] if p in opt.state else torch.zeros_like(p) for p in model.parameters()
            )
        )
        g = _step(model, opt, comb, rank, step)
        x_new, m_new = STEP_FN[method](xs, ms, _gather(g), LR, BETA, mix)
        errors.append(float((_flat(model.parameters()) - x_new[rank]).abs().max()))
        errors.append(
            float((_flat(opt.state[p]["momentum_buffer"] for p in model.parameters()) - m_new[rank]).abs().max())
        )
        metrics = comb.metrics()
        distances.append(metrics["combine/consensus_distance"])
        assert metrics["combine/consensus_distance"] == pytest.approx(
            consensus_distance(_gather(_flat(model.parameters())))
        )
        if step == 3:  # a checkpoint of every rank, restored into fresh workers that continue beside these
            comb.before_save(step)
            state = [copy.deepcopy(comb.states()["combine"].state_dict()) if rank == 0 else None]
            dist.broadcast_object_list(state, src=0)
            resumed = _setup(method, topology, rank + 100)  # other initial weights: all must come from the state
            resumed[2].states()["combine"].load_state_dict(state[0])
    for step in range(4, STEPS + 1):  # the resumed copy runs steps 4..6 on the same data
        _step(*resumed, rank, step)
    return {
        "errors": errors,
        "distances": distances,  # [before step 1, after step 1, ...]
        "metrics": comb.metrics(),
        "params": _flat(model.parameters()),
        "resumed": _flat(resumed[0].parameters()),
        "P": sum(p.numel() for p in model.parameters()),
    }


# (method, topology, neighbours): at W = 4 the exponential graph (i +/- 1, 2) is the complete graph
CASES = (("decentlam", "ring", 2), ("dmsgd", "ring", 2), ("decentlam", "exponential", 3))


def _worker(rank: int, world: int, out: dict) -> None:
    """All cases in one group (a spawn of 4 processes costs seconds)."""
    out[rank] = {case: _run(rank, world, *case[:2]) for case in CASES}


def test_each_worker_follows_the_recursion_and_resumes_exactly():
    runs = spawn_gloo(_worker, WORLD)
    for case in CASES:
        _check({r: runs[r][case] for r in range(WORLD)}, degree=case[2])


def _check(res: dict, degree: int) -> None:
    for r in range(WORLD):
        assert max(res[r]["errors"]) < 1e-5, res[r]["errors"]  # float32 steps against the float64 recursion
        torch.testing.assert_close(res[r]["resumed"], res[r]["params"], rtol=0, atol=0)  # exact resume
        d = res[r]["distances"]
        assert d == res[0]["distances"]  # the same measurement on every rank
        assert max(d[1:]) < d[0]  # bounded: the mixing keeps the workers nearer than they started
        m = res[r]["metrics"]
        P = res[r]["P"]
        assert m["combine/bytes_per_step"] == degree * P * 4  # |D| neighbours x P float32
        assert m["combine/allreduce_bytes_per_step"] == 2 * (WORLD - 1) * P * 4 // WORLD
        assert m["combine/bytes_sent"] == STEPS * degree * P * 4
    assert res[0]["distances"][-1] > 0  # the workers' parameters differ (different data)
