"""The windows of token shards and their order in an epoch: a pure function of ``(seed, epoch)``
with the locality an object store needs.

Window ids.  Training shard ``i`` (in manifest order) holds ``n_i`` windows at stride ``context``;
its windows are the ids ``offsets[i] .. offsets[i] + n_i - 1`` of one id space.

Order of an epoch.  The shards are permuted (by ``(seed, epoch)``), cut into blocks of
``block`` consecutive shards of that permutation, and the windows of each block are shuffled
among themselves; the epoch is the blocks one after another.  So the epoch visits every window
exactly once, and a global batch at any cursor draws from one block, or two at a block's edge:
at most ``2 * block`` shards, whatever B and W (a rank's share is a contiguous slice of it).  The
global batch at step t is the same windows at every W, and a checkpoint holds only ``(epoch,
cursor)`` (trainers/data/sampler.py); this module only replaces the permutation.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def window_offsets(counts: Sequence[int]) -> np.ndarray:
    """``[0, n_0, n_0 + n_1, ...]``: where each shard's window ids start (length ``S + 1``)."""
    return np.concatenate([[0], np.cumsum(np.asarray(counts, dtype=np.int64))]).astype(np.int64)


def shard_of(offsets: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """The shard of each window id."""
    return np.searchsorted(offsets, ids, side="right") - 1


def shard_sequence(seed: int, epoch: int, n_shards: int) -> np.ndarray:
    """The shards of an epoch in the order it reads them."""
    rng = np.random.Generator(np.random.PCG64([seed, epoch, 0x5A4D]))
    return rng.permutation(n_shards)


def blocks(seed: int, epoch: int, n_shards: int, block: int) -> list[np.ndarray]:
    """The epoch's blocks of shards, in order."""
    seq = shard_sequence(seed, epoch, n_shards)
    return [seq[i : i + block] for i in range(0, n_shards, block)]


def epoch_order(seed: int, epoch: int, offsets: np.ndarray, block: int) -> np.ndarray:
    """Every window id once: the epoch's blocks in order, each block's windows shuffled among themselves."""
    if block < 1:
        raise ValueError(f"data.shard_block: must be >= 1, got {block}")
    n_shards = len(offsets) - 1
    rng = np.random.Generator(np.random.PCG64([seed, epoch, 0xB10C]))
    out = []
    for group in blocks(seed, epoch, n_shards, block):
        ids = np.concatenate([np.arange(offsets[s], offsets[s + 1], dtype=np.int64) for s in group])
        rng.shuffle(ids)
        out.append(ids)
    return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)


def shards_ahead(seed: int, epoch: int, cursor: int, offsets: np.ndarray, block: int, ahead: int = 1) -> list[int]:
    """The shards of the block that holds position ``cursor`` of the epoch and of the ``ahead``
    blocks after it (into the next epoch when this one ends), in the order they are read: what a
    worker at that position needs now and next.  No window list is built (arithmetic on counts)."""
    n_shards = len(offsets) - 1
    counts = np.diff(offsets)
    out: list[int] = []
    e, pos = epoch, cursor
    while True:
        done = 0
        for group in blocks(seed, e, n_shards, block):
            size = int(counts[group].sum())
            if done + size > pos or out:
                out.extend(int(s) for s in group)
                if len(out) >= (ahead + 1) * block or len(out) >= n_shards:
                    return list(dict.fromkeys(out))[: (ahead + 1) * block]
            done += size
        e, pos = e + 1, 0
