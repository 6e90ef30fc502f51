"""The token shards as map-style windows in the global data order (``data.name`` of the catalog's
``TOKENS`` entry).

``TokenWindows`` is what the loop's ``RankLoader`` reads (trainers/data/sampler.py): sample ``i`` is a
window of ``context + 1`` tokens (``x = w[:-1]``, ``y = w[1:]``), ``epoch_order`` replaces the global
permutation by the shard-local one of ``trainers/data/shards/order.py`` (still a pure function of
``(seed, epoch)``: the same global batches at every W, a checkpoint of ``(epoch, cursor)``), and
``reading_at`` tells the shard cache which shards the coming windows need so it fetches them ahead.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from trainers.data.shards.cache import ShardCache
from trainers.data.shards.manifest import Manifest, Shard, check_context, read_manifest, windows_in
from trainers.data.shards.order import epoch_order, shard_of, shards_ahead, window_offsets

DEFAULT_CACHE_BYTES = 4 << 30


class TokenWindows(torch.utils.data.Dataset):
    """Windows of ``context + 1`` tokens at stride ``context`` in each of ``shards`` (none crosses two).

    ``shuffle``: the training split's order (``epoch_order``, ``reading_at``); validation is read in
    its plain order, window after window."""

    def __init__(self, cache: ShardCache, shards: Sequence[Shard], context: int, block: int, shuffle: bool) -> None:
        self.cache, self.shards, self.context, self.block = cache, tuple(shards), int(context), int(block)
        self.offsets = window_offsets([windows_in(s.tokens, self.context) for s in self.shards])
        self.n = int(self.offsets[-1])
        self._span = np.arange(self.context + 1)
        self._seed: int | None = None
        self._order: tuple[tuple[int, int], np.ndarray] | None = None
        self._ahead: list[int] = []
        if not shuffle:  # validation: no order of its own, nothing to hear
            self.epoch_order = None
            self.reading_at = None

    def __len__(self) -> int:
        return self.n

    def epoch_order(self, seed: int, epoch: int, n: int) -> np.ndarray:
        """The epoch's windows: shards permuted, windows shuffled within blocks of ``block`` shards."""
        assert n == self.n, f"the sampler counts {n} windows, the shards hold {self.n}"
        self._seed = int(seed)  # what reading_at derives the shards ahead from
        if self._order is None or self._order[0] != (seed, epoch):
            self._order = ((seed, epoch), epoch_order(seed, epoch, self.offsets, self.block))
        return self._order[1]

    def reading_at(self, epoch: int, cursor: int) -> None:
        """The loop is about to read the global batch at ``(epoch, cursor)``: keep the shards of its
        block and the next, and fetch them ahead (a remote corpus)."""
        if self._seed is None or not self.cache.remote:
            return  # a local folder is read in place: nothing to fetch
        ahead = shards_ahead(self._seed, epoch, cursor, self.offsets, self.block, ahead=1)
        if ahead != self._ahead:
            self._ahead = ahead
            self.cache.want([self.shards[i] for i in ahead])

    def _windows(self, ids: np.ndarray) -> np.ndarray:
        if len(ids) and (ids.min() < 0 or ids.max() >= self.n):
            raise IndexError(f"window ids outside [0, {self.n})")
        shard = shard_of(self.offsets, ids)
        starts = (ids - self.offsets[shard]) * self.context
        first = int(shard[0]) if len(ids) else 0
        if len(ids) and (shard == first).all():  # the common case in a block of few shards: one gather
            return self.cache.array(self.shards[first])[starts[:, None] + self._span].astype(np.int64)
        out = np.empty((len(ids), self.context + 1), dtype=np.int64)
        for s in np.unique(shard):
            rows = np.nonzero(shard == s)[0]
            out[rows] = self.cache.array(self.shards[int(s)])[starts[rows, None] + self._span]
        return out

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        w = torch.from_numpy(self._windows(np.asarray([int(i)], dtype=np.int64))[0])
        return w[:-1], w[1:]

    def __getitems__(self, indices: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        w = torch.from_numpy(self._windows(np.asarray(indices, dtype=np.int64)))
        return w[:, :-1], w[:, 1:]


def load_tokens(
    root: str,
    *,
    context: int = 128,
    val_fraction: float = 0.2,
    block: int = 4,
    cache_bytes: int = DEFAULT_CACHE_BYTES,
    cache_dir: str | None = None,
    manifest: Manifest | None = None,
) -> tuple[TokenWindows, TokenWindows]:
    """``(train, val)`` windows of the corpus at ``root``: validation is the last shards
    (:meth:`Manifest.split`), training the others (read in the shard-local order of the sampler's seed)."""
    m = manifest or read_manifest(root)
    check_context(m, context)
    cache = ShardCache(m, cache_bytes, cache_dir)
    train_shards, val_shards = m.split(val_fraction)
    train = TokenWindows(cache, train_shards, context, block, shuffle=True)
    return train, TokenWindows(cache, val_shards, context, block, shuffle=False)
