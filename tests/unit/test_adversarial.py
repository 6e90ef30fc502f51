"""Adversarial training (trainers/loop/adversarial.py): the perturbation formula against a hand
computation, which weights each method perturbs with (sync: the step's own, conadv: the previous
step's), an exact resume with ConAdv on, and the config's refusals."""

from __future__ import annotations

import contextlib
import os
import shutil

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from orchestrator.config.rules import check_combinations
from orchestrator.config.schema import ConfigError, RootConfig
from orchestrator.preview import make_plan
from search.space import SpaceError, parse_space
from trainers.link.runtime import Runtime
from trainers.loop.adversarial import perturbation
from trainers.loop.config import LoopConfig
from trainers.loop.trainer import Trainer
from trainers.workload.factory import cross_entropy

CNN = {
    "data": {"name": "synthetic", "size": 128, "shape": [3, 8, 8]},
    "model": {"name": "cnn", "norm": "batch", "hidden": 8},
    "optimizer": {"name": "sgd", "lr": 0.1, "mf": 0.9, "base_batch_size": 32},
    "batch": {"size": 32, "max_local_batch": 16},
    "train": {"epochs": 2, "seed": 5, "push_every_s": 0},
}


def _raw(method: str, **train) -> dict:
    raw = {k: dict(v) for k, v in CNN.items()}
    raw["train"].update({"adversarial": {"method": method, "epsilon": 0.1}, **train})
    return raw


def _trainer(raw: dict, runtime: Runtime | None = None) -> Trainer:
    return Trainer(LoopConfig.model_validate(raw), runtime or Runtime(), rank=0, world=1, device=torch.device("cpu"))


# --------------------------------------------------------------------------- the formula


def _hand_grad_x(w: np.ndarray, b: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """d/dx of sum_i CE(W x_i + b, y_i) = W^T (softmax(z_i) - onehot(y_i)), by hand."""
    z = x @ w.T + b
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    p[np.arange(len(y)), y] -= 1.0
    return p @ w


@pytest.mark.parametrize("steps", [1, 3])
def test_perturbation_is_signed_input_gradient_steps_clipped_to_epsilon(steps):
    lin = torch.nn.Linear(3, 2)
    w = np.array([[0.5, -1.0, 0.25], [-0.3, 0.8, -0.6]])
    b = np.array([0.1, -0.2])
    x = np.array([[1.0, 0.5, -1.0], [0.2, -0.4, 0.3], [-1.0, 1.0, 0.0]])
    y = np.array([0, 1, 1])
    state = {"weight": torch.tensor(w, dtype=torch.float64), "bias": torch.tensor(b, dtype=torch.float64)}
    eps = 0.2
    got = perturbation(
        lin.double(), state, cross_entropy, torch.tensor(x), torch.tensor(y), eps, steps, contextlib.nullcontext
    )
    delta = np.zeros_like(x)  # delta_{k+1} = clip(delta_k + (eps/K) sign(grad_x l(x + delta_k)), -eps, eps)
    for _ in range(steps):
        delta = np.clip(delta + eps / steps * np.sign(_hand_grad_x(w, b, x + delta, y)), -eps, eps)
    np.testing.assert_allclose(got.numpy(), delta, atol=1e-12)
    if steps == 1:  # FGSM: every coordinate moves by exactly eps
        np.testing.assert_allclose(np.abs(got.numpy()), eps)
    assert lin.weight.grad is None  # the input gradient leaves the weights' gradients alone


def test_token_ids_have_no_input_gradient():
    emb = torch.nn.Embedding(5, 2)
    with pytest.raises(TypeError, match=r"train\.adversarial.*method: none"):
        perturbation(
            emb, dict(emb.named_parameters()), cross_entropy, torch.tensor([1, 2]), torch.tensor([0, 1]), 0.1, 1,
            contextlib.nullcontext,
        )  # fmt: skip


# --------------------------------------------------------------------------- which weights perturb


def _record(t: Trainer) -> tuple[list, list]:
    """(weights the input-gradient pass saw, ids it perturbed) and (weights before each step, ids it trained)."""
    seen, trained = [], []
    adv = t.learner.adversary
    adv.on_perturb = lambda state, ids: seen.append((state["features.0.weight"].clone(), ids.copy()))
    backward = t.learner.backward

    def spy(batch, epoch, deltas=None):
        trained.append((t.learner.model.features[0].weight.detach().clone(), batch.ids.copy()))
        return backward(batch, epoch, deltas)

    t.learner.backward = spy
    return seen, trained


@pytest.mark.parametrize("method", ["sync", "conadv"])
def test_the_perturbation_of_step_t_uses_the_weights_of_t_for_sync_and_t_minus_1_for_conadv(method):
    t = _trainer(_raw(method))
    seen, trained = _record(t)
    for _ in range(6):  # across the epoch end (4 steps an epoch)
        t.advance()
    for k, (w_k, ids_k) in enumerate(trained):
        if k:
            assert not torch.equal(w_k, trained[k - 1][0])  # the weights moved
        (w_seen,) = [w for w, ids in seen if np.array_equal(ids, ids_k)]  # perturbed once
        lag = 0 if method == "sync" or k == 0 else 1  # conadv's first step has no older weights
        assert torch.equal(w_seen, trained[k - lag][0]), (method, k)


def test_conadv_perturbs_the_next_batch_ahead_and_the_weights_train_on_the_clean_weight_mix():
    t = _trainer(_raw("conadv"))
    t.advance()
    pending = t.learner.adversary.pending
    nxt = t.learner.batches.next(t.state.epoch, t.state.cursor, t.plan.batch)
    assert pending is not None and np.array_equal(pending[0], nxt.ids)
    assert all(d.abs().max() == pytest.approx(0.1) for d in pending[2])
    # another rank's slices of the same global batch (a checkpoint rank 0 wrote): not used there
    other = t.learner.batches.next(t.state.epoch, t.state.cursor, t.plan.batch)
    other.micro_ids = [m[::-1].copy() for m in other.micro_ids]
    seen, _ = _record(t)
    t.learner.adversary.for_step(other, t.state.epoch)
    assert len(seen) == 1 and t.learner.adversary.pending is None  # recomputed from the stale weights
    # g = c grad(clean) + (1 - c) grad(perturbed): with zero perturbations, plain training's gradient
    batch = t.learner.batches.next(0, 0, 32)
    plain = _trainer(_raw("none"))
    zero = _trainer(_raw("sync"))
    zero.learner.adversary.cfg = zero.learner.adversary.cfg.model_copy(update={"epsilon": 0.0})
    assert plain.learner.backward(batch, 0) == pytest.approx(
        zero.learner.backward(batch, 0, zero.learner.adversary.for_step(batch, 0))
    )
    for p, q in zip(plain.learner.params, zero.learner.params, strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6)
    # c = 0: the gradient of the perturbed batch alone
    only = _trainer(_raw("sync", adversarial={"method": "sync", "epsilon": 0.1, "clean_weight": 0.0}))
    deltas = only.learner.adversary.for_step(batch, 0)
    only.learner.backward(batch, 0, deltas)
    plain.learner.opt.zero_grad()
    for (x, y), d in zip(batch.micro, deltas, strict=True):
        F.cross_entropy(plain.learner.model(x + d), y, reduction="sum").div(32).backward()
    for p, q in zip(plain.learner.params, only.learner.params, strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------- resume


def test_conadv_resume_is_exact(tmp_path):
    raw = _raw("conadv")
    raw["checkpoint"] = {"every_steps": 3, "keep": 100}
    runtime = Runtime(storage=str(tmp_path), run_prefix="adv", run_name="adv")
    straight = _trainer(raw, runtime)
    straight.run()
    assert straight.state.step == 8
    folder = os.path.join(str(tmp_path), "adv")
    for name in os.listdir(folder):  # resume at step 3: drop the newer checkpoints
        if name.startswith("checkpoint_step") and int(name[len("checkpoint_step") :][:8]) > 3:
            shutil.rmtree(os.path.join(folder, name))
    again = _trainer(raw, runtime)
    again.run()
    assert again.state.step == 8
    for p, q in zip(straight.learner.params, again.learner.params, strict=True):
        assert torch.equal(p, q)


# --------------------------------------------------------------------------- config


def _root(**train) -> RootConfig:
    raw = {k: dict(v) for k, v in CNN.items()}
    raw["train"].update(train)
    return RootConfig.model_validate(raw)


def test_config_refuses_token_ids_a_zero_epsilon_and_unknown_methods():
    check_combinations(_root(adversarial={"method": "conadv", "epsilon": 0.05}))
    lm = _root(adversarial={"method": "sync"})
    lm.data.name, lm.model.name = "text", "gpt"
    with pytest.raises(ConfigError, match=r"^train\.adversarial\.method: sync .*token ids.*method: none$"):
        check_combinations(lm)
    with pytest.raises(ConfigError, match=r"^train\.adversarial\.epsilon: 0 .*epsilon > 0"):
        check_combinations(_root(adversarial={"method": "conadv", "epsilon": 0}))
    with pytest.raises(ValueError, match="adversarial.method"):
        _root(adversarial={"method": "disadv"})


def test_search_explores_the_method_and_plan_names_it():
    space = parse_space(
        {
            "base": {k: dict(v) for k, v in CNN.items()},
            "objective": {"metric": "val/accuracy", "direction": "maximize"},
            "params": {
                "train.adversarial.method": {"choices": ["none", "sync", "conadv"]},
                "train.adversarial.epsilon": {"low": 0.01, "high": 0.1, "when": "train.adversarial.method != none"},
            },
        }
    )
    cfg = space.config({"train.adversarial.method": "conadv", "train.adversarial.epsilon": 0.05})
    assert (cfg.train.adversarial.method, cfg.train.adversarial.epsilon) == ("conadv", 0.05)
    with pytest.raises(SpaceError, match="train.adversarial.method"):
        parse_space(
            {
                "base": {k: dict(v) for k, v in CNN.items()},
                "objective": {"metric": "val/accuracy", "direction": "maximize"},
                "params": {"train.adversarial.method": {"choices": ["none", "disadv"]}},
            }
        )
    notes = make_plan(cfg).notes
    assert any(n.startswith("adversarial: conadv, epsilon 0.05") for n in notes), notes
    assert not any(n.startswith("adversarial") for n in make_plan(_root()).notes)


def test_the_bench_table_runs_none_sync_and_conadv_through_the_loop(capsys):
    from bench.large_batch import main  # noqa: PLC0415 - the bench module only for this test

    argv = [
        "--tables",
        "conadv",
        "--seeds",
        "1",
        "--adv-epochs",
        "1",
        "--adv-size",
        "320",
        "--adv-batch",
        "128",
        "--adv-time-steps",
        "1",
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| B = ")]
    assert [r.split("|")[1].strip() for r in rows] == [
        "B = 64, none",
        "B = 128, none",
        "B = 128, sync (two passes)",
        "B = 128, conadv",
    ]
    assert "conadv_minus_none_points=" in out
