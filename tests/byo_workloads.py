"""Factories for the tests of users' own models and data (importable as ``tests.byo_workloads:...`` by the Ray workers
too, which get the repository root on their path)."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

import torch
from torch import nn

from trainers.data.config import DataConfig
from trainers.data.datasets import load_data


class DigitsMap(torch.utils.data.Dataset):
    """scikit-learn's digits as a map-style dataset, split exactly as the in-memory path splits them."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, batched: bool) -> None:
        self.x, self.y, self.batched = x, y, batched

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i]

    def __getattr__(self, name: str):
        if name == "__getitems__" and self.__dict__.get("batched"):
            return self._getitems
        raise AttributeError(name)

    def _getitems(self, indices: Sequence[int]):
        idx = torch.as_tensor(list(indices), dtype=torch.long)
        return self.x[idx], self.y[idx]


def digits(seed: int = 0, batched: bool = True):
    """``(train, val)`` of the built-in digits split by ``seed`` (the in-memory path's ``train.seed``)."""
    d = load_data(DataConfig(name="digits"), seed)
    return DigitsMap(d.train_x, d.train_y, batched), DigitsMap(d.val_x, d.val_y, batched)


def mlp(hidden: int = 32) -> nn.Module:
    """The built-in ``mlp`` with ``norm: none`` on 8x8 digits, as a factory."""
    return nn.Sequential(
        nn.Flatten(), nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 10)
    )


class CorruptRecord(DigitsMap):
    """Digits whose record ``bad`` cannot be read: ``__getitem__`` raises on it (a corrupt file in a
    user's dataset, met only when training reaches it)."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, bad: int) -> None:
        super().__init__(x, y, batched=False)
        self.bad = bad

    def __getitem__(self, i: int):
        if i == self.bad:
            raise ValueError(f"corrupt record {i}")
        return self.x[i], self.y[i]


def corrupt_digits(seed: int = 0, bad: int = 100):
    """``(train, val)`` of digits whose training record ``bad`` raises when read."""
    d = load_data(DataConfig(name="digits"), seed)
    return CorruptRecord(d.train_x, d.train_y, bad), DigitsMap(d.val_x, d.val_y, False)


class _Slow(nn.Sequential):
    """A sequential model whose training forward first sleeps ``sleep_s`` (no CPU taken); with
    ``brake`` (a file's path) it sleeps only while that file exists, so a test lifts the brake
    (removes the file) once the event it waits for has happened, instead of waiting out the run."""

    def __init__(self, sleep_s: float, brake: str | None, *layers: nn.Module) -> None:
        super().__init__(*layers)
        self.sleep_s = sleep_s
        self.brake = brake

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and self.sleep_s > 0 and (self.brake is None or os.path.exists(self.brake)):
            time.sleep(self.sleep_s)
        return super().forward(x)


def slow_mlp(hidden: int = 32, sleep_s: float = 0.0, brake: str | None = None) -> nn.Module:
    """:func:`mlp` (same weights, same math) whose every training micro-batch takes at least ``sleep_s``
    (while the file ``brake`` exists, when one is named): a test's run lasts long enough for nodes to
    leave and come back or a server to go away, on any machine's speed, and no longer than it needs."""
    return _Slow(sleep_s, brake, *mlp(hidden))
