"""This rank's micro-batches of the global data order, for a ``torch.utils.data.DataLoader``.

Map-style datasets (a user's factory, the built-in ``text`` set) are served through a plain
``DataLoader`` so that loading, collation and host-to-device copies overlap the step.  The order
stays ours: :class:`GlobalBatchSampler` walks the epoch's permutation with the very functions of
the in-memory path (:func:`trainers.data.order.epoch_permutation`, :func:`~trainers.data.order.global_batch`,
:func:`~trainers.data.order.slice_bounds`, :func:`~trainers.data.order.micro_batches`), so rank ``r`` of ``W``
trains on exactly the ids the tensor-indexing path would give it, the global batch is the same at
every W, and a checkpoint needs only ``(epoch, cursor)`` to resume exactly at another W
(docs/architecture.md, "data order").  Ray Data's ``streaming_split`` is deliberately not used to
drive the order: its rows per rank depend on timing and it has no open-source mid-epoch resume.

Prefetching when B changes.  A ``DataLoader`` pulls index lists from its batch sampler ahead of
the consumer (``prefetch_factor * num_workers`` lists in flight), so the sampler has to know B
for the steps ahead.  The choice made here: the sampler is *planned* at a position with one B
(:meth:`GlobalBatchSampler.plan`) and then yields every global batch at that B, epoch after
epoch; :class:`RankLoader` asks for "the next global batch of size B", and when B differs from the
planned one it re-plans from its current position and restarts the loader's iterator, which
drops what was prefetched at the old B (with ``persistent_workers`` the worker processes stay;
PyTorch's ``_MultiProcessingDataLoaderIter._reset`` discards the outstanding results).  B
changes a handful of times per run (a schedule's milestones, the noise-scale policy's growth
steps), so the lost prefetch is a few micro-batches per change, while a sampler that asked the
loop for B at every step could not run ahead at all.

Batched fetching.  PyTorch's fetcher calls ``dataset.__getitems__(indices)`` when the dataset has
it and passes the result to ``collate_fn``.  :func:`collate` accepts both forms: a list of
``(input, target)`` samples (PyTorch's contract, stacked by ``default_collate``) or an already
batched ``(inputs, targets)`` tuple whose leading dimension is the micro-batch (returned as is).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Sampler
from torch.utils.data._utils.collate import default_collate
from torch.utils.data._utils.pin_memory import pin_memory

from trainers.data.config import LoaderConfig
from trainers.data.order import epoch_permutation, global_batch, micro_batches, slice_bounds

PLAN_SAMPLES = 8192
"""About how many samples of global batches :class:`RankLoader` plans at a time with ``workers: 0``."""


def rank_micro_batches(
    ids: np.ndarray, rank: int, world: int, max_local_batch: int, split_single: bool = False
) -> list[np.ndarray]:
    """Rank ``rank``'s micro-batches of the global batch ``ids``, as the in-memory loop cuts them.

    The slice is ``ids[slice_bounds(len(ids), rank, world)]``, split by ``micro_batches`` into at
    most ``max_local_batch`` ids each.  ``split_single`` reproduces the loop's rule for the
    noise-scale estimate at W=1: a slice that would be one micro-batch of at least two samples is
    cut in two (``micro_batches(mine, ceil(len/2))``).  An empty slice (B < W) gives ``[]``.
    """
    lo, hi = slice_bounds(len(ids), rank, world)
    mine = ids[lo:hi]
    micros = micro_batches(mine, max_local_batch)
    if split_single and world == 1 and len(micros) == 1 and len(mine) >= 2:
        micros = micro_batches(mine, (len(mine) + 1) // 2)
    return micros


@dataclass(frozen=True)
class PlannedStep:
    """One global batch as planned: where it starts and what this rank trains on."""

    epoch: int
    cursor: int  # samples of the epoch consumed before this batch
    ids: np.ndarray  # the whole global batch (every rank's share), in order
    micro: list[np.ndarray]  # this rank's micro-batches (may be empty)

    @property
    def next_position(self) -> tuple[int, int]:
        return self.epoch, self.cursor + len(self.ids)


class GlobalBatchSampler(Sampler[list[int]]):
    """Yields this rank's micro-batches (lists of dataset indices) of the global data order.

    For a dataset of ``n`` training samples, starting at ``(epoch, cursor)`` with global batch
    ``batch_size``: for each global batch ``ids = global_batch(epoch_permutation(seed, epoch, n),
    cursor, B)`` it yields :func:`rank_micro_batches` of ``ids`` in order, advances the cursor by
    ``len(ids)`` and, at the end of an epoch, goes on at ``(epoch + 1, 0)``.  ``epochs`` bounds
    how many epochs one iteration covers (``None``: endless, what :class:`RankLoader` uses).
    Ranks with an empty slice yield nothing for that batch; :meth:`steps` gives the same plan
    with the batch boundaries, so a consumer knows how many micro-batches make each step.
    """

    def __init__(
        self,
        n: int,
        *,
        seed: int,
        rank: int,
        world: int,
        max_local_batch: int,
        batch_size: int,
        epoch: int = 0,
        cursor: int = 0,
        epochs: int | None = 1,
        split_single: bool = False,
        order: Callable[[int, int, int], np.ndarray] | None = None,
    ) -> None:
        if n <= 0:
            raise ValueError(f"n: the dataset is empty (n={n})")
        if not 0 <= rank < world:
            raise ValueError(f"rank: must be in [0, {world}), got {rank}")
        if max_local_batch < 1:
            raise ValueError(f"max_local_batch: must be >= 1, got {max_local_batch}")
        self.n, self.seed, self.rank, self.world = int(n), int(seed), int(rank), int(world)
        self.max_local_batch, self.split_single = int(max_local_batch), bool(split_single)
        self.epochs = epochs
        # ``order(seed, epoch, n)``: the epoch's permutation (default :func:`epoch_permutation`); a
        # dataset with a locality-aware order of its own (trainers/data/shards) gives its ``epoch_order``
        self.order = order or epoch_permutation
        self.epoch, self.cursor, self.batch_size = 0, 0, 1
        self._cut_cache: dict[int, list[tuple[int, int]]] = {}
        self.plan(epoch=epoch, cursor=cursor, batch_size=batch_size)

    def plan(self, *, epoch: int, cursor: int, batch_size: int) -> None:
        """Set where the next iteration starts and the global batch it uses throughout."""
        if batch_size < 1:
            raise ValueError(f"batch_size: must be >= 1, got {batch_size}")
        if not 0 <= cursor <= self.n:
            raise ValueError(f"cursor: must be in [0, {self.n}], got {cursor}")
        if cursor == self.n:  # an epoch that just ended: go on at the next one
            epoch, cursor = epoch + 1, 0
        self.epoch, self.cursor, self.batch_size = int(epoch), int(cursor), int(batch_size)

    def _cuts(self, batch_len: int) -> list[tuple[int, int]]:
        """Where this rank's micro-batches of a global batch of ``batch_len`` lie in it: :func:`rank_micro_batches`
        of ``arange(batch_len)`` (each is a contiguous range), computed once per length."""
        cuts = self._cut_cache.get(batch_len)
        if cuts is None:
            micro = rank_micro_batches(
                np.arange(batch_len), self.rank, self.world, self.max_local_batch, self.split_single
            )
            cuts = self._cut_cache[batch_len] = [(int(m[0]), int(m[-1]) + 1) for m in micro]
        return cuts

    def steps(self) -> Iterator[PlannedStep]:
        """The planned global batches from the planned position, with this rank's micro-batches."""
        epoch, cursor = self.epoch, self.cursor
        last = None if self.epochs is None else self.epoch + self.epochs
        while last is None or epoch < last:
            perm = self.order(self.seed, epoch, self.n)
            while cursor < self.n:
                ids = global_batch(perm, cursor, self.batch_size)
                yield PlannedStep(epoch, cursor, ids, [ids[a:b] for a, b in self._cuts(len(ids))])
                cursor += len(ids)
            epoch, cursor = epoch + 1, 0

    def __iter__(self) -> Iterator[list[int]]:
        for step in self.steps():
            for mb in step.micro:
                yield mb.tolist()

    def __len__(self) -> int:
        """Micro-batches one iteration yields (only for a bounded number of ``epochs``)."""
        if self.epochs is None:
            raise TypeError("an endless GlobalBatchSampler (epochs=None) has no length")
        return sum(len(s.micro) for s in self.steps())


def collate(data: Any) -> Any:
    """Collate what the fetcher got: a list of samples, or an already batched ``(inputs, targets)``.

    A ``list`` is PyTorch's ``__getitems__`` contract (one sample per index) and goes through
    ``default_collate``; a ``tuple`` of tensors/arrays is a batch a dataset made in one call
    (the built-in text set does) and is returned as tensors without copying.
    """
    if isinstance(data, tuple) and data and all(isinstance(t, (torch.Tensor, np.ndarray)) for t in data):
        return tuple(torch.as_tensor(t) for t in data)
    return default_collate(data)


def fetch(dataset: Any, indices: Sequence[int]) -> Any:
    """Load ``indices`` in this process the way the ``DataLoader`` would (``__getitems__`` if present)."""
    getitems = getattr(dataset, "__getitems__", None)
    data = getitems(list(indices)) if getitems else [dataset[i] for i in indices]
    return collate(data)


@dataclass
class GlobalBatch:
    """One step's data on this rank: the global batch ids and this rank's loaded micro-batches."""

    epoch: int
    cursor: int
    ids: np.ndarray
    micro_ids: list[np.ndarray]
    micro: list[Any]  # the collated (inputs, targets) of each micro-batch, in order

    @property
    def local_size(self) -> int:
        return int(sum(len(m) for m in self.micro_ids))


class RankLoader:
    """This rank's micro-batches in the global order; the loop asks for one global batch at a time.

    ``next_global_batch(B)`` returns this rank's micro-batches of the global batch that starts at
    the current position and advances the position (rolling over to the next epoch).  While B
    stays the same the loader plans (and, with loader processes, loads) ahead; a different B
    re-plans from the current position (what was planned or prefetched at the old B is dropped).
    :meth:`seek` moves to a checkpoint's ``(epoch, cursor)``.

    Two ways to load, the same tensors in the same order.  With ``data.loader.workers > 0`` a
    ``DataLoader`` over :class:`GlobalBatchSampler` (its processes load ahead of the step).  With
    ``workers: 0`` there is nothing for a ``DataLoader`` to overlap, so it is skipped: each
    micro-batch is loaded in this process the way its single-process iterator would
    (:func:`fetch`: ``__getitems__`` or one ``__getitem__`` a sample, :func:`collate`, pinned when
    ``pin_memory`` and an accelerator is present) without its per-batch index lists and hooks.  One
    difference: a ``DataLoader`` draws a base seed from torch's global generator at each (re)start
    of its iterator (a change of B, a resume); this path draws nothing, so the model's random
    stream no longer depends on when B changed.

    A dataset may bring its own order and hear where the loop reads: ``dataset.epoch_order(seed,
    epoch, n)`` replaces :func:`epoch_permutation` (still a pure function of ``(seed, epoch)``), and
    ``dataset.reading_at(epoch, cursor)`` is called in this process before each global batch is
    loaded (the token shards prefetch the shards the coming windows need: trainers/data/shards).
    With ``workers: 0`` it may also locate many micro-batches at once: ``dataset.plan_fetch(micro)``
    (a list of id arrays) returns one plan each, and ``dataset.load_planned(plan)`` loads one; the
    loader plans about :data:`PLAN_SAMPLES` samples of global batches at a time (never past an
    epoch's end).
    """

    def __init__(
        self,
        dataset: Any,
        *,
        seed: int,
        rank: int,
        world: int,
        max_local_batch: int,
        config: LoaderConfig | None = None,
        split_single: bool = False,
    ) -> None:
        self.dataset = dataset
        self.config = config or LoaderConfig()
        self.sampler = GlobalBatchSampler(
            len(dataset),
            seed=seed,
            rank=rank,
            world=world,
            max_local_batch=max_local_batch,
            batch_size=1,
            epochs=None,
            split_single=split_single,
            order=getattr(dataset, "epoch_order", None),
        )
        self._reading_at = getattr(dataset, "reading_at", None)
        workers = self.config.workers
        self.loader: DataLoader | None = None
        if workers > 0:
            self.loader = DataLoader(
                dataset,
                batch_sampler=self.sampler,
                num_workers=workers,
                collate_fn=collate,
                pin_memory=self.config.pin_memory,
                prefetch_factor=self.config.prefetch,
                persistent_workers=True,
            )
        self._pin = self.config.pin_memory and torch.accelerator.is_available()
        self._plan_fetch = getattr(dataset, "plan_fetch", None)
        self._load_planned = getattr(dataset, "load_planned", None)
        if self._plan_fetch is None or self._load_planned is None:
            self._plan_fetch = self._load_planned = None
        self._ahead: deque[tuple[PlannedStep, list[Any]]] = deque()
        self.epoch, self.cursor = 0, 0
        self._planned_b: int | None = None
        self._steps: Iterator[PlannedStep] | None = None
        self._data: Iterator[Any] | None = None
        self.replans = 0  # how many times a change of B or a seek restarted the plan

    def seek(self, epoch: int, cursor: int) -> None:
        """Continue at ``(epoch, cursor)`` (a resume); the next call re-plans."""
        self.epoch, self.cursor = int(epoch), int(cursor)
        self._planned_b = None

    def _replan(self, batch_size: int) -> None:
        self.sampler.plan(epoch=self.epoch, cursor=self.cursor, batch_size=batch_size)
        self.epoch, self.cursor = self.sampler.epoch, self.sampler.cursor
        self._steps = self.sampler.steps()
        self._ahead.clear()
        if self.loader is not None:
            self._data = iter(self.loader)  # re-iterating resets a persistent iterator: prefetch dropped
        self._planned_b = batch_size
        self.replans += 1

    def _plan_ahead(self, batch_size: int) -> None:
        """The next global batches (about :data:`PLAN_SAMPLES` samples), each with its micro-batches'
        plans: the dataset's ``plan_fetch`` over all of them at once, or the id arrays themselves."""
        assert self._steps is not None
        steps: list[PlannedStep] = []
        while len(steps) < max(1, PLAN_SAMPLES // batch_size):
            steps.append(next(self._steps))
            if steps[-1].next_position[1] >= self.sampler.n:
                break  # the epoch's last batch: the next epoch's order is made when it is read
        if self._plan_fetch is None:
            self._ahead.extend((step, step.micro) for step in steps)
            return
        plans = self._plan_fetch([m for step in steps for m in step.micro])
        at = 0
        for step in steps:
            self._ahead.append((step, plans[at : at + len(step.micro)]))
            at += len(step.micro)

    def _load(self, plan: Any) -> Any:
        data = self._load_planned(plan) if self._load_planned is not None else fetch(self.dataset, plan.tolist())
        return pin_memory(data) if self._pin else data

    def next_global_batch(self, batch_size: int) -> GlobalBatch:
        """This rank's micro-batches of the global batch of ``batch_size`` at the current position."""
        if batch_size != self._planned_b or self._steps is None:
            self._replan(batch_size)
        if self.loader is None:
            if not self._ahead:
                self._plan_ahead(batch_size)
            step, plans = self._ahead.popleft()
            if self._reading_at is not None:
                self._reading_at(step.epoch, step.cursor)
            micro = [self._load(p) for p in plans]
        else:
            assert self._steps is not None and self._data is not None
            step = next(self._steps)
            if self._reading_at is not None:
                self._reading_at(step.epoch, step.cursor)
            micro = [next(self._data) for _ in step.micro]
        self.epoch, self.cursor = step.next_position
        if self.cursor >= self.sampler.n:
            self.epoch, self.cursor = self.epoch + 1, 0
        return GlobalBatch(step.epoch, step.cursor, step.ids, step.micro, micro)

    def fetch(self, ids: Sequence[int] | np.ndarray) -> Any:
        """Load ``ids`` in this process, collated (e.g. one sample for an empty slice's zero backward)."""
        return fetch(self.dataset, np.asarray(ids).tolist())

    def close(self) -> None:
        """Stop the loader's worker processes (they also stop when this object is collected)."""
        self._data = None
        self._steps = None
        self._planned_b = None
        self._ahead.clear()
        if self.loader is not None and getattr(self.loader, "_iterator", None) is not None:
            self.loader._iterator = None  # the last reference: its __del__ shuts the workers down
