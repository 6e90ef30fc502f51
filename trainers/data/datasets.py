"""The ``data`` section and the built-in datasets, held in memory as tensors.

Small datasets are indexed as tensors with the permutation slice (order.py) instead of a
DataLoader: per-sample collation dominates small models (about 6x here on digits).
"""

from __future__ import annotations

import importlib.util
import math
import os
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field, field_validator, model_validator

from trainers import catalog
from trainers.accel.device import DataDeviceConfig
from trainers.data.augment import AugmentConfig
from trainers.data.sampler import LoaderConfig

CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR_STD = (0.2470, 0.2435, 0.2616)


class DataConfig(DataDeviceConfig, AugmentConfig):
    """The ``data`` section (``device``: trainers/accel/device.py; ``augment``: trainers/data/augment.py)."""

    name: Literal[catalog.DATASET_NAMES] | None = Field(
        default=None, description="a built-in dataset (default digits when no factory is given)"
    )
    factory: str | None = Field(
        default=None,
        description="'package.module:function' returning (train, val) map-style datasets; exclusive with name",
    )
    params: dict[str, Any] = Field(default_factory=dict, description="keyword arguments of the factory")
    loader: LoaderConfig = Field(default_factory=lambda: LoaderConfig(), description="the DataLoader of map-style data")
    root: str | None = Field(default=None, description="dataset directory (cifar10)")
    val_fraction: float = Field(default=0.2, gt=0.0, lt=1.0, description="share of the training set held out")
    val_split: Literal["fraction", "test"] = Field(
        default="fraction",
        description="fraction: hold out val_fraction of the training set; test: validate "
        "on the official test set (cifar10), train on the whole training set",
    )
    # text only: byte-level tokens of a local text (default: Python's own standard library sources)
    path: str | None = Field(default=None, description="text: a text file (default: stdlib sources)")
    context: int = Field(default=128, gt=0, description="text: tokens per sequence (T)")
    # synthetic only: a classification set labelled by a fixed random teacher network
    size: int = Field(default=4096, gt=1, description="synthetic: samples in the set")
    shape: list[int] = Field(default_factory=lambda: [1, 8, 8], description="synthetic: one input's shape")
    num_classes: int = Field(default=10, ge=2, description="synthetic: classes the teacher labels")
    seed: int = Field(default=0, description="synthetic: seed of the inputs and the teacher network")

    @field_validator("shape")
    @classmethod
    def _shape_positive(cls, v: list[int]) -> list[int]:
        if not v or any(d <= 0 for d in v):
            raise ValueError(
                f"must be a non-empty list of positive sizes (got {v}); write e.g. [1, 8, 8] (channels, height, width)"
            )
        return v

    @model_validator(mode="after")
    def _default_name(self) -> DataConfig:
        # name and factory both given, data.val_split against the dataset: orchestrator/config/rules.py
        if self.name is None and self.factory is None:
            self.name = catalog.DEFAULT_DATASET
        return self

    @property
    def builtin(self) -> catalog.BuiltinDataset | None:
        """The built-in dataset ``name`` names (None: a factory's data)."""
        return None if self.name is None else catalog.BUILTIN_DATASETS[self.name]

    @property
    def in_memory(self) -> bool:
        """Whether the training set is held as tensors (the fast indexing path)."""
        return self.factory is None and self.builtin is not None and self.builtin.in_memory

    def check_available(self) -> None:
        """Raise ``ValueError`` if the data cannot be loaded (called before Ray starts)."""
        if self.name == catalog.TEXT.name and self.path and not os.path.isfile(os.path.expanduser(self.path)):
            raise ValueError(
                f"data.path: no text file at {self.path!r}; give a text file, or leave data.path "
                "unset for the corpus of Python's own standard library"
            )
        if self.name == catalog.CIFAR10.name:
            if not self.root:
                raise ValueError("data.root: required for cifar10; set it to the folder holding cifar-10-batches-py")
            folder = os.path.join(os.path.expanduser(self.root), "cifar-10-batches-py")
            missing = [f for f in CIFAR_FILES if not os.path.isfile(os.path.join(folder, f))]
            if missing:
                raise ValueError(
                    f"data.root: no CIFAR-10 at {folder!r} (missing {', '.join(missing)}); "
                    "download cifar-10-python.tar.gz and extract it there"
                )


@dataclass(frozen=True)
class DatasetInfo:
    shape: tuple[int, ...]
    num_classes: int


def dataset_info(cfg: DataConfig) -> DatasetInfo:
    """Input shape and classes of a built-in in-memory dataset (a generated one's: the config's)."""
    entry = cfg.builtin
    if entry is None or entry.shape is None or entry.num_classes is None:
        return DatasetInfo(tuple(cfg.shape), cfg.num_classes)
    return DatasetInfo(entry.shape, entry.num_classes)


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


CIFAR_FILES = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch", "batches.meta"]


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
