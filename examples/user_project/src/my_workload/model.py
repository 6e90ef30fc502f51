"""A small residual MLP with LayerNorm (no BatchNorm: results do not depend on the micro-batch size)."""

from __future__ import annotations

import torch
from torch import nn


class Residual(nn.Module):
    """``x + W2 gelu(W1 layernorm(x))``."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.LayerNorm(width), nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x)


class RingNet(nn.Module):
    """Lift a 2-D point to ``width``, ``depth`` residual blocks, classify into ``classes`` rings."""

    def __init__(self, width: int, depth: int, classes: int) -> None:
        super().__init__()
        self.stem = nn.Linear(2, width)
        self.blocks = nn.Sequential(*(Residual(width) for _ in range(depth)))
        self.head = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.stem(x)))


def ring_net(width: int = 64, depth: int = 2, classes: int = 3) -> RingNet:
    """The model factory."""
    return RingNet(width, depth, classes)
