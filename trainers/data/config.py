"""The ``data`` section (``DataConfig``, with ``data.loader`` and the augmentation fields) and what
the config checks read of a built-in dataset without loading it (``dataset_info``).

No torch here: the driver validates a config without importing it.  The loaders are in
``trainers/data/datasets.py``, the augmentations in ``trainers/data/augment.py``, the
``DataLoader``'s sampler in ``trainers/data/sampler.py``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from trainers import catalog
from trainers.accel.config import DataDeviceConfig
from trainers.data.shards.manifest import check_corpus, is_uri
from trainers.section import Section

__all__ = [
    "AUGMENT_NAMES",
    "CIFAR_FILES",
    "AugmentConfig",
    "DataConfig",
    "DatasetInfo",
    "LoaderConfig",
    "dataset_info",
    "parse_augment",
]

AUGMENT_NAMES: tuple[str, ...] = ("random_crop", "hflip")
"""The augmentations ``data.augment`` may list (``trainers.data.augment.AUGMENTS``)."""

CIFAR_FILES = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch", "batches.meta"]


def parse_augment(names: Sequence[str] | None) -> list[str]:
    """Check a ``data.augment`` list: known names, none twice; ``ValueError`` naming the field."""
    out: list[str] = []
    for name in names or []:
        if name not in AUGMENT_NAMES:
            raise ValueError(f"data.augment: unknown {name!r}; expected one of {', '.join(AUGMENT_NAMES)}")
        if name in out:
            raise ValueError(f"data.augment: {name!r} is listed twice; list it once")
        out.append(name)
    return out


class AugmentConfig(Section):
    """The augmentation fields of the ``data`` section (``DataConfig`` takes them as a base class)."""

    augment: list[str] = Field(
        default_factory=list,
        description="on-device augmentations, applied in this order: random_crop (zero padding crop_padding), hflip",
    )
    crop_padding: int = Field(default=4, ge=1, description="random_crop: zero padding on each side")

    @field_validator("augment")
    @classmethod
    def _known(cls, v: list[str]) -> list[str]:
        return parse_augment(v)


class LoaderConfig(Section):
    """The ``data.loader`` section: how the ``DataLoader`` of a map-style dataset runs.

    ``workers`` loader processes (0: load in the training process), ``pin_memory`` for faster
    copies to a GPU, ``prefetch`` micro-batches loaded ahead per loader process (PyTorch's
    ``prefetch_factor``; used only when ``workers > 0``).
    """

    workers: int = Field(default=0, ge=0, description="loader processes; 0 = load in the training process")
    pin_memory: bool = Field(default=False, description="page-locked batches, for faster copies to a GPU")
    prefetch: int = Field(
        default=2,
        ge=1,
        description="micro-batches loaded ahead per loader process (prefetch_factor; only with workers > 0)",
    )


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
    root: str | None = Field(
        default=None,
        description="dataset directory (cifar10); token_shards: the folder or object-store prefix (s3://...) of the "
        "shards and their manifest.json",
    )
    val_fraction: float = Field(default=0.2, gt=0.0, lt=1.0, description="share of the training set held out")
    val_split: Literal["fraction", "test"] = Field(
        default="fraction",
        description="fraction: hold out val_fraction of the training set; test: validate "
        "on the official test set (cifar10), train on the whole training set",
    )
    # text only: byte-level tokens of a local text (default: Python's own standard library sources)
    path: str | None = Field(default=None, description="text: a text file (default: stdlib sources)")
    context: int = Field(default=128, gt=0, description="text, token_shards: tokens per sequence (T)")
    # token_shards only: shards of token ids under data.root (trainers/data/shards/)
    shard_block: int = Field(
        default=4,
        ge=1,
        description="token_shards: shards whose windows are shuffled together (a global batch reads <= 2x)",
    )
    cache_bytes: int = Field(
        default=4 << 30,
        gt=0,
        description="token_shards in an object store: bytes of shards each worker keeps on its disk (the block read "
        "now and the next one)",
    )
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
        if self.name == catalog.TOKENS.name and self.root and "://" not in self.root:
            self.root = os.path.abspath(os.path.expanduser(self.root))  # workers may start elsewhere
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
        if self.name == catalog.TOKENS.name:
            self._check_shards()
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

    def _check_shards(self) -> None:
        """The manifest, every shard's presence and size, the context, and a cache that holds two blocks."""
        if not self.root:
            raise ValueError(
                "data.root: required for token_shards; set it to the folder or s3:// prefix holding manifest.json "
                "(python -m orchestrator tokens prepare SRC... --out DIR writes one)"
            )
        m = check_corpus(self.root, self.context)
        if is_uri(self.root):
            largest = max(s.bytes for s in m.shards)
            need = (2 * min(self.shard_block, len(m.shards)) + 1) * largest
            if self.cache_bytes < need:
                raise ValueError(
                    f"data.cache_bytes: {self.cache_bytes} cannot hold the block read now and the next "
                    f"({self.shard_block} shards each, data.shard_block) plus a validation shard, {need} bytes at "
                    f"the largest shard's {largest}; raise data.cache_bytes to at least {need} or lower "
                    "data.shard_block"
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
