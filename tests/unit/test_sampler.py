"""The batch sampler yields exactly the in-memory path's ids; the RankLoader serves them through a DataLoader."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from trainers.data.config import LoaderConfig
from trainers.data.order import epoch_permutation, global_batch, micro_batches, slice_bounds
from trainers.data.sampler import GlobalBatchSampler, RankLoader, collate, fetch, rank_micro_batches


def in_memory_ids(n, seed, epoch, cursor, B, rank, world, max_local_batch, split_single=False):
    """What trainers/loop/trainer.py trains on for one epoch from ``cursor``: a list of micro-batch id lists."""
    perm = epoch_permutation(seed, epoch, n)
    out = []
    while cursor < n:
        ids = global_batch(perm, cursor, B)
        lo, hi = slice_bounds(len(ids), rank, world)
        mine = ids[lo:hi]
        micros = micro_batches(mine, max_local_batch)
        if split_single and world == 1 and len(micros) == 1 and len(mine) >= 2:
            micros = micro_batches(mine, (len(mine) + 1) // 2)
        out += [m.tolist() for m in micros]
        cursor += len(ids)
    return out


def test_same_ids_as_in_memory_path_over_random_settings():
    rng = np.random.default_rng(0)
    for _ in range(300):
        n = int(rng.integers(1, 300))
        B = int(rng.integers(1, 80))
        world = int(rng.integers(1, 6))
        mlb = int(rng.integers(1, 40))
        cursor = int(rng.integers(0, n + 1))
        seed, epoch = int(rng.integers(0, 5)), int(rng.integers(0, 3))
        split = bool(rng.integers(0, 2))
        for rank in range(world):
            s = GlobalBatchSampler(
                n,
                seed=seed,
                rank=rank,
                world=world,
                max_local_batch=mlb,
                batch_size=B,
                epoch=epoch,
                cursor=cursor,
                split_single=split,
            )
            got = list(s)
            want = in_memory_ids(n, seed, epoch, cursor, B, rank, world, mlb, split)
            if cursor == n:  # an ended epoch continues at the next one
                want = in_memory_ids(n, seed, epoch + 1, 0, B, rank, world, mlb, split)
            assert got == want, (n, B, world, mlb, cursor, rank)
            assert len(s) == len(want)
            assert all(len(m) <= mlb for m in got)


@pytest.mark.parametrize("n,B,world,mlb", [(100, 32, 3, 5), (7, 10, 4, 1), (64, 64, 1, 16), (50, 3, 5, 2)])
def test_union_over_ranks_is_each_global_batch_exactly_once(n, B, world, mlb):
    samplers = [
        GlobalBatchSampler(n, seed=1, rank=r, world=world, max_local_batch=mlb, batch_size=B) for r in range(world)
    ]
    per_rank = [list(s.steps()) for s in samplers]
    assert len({len(p) for p in per_rank}) == 1  # every rank sees the same number of global batches
    perm = epoch_permutation(1, 0, n)
    for k in range(len(per_rank[0])):
        steps = [p[k] for p in per_rank]
        union = np.concatenate([np.concatenate(s.micro) if s.micro else np.array([], dtype=np.int64) for s in steps])
        assert np.array_equal(union, global_batch(perm, k * B, B))  # the batch, once, in order
        assert all(np.array_equal(s.ids, steps[0].ids) for s in steps)


def test_resume_at_a_cursor_continues_the_same_order():
    full = GlobalBatchSampler(90, seed=3, rank=1, world=2, max_local_batch=4, batch_size=12)
    steps = list(full.steps())
    for k in range(len(steps)):
        resumed = GlobalBatchSampler(
            90, seed=3, rank=1, world=2, max_local_batch=4, batch_size=12, cursor=steps[k].cursor
        )
        rest = [m.tolist() for s in steps[k:] for m in s.micro]
        assert list(resumed) == rest


def test_endless_sampler_rolls_over_epochs_and_has_no_length():
    s = GlobalBatchSampler(10, seed=0, rank=0, world=1, max_local_batch=100, batch_size=4, epochs=None)
    it = s.steps()
    got = [next(it) for _ in range(6)]
    assert [(p.epoch, p.cursor) for p in got] == [(0, 0), (0, 4), (0, 8), (1, 0), (1, 4), (1, 8)]
    assert np.array_equal(got[3].ids, epoch_permutation(0, 1, 10)[:4])
    with pytest.raises(TypeError):
        len(s)


def test_bad_arguments_name_the_field():
    with pytest.raises(ValueError, match="^rank"):
        GlobalBatchSampler(10, seed=0, rank=2, world=2, max_local_batch=1, batch_size=1)
    with pytest.raises(ValueError, match="^batch_size"):
        GlobalBatchSampler(10, seed=0, rank=0, world=2, max_local_batch=1, batch_size=0)
    with pytest.raises(ValueError, match="^cursor"):
        GlobalBatchSampler(10, seed=0, rank=0, world=2, max_local_batch=1, batch_size=1, cursor=11)
    with pytest.raises(ValueError, match="^n"):
        GlobalBatchSampler(0, seed=0, rank=0, world=2, max_local_batch=1, batch_size=1)


class Squares(torch.utils.data.Dataset):
    """Map-style: sample i is (tensor([i, i*i]), i % 3)."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return torch.tensor([float(i), float(i * i)]), i % 3


class BatchedSquares(Squares):
    """The same samples, fetched in one call as an already batched (inputs, targets) tuple."""

    calls = 0

    def __getitems__(self, indices):
        type(self).calls += 1
        idx = torch.as_tensor(indices, dtype=torch.float32)
        return torch.stack([idx, idx * idx], dim=1), torch.as_tensor(indices) % 3


def test_collate_accepts_samples_and_batches():
    x, y = collate([Squares(5)[1], Squares(5)[2]])
    assert x.tolist() == [[1.0, 1.0], [2.0, 4.0]] and y.tolist() == [1, 2]
    x2, y2 = fetch(BatchedSquares(5), [1, 2])
    assert torch.equal(x, x2) and torch.equal(y, y2)


def test_dataloader_over_sampler_yields_the_ids_in_order():
    s = GlobalBatchSampler(40, seed=2, rank=0, world=2, max_local_batch=3, batch_size=8)
    want = list(s)
    for ds in (Squares(40), BatchedSquares(40)):
        got = [x[:, 0].long().tolist() for x, _ in DataLoader(ds, batch_sampler=s, collate_fn=collate)]
        assert got == want


def test_batched_getitems_is_one_call_per_micro_batch():
    BatchedSquares.calls = 0
    s = GlobalBatchSampler(40, seed=2, rank=0, world=1, max_local_batch=5, batch_size=10)
    n_micro = len(list(DataLoader(BatchedSquares(40), batch_sampler=s, collate_fn=collate)))
    assert BatchedSquares.calls == n_micro == 8


def run_loader(loader: RankLoader, sizes):
    out = []
    for B in sizes:
        gb = loader.next_global_batch(B)
        out.append(
            (
                gb.epoch,
                gb.cursor,
                gb.ids.tolist(),
                [x[:, 0].long().tolist() for x, _ in gb.micro],
                [m.tolist() for m in gb.micro_ids],
            )
        )
    return out


def expected_steps(n, seed, rank, world, mlb, sizes, epoch=0, cursor=0):
    """Walk the in-memory order with B changing step by step."""
    out = []
    for B in sizes:
        perm = epoch_permutation(seed, epoch, n)
        ids = global_batch(perm, cursor, B)
        micros = [m.tolist() for m in rank_micro_batches(ids, rank, world, mlb)]
        out.append((epoch, cursor, ids.tolist(), micros, micros))
        cursor += len(ids)
        if cursor >= n:
            epoch, cursor = epoch + 1, 0
    return out


SIZES = [4, 4, 6, 6, 6, 2, 9, 9, 9, 9, 9, 3, 3]


@pytest.mark.parametrize("world,rank", [(1, 0), (3, 1), (3, 2)])
def test_rank_loader_follows_changes_of_b_and_epochs(world, rank):
    loader = RankLoader(BatchedSquares(23), seed=5, rank=rank, world=world, max_local_batch=2)
    got = run_loader(loader, SIZES)
    assert got == expected_steps(23, 5, rank, world, 2, SIZES)
    assert loader.replans == 5  # one per run of equal B: 4, 6, 2, 9, 3
    loader.close()


def test_rank_loader_seek_resumes_exactly():
    loader = RankLoader(Squares(23), seed=5, rank=0, world=2, max_local_batch=2)
    first = run_loader(loader, SIZES[:5])
    epoch, cursor = loader.epoch, loader.cursor
    again = RankLoader(Squares(23), seed=5, rank=0, world=2, max_local_batch=2)
    again.seek(epoch, cursor)
    rest = run_loader(again, SIZES[5:])
    assert first + rest == expected_steps(23, 5, 0, 2, 2, SIZES)


def test_loader_config_defaults_and_validation():
    c = LoaderConfig()
    assert (c.workers, c.pin_memory, c.prefetch) == (0, False, 2)
    with pytest.raises(ValueError):
        LoaderConfig(workers=-1)
    with pytest.raises(ValueError):
        LoaderConfig(prefetch=0)
    with pytest.raises(ValueError):
        LoaderConfig(threads=2)


def test_an_empty_slice_gets_no_micro_batches_but_can_fetch_a_sample():
    loader = RankLoader(BatchedSquares(23), seed=5, rank=2, world=3, max_local_batch=2)
    gb = loader.next_global_batch(2)  # B < W: rank 2 has nothing to train on
    assert gb.micro == [] and gb.micro_ids == [] and gb.local_size == 0 and len(gb.ids) == 2
    x, y = loader.fetch(gb.ids[:1])
    assert x.shape == (1, 2) and int(x[0, 0]) == int(gb.ids[0])
    assert (loader.epoch, loader.cursor) == (0, 2)


class PlannedSquares(BatchedSquares):
    """The same samples through the planned protocol (``plan_fetch`` / ``load_planned``), recording the plans."""

    def __init__(self, n: int):
        super().__init__(n)
        self.planned: list[list[list[int]]] = []

    def plan_fetch(self, micro):
        self.planned.append([m.tolist() for m in micro])
        return [("plan", m.copy()) for m in micro]

    def load_planned(self, plan):
        tag, ids = plan
        assert tag == "plan"
        return self.__getitems__(ids.tolist())


@pytest.mark.parametrize("world,rank", [(1, 0), (3, 1)])
def test_a_planned_dataset_gets_the_same_batches_planned_up_to_an_epochs_end(world, rank):
    ds = PlannedSquares(23)
    loader = RankLoader(ds, seed=5, rank=rank, world=world, max_local_batch=2)
    assert run_loader(loader, SIZES) == expected_steps(23, 5, rank, world, 2, SIZES)
    # a plan starts at each change of B and each new epoch, and holds the rest of that epoch at that B
    want, epoch, cursor, last_b = [], 0, 0, None
    for B in SIZES:
        if B != last_b or cursor == 0:
            want.append(in_memory_ids(23, 5, epoch, cursor, B, rank, world, 2))
        last_b, cursor = B, cursor + len(global_batch(np.arange(23), cursor, B))
        if cursor >= 23:
            epoch, cursor = epoch + 1, 0
    assert ds.planned == want


def test_without_loader_processes_no_dataloader_and_no_draw_from_torchs_generator():
    torch.manual_seed(11)
    before = torch.get_rng_state()
    loader = RankLoader(BatchedSquares(23), seed=5, rank=0, world=2, max_local_batch=2)
    run_loader(loader, SIZES)
    loader.seek(0, 3)
    loader.next_global_batch(5)
    assert loader.loader is None and loader.replans == 6
    assert torch.equal(torch.get_rng_state(), before)  # a DataLoader draws a base seed at every restart
