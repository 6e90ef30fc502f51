"""DmSGD and DecentLaM (trainers/combine/decentral.py): the graphs, each recursion against a
hand-computed case (4 scalar workers on a ring), and the momentum-amplified bias of DmSGD that
DecentLaM removes (per-worker quadratics whose global optimum is the mean of their minima)."""

import pytest
import torch

from search.space import parse_space
from tests.unit.test_combine_wiring import raw
from trainers.combine.combinations import build_combination
from trainers.combine.config import CombineConfig
from trainers.combine.decentral import (
    Decentralized,
    allreduce_bytes,
    consensus_distance,
    decentlam_step,
    dmsgd_step,
    mixing_matrix,
    neighbour_offsets,
)


def test_graphs_and_their_weights():
    assert neighbour_offsets("ring", 4) == [1, 3]
    assert neighbour_offsets("ring", 2) == [1]
    assert neighbour_offsets("exponential", 8) == [1, 2, 4, 6, 7]  # i +/- 1, 2, 4
    assert neighbour_offsets("exponential", 4) == [1, 2, 3]  # the complete graph
    ring = mixing_matrix("ring", 4)
    third = 1 / 3
    expected = torch.tensor(
        [[third, third, 0, third], [third, third, third, 0], [0, third, third, third], [third, 0, third, third]],
        dtype=torch.float64,
    )
    torch.testing.assert_close(ring, expected)
    torch.testing.assert_close(mixing_matrix("ring", 2), torch.full((2, 2), 0.5, dtype=torch.float64))
    for topo, n in (("ring", 5), ("exponential", 8), ("exponential", 6)):
        w = mixing_matrix(topo, n)
        torch.testing.assert_close(w, w.T)  # symmetric
        torch.testing.assert_close(w.sum(0), torch.ones(n, dtype=torch.float64))  # doubly stochastic
    assert float(mixing_matrix("exponential", 8)[0, 4]) == pytest.approx(1 / 6)
    with pytest.raises(ValueError, match="at least 2 workers"):
        neighbour_offsets("ring", 1)


X = torch.tensor([0.0, 1.0, 2.0, 3.0], dtype=torch.float64)
M0 = torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=torch.float64)
G = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64)


def test_dmsgd_by_hand():
    """m' = 0.5 m + g = [1.5, 2, 3, 4]; x - 0.1 m' = [-0.15, 0.8, 1.7, 2.6]; each the ring average of three."""
    x, m = dmsgd_step(X, M0, G, lr=0.1, beta=0.5, mix=mixing_matrix("ring", 4))
    torch.testing.assert_close(m, torch.tensor([1.5, 2.0, 3.0, 4.0], dtype=torch.float64))
    torch.testing.assert_close(x, torch.tensor([3.25, 2.35, 5.1, 4.15], dtype=torch.float64) / 3)


def test_decentlam_by_hand():
    """W x = [4/3, 1, 2, 5/3], x - W x = [-4/3, 0, 0, 4/3]; m' = 0.5 m + g + (x - W x) / 0.1;
    x' = x - 0.1 m' = W x - 0.1 (0.5 m + g)."""
    x, m = decentlam_step(X, M0, G, lr=0.1, beta=0.5, mix=mixing_matrix("ring", 4))
    torch.testing.assert_close(m, torch.tensor([1.5 - 40 / 3, 2.0, 3.0, 4.0 + 40 / 3], dtype=torch.float64))
    torch.testing.assert_close(x, torch.tensor([4 / 3 - 0.15, 0.8, 1.7, 5 / 3 - 0.4], dtype=torch.float64))


def test_consensus_distance_and_bytes():
    assert consensus_distance(X) == pytest.approx(1.25)  # mean of 1.5^2, 0.5^2, 0.5^2, 1.5^2
    assert consensus_distance(torch.ones(3, 7)) == 0.0
    assert allreduce_bytes(100, 4, 4) == 600  # 2 (n-1)/n of 400 bytes


def _fixed_point_bias(step, beta: float, lr: float, topo: str = "ring", n: int = 8) -> float:
    """Workers i minimise (x - c_i)^2 / 2 with exact gradients (a large batch: no noise); the
    global optimum is mean(c).  Returns the RMS distance of the workers' fixed point from it."""
    c = torch.tensor([-3.0, -1.0, 1.0, 3.0, -2.0, 0.0, 2.0, 4.0], dtype=torch.float64)[:n]
    mix = mixing_matrix(topo, n)
    x, m = torch.zeros(n, dtype=torch.float64), torch.zeros(n, dtype=torch.float64)
    for _ in range(1500):
        x, m = step(x, m, x - c, lr, beta, mix)
    x_next, _ = step(x, m, x - c, lr, beta, mix)
    assert float((x_next - x).abs().max()) < 1e-9  # it is a fixed point
    return float((x - c.mean()).pow(2).mean().sqrt())


@pytest.mark.parametrize("topo", ["ring", "exponential"])
def test_momentum_amplifies_dmsgd_bias_but_not_decentlams(topo):
    lr = 0.02
    dm = [_fixed_point_bias(dmsgd_step, b, lr, topo) for b in (0.0, 0.5, 0.9)]
    dl = [_fixed_point_bias(decentlam_step, b, lr, topo) for b in (0.0, 0.5, 0.9)]
    assert dm[0] < dm[1] < dm[2] and dm[2] > 4 * dm[0]  # ~ lr / (1 - beta)
    assert dl == pytest.approx([dl[0]] * 3, rel=1e-6)  # the momentum is out of the bias
    assert dl[2] < dm[2] / 1.5  # at the paper's beta = 0.9 DecentLaM is nearer (x1.9 exponential, x3.8 ring)
    # a larger LR (the linear scaling rule at a larger batch) grows the bias further
    assert _fixed_point_bias(dmsgd_step, 0.9, 2 * lr, topo) > 1.4 * dm[2]


def test_combination_wiring_and_the_one_worker_refusal():
    cfg = CombineConfig(method="decentlam", topology="ring")
    c = build_combination(cfg, world=4)
    assert not c.uses_ddp
    assert c.loss_scale(batch_size=32, local_count=8) == pytest.approx(4 / 32)  # normalised by B
    assert set(c.states()) == {"combine"}
    assert CombineConfig(method="dmsgd").graph == "exponential"
    with pytest.raises(ValueError, match="scaling.min_workers >= 2"):
        build_combination(CombineConfig(method="dmsgd"), world=1)
    with pytest.raises(ValueError, match="combine.method"):
        Decentralized("mean", "ring", 4)


def test_a_search_space_may_choose_decentlam():
    space = parse_space(
        {
            "base": raw(scaling={"min_workers": 2, "max_workers": 2}),
            "objective": {"metric": "val/accuracy", "direction": "maximize"},
            "params": {
                "combine.method": {"choices": ["mean", "dmsgd", "decentlam"]},
                "combine.topology": {"choices": ["ring", "exponential"], "when": "combine.method != mean"},
            },
        }
    )
    cfg = space.config({"combine.method": "decentlam", "combine.topology": "ring"})
    assert (cfg.combine.method, cfg.combine.graph) == ("decentlam", "ring")


def test_a_resize_starts_every_worker_from_the_average():
    """A checkpoint of 4 workers restored into a group of another size: parameters, momentum and
    floating buffers are the saved rows' average (here one process, so W = 1 != 4)."""
    model = torch.nn.Sequential(torch.nn.Linear(2, 1), torch.nn.BatchNorm1d(1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    d = Decentralized("decentlam", "ring", 2)
    d.model, d.optimizer = model, opt
    n_params = sum(p.numel() for p in model.parameters())  # 3 + 2 (BatchNorm's weight and bias)
    n = 2 * n_params + 2  # parameters, momentum, running mean and var
    rows = torch.arange(4 * n, dtype=torch.float64).reshape(4, n)
    d.load_state_dict(
        {"method": "decentlam", "topology": "ring", "world": 4, "steps": 7, "bytes_sent": 9, "ranks": rows}
    )
    mean = rows.mean(0)
    got = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).double()
    torch.testing.assert_close(got, mean[:n_params])
    mom = torch.cat([opt.state[p]["momentum_buffer"].reshape(-1) for p in model.parameters()]).double()
    torch.testing.assert_close(mom, mean[n_params : 2 * n_params])
    torch.testing.assert_close(model[1].running_var.double(), mean[-1:])
    assert (d.steps, d.bytes_sent) == (7, 9)
