"""Noisy concentric rings: sample ``i`` is a 2-D point and the index of the ring it was drawn from.

Each split is generated once from its own seed (a pure function of the parameters), so every
process that calls the factory gets the same data; the orchestrator decides the order.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from torch.utils.data import Dataset


class RingPoints(Dataset):
    """``n`` points on ``classes`` rings of radius 1..classes, with Gaussian noise ``noise``.

    ``__getitem__(i) -> (point [2] float32, ring int64)``; ``__getitems__(indices)`` returns the
    batch ``(points [b, 2], rings [b])`` in one gather.
    """

    def __init__(self, n: int, classes: int, noise: float, seed: int) -> None:
        rng = np.random.default_rng(seed)
        ring = rng.integers(0, classes, size=n)
        angle = rng.uniform(0.0, 2.0 * math.pi, size=n)
        radius = 1.0 + ring + rng.normal(0.0, noise, size=n)
        points = np.stack([radius * np.cos(angle), radius * np.sin(angle)], axis=1) / classes
        self.points = torch.tensor(points, dtype=torch.float32)
        self.rings = torch.tensor(ring, dtype=torch.long)

    def __len__(self) -> int:
        return len(self.rings)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.points[i], self.rings[i]

    def __getitems__(self, indices: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.as_tensor(indices, dtype=torch.long)
        return self.points[idx], self.rings[idx]


def rings(
    n_train: int = 8192, n_val: int = 2048, classes: int = 3, noise: float = 0.15, seed: int = 0
) -> tuple[RingPoints, RingPoints]:
    """The data factory: ``(train, val)``."""
    return RingPoints(n_train, classes, noise, seed), RingPoints(n_val, classes, noise, seed + 1)
