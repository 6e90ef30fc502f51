"""The DataLoader path with loader processes: 0 and 2 workers yield the same tensors in the same order.

In tests/integration because it starts loader processes (no Ray).
"""

from __future__ import annotations

import torch

from trainers.data.config import LoaderConfig
from trainers.data.sampler import RankLoader
from trainers.data.text import load_text


class Squares(torch.utils.data.Dataset):
    """Map-style, per-sample ``__getitem__`` only: sample i is (tensor([i, i*i]), i % 3)."""

    def __len__(self) -> int:
        return 57

    def __getitem__(self, i: int):
        return torch.tensor([float(i), float(i * i)]), i % 3


SIZES = [8, 8, 8, 5, 5, 12, 12, 12, 12, 12, 3, 3, 3, 3]  # changes of B mid-epoch and across epochs


def collect(dataset, workers: int, rank: int, world: int, seek=None):
    loader = RankLoader(
        dataset, seed=7, rank=rank, world=world, max_local_batch=3, config=LoaderConfig(workers=workers, prefetch=2)
    )
    if seek is not None:
        loader.seek(*seek)
    out = []
    for B in SIZES:
        gb = loader.next_global_batch(B)
        out.append((gb.epoch, gb.cursor, [tuple(t.clone() for t in m) for m in gb.micro]))
    loader.close()
    return out


def same(a, b) -> bool:
    if len(a) != len(b):
        return False
    for (e1, c1, m1), (e2, c2, m2) in zip(a, b):
        if (e1, c1) != (e2, c2) or len(m1) != len(m2):
            return False
        if not all(torch.equal(x, y) for p, q in zip(m1, m2) for x, y in zip(p, q)):
            return False
    return True


def test_zero_and_two_loader_workers_give_the_same_tensors_in_order():
    for rank, world in [(0, 1), (1, 2)]:
        plain = collect(Squares(), 0, rank, world)
        assert same(plain, collect(Squares(), 2, rank, world))
    assert same(collect(Squares(), 0, 0, 2, seek=(1, 17)), collect(Squares(), 2, 0, 2, seek=(1, 17)))


def test_text_windows_through_two_loader_workers(tmp_path):
    src = tmp_path / "t.txt"
    src.write_bytes(bytes(range(256)) * 40)
    train, _ = load_text(src, context=16, cache_dir=tmp_path)
    assert same(collect(train, 0, 0, 3), collect(train, 2, 0, 3))
