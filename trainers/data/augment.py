"""Data augmentation on the device, whose randomness is a pure function of (seed, epoch, sample id).

``data.augment: [random_crop, hflip]`` is the CIFAR recipe (He et al. 2016, "Deep Residual
Learning for Image Recognition", section 4.2: 4 pixels of zero padding, a random 32x32 crop,
and a random horizontal flip).  Both run on a whole batch at once, on whatever device the batch
is on, with no global RNG: each sample's crop offsets and flip bit come from a counter-based
hash (in the spirit of Salmon et al. 2011, "Parallel random numbers: as easy as 1, 2, 3") of

    (seed, epoch, sample id, stream)

where the sample id is the row of the training set (not its position in a batch) and the
stream tells the draws apart (crop row, crop column, flip).  So a sample is augmented the same
way in a given epoch whatever the world size, the micro-batch cut, the rank that draws it or a
resume in between: resume stays exact (docs/architecture.md), and nothing needs checkpointing.

The hash is ``lowbias32``-style integer mixing (xor-shift, multiply, xor-shift, ...) on 32-bit
values held in int64 with odd multipliers below 2^31, so every product stays below 2^63 and the
result is bit-identical on CPU and GPU.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from trainers.data.config import AugmentConfig, parse_augment

__all__ = [
    "AUGMENTS",
    "Augment",
    "hflip",
    "random_bits",
    "random_crop",
    "uniform_ints",
]

_MASK = 0xFFFFFFFF
_M1, _M2 = 0x7FEB352D, 0x2C1B3C6D  # odd, < 2^31: a 32-bit value times one stays below 2^63
_STREAM_ROW, _STREAM_COL, _STREAM_FLIP = 0x1B873593, 0x68E31DA4, 0x3C6EF372


def _mix(h: torch.Tensor) -> torch.Tensor:
    """One round of 32-bit integer mixing on an int64 tensor of values in [0, 2^32)."""
    h = h ^ (h >> 16)
    h = (h * _M1) & _MASK
    h = h ^ (h >> 15)
    h = (h * _M2) & _MASK
    return h ^ (h >> 16)


def random_bits(seed: int, epoch: int, ids: torch.Tensor, stream: int) -> torch.Tensor:
    """32 pseudo-random bits per sample id (int64 in [0, 2^32)), a pure function of the four
    inputs, computed on ``ids``' device."""
    ids = ids.to(torch.int64) & _MASK
    h = _mix(torch.full_like(ids, (seed ^ 0x9E3779B9) & _MASK))
    h = _mix(h ^ (epoch & _MASK))
    h = _mix(h ^ ids)
    return _mix(h ^ (stream & _MASK))


def uniform_ints(seed: int, epoch: int, ids: torch.Tensor, stream: int, n: int) -> torch.Tensor:
    """An integer in ``[0, n)`` per sample id (the top bits of :func:`random_bits`, scaled: no
    modulo bias beyond 2^-32)."""
    return (random_bits(seed, epoch, ids, stream) * n) >> 32


def random_crop(x: torch.Tensor, ids: torch.Tensor, seed: int, epoch: int, padding: int = 4) -> torch.Tensor:
    """Pad each image of the ``[N, C, H, W]`` batch by ``padding`` zeros on every side, then take the
    ``H x W`` window at offsets ``(dy, dx)``, each uniform in ``[0, 2 * padding]``, per sample.
    Works on any dtype (uint8 raw pixels included) and device; the output is contiguous."""
    if x.dim() != 4:
        raise ValueError(f"random_crop: needs a 4-D [N, C, H, W] batch, got shape {list(x.shape)}")
    if padding <= 0 or x.shape[0] == 0:
        return x
    n, c, h, w = x.shape
    ids = ids.to(x.device)
    dy = uniform_ints(seed, epoch, ids, _STREAM_ROW, 2 * padding + 1)
    dx = uniform_ints(seed, epoch, ids, _STREAM_COL, 2 * padding + 1)
    xp = F.pad(x.contiguous(), (padding, padding, padding, padding))
    rows = (dy.view(n, 1, 1, 1) + torch.arange(h, device=x.device).view(1, 1, h, 1)).expand(n, c, h, w + 2 * padding)
    xp = torch.gather(xp, 2, rows)
    cols = (dx.view(n, 1, 1, 1) + torch.arange(w, device=x.device).view(1, 1, 1, w)).expand(n, c, h, w)
    return torch.gather(xp, 3, cols)


def hflip(x: torch.Tensor, ids: torch.Tensor, seed: int, epoch: int) -> torch.Tensor:
    """Mirror each image of the batch left-right with probability 1/2 (one bit per sample)."""
    if x.dim() < 2 or x.shape[0] == 0:
        return x
    flip = (random_bits(seed, epoch, ids.to(x.device), _STREAM_FLIP) >> 31).bool()
    return torch.where(flip.view(-1, *([1] * (x.dim() - 1))), x.flip(-1), x)


AugmentFn = Callable[[torch.Tensor, torch.Tensor, int, int], torch.Tensor]

#: name (``trainers.data.config.AUGMENT_NAMES``) -> fn(x, ids, seed, epoch) (``random_crop`` with its
#: padding bound by :class:`Augment`)
AUGMENTS: dict[str, AugmentFn] = {
    "random_crop": random_crop,
    "hflip": hflip,
}


class Augment:
    """The configured augmentations as one callable ``(x, ids, epoch) -> x`` over a raw batch.

    ``seed`` is the run's ``train.seed``; ``ids`` the batch's sample ids (rows of the training set),
    a tensor or an array.  Stateless: nothing to checkpoint."""

    def __init__(self, names: Sequence[str], seed: int, padding: int = 4):
        self.names = parse_augment(names)
        self.seed, self.padding = int(seed), int(padding)

    @classmethod
    def from_config(cls, cfg: AugmentConfig, seed: int) -> Augment | None:
        """None when the list is empty (the loop then skips the call)."""
        return cls(cfg.augment, seed, cfg.crop_padding) if cfg.augment else None

    def __bool__(self) -> bool:
        return bool(self.names)

    def __call__(self, x: torch.Tensor, ids: torch.Tensor | np.ndarray | Sequence[int], epoch: int) -> torch.Tensor:
        idx = ids if isinstance(ids, torch.Tensor) else torch.as_tensor(np.asarray(ids, dtype=np.int64))
        idx = idx.to(x.device, torch.int64)
        for name in self.names:
            if name == "random_crop":
                x = random_crop(x, idx, self.seed, epoch, self.padding)
            else:
                x = AUGMENTS[name](x, idx, self.seed, epoch)
        return x
