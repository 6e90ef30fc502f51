"""trainers/catalog.py is the one home of what a built-in model or dataset is: the product code
names none of them outside it, and each entry agrees with what its builder or loader makes."""

from __future__ import annotations

import ast
import inspect
import pickle
import typing
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from orchestrator.config.prepare import validated
from orchestrator.config.schema import ConfigError
from trainers.catalog import BUILTIN_DATASETS, BUILTIN_MODELS, DATASET_NAMES, MODEL_NAMES
from trainers.data.config import DataConfig, dataset_info
from trainers.data.datasets import load_data
from trainers.workload.build import data_factory, model_factory
from trainers.workload.config import ModelConfig
from trainers.workload.lm_models import LM_MODELS
from trainers.workload.models import MODELS

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("orchestrator", "trainers", "search")
REGISTRY = Path("trainers/catalog.py")
# orchestrator/record/params.py's EXTRA_RULES still compare data.name with these two names; they can
# read the entries instead (``c.data.builtin.inputs == "tokens"``, ``c.data.builtin.generated``)


def named_builtins() -> set[tuple[Path, str]]:
    """``(file, name)`` of every string constant in the product code equal to a built-in's name."""
    names = set(MODEL_NAMES) | set(DATASET_NAMES)
    found = set()
    for package in PRODUCT:
        for path in sorted((ROOT / package).rglob("*.py")):
            relative = path.relative_to(ROOT)
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names:
                    found.add((relative, node.value))
    return found


def test_the_product_code_names_no_builtin_outside_the_catalog():
    outside = {(path, name) for path, name in named_builtins() if path != REGISTRY}
    assert not outside, (
        f"built-in names written out of trainers/catalog.py: {sorted(outside)}; "
        "ask the entry (config.builtin, catalog.model_names/dataset_names) instead"
    )


def test_the_config_accepts_exactly_the_catalogs_names_in_its_order():
    for section, names in ((ModelConfig, MODEL_NAMES), (DataConfig, DATASET_NAMES)):
        literal = next(a for a in typing.get_args(section.model_fields["name"].annotation) if a is not type(None))
        assert typing.get_args(literal) == names


# --------------------------------------------------------------------------- datasets


def _write_tiny_cifar(root: Path, per_batch: int = 4) -> None:
    """A few samples in CIFAR-10's own on-disk format (python pickles of dicts)."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        entry = {
            "data": rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8),
            "labels": rng.integers(0, 10, per_batch).tolist(),
        }
        with open(folder / name, "wb") as f:
            pickle.dump(entry, f)
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump({"label_names": [f"c{i}" for i in range(10)]}, f)


def _small_data(name: str, tmp_path: Path) -> dict:
    """A ``data`` section of each built-in dataset that loads offline in milliseconds."""
    if name == "cifar10":
        _write_tiny_cifar(tmp_path)
        return {"name": name, "root": str(tmp_path)}
    if name == "text":
        (tmp_path / "corpus.txt").write_text("the quick brown fox jumps over the lazy dog\n" * 40)
        return {"name": name, "path": str(tmp_path / "corpus.txt"), "context": 16}
    if name == "token_shards":
        from trainers.data.shards.prepare import prepare

        (tmp_path / "corpus.txt").write_text("the quick brown fox jumps over the lazy dog\n" * 40)
        prepare([str(tmp_path / "corpus.txt")], str(tmp_path / "shards"), shard_tokens=400, progress=False)
        return {"name": name, "root": str(tmp_path / "shards"), "context": 16}
    if name == "synthetic":
        return {"name": name, "size": 64, "shape": [2, 3, 3], "num_classes": 4}
    return {"name": name}


SMALL_DATA_KNOWN = ("digits", "synthetic", "cifar10", "text", "token_shards")


def test_every_dataset_has_a_small_case_here():
    assert set(SMALL_DATA_KNOWN) == set(BUILTIN_DATASETS), "give _small_data a case for the new dataset"


@pytest.mark.parametrize("name", DATASET_NAMES)
def test_a_dataset_loads_as_its_entry_says(name, tmp_path, monkeypatch):
    monkeypatch.setenv("ELASTIC_CACHE_DIR", str(tmp_path / "cache"))
    entry = BUILTIN_DATASETS[name]
    cfg = DataConfig(**_small_data(name, tmp_path))
    assert cfg.builtin is entry and cfg.in_memory == entry.in_memory
    cfg.check_available()
    if not entry.in_memory:
        load, params = data_factory(cfg, seed=0)
        x, _ = load(**params)[0][0]
        assert entry.inputs == "tokens" and x.dtype == torch.int64 and tuple(x.shape) == (cfg.context,)
        return
    data = load_data(cfg, split_seed=0)
    shape = entry.shape if entry.shape is not None else tuple(cfg.shape)
    classes = entry.num_classes if entry.num_classes is not None else cfg.num_classes
    assert tuple(data.train_x.shape[1:]) == shape == dataset_info(cfg).shape
    assert (entry.inputs == "image") == (len(shape) == 3 and entry.shape is not None)
    assert int(data.train_y.max()) < classes == dataset_info(cfg).num_classes
    total = data.num_train + len(data.val_y)
    if entry.generated:
        assert total == cfg.size and entry.train_samples is None
    elif not entry.needs_root:  # a set in files is a tiny copy here, not the real one
        assert total == entry.train_samples


@pytest.mark.parametrize("name", DATASET_NAMES)
def test_only_a_dataset_with_a_test_set_validates_on_it(name, tmp_path):
    entry = BUILTIN_DATASETS[name]
    section = {**_small_data(name, tmp_path), "val_split": "test"}
    if entry.test_samples is None:
        with pytest.raises(ConfigError, match=r"^data\.val_split: test needs a dataset with an official test set"):
            validated({"data": section})
        return
    validated({"data": section})
    data = load_data(DataConfig(**section), split_seed=0)
    assert len(data.val_y) == 4  # the tiny copy's test batch


# --------------------------------------------------------------------------- models


def _build(name: str, device: str, **fields) -> nn.Module:
    """The built-in model through the builder the runs use (model_factory), on 3x8x8 images or text."""
    entry = BUILTIN_MODELS[name]
    data = (
        DataConfig(name="text", context=16)
        if entry.language_model
        else DataConfig(name="synthetic", shape=[3, 8, 8], num_classes=10)
    )
    fn, params = model_factory(ModelConfig(name=name, **fields), data)
    with torch.device(device):
        return fn(**params)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_a_model_has_one_builder_of_its_kind(name):
    entry = BUILTIN_MODELS[name]
    assert (name in LM_MODELS) == entry.language_model
    assert (name in MODELS) == (not entry.language_model)
    builder = LM_MODELS.get(name)
    assert entry.uses_context == (builder is not None and "context" in inspect.signature(builder).parameters)


def test_every_builder_has_an_entry():
    assert set(MODELS) | set(LM_MODELS) == set(BUILTIN_MODELS)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_a_model_takes_the_inputs_its_entry_says(name):
    entry = BUILTIN_MODELS[name]
    model = _build(name, "meta")
    assert entry.image == any(isinstance(m, nn.Conv2d) for m in model.modules())
    if entry.language_model:
        assert model(torch.zeros((2, 16), dtype=torch.long, device="meta")).shape == (2, 16, 256)
        return
    assert model(torch.zeros((2, 3, 8, 8), device="meta")).shape == (2, 10)
    build_flat, _ = model_factory(ModelConfig(name=name), DataConfig(name="synthetic", shape=[5], num_classes=10))
    with torch.device("meta"):
        if entry.inputs == "any":
            assert build_flat()(torch.zeros((2, 5))).shape == (2, 10)
        else:
            with pytest.raises(RuntimeError):
                build_flat()(torch.zeros((2, 5)))


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_a_model_reads_the_fields_its_entry_says(name):
    entry = BUILTIN_MODELS[name]

    def size(model: nn.Module) -> int:
        return sum(p.numel() for p in model.parameters())

    assert entry.uses_hidden == (size(_build(name, "meta", hidden=16)) != size(_build(name, "meta", hidden=64)))
    if entry.language_model:
        assert not entry.residual and not entry.small
        return
    zeroed = _build(name, "cpu", zero_init_residual=True)
    starts_at_zero = any(isinstance(m, nn.BatchNorm2d) and not m.weight.any() for m in zeroed.modules())
    assert entry.residual == starts_at_zero
    # small: built and run on the CPU in milliseconds by the config checks
    assert entry.small == (size(_build(name, "meta")) < 1_000_000)


def test_the_default_names_are_entries():
    assert ModelConfig().builtin is not None and DataConfig().builtin is not None
