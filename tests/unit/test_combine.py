"""Tier 1: gradient combination (trainers/combine/methods.py) against hand computations; no processes."""

import math

import pytest
import torch
from pydantic import ValidationError

from orchestrator.config.schema import validate
from trainers.combine.config import CombineConfig
from trainers.combine.methods import (
    AdasumCombiner,
    LocalSGD,
    adasum_allreduce,
    adasum_layers,
    adasum_pair,
    adasum_tree,
    local_variance,
)
from trainers.policies.batching import BatchConfig, BatchStats, NormTestBatch
from trainers.policies.noise import norm_test

D = torch.float64


def t(*xs):
    return torch.tensor(xs, dtype=D)


def hand_pair(a, b):
    """The formula written out with Python floats."""
    a, b = a.tolist(), b.tolist()
    dot = sum(x * y for x, y in zip(a, b))
    na, nb = sum(x * x for x in a), sum(y * y for y in b)
    ca = 1 - dot / (2 * na) if na else 1.0
    cb = 1 - dot / (2 * nb) if nb else 1.0
    return torch.tensor([ca * x + cb * y for x, y in zip(a, b)], dtype=D)


# --------------------------------------------------------------------------- config


def _combination_error(**sections) -> str | None:
    """What ``orchestrator/config/rules.py check_combine`` says of a config with these sections (None: fine)."""
    from orchestrator.config.rules import check_combine
    from orchestrator.config.schema import ConfigError, validate

    try:
        check_combine(validate(sections))
    except ConfigError as e:
        return str(e)
    return None


def test_config_defaults_and_cross_checks():
    from orchestrator.config.rules import check_combinations
    from orchestrator.config.schema import ConfigError

    assert CombineConfig().method == "mean"
    c = CombineConfig(method="local_sgd", local_steps=4)
    assert c.H == 4 and c.averages_momentum
    assert not CombineConfig(method="local_sgd", local_steps=4, average_momentum=False).averages_momentum
    for combine, start in (
        ({"method": "adasum", "local_steps": 4}, "combine.local_steps: only used by"),
        ({"method": "local_sgd"}, "combine.local_steps: required"),
        ({"method": "mean", "average_momentum": True}, "combine.average_momentum"),
    ):
        cfg = validate({"combine": combine, "schedule": {"scaling_rule": "none"}})  # each field fine alone
        with pytest.raises(ConfigError, match=f"^{start}"):
            check_combinations(cfg)
    with pytest.raises(ValidationError, match="local_steps"):
        CombineConfig(method="local_sgd", local_steps=0)
    with pytest.raises(ValidationError, match="method"):
        CombineConfig(method="sum")
    with pytest.raises(ValidationError, match="extra"):
        CombineConfig(method="mean", bogus=1)


def test_check_combination():
    ada, loc = {"method": "adasum"}, {"method": "local_sgd", "local_steps": 4}
    none, adascale = {"scaling_rule": "none"}, {"scaling_rule": "adascale"}
    assert _combination_error(batch={"policy": "noise_scale"}, schedule=adascale) is None  # mean: anything
    assert _combination_error(combine=ada, schedule=none) is None
    assert _combination_error(combine=ada).startswith("schedule.scaling_rule:")
    assert _combination_error(combine=ada, schedule=none, batch={"policy": "noise_scale"}).startswith("batch.policy:")
    assert _combination_error(combine=ada, schedule=none, scaling={"max_workers": 4}).startswith("scaling.min_workers")
    assert _combination_error(combine=loc) is None
    assert _combination_error(combine=loc, schedule=adascale).startswith("schedule.scaling_rule:")
    assert _combination_error(combine=loc, batch={"policy": "noise_scale"}).startswith("batch.policy:")
    assert _combination_error(combine=loc, batch={"policy": "norm_test"}).startswith("scaling.max_workers")
    two = {"max_workers": 2}
    assert _combination_error(combine=loc, batch={"policy": "norm_test", "check_every": 6}, scaling=two).startswith(
        "batch.check_every:"
    )
    assert _combination_error(combine=loc, batch={"policy": "norm_test", "check_every": 8}, scaling=two) is None
    assert _combination_error(combine=loc, scaling={"use_gpu": True}, train={"precision": "fp16"}).startswith(
        "train.precision: fp16 cannot be used with combine.method local_sgd"
    )


# --------------------------------------------------------------------------- Adasum


def test_parallel_gradients_give_their_mean():
    a = t(1.0, 2.0, -3.0)
    torch.testing.assert_close(adasum_pair(a, a), a)
    # parallel but of different lengths: a.b/(2|a|^2) = 1, a.b/(2|b|^2) = 1/4 -> 0*a + 3/4*b
    b = 2 * a
    torch.testing.assert_close(adasum_pair(a, b), 0.75 * b)
    torch.testing.assert_close(adasum_pair(a, b), hand_pair(a, b))


def test_orthogonal_gradients_give_their_sum():
    a, b = t(1.0, 0.0, 2.0), t(0.0, 5.0, 0.0)
    torch.testing.assert_close(adasum_pair(a, b), a + b)


def test_general_pair_matches_hand_formula_and_symmetry():
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(7, generator=g, dtype=D), torch.randn(7, generator=g, dtype=D)
    torch.testing.assert_close(adasum_pair(a, b), hand_pair(a, b))
    torch.testing.assert_close(adasum_pair(a, b), adasum_pair(b, a))
    # scale-equivariance: why Adasum of gradients equals Adasum of plain-SGD deltas
    torch.testing.assert_close(adasum_pair(-0.1 * a, -0.1 * b), -0.1 * adasum_pair(a, b))


def test_zero_input_is_the_identity():
    b = t(3.0, -1.0)
    torch.testing.assert_close(adasum_pair(torch.zeros(2, dtype=D), b), b)
    torch.testing.assert_close(adasum_pair(b, torch.zeros(2, dtype=D)), b)
    assert torch.all(torch.isfinite(adasum_pair(torch.zeros(2, dtype=D), torch.zeros(2, dtype=D))))


def test_three_and_four_workers_match_the_tree_formula():
    g = torch.Generator().manual_seed(1)
    x = [torch.randn(5, generator=g, dtype=D) for _ in range(6)]
    torch.testing.assert_close(adasum_tree(x[:1]), x[0])
    torch.testing.assert_close(adasum_tree(x[:3]), hand_pair(hand_pair(x[0], x[1]), x[2]))
    torch.testing.assert_close(adasum_tree(x[:4]), hand_pair(hand_pair(x[0], x[1]), hand_pair(x[2], x[3])))
    four = hand_pair(hand_pair(x[0], x[1]), hand_pair(x[2], x[3]))
    torch.testing.assert_close(adasum_tree(x[:5]), hand_pair(four, x[4]))
    torch.testing.assert_close(adasum_tree(x[:6]), hand_pair(four, hand_pair(x[4], x[5])))
    with pytest.raises(ValueError):
        adasum_tree([])


def test_tree_of_orthogonal_and_equal_inputs():
    e = torch.eye(4, dtype=D)
    for w in (2, 3, 4):
        torch.testing.assert_close(
            adasum_tree([e[i] * (i + 1) for i in range(w)]), sum(e[i] * (i + 1) for i in range(w))
        )
        a = t(0.5, -1.0, 2.0, 0.0)
        torch.testing.assert_close(adasum_tree([a] * w), a)


def test_applied_per_layer_not_to_the_whole_vector():
    # layer 0: orthogonal across workers (sum); layer 1: identical (mean = the input)
    w0 = [t(1.0, 0.0), t(3.0)]
    w1 = [t(0.0, 2.0), t(3.0)]
    out = adasum_layers([w0, w1])
    torch.testing.assert_close(out[0], t(1.0, 2.0))
    torch.testing.assert_close(out[1], t(3.0))
    # the whole-vector Adasum would differ (the vectors are neither orthogonal nor equal)
    whole = adasum_pair(torch.cat(w0), torch.cat(w1))
    assert not torch.allclose(whole, torch.cat(out))
    # shapes are kept
    m = [[torch.ones(2, 3, dtype=D)], [torch.ones(2, 3, dtype=D)]]
    assert adasum_layers(m)[0].shape == (2, 3)


def test_allreduce_without_a_process_group_is_a_copy():
    x = [t(1.0, 2.0)]
    out = adasum_allreduce(x)
    torch.testing.assert_close(out[0], x[0])
    assert out[0] is not x[0]


def test_combiner_turns_scaled_grads_into_the_mean_gradient():
    p = torch.nn.Parameter(torch.zeros(3, dtype=D))
    p.grad = t(2.0, 4.0, 6.0)  # loss scaled by W/B = 2/8 over b_i = 4 samples: factor 1
    AdasumCombiner([p]).combine(local_count=4, loss_scale=2 / 8)
    torch.testing.assert_close(p.grad, t(2.0, 4.0, 6.0))
    p.grad = t(2.0, 4.0, 6.0)
    AdasumCombiner([p]).combine(local_count=2, loss_scale=1 / 2)
    torch.testing.assert_close(p.grad, t(2.0, 4.0, 6.0))
    p.grad = t(1.0, 1.0, 1.0)
    AdasumCombiner([p]).combine(local_count=4, loss_scale=1.0)
    torch.testing.assert_close(p.grad, t(0.25, 0.25, 0.25))
    AdasumCombiner([p]).combine(local_count=0, loss_scale=1.0)
    torch.testing.assert_close(p.grad, torch.zeros(3, dtype=D))


# --------------------------------------------------------------------------- local SGD


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2))


def test_should_sync_every_h_steps():
    loc = LocalSGD(CombineConfig(method="local_sgd", local_steps=4))
    assert [s for s in range(13) if loc.should_sync(s)] == [4, 8, 12]
    assert all(LocalSGD(CombineConfig(method="local_sgd", local_steps=1)).should_sync(s) for s in range(1, 5))
    with pytest.raises(ValueError, match="combine.method"):
        LocalSGD(CombineConfig())


def test_bytes_counted_against_per_step_averaging():
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(5, 3)).sum().backward()
    opt.step()  # creates the momentum buffers
    P = sum(p.numel() for p in model.parameters())
    buf = sum(b.numel() for b in model.buffers() if b.is_floating_point())
    for avg_m, expected_sent in ((True, (2 * P + buf) * 4), (False, (P + buf) * 4)):
        loc = LocalSGD(CombineConfig(method="local_sgd", local_steps=8, average_momentum=avg_m))
        r = loc.sync(model, opt, step=8)
        assert r.bytes_sent == expected_sent
        assert loc.bytes_baseline == 8 * P * 4
        loc.sync(model, opt, step=16)
        assert loc.syncs == 2
        assert loc.bytes_saved == 16 * P * 4 - 2 * expected_sent
        m = loc.metrics()
        assert m["combine/syncs"] == 2 and m["combine/bytes_saved"] == loc.bytes_saved
    # H=1 with momentum averaging sends more than per-step gradient averaging: a negative saving
    loc = LocalSGD(CombineConfig(method="local_sgd", local_steps=1))
    loc.sync(model, opt, step=1)
    assert loc.bytes_saved < 0


def test_state_dict_round_trip_and_h_check():
    cfg = CombineConfig(method="local_sgd", local_steps=4)
    model, loc = _model(), LocalSGD(cfg)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loc.sync(model, opt, step=4)
    other = LocalSGD(cfg)
    other.load_state_dict(loc.state_dict())
    assert other.state_dict() == loc.state_dict()
    assert all(isinstance(v, int) for v in loc.state_dict().values())
    with pytest.raises(ValueError, match="combine.local_steps"):
        LocalSGD(CombineConfig(method="local_sgd", local_steps=2)).load_state_dict(loc.state_dict())
    with pytest.raises(KeyError):
        other.load_state_dict({"H": 4})


def test_local_variance_is_eq3():
    b, g = [4.0, 6.0], [t(1.0, 0.0), t(0.0, 2.0)]
    B = sum(b)
    gb = (b[0] * g[0] + b[1] * g[1]) / B
    expected = (b[0] * (g[0] - gb).dot(g[0] - gb) + b[1] * (g[1] - gb).dot(g[1] - gb)) / 1
    got = local_variance(b, [float(x.dot(x)) for x in g], float(gb.dot(gb)))
    assert got == pytest.approx(float(expected))
    assert local_variance([4.0], [1.0], 1.0) is None
    assert local_variance([4.0, 0.0], [1.0, 9.0], 1.0) is None


def test_single_process_norm_test_needs_two_workers():
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.randn(5, 3)).sum().backward()
    loc = LocalSGD(CombineConfig(method="local_sgd", local_steps=2), norm_test_eta=0.5)
    r = loc.sync(model, opt, step=2, local_count=5)
    assert r.norm_test is None and r.variance is None
    assert r.bytes_sent > sum(p.numel() for p in model.parameters()) * 4  # the gradient was sent too


def test_norm_test_feeds_the_batch_policy_monotonically():
    """What the lead wires: at a sync, the local norm test's suggestion goes to the norm_test batch
    policy as BatchStats(norm_test=...); B only grows."""
    pol = NormTestBatch(BatchConfig(size=16, policy="norm_test", check_every=4, round_to=8, max_size=1024))
    B = 16
    history = []
    for step, (var, gsq) in zip((4, 8, 12), ((100.0, 1.0), (10.0, 1.0), (900.0, 1.0))):
        nt = norm_test(var, gsq, B, eta=0.5)
        d = pol.decide(step, 0.0, B, BatchStats(norm_test=nt.suggested))
        if d:
            B = d.size
        history.append(B)
    # 100 / (0.5^2 * 1) = 400; then 10/400 <= 0.25 passes; then 900/0.25 = 3600 is capped at 1024
    assert history == [math.ceil(400 / 8) * 8, 400, 1024]
