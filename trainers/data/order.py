"""The data order every worker agrees on: one permutation of the training set per (seed, epoch),
consumed in global batches.

Rank r of W takes a contiguous slice of each, cut into micro-batches of at most ``max_local_batch``.
Only the slicing depends on W, so a checkpoint needs only the cursor (samples consumed in the epoch)
to resume at any W."""

from __future__ import annotations

import math

import numpy as np


def epoch_permutation(seed: int, epoch: int, n: int) -> np.ndarray:
    """The order of the ``n`` training samples in ``epoch``: a function of (seed, epoch) only."""
    rng = np.random.Generator(np.random.PCG64([seed, epoch, 0x5EED]))
    return rng.permutation(n)


def global_batch(perm: np.ndarray, cursor: int, batch_size: int) -> np.ndarray:
    """The next global batch: up to ``batch_size`` ids from ``cursor`` (the last one may be short)."""
    return perm[cursor : cursor + batch_size]


def slice_bounds(batch_len: int, rank: int, world: int) -> tuple[int, int]:
    """Worker ``rank``'s contiguous share of a global batch; the first ``batch_len % world`` get one more."""
    base, extra = divmod(batch_len, world)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def micro_batches(ids: np.ndarray, max_local_batch: int) -> list[np.ndarray]:
    """Split a worker's slice into ``ceil(len/max_local_batch)`` near-equal micro-batches."""
    if len(ids) == 0:
        return []
    if len(ids) <= max_local_batch:
        return [ids]
    n_micro = math.ceil(len(ids) / max_local_batch)
    return [a for a in np.array_split(ids, n_micro)]


def accum_steps(batch_size: int, world: int, max_local_batch: int) -> int:
    """Micro-batches per optimizer step on the rank with the largest slice (rank 0).

    ``max(1, ceil(ceil(B / W) / max_local_batch))``: rank 0's slice of a global batch of
    ``B`` samples has ``ceil(B / W)`` of them (:func:`slice_bounds`), cut into that many
    micro-batches (:func:`micro_batches`; an empty slice still takes one step).  The one
    formula for accumulation steps: the loop's ``batch/accum_steps`` and ``plan`` use it.
    """
    return max(1, math.ceil(math.ceil(batch_size / world) / max_local_batch))


def smallest_micro_batch(batch_len: int, world: int, max_local_batch: int, split_single: bool = False) -> int:
    """The fewest samples any worker puts through the model at once for a global batch of
    ``batch_len`` on ``world`` workers: the smallest micro-batch of :func:`micro_batches` over the
    slices of :func:`slice_bounds`, or 0 when a worker's slice is empty (it then runs one stand-in
    sample to join the all-reduce).  ``split_single``: the noise probe's rule at W = 1, which cuts a
    slice of 2 to ``max_local_batch`` samples in two halves (``trainers/data/sampler.py``).

    Arithmetic only (no arrays): the driver asks it for every batch a config can produce."""
    if batch_len < 1 or world < 1 or max_local_batch < 1:
        raise ValueError(f"need batch_len, world, max_local_batch >= 1, got {batch_len}, {world}, {max_local_batch}")
    if batch_len < world:
        return 0
    base, extra = divmod(batch_len, world)
    smallest = None
    for n in {base, base + 1} if extra else {base}:
        cap = max_local_batch
        if split_single and world == 1 and 2 <= n <= max_local_batch:
            cap = (n + 1) // 2
        # np.array_split of n into ceil(n / cap) parts: the smaller parts hold n // parts samples
        parts = max(1, math.ceil(n / cap))
        size = n // parts
        smallest = size if smallest is None else min(smallest, size)
    return int(smallest)
