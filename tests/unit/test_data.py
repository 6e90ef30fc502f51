"""The data order: one permutation per (seed, epoch), global batches, worker slices, micro-batches."""

import os

import numpy as np
import pytest
import torch

from trainers.data.config import DataConfig
from trainers.data.datasets import CIFAR_MEAN, CIFAR_STD, load_data
from trainers.data.order import epoch_permutation, global_batch, micro_batches, slice_bounds


def test_permutation_depends_only_on_seed_and_epoch():
    a = epoch_permutation(3, 1, 100)
    assert np.array_equal(a, epoch_permutation(3, 1, 100))
    assert not np.array_equal(a, epoch_permutation(3, 2, 100))
    assert not np.array_equal(a, epoch_permutation(4, 1, 100))
    assert sorted(a.tolist()) == list(range(100))


@pytest.mark.parametrize("n,world", [(10, 3), (7, 7), (64, 2), (5, 8), (101, 4)])
def test_slices_cover_batch_exactly_once(n, world):
    bounds = [slice_bounds(n, r, world) for r in range(world)]
    covered = [i for lo, hi in bounds for i in range(lo, hi)]
    assert covered == list(range(n))
    sizes = [hi - lo for lo, hi in bounds]
    assert max(sizes) - min(sizes) <= 1
    assert sizes == sorted(sizes, reverse=True)  # the first ranks take the extra samples


def test_micro_batches_respect_max_and_keep_order():
    ids = np.arange(50)
    parts = micro_batches(ids, 16)
    assert len(parts) == 4
    assert all(len(p) <= 16 for p in parts)
    assert np.array_equal(np.concatenate(parts), ids)
    assert micro_batches(np.arange(0), 16) == []


def test_epoch_consumed_in_global_batches_sees_each_sample_once():
    perm = epoch_permutation(0, 0, 103)
    seen, cursor = [], 0
    while cursor < 103:
        b = global_batch(perm, cursor, 20)
        seen += b.tolist()
        cursor += len(b)
    assert sorted(seen) == list(range(103))


def test_digits_split_is_seeded_and_disjoint():
    cfg = DataConfig(name="digits", val_fraction=0.25)
    a, b = load_data(cfg, 0), load_data(cfg, 0)
    assert torch.equal(a.train_y, b.train_y) and a.info.shape == (1, 8, 8)
    assert a.num_train + len(a.val_y) == 1797
    c = load_data(cfg, 1)
    assert not torch.equal(a.train_x, c.train_x)


def test_synthetic_is_learnable_and_shaped():
    cfg = DataConfig(name="synthetic", size=500, shape=[3, 4, 4], num_classes=5, val_fraction=0.2)
    d = load_data(cfg, 0)
    assert d.train_x.shape[1:] == (3, 4, 4)
    assert d.num_train == 400
    assert set(d.train_y.unique().tolist()) <= set(range(5))
    assert len(d.train_y.unique()) >= 3  # the teacher uses several classes


def _write_tiny_cifar(root, per_batch=6):
    """A tiny dataset in CIFAR-10's own on-disk format (python pickles of dicts)."""
    import os
    import pickle

    folder = os.path.join(root, "cifar-10-batches-py")
    os.makedirs(folder)
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        entry = {
            "data": rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8),
            "labels": rng.integers(0, 10, per_batch).tolist(),
        }
        with open(os.path.join(folder, name), "wb") as f:
            pickle.dump(entry, f)
    with open(os.path.join(folder, "batches.meta"), "wb") as f:
        pickle.dump({"label_names": [f"c{i}" for i in range(10)]}, f)
    return folder


def test_cifar10_loads_through_torchvision_from_local_root(tmp_path):
    _write_tiny_cifar(str(tmp_path))
    cfg = DataConfig(name="cifar10", root=str(tmp_path), val_fraction=0.2)
    cfg.check_available()
    d = load_data(cfg, 0)
    assert d.train_x.shape[1:] == (3, 32, 32)
    assert d.num_train + len(d.val_y) == 30
    assert d.train_x.dtype == torch.float32


def test_cifar10_missing_root_is_a_clear_error(tmp_path):
    cfg = DataConfig(name="cifar10", root=str(tmp_path / "nope"))
    with pytest.raises(ValueError, match="data.root: no CIFAR-10"):
        cfg.check_available()


def test_cifar10_val_split_test_validates_on_the_official_test_batch(tmp_path):
    """data.val_split: test: the whole training set trains, the test batch validates;
    the worker loop's raw form keeps uint8 pixels and normalises them per batch to the same inputs."""
    import pickle

    folder = _write_tiny_cifar(str(tmp_path))
    with open(os.path.join(folder, "test_batch"), "rb") as f:
        test = pickle.load(f)
    cfg = DataConfig(name="cifar10", root=str(tmp_path), val_split="test")
    d = load_data(cfg, 0)
    assert d.num_train == 30 and len(d.val_y) == 6
    assert d.val_y.tolist() == test["labels"]
    want = torch.from_numpy(test["data"].reshape(6, 3, 32, 32)).float() / 255.0
    mean, std = torch.tensor(CIFAR_MEAN).view(1, 3, 1, 1), torch.tensor(CIFAR_STD).view(1, 3, 1, 1)
    assert torch.allclose(d.val_x, (want - mean) / std)
    raw = load_data(cfg, 0, raw=True)
    assert raw.train_x.dtype == torch.uint8 and (raw.mean, raw.std) == (CIFAR_MEAN, CIFAR_STD)
    from trainers.data.pipeline import normalize_pixels

    stats = torch.tensor(CIFAR_MEAN).view(1, 3, 1, 1), torch.tensor(CIFAR_STD).view(1, 3, 1, 1)
    assert torch.equal(normalize_pixels(raw.train_x, *stats), d.train_x)
    assert torch.equal(normalize_pixels(raw.val_x, *stats), d.val_x)
    # the default stays a held-out fraction of the training batches
    assert load_data(DataConfig(name="cifar10", root=str(tmp_path)), 0).num_train == 24


def test_val_split_test_needs_cifar10():
    from orchestrator.config.prepare import validated
    from orchestrator.config.schema import ConfigError

    with pytest.raises(ConfigError, match=r"^data\.val_split: test needs a dataset with an official test set"):
        validated({"data": {"name": "digits", "val_split": "test"}})
    validated({"data": {"name": "cifar10", "root": "/nowhere", "val_split": "test"}})  # the files: check_data_files


def test_the_loop_trains_tiny_cifar_with_the_recipes_input_options(tmp_path):
    """cifar10 with val_split test, augmentation, channels_last and bf16 through the real loop."""
    from trainers.link.runtime import Runtime
    from trainers.loop.config import LoopConfig
    from trainers.loop.trainer import Trainer

    _write_tiny_cifar(str(tmp_path))
    cfg = LoopConfig.model_validate(
        {
            "data": {
                "name": "cifar10",
                "root": str(tmp_path),
                "val_split": "test",
                "augment": ["random_crop", "hflip"],
            },
            "model": {"name": "cnn", "norm": "batch", "hidden": 16, "channels_last": True},
            "batch": {"size": 12, "max_local_batch": 6},
            "optimizer": {"base_batch_size": 12},
            "train": {"precision": "bf16", "epochs": 1},
        }
    )
    t = Trainer(cfg, Runtime(), rank=0, world=1, device=torch.device("cpu"))
    assert t.work.tensors.train_x.dtype == torch.uint8 and t.plan.n == 30
    seen = []
    t.learner.model.register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    loss = t.train_step(np.arange(12))
    assert np.isfinite(loss) and seen[0].dtype == torch.float32
    assert seen[0].is_contiguous(memory_format=torch.channels_last)
    assert abs(float(seen[0].mean())) < 3.0  # normalised, not raw 0..255
    m = t.evaluate()
    assert 0.0 <= m["val/accuracy"] <= 1.0 and np.isfinite(m["val/loss"])
