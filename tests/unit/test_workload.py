"""trainers/workload/build.py: built-in and factory workloads, the two batch paths giving the same ids,
the loop's loss and evaluation for any workload, and the driver-side helpers for users' factories."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from orchestrator.api import _record, by_value_fields, resume_hint
from orchestrator.config.code import code_modules, package_folder
from orchestrator.config.schema import validate
from trainers.data.config import DataConfig, LoaderConfig
from trainers.data.datasets import load_data
from trainers.link import metrics as M
from trainers.link.runtime import Runtime
from trainers.loop.config import LoopConfig
from trainers.workload.build import (
    BY_VALUE,
    LoaderBatches,
    TensorBatches,
    _TensorPairs,
    build_workload,
    correct,
    largest_batch,
    train_size,
)
from trainers.workload.factory import FactoryError, token_cross_entropy


def _trainer(raw, functions=None):
    from trainers.loop.trainer import Trainer

    return Trainer(
        LoopConfig.model_validate(raw), Runtime(), rank=0, world=1, device=torch.device("cpu"), functions=functions
    )


def test_defaults_and_loss_by_model():
    cfg = LoopConfig()
    assert (cfg.data.name, cfg.model.name, cfg.data.in_memory) == ("digits", "cnn", True)
    assert cfg.model.loss_name() == "cross_entropy"
    lm = LoopConfig.model_validate({"data": {"name": "text"}, "model": {"name": "lstm"}})
    assert lm.model.loss_name() == "token_cross_entropy" and not lm.data.in_memory
    fac = LoopConfig.model_validate({"data": {"factory": "a.b:c", "params": {"n": 3}}, "model": {"factory": "a.b:m"}})
    assert (fac.data.name, fac.model.name, fac.data.params) == (None, None, {"n": 3})
    assert fac.data.loader == LoaderConfig()


@pytest.mark.parametrize("trial", range(40))
def test_tensor_and_loader_paths_give_the_same_micro_batches(trial):
    """Same (seed, epoch, cursor, B, W, max_local_batch): the same ids and the same tensors on every rank."""
    rng = np.random.default_rng(trial)
    data = load_data(DataConfig(name="digits"), 0)
    train, val = _TensorPairs(data.train_x, data.train_y), _TensorPairs(data.val_x, data.val_y)
    world = int(rng.integers(1, 5))
    bsz, mlb = int(rng.integers(1, 300)), int(rng.integers(1, 64))
    epoch, cursor = int(rng.integers(0, 3)), int(rng.integers(0, data.num_train - 1))
    split = bool(rng.integers(0, 2))
    for rank in range(world):
        a = TensorBatches(data, seed=7, rank=rank, world=world, max_local_batch=mlb, split_single=split)
        b = LoaderBatches(train, val, seed=7, rank=rank, world=world, max_local_batch=mlb, split_single=split)
        pos = (epoch, cursor)
        for _ in range(3):
            x, y = a.next(*pos, bsz), b.next(*pos, bsz)
            np.testing.assert_array_equal(x.ids, y.ids)
            assert [m.tolist() for m in x.micro_ids] == [m.tolist() for m in y.micro_ids]
            for (xa, ya), (xb, yb) in zip(x.micro, y.micro):
                assert torch.equal(xa, xb) and torch.equal(ya, yb)
            cur = pos[1] + len(x.ids)
            pos = (pos[0] + 1, 0) if cur >= data.num_train else (pos[0], cur)
        b.close()


DIGITS_IN_MEMORY = {
    "data": {"name": "digits"},
    "model": {"name": "mlp", "norm": "none", "hidden": 32},
    "optimizer": {"name": "sgd", "lr": 0.05, "mf": 0.9, "base_batch_size": 50},
    "batch": {"size": 50, "max_local_batch": 16},
}
DIGITS_FACTORY = {
    **DIGITS_IN_MEMORY,
    "data": {"factory": "tests.byo_workloads:digits"},
    "model": {"factory": "tests.byo_workloads:mlp", "params": {"hidden": 32}},
}


@pytest.mark.parametrize("policy", [{}, {"policy": "noise_scale", "max_size": 200, "check_every": 2}])
def test_factory_dataloader_path_trains_like_the_in_memory_path(policy):
    """The same data, model and order through a DataLoader: the same losses step by step (the noise
    probe's micro-batch split at W = 1 included)."""
    losses = {}
    for name, raw in (("memory", DIGITS_IN_MEMORY), ("factory", DIGITS_FACTORY)):
        raw = {**raw, "batch": {**raw["batch"], **policy}}
        t = _trainer(raw)
        assert type(t.learner.batches).__name__ == ("TensorBatches" if name == "memory" else "LoaderBatches")
        out = []
        for _ in range(6):
            b = t.learner.batches.next(t.state.epoch, t.state.cursor, t.plan.batch)
            out.append(t.train_step(b))
            t.state.cursor += len(b.ids)
            t.state.step += 1
        out.append(t.evaluate()[M.VAL_LOSS])
        if t.learner.gns is not None:
            out.append(t.learner.gns.b_simple)
        losses[name] = out
        t.close()
    np.testing.assert_allclose(losses["factory"], losses["memory"], rtol=1e-5)
    assert losses["memory"][5] < losses["memory"][0]


def test_language_model_metrics_and_perplexity(tmp_path, monkeypatch):
    monkeypatch.setenv("ELASTIC_CACHE_DIR", str(tmp_path))
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog. " * 200)
    raw = {
        "data": {"name": "text", "path": str(corpus), "context": 16},
        "model": {"name": "gpt", "params": {"n_layer": 1, "n_head": 2, "d_model": 16}},
        "optimizer": {"name": "adamw", "lr": 0.01},
        "batch": {"size": 8, "max_local_batch": 8},
    }
    t = _trainer(raw)
    assert t.work.tokens_per_sample == 16 and t.work.loss_fn is token_cross_entropy
    b = t.learner.batches.next(0, 0, 8)
    t.train_step(b)
    t.state.samples_seen = 8
    m = t.metrics_for_step(1.0)
    assert m[M.BATCH_GLOBAL_TOKENS] == 128 and m[M.TOKENS_SEEN] == 128
    ev = t.evaluate()
    assert ev[M.VAL_PERPLEXITY] == pytest.approx(math.exp(ev[M.VAL_LOSS]))
    # val/loss is the per-sequence mean of token losses over the whole validation split
    model = t.work.model.eval()
    val = t.work.val
    with torch.no_grad():
        x, y = val.__getitems__(list(range(len(val))))
        want = token_cross_entropy(model(x), y).mean().item()
    assert ev[M.VAL_LOSS] == pytest.approx(want, rel=1e-5)
    assert 0.0 <= ev[M.VAL_ACCURACY] <= 1.0  # token accuracy
    t.close()


def test_accuracy_only_for_classes_or_tokens():
    assert correct(torch.tensor([[0.1, 0.9], [0.8, 0.2]]), torch.tensor([1, 1])).item() == 1
    tok = correct(
        torch.zeros(2, 3, 4).scatter_(2, torch.zeros(2, 3, 1, dtype=torch.long), 1.0),
        torch.tensor([[0, 0, 1], [0, 1, 1]]),
    )
    assert tok.item() == pytest.approx(2 / 3 + 1 / 3)
    assert correct(torch.randn(4, 1), torch.randn(4, 1)) is None  # regression: no accuracy


def test_image_model_needs_builtin_data_and_sizes():
    cfg = LoopConfig.model_validate({"data": {"factory": "tests.byo_workloads:digits"}, "model": {"name": "cnn"}})
    with pytest.raises(FactoryError, match="model.name: 'cnn' needs a built-in image dataset"):
        build_workload(cfg)
    assert train_size(cfg) == 1438 == train_size(LoopConfig())
    root = validate({"batch": {"size": 32, "max_local_batch": 16, "policy": "noise_scale", "max_size": 512}})
    assert largest_batch(root.batch) == 512


def _importable(n_train: int = 4):
    return None


def test_fit_records_importable_functions_by_name_and_others_by_value():
    raw, functions = {"model": {"name": "cnn"}}, {}
    _record("data", _importable, raw, functions)
    assert raw["data"]["factory"] == f"{__name__}:_importable" and functions == {}
    _record("model", lambda: None, raw, functions)
    assert "name" not in raw["model"] and raw["model"]["factory"].startswith(BY_VALUE)
    assert "<lambda>" in raw["model"]["factory"] and list(functions) == ["model"]
    assert by_value_fields(raw) == {"model.factory": raw["model"]["factory"]}
    hint = resume_hint("abc123", raw)
    assert "\n" not in hint and "fit(resume='abc123', model_fn=<" in hint
    assert resume_hint("abc123", {"data": {"factory": "a.b:c"}}) is None


def test_rank_0_tells_the_driver_its_training_set_at_the_group_start(monkeypatch):
    """The driver sizes its bar for a factory's data with the count rank 0 sends in PhaseStart."""
    from trainers.link.messages import PhaseStart

    class Started(Exception):
        pass

    def emit(event):
        if isinstance(event, PhaseStart):
            raise Started(event.train_samples)

    t = _trainer(DIGITS_FACTORY)
    monkeypatch.setattr(t, "restore", lambda: False)
    monkeypatch.setattr(t.report, "emit", emit)
    with pytest.raises(Started) as sent:
        t.train()
    assert sent.value.args == (t.work.num_train,) and t.work.num_train == len(t.work.train) > 0
    t.close()


def test_a_by_value_factory_without_its_function_is_a_clear_error():
    cfg = LoopConfig.model_validate({**DIGITS_FACTORY, "model": {"factory": f"{BY_VALUE}__main__.<lambda>"}})
    with pytest.raises(FactoryError, match=r"model.factory: .* was sent by value"):
        build_workload(cfg)
    t = _trainer(
        {**DIGITS_FACTORY, "model": {"factory": f"{BY_VALUE}__main__.<lambda>"}},
        functions={"model": lambda hidden=8: torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10))},
    )
    assert t.train_step(np.arange(50)) > 0
    t.close()


def test_code_modules_ship_packages_that_are_not_installed(tmp_path, monkeypatch):
    pkg = tmp_path / "shipme_pkg17"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "data.py").write_text("def f():\n    return None\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert package_folder("shipme_pkg17.data") == str(pkg.resolve())
    assert package_folder("torch.nn") is None  # installed in site-packages
    assert package_folder("trainers.data.text") is None  # this project's own
    extra = tmp_path / "extra"
    extra.mkdir()
    cfg = validate(
        {
            "data": {"factory": "shipme_pkg17.data:f"},
            "model": {"factory": "torch.nn:Linear"},
            "code": {"py_modules": [str(extra)]},
        }
    )
    assert code_modules(cfg) == [str(extra), str(pkg.resolve())]
    assert code_modules(validate({"data": {"factory": "shipme_pkg17.data:f"}, "code": {"auto": False}})) == []


def test_noise_scale_policy_with_a_language_model(tmp_path, monkeypatch):
    """The noise-scale estimate from per-sequence loss sums (no extra backward) works for the GPT."""
    monkeypatch.setenv("ELASTIC_CACHE_DIR", str(tmp_path))
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"line {i}: the value is {i * 7 % 13}\n" for i in range(600)))
    raw = {
        "data": {"name": "text", "path": str(corpus), "context": 16},
        "model": {"name": "gpt", "params": {"n_layer": 1, "n_head": 2, "d_model": 16}},
        "optimizer": {"name": "adamw", "lr": 0.01},
        "batch": {"size": 16, "max_local_batch": 16, "policy": "noise_scale", "max_size": 64, "check_every": 2},
    }
    t = _trainer(raw)
    assert t.learner.noise is not None
    for _ in range(4):
        b = t.learner.batches.next(t.state.epoch, t.state.cursor, t.plan.batch)
        assert [len(m) for m in b.micro_ids] == [8, 8]  # W = 1: the slice is cut in two small batches
        t.train_step(b)
        t.state.cursor += len(b.ids)
        t.state.step += 1
    assert t.learner.gns.b_simple is not None and math.isfinite(t.learner.gns.b_simple)
    m = t.metrics_for_step(1.0)
    assert M.GNS_B_SIMPLE in m
    t.close()
