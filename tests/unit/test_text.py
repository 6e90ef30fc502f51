"""The byte-level text workload: the memmap cache (built once, reused, rebuilt on change) and its windows."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest
import torch

from trainers.data.sampler import fetch
from trainers.data.text import ByteWindows, default_corpus, load_text, load_tokens, token_cache


def test_default_corpus_is_a_fixed_list_of_stdlib_files():
    files = default_corpus()
    assert files == default_corpus()
    assert len(files) >= 50
    assert sum(f.stat().st_size for f in files) > 1_000_000  # enough for a quickstart


def test_cache_is_reused_and_rebuilt_when_the_source_changes(tmp_path):
    src = tmp_path / "a.txt"
    src.write_bytes(b"hello world, " * 20)
    cache = token_cache(src, tmp_path / "c")
    assert cache.suffix == ".u8" and (cache.with_suffix(".json")).is_file()
    assert bytes(load_tokens(cache)) == src.read_bytes()
    built = cache.stat().st_mtime_ns
    assert token_cache(src, tmp_path / "c") == cache and cache.stat().st_mtime_ns == built  # reused
    os.utime(src, ns=(src.stat().st_atime_ns, src.stat().st_mtime_ns + 10**9))  # touched, same bytes
    assert token_cache(src, tmp_path / "c") == cache and cache.stat().st_mtime_ns == built
    src.write_bytes(b"HELLO WORLD, " * 20)  # same size, new content, new mtime
    os.utime(src, ns=(src.stat().st_atime_ns, src.stat().st_mtime_ns + 2 * 10**9))
    token_cache(src, tmp_path / "c")
    assert bytes(load_tokens(cache)) == src.read_bytes()
    src.write_bytes(b"short")
    token_cache(src, tmp_path / "c")
    assert bytes(load_tokens(cache)) == b"short"
    assert not [p for p in (tmp_path / "c").iterdir() if p.name.endswith(".tmp")]  # no temp files left


def test_several_sources_are_joined_by_newlines(tmp_path):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_bytes(b"abc")
    b.write_bytes(b"def")
    cache = token_cache([a, b], tmp_path)
    assert bytes(load_tokens(cache)) == b"abc\ndef"
    assert token_cache([b, a], tmp_path) != cache  # another list, another cache


def test_missing_source_names_the_field(tmp_path):
    with pytest.raises(FileNotFoundError, match="^data.path: no text file"):
        token_cache(tmp_path / "nope.txt", tmp_path)


def test_windows_are_next_byte_pairs_within_their_split():
    tokens = np.arange(100, dtype=np.uint8)
    ds = ByteWindows(tokens, 10, 50, context=8)
    assert len(ds) == (50 - 10 - 8 - 1) // 8 + 1 == 4
    x, y = ds[1]
    assert x.dtype == torch.int64 and x.tolist() == list(range(18, 26)) and y.tolist() == list(range(19, 27))
    last_x, last_y = ds[len(ds) - 1]
    assert int(last_y[-1]) < 50  # never reads past the split
    xb, yb = ds.__getitems__([3, 0, 1])
    assert xb.shape == (3, 8)
    assert torch.equal(xb[2], x) and torch.equal(yb[2], y)
    with pytest.raises(IndexError):
        ds[4]
    overlapping = ByteWindows(tokens, 0, 100, context=8, stride=1)
    assert len(overlapping) == 100 - (8 + 1) + 1 == 92  # starts 0..91


def test_split_is_contiguous_with_no_leakage(tmp_path):
    src = tmp_path / "t.txt"
    src.write_bytes(bytes(range(256)) * 8)
    train, val = load_text(src, context=16, val_fraction=0.25, cache_dir=tmp_path)
    n = 256 * 8
    assert train.lo == 0 and train.hi == val.lo == round(n * 0.75) and val.hi == n
    last_train_byte = train.lo + (len(train) - 1) * train.stride + train.context  # the last target byte
    assert last_train_byte < val.lo
    x, y = fetch(val, list(range(len(val))))
    assert x.shape == (len(val), 16)


def test_windows_pickle_without_the_data(tmp_path):
    src = tmp_path / "t.txt"
    src.write_bytes(b"0123456789" * 1000)
    train, _ = load_text(src, context=32, cache_dir=tmp_path)
    blob = pickle.dumps(train)
    assert len(blob) < 2000  # the memmap is re-opened by the receiver, not copied
    again = pickle.loads(blob)
    assert torch.equal(again[7][0], train[7][0])


def test_bad_settings_name_the_field(tmp_path):
    with pytest.raises(ValueError, match="^data.context"):
        ByteWindows(np.zeros(10, np.uint8), 0, 10, context=10)
    with pytest.raises(ValueError, match="^data.val_fraction"):
        load_text(tmp_path / "x", val_fraction=1.0)
