"""The built-in datasets, held in memory as tensors (the ``data`` section: ``trainers/data/config.py``).

Small datasets are indexed as tensors with the permutation slice (order.py) instead of a
DataLoader: per-sample collation dominates small models (about 6x here on digits).
"""

from __future__ import annotations

import importlib.util
import math
import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from trainers import catalog
from trainers.data.config import DataConfig, DatasetInfo, dataset_info

CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR_STD = (0.2470, 0.2435, 0.2616)


@dataclass
class InMemoryData:
    """Train and validation tensors with their sample ids (row numbers in the full set).

    ``mean``/``std`` (per channel) are set when the inputs are raw uint8 pixels (``load_data(...,
    raw=True)``): the consumer then normalises each batch, ``(x / 255 - mean) / std``
    (:class:`~trainers.data.pipeline.InputPipeline`)."""

    train_x: torch.Tensor
    train_y: torch.Tensor
    val_x: torch.Tensor
    val_y: torch.Tensor
    info: DatasetInfo
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None

    @property
    def num_train(self) -> int:
        return int(self.train_y.shape[0])


# --------------------------------------------------------------------------- loaders


def digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits (8x8 images, 0..16, and their labels), read from the CSV file
    it ships, without importing scikit-learn (1.2 s of a worker's start here); its own loader
    where the file is not found."""

    spec = importlib.util.find_spec("sklearn")  # finds the package without running it
    path = os.path.join(os.path.dirname(spec.origin), "datasets", "data", "digits.csv.gz") if spec else ""
    if not os.path.isfile(path):
        from sklearn.datasets import load_digits

        d = load_digits()
        return d.data, d.target
    table = np.loadtxt(path, delimiter=",")  # 64 pixels, then the label, per row
    return table[:, :-1], table[:, -1].astype(np.int64)


def _load_digits() -> tuple[torch.Tensor, torch.Tensor]:
    pixels, labels = digits_arrays()
    x = torch.tensor(pixels, dtype=torch.float32).reshape(-1, 1, 8, 8) / 16.0
    x = (x - 0.3) / 0.4  # roughly zero mean, unit variance
    return x, torch.tensor(labels, dtype=torch.long)


def _load_synthetic(cfg: DataConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs ~ N(0, 1); labels = argmax of a fixed random two-layer teacher."""
    g = torch.Generator().manual_seed(cfg.seed + 12345)
    shape = tuple(cfg.shape)
    x = torch.randn((cfg.size, *shape), generator=g)
    d_in = math.prod(shape)
    hidden = 64
    w1 = torch.randn(d_in, hidden, generator=g) / math.sqrt(d_in)
    w2 = torch.randn(hidden, cfg.num_classes, generator=g) / math.sqrt(hidden)
    logits = torch.tanh(x.reshape(cfg.size, -1) @ w1) @ w2
    return x, logits.argmax(dim=1)


def _load_cifar10(cfg: DataConfig, train: bool = True, raw: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """CIFAR-10's training batches (``train=False``: the official test batch) through torchvision's
    own loader, from a local root; normalised float32 inputs, or the raw uint8 pixels when ``raw``.

    torchvision checks the md5 of each file against the official release; we check
    only that the files are there, so a small set in the same on-disk format (what
    the tests write) loads through the same code.  Nothing is downloaded.
    """
    from torchvision.datasets import CIFAR10

    class _LocalCIFAR10(CIFAR10):
        # Same files and parsing as torchvision's loader; md5=None checks presence only.
        train_list = [[name, None] for name, _ in CIFAR10.train_list]
        test_list = [[name, None] for name, _ in CIFAR10.test_list]
        meta = {**CIFAR10.meta, "md5": None}

    ds = _LocalCIFAR10(root=os.path.expanduser(cfg.root or ""), train=train, download=False)
    pixels = torch.from_numpy(np.ascontiguousarray(ds.data)).permute(0, 3, 1, 2)
    if raw:
        return pixels.contiguous(), torch.tensor(ds.targets, dtype=torch.long)
    x = pixels.float() / 255.0
    mean = torch.tensor(CIFAR_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(CIFAR_STD).view(1, 3, 1, 1)
    return (x - mean) / std, torch.tensor(ds.targets, dtype=torch.long)


def load_data(cfg: DataConfig, split_seed: int, raw: bool = False) -> InMemoryData:
    """Load the whole dataset and split it into train/validation by ``split_seed`` (``data.val_split:
    test``: the whole training set, and the official test set as validation).

    ``raw``: CIFAR-10's inputs stay uint8 pixels, with the mean/std to normalise each batch by
    (what the worker loop asks for: 4x less memory, augmentation on raw pixels); the other sets
    are float already and come the same either way."""
    if cfg.name == catalog.DIGITS.name:
        x, y = _load_digits()
    elif cfg.name == catalog.SYNTHETIC.name:
        x, y = _load_synthetic(cfg)
    else:
        x, y = _load_cifar10(cfg, raw=raw)
        stats = (CIFAR_MEAN, CIFAR_STD) if raw else (None, None)
        if cfg.val_split == "test":
            vx, vy = _load_cifar10(cfg, train=False, raw=raw)
            return InMemoryData(x, y, vx, vy, dataset_info(cfg), *stats)
        return _split(x, y, cfg, split_seed, *stats)
    return _split(x, y, cfg, split_seed)


def _split(
    x: torch.Tensor, y: torch.Tensor, cfg: DataConfig, split_seed: int, mean: Any = None, std: Any = None
) -> InMemoryData:
    """Hold out ``round(n * val_fraction)`` samples (at least one), chosen by ``split_seed``."""
    n = int(y.shape[0])
    g = torch.Generator().manual_seed(split_seed)
    order = torch.randperm(n, generator=g)
    n_val = max(1, int(round(n * cfg.val_fraction)))
    val, train = order[:n_val], order[n_val:]
    return InMemoryData(
        x[train].contiguous(),
        y[train].contiguous(),
        x[val].contiguous(),
        y[val].contiguous(),
        dataset_info(cfg),
        mean,
        std,
    )
