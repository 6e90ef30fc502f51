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

Located = tuple[int, np.ndarray, "np.ndarray | None", tuple[tuple[int, int, int], ...]]
"""A micro-batch's windows located (:meth:`TokenWindows.plan_fetch`): its size, each window's index in
its shard grouped by shard, the row of each in the batch (``None``: one shard, in order), and the
runs ``(shard, start, stop)`` of that grouping."""


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
        self._views: dict[int, np.ndarray] | None = None if cache.remote else {}
        if not shuffle:  # validation: no order of its own, nothing to hear
            self.epoch_order = None
            self.reading_at = None
        elif not cache.remote:  # a local folder is read in place: nothing to fetch ahead
            self.reading_at = None

    def __len__(self) -> int:
        return self.n

    def __getstate__(self) -> dict:
        """What a loader process gets: no views (pickled, a view would carry its shard's tokens)."""
        state = dict(self.__dict__)
        state["_views"] = None if state["_views"] is None else {}
        return state

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
        if self._seed is None:
            return
        ahead = shards_ahead(self._seed, epoch, cursor, self.offsets, self.block, ahead=1)
        if ahead != self._ahead:
            self._ahead = ahead
            self.cache.want([self.shards[i] for i in ahead])

    def plan_fetch(self, micro: Sequence[np.ndarray]) -> list[Located]:
        """Locate the windows of many micro-batches in one vectorised pass (what :meth:`load_planned`
        takes, one per micro-batch): each window's shard and index in it, grouped by shard.

        The loop's loader (``RankLoader`` with ``data.loader.workers: 0``) plans a run of global
        batches at once, so a batch's load is a gather per shard it touches and nothing else."""
        sizes = np.fromiter((len(m) for m in micro), dtype=np.int64, count=len(micro))
        if not len(micro):
            return []
        ids = np.concatenate(micro).astype(np.int64, copy=False)
        if not len(ids):
            return [(0, ids, None, ()) for _ in micro]
        if ids.min() < 0 or ids.max() >= self.n:
            raise IndexError(f"window ids outside [0, {self.n})")
        shard = shard_of(self.offsets, ids)
        which = np.repeat(np.arange(len(micro), dtype=np.int64), sizes)
        key = which * len(self.shards) + shard
        order = np.argsort(key, kind="stable")  # by micro-batch, then shard; a shard's windows keep their order
        first = np.cumsum(sizes) - sizes  # each micro-batch's start in ``ids``
        rows = order - first[which[order]]  # the row of each sorted window in its micro-batch
        local = (ids - self.offsets[shard])[order]
        sorted_key = key[order]
        edges = np.flatnonzero(sorted_key[1:] != sorted_key[:-1]) + 1
        run_start = np.concatenate([[0], edges]).astype(np.int64)
        run_stop = np.concatenate([edges, [len(ids)]]).astype(np.int64)
        starts = first.tolist()
        runs: list[list[tuple[int, int, int]]] = [[] for _ in micro]
        head = order[run_start]
        for j, s, a, b in zip(which[head].tolist(), shard[head].tolist(), run_start.tolist(), run_stop.tolist()):
            runs[j].append((s, a - starts[j], b - starts[j]))
        out: list[Located] = []
        for j, (lo, n) in enumerate(zip(starts, sizes.tolist())):
            one = len(runs[j]) <= 1  # one shard (or none): the rows are in order
            out.append((n, local[lo : lo + n], None if one else rows[lo : lo + n], tuple(runs[j])))
        return out

    def _view(self, s: int) -> np.ndarray:
        """Shard ``s`` as its windows, ``(windows, context + 1)``, a strided view (no copy): a window is
        a row, so a batch is a row gather (a copy of ``context + 1`` tokens each), not one index a token."""
        if self._views is not None and s in self._views:  # a local folder's shards stay mapped
            return self._views[s]
        arr = self.cache.array(self.shards[s])
        rows = int(self.offsets[s + 1] - self.offsets[s])
        step = arr.strides[0]
        view = np.ndarray((rows, self.context + 1), arr.dtype, arr, 0, (self.context * step, step))
        if self._views is not None:
            self._views[s] = view
        # a store's: built on each call (under 1 us), a kept view would keep an evicted shard's file mapped
        return view

    def load_planned(self, located: Located) -> tuple[torch.Tensor, torch.Tensor]:
        """One micro-batch located by :meth:`plan_fetch`: ``(inputs, targets)``, int64, ``(n, context)``."""
        n, local, rows, runs = located
        if rows is None:
            w = self._view(runs[0][0])[local].astype(np.int64) if runs else np.empty((0, self.context + 1), np.int64)
        else:
            w = np.empty((n, self.context + 1), dtype=np.int64)
            for s, a, b in runs:
                w[rows[a:b]] = self._view(s)[local[a:b]]
        t = torch.from_numpy(w)
        return t[:, :-1], t[:, 1:]

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self.__getitems__([int(i)])
        return x[0], y[0]

    def __getitems__(self, indices: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """An already batched ``(inputs, targets)``: the ``DataLoader``'s path (loader processes)."""
        return self.load_planned(self.plan_fetch([np.asarray(indices, dtype=np.int64)])[0])


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
