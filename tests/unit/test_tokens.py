"""Token shards (trainers/data/shards/): the epoch order (a permutation with shard locality, a pure
function of (seed, epoch)), the manifest's checks, ``tokens prepare``, and the windows of a local
corpus read through the sampler.  The object-store cache is tested against moto's server:
tests/integration/test_token_shards.py."""

from __future__ import annotations

import json
import os
import pickle

import numpy as np
import pytest
import torch

from trainers.data.sampler import GlobalBatchSampler, RankLoader, fetch
from trainers.data.shards.dataset import load_tokens
from trainers.data.shards.manifest import ShardError, check_corpus, read_manifest
from trainers.data.shards.order import epoch_order, shard_of, shards_ahead, window_offsets
from trainers.data.shards.prepare import prepare
from trainers.data.text import token_cache

COUNTS = [37, 50, 12, 64, 41, 29, 55, 8, 70, 33]


@pytest.fixture(autouse=True)
def _cache_in_tmp(tmp_path, monkeypatch):
    """Shard caches and verification markers under the test's folder, not the user's ~/.cache."""
    monkeypatch.setenv("ELASTIC_CACHE_DIR", str(tmp_path / "cache"))


@pytest.mark.parametrize("block", [1, 2, 3, 4, 10])
def test_an_epoch_is_every_window_once(block):
    offsets = window_offsets(COUNTS)
    for epoch in range(3):
        order = epoch_order(7, epoch, offsets, block)
        assert sorted(order.tolist()) == list(range(sum(COUNTS)))


def test_the_order_is_a_function_of_seed_and_epoch_only():
    offsets = window_offsets(COUNTS)
    a = epoch_order(7, 2, offsets, 3)
    assert np.array_equal(a, epoch_order(7, 2, offsets, 3))
    assert not np.array_equal(a, epoch_order(7, 3, offsets, 3))
    assert not np.array_equal(a, epoch_order(8, 2, offsets, 3))


@pytest.mark.parametrize("batch", [1, 5, 16, 64, 200])
def test_a_global_batch_reads_at_most_two_blocks_of_shards(batch):
    offsets, block = window_offsets(COUNTS), 2
    for epoch in range(3):
        order = epoch_order(3, epoch, offsets, block)
        for cursor in range(0, len(order), batch):
            shards = set(shard_of(offsets, order[cursor : cursor + batch]).tolist())
            assert len(shards) <= 2 * block or batch > min(COUNTS) * block


def test_a_plain_permutation_would_read_every_shard():
    """What the locality buys: the default order's batch of 64 touches nearly all ten shards."""
    offsets = window_offsets(COUNTS)
    perm = np.random.default_rng(0).permutation(sum(COUNTS))
    assert len(set(shard_of(offsets, perm[:64]).tolist())) >= 9
    assert len(set(shard_of(offsets, epoch_order(0, 0, offsets, 2)[:64]).tolist())) <= 4


def test_the_shards_ahead_are_the_block_read_now_and_the_next():
    offsets, block = window_offsets(COUNTS), 2
    order = epoch_order(5, 1, offsets, block)
    for cursor in (0, 30, 150, 398):
        ahead = shards_ahead(5, 1, cursor, offsets, block)
        now = int(shard_of(offsets, order[cursor : cursor + 1])[0])
        assert now in ahead[:block] and block < len(ahead) <= 2 * block
    last = shards_ahead(5, 1, len(order) - 1, offsets, block)  # the next block is the next epoch's first
    first_next = shard_of(offsets, epoch_order(5, 2, offsets, block)[:1]).tolist()
    assert first_next[0] in last


# --------------------------------------------------------------------------- a corpus on disk


def _corpus(tmp_path, text: bytes = b"", shard_tokens: int = 400, **kw):
    src = tmp_path / "src.txt"
    src.write_bytes(text or bytes(range(256)) * 12)
    return prepare([str(src)], str(tmp_path / "shards"), shard_tokens=shard_tokens, progress=False, **kw)[0]


def test_prepare_writes_the_bytes_of_the_text_set_and_is_idempotent(tmp_path):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_bytes(b"first file " * 50)
    b.write_bytes(b"second " * 70)
    m, written = prepare([str(a), str(b)], str(tmp_path / "out"), shard_tokens=200, progress=False)
    assert written and m.dtype == "uint16" and m.vocab_size == 256 and m.eos_id is None
    stream = np.concatenate([np.fromfile(tmp_path / "out" / s.name, dtype="<u2") for s in m.shards])
    assert stream.astype(np.uint8).tobytes() == token_cache([a, b], tmp_path / "c").read_bytes()
    assert all(s.tokens >= 100 for s in m.shards)  # the short tail joined the last shard
    before = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "out").iterdir()}
    assert prepare([str(a), str(b)], str(tmp_path / "out"), shard_tokens=200, progress=False)[1] is False
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / "out").iterdir()} == before
    m2, written = prepare([str(a), str(b)], str(tmp_path / "out"), shard_tokens=300, progress=False)
    assert written and len(m2.shards) < len(m.shards)
    names = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert names == sorted([*(s.name for s in m2.shards), "manifest.json"])


def test_prepare_trains_a_byte_level_bpe_with_an_eos(tmp_path):
    text = b"def f(x):\n    return x + 1\n" * 200
    m = _corpus(tmp_path, text, shard_tokens=300, train_bpe=300)
    assert m.vocab_size <= 300 and m.eos_id is not None
    assert (tmp_path / "shards" / "tokenizer.json").is_file()
    ids = np.concatenate([np.fromfile(tmp_path / "shards" / s.name, dtype="<u2") for s in m.shards])
    assert ids.max() < m.vocab_size and ids[-1] == m.eos_id and len(ids) < len(text) / 2


def test_prepare_refuses_a_corpus_of_one_shard(tmp_path):
    with pytest.raises(ValueError, match="^--shard-tokens: .* lower --shard-tokens"):
        _corpus(tmp_path, b"tiny", shard_tokens=400)


def test_the_checks_of_a_good_corpus(tmp_path):
    m = _corpus(tmp_path)
    root = str(tmp_path / "shards")
    assert check_corpus(root, 64).shards == m.shards
    with pytest.raises(ShardError, match=r"^data\.context: 500 \+ 1 tokens do not fit in shard"):
        check_corpus(root, 500)


def test_a_missing_manifest_or_shard_and_a_wrong_size_are_one_line(tmp_path):
    with pytest.raises(ShardError, match=r"^data\.root: no manifest\.json at .*tokens prepare"):
        read_manifest(str(tmp_path))
    m = _corpus(tmp_path)
    root = tmp_path / "shards"
    (root / m.shards[1].name).write_bytes(b"\0" * 10)
    with pytest.raises(ShardError, match=r"^data\.root: shard 'shard-00001\.bin' has 10 bytes, the manifest says"):
        check_corpus(str(root), 16)
    os.unlink(root / m.shards[1].name)
    with pytest.raises(ShardError, match=r"^data\.root: shard 'shard-00001\.bin' listed in manifest\.json is missing"):
        check_corpus(str(root), 16)
    raw = json.loads((root / "manifest.json").read_text())
    (root / "manifest.json").write_text(json.dumps(raw | {"dtype": "float32"}))
    with pytest.raises(ShardError, match=r"^data\.root: .*dtype 'float32' is not one of uint16, uint32"):
        read_manifest(str(root))
    (root / "manifest.json").write_text(json.dumps(raw | {"vocab_size": 70000}))
    with pytest.raises(ShardError, match=r"vocab_size 70000 does not fit dtype uint16"):
        read_manifest(str(root))
    for e in (ShardError,):
        assert all("\n" not in str(x) for x in [e("x")])


def test_a_shard_whose_content_changed_is_refused_when_opened(tmp_path):
    m = _corpus(tmp_path)
    path = tmp_path / "shards" / m.shards[0].name
    first, _ = load_tokens(str(tmp_path / "shards"), context=16, val_fraction=0.3)
    fetch(first, [0])  # verified once on this machine: a marker remembers it (same inode, size, mtime)
    assert len(os.listdir(os.path.join(first.cache.directory, "verified"))) == 1
    again, _ = load_tokens(str(tmp_path / "shards"), context=16, val_fraction=0.3)
    fetch(again, [0])
    data = bytearray(path.read_bytes())
    data[5] ^= 1  # same size, other content (and another mtime: the marker no longer applies)
    path.write_bytes(bytes(data))
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    train, _ = load_tokens(str(tmp_path / "shards"), context=16, val_fraction=0.3)
    with pytest.raises(ShardError, match=r"^data\.root: shard 'shard-00000\.bin' .* does not match the manifest"):
        fetch(train, [0])


def test_windows_are_next_token_pairs_and_validation_is_held_out_shards(tmp_path):
    m = _corpus(tmp_path)
    train, val = load_tokens(str(tmp_path / "shards"), context=16, val_fraction=0.3)
    n_val = max(1, round(len(m.shards) * 0.3))
    assert train.shards == m.shards[:-n_val] and val.shards == m.shards[-n_val:]
    x, y = fetch(train, [0, len(train) - 1])
    assert x.shape == (2, 16) and np.array_equal(x[:, 1:].numpy(), y[:, :-1].numpy())
    first = np.fromfile(tmp_path / "shards" / m.shards[0].name, dtype="<u2")
    assert np.array_equal(x[0].numpy(), first[:16]) and np.array_equal(y[0].numpy(), first[1:17])
    assert val.epoch_order is None and val.reading_at is None  # validation reads in its plain order
    restored = pickle.loads(pickle.dumps(train))  # what a DataLoader process gets
    assert np.array_equal(fetch(restored, [3, 9])[0].numpy(), fetch(train, [3, 9])[0].numpy())


@pytest.mark.parametrize(("world", "batch"), [(1, 7), (2, 7), (3, 10), (4, 3)])
def test_the_loader_reads_the_same_global_batches_at_every_world(tmp_path, world, batch):
    """The shard-local order goes through the sampler: every rank's share of each global batch is
    the slice of the same windows, and the ranks' data together is the batch's windows."""
    _corpus(tmp_path, shard_tokens=300)
    train, _ = load_tokens(str(tmp_path / "shards"), context=16, val_fraction=0.2, block=2)
    loaders = [RankLoader(train, seed=3, rank=r, world=world, max_local_batch=4) for r in range(world)]
    ref = epoch_order(3, 0, train.offsets, 2)
    for step in range(5):
        got = [ld.next_global_batch(batch) for ld in loaders]
        assert all(np.array_equal(g.ids, ref[step * batch : (step + 1) * batch]) for g in got)
        mine = np.concatenate([np.concatenate(g.micro_ids) for g in got if g.micro_ids])
        assert np.array_equal(mine, ref[step * batch : (step + 1) * batch])
        x = np.concatenate([m[0].numpy() for g in got for m in g.micro])
        assert np.array_equal(x, fetch(train, mine)[0].numpy())


def _from_files(folder, train, ids):
    """Each window read straight from its shard's file: the reference for the planned gather."""
    rows = []
    for i in ids:
        s = int(np.searchsorted(train.offsets, i, side="right") - 1)
        tokens = np.fromfile(os.path.join(folder, train.shards[s].name), dtype="<u2")
        start = (int(i) - int(train.offsets[s])) * train.context
        rows.append(tokens[start : start + train.context + 1].astype(np.int64))
    return np.array(rows, dtype=np.int64).reshape(len(rows), train.context + 1)


def test_planned_loads_are_the_windows_in_their_order(tmp_path):
    """``plan_fetch`` locates many micro-batches at once (grouped by shard) and ``load_planned`` puts
    every window back in its row: one shard, several, none, repeats, a shard's last window."""
    _corpus(tmp_path, shard_tokens=300)
    folder = str(tmp_path / "shards")
    train, _ = load_tokens(folder, context=16, val_fraction=0.2, block=2)
    rng = np.random.default_rng(0)
    last = train.offsets[1:] - 1
    micro = [rng.integers(0, len(train), k) for k in (1, 6, 0, 40)]
    micro += [np.arange(train.offsets[2], train.offsets[3]), np.array([last[0], 0, 0, last[-1], last[0]])]
    plans = train.plan_fetch(micro)
    assert len(plans) == len(micro) and train.plan_fetch([]) == []
    for ids, plan in zip(micro, plans):
        x, y = train.load_planned(plan)
        ref = _from_files(folder, train, ids)
        assert x.dtype == torch.int64 and x.shape == (len(ids), 16)
        assert np.array_equal(x.numpy(), ref[:, :-1]) and np.array_equal(y.numpy(), ref[:, 1:])
        assert np.array_equal(train.__getitems__(ids.tolist())[0].numpy(), ref[:, :-1])
    assert plans[4][2] is None  # one shard: rows in order, a single gather
    assert train.reading_at is None  # a local folder: nothing to fetch ahead
    assert train._views and pickle.loads(pickle.dumps(train))._views == {}  # a loader process maps its own
    with pytest.raises(IndexError, match="window ids outside"):
        train.plan_fetch([np.array([0, len(train)])])


def test_the_loaders_batches_are_the_windows_of_the_order(tmp_path):
    """What the loop's loader hands out (planned ahead, no DataLoader at workers 0) against the files."""
    _corpus(tmp_path, shard_tokens=300)
    folder = str(tmp_path / "shards")
    train, _ = load_tokens(folder, context=16, val_fraction=0.2, block=2)
    loader = RankLoader(train, seed=3, rank=1, world=2, max_local_batch=3)
    for batch in (7, 7, 12, 12, 12, 5):
        gb = loader.next_global_batch(batch)
        for ids, (x, y) in zip(gb.micro_ids, gb.micro):
            ref = _from_files(folder, train, ids)
            assert np.array_equal(x.numpy(), ref[:, :-1]) and np.array_equal(y.numpy(), ref[:, 1:])


def test_the_sampler_takes_the_datasets_order():
    offsets = window_offsets(COUNTS)
    s = GlobalBatchSampler(
        int(offsets[-1]), seed=1, rank=0, world=1, max_local_batch=1000, batch_size=1000,
        order=lambda seed, epoch, n: epoch_order(seed, epoch, offsets, 2),
    )  # fmt: skip
    assert np.array_equal(next(s.steps()).ids, epoch_order(1, 0, offsets, 2)[:1000])


def test_the_config_refuses_token_shards_settings_in_one_line(tmp_path):
    from orchestrator.config.prepare import load_config
    from orchestrator.config.schema import ConfigError

    _corpus(tmp_path)
    model = {"name": "gpt", "params": {"n_layer": 1, "n_head": 2, "d_model": 16}}

    def refused(data: dict, match: str, **more) -> None:
        with pytest.raises(ConfigError, match=match) as e:
            load_config({"data": data, "model": model, **more})
        assert "\n" not in str(e.value)

    good = {"name": "token_shards", "root": str(tmp_path / "shards"), "context": 16}
    cfg = load_config({"data": good, "model": model, "batch": {"size": 8, "max_local_batch": 8}})
    assert os.path.isabs(cfg.data.root)
    refused({"name": "token_shards"}, r"^data\.root: required for token_shards")
    refused({"name": "text", "cache_bytes": 1000}, r"^data\.cache_bytes: has no effect unless data\.name is token_")
    refused({**good, "root": str(tmp_path)}, r"^data\.root: no manifest\.json at ")
    fewer = r"^data\.name: the training set has \d+ samples, fewer than the global batch of 512"
    refused(good, fewer, batch={"size": 512})
    big = json.loads((tmp_path / "shards" / "manifest.json").read_text()) | {"vocab_size": 4096}
    (tmp_path / "shards" / "manifest.json").write_text(json.dumps(big))
    refused(good, r"^model\.params\.vocab_size: 256 is below the 4096 token ids of the shards at .*; set model")


class _FlakyStore:
    """A pyarrow-like filesystem whose reads fail ``failures`` times, then serve ``data``."""

    def __init__(self, data: bytes, failures: int) -> None:
        self.data, self.failures, self.opened = data, failures, 0

    def open_input_stream(self, path):
        import io

        self.opened += 1
        if self.opened <= self.failures:
            raise OSError("When reading information for key 'corpus/shard-00000.bin': connection refused")
        return io.BytesIO(self.data)


@pytest.mark.parametrize("failures", [0, 3, 4])
def test_a_store_that_does_not_answer_is_retried_with_backoff_then_one_line(tmp_path, monkeypatch, failures):
    from trainers.data.shards import cache as cache_module
    from trainers.data.shards.cache import RETRIES, ShardCache
    from trainers.data.shards.manifest import Manifest

    m = _corpus(tmp_path)
    data = (tmp_path / "shards" / m.shards[0].name).read_bytes()
    store = _FlakyStore(data, failures)
    monkeypatch.setattr(cache_module, "remote", lambda location: (store, location.split("://", 1)[1]))
    remote = Manifest("s3://b/corpus", m.dtype, m.vocab_size, m.eos_id, m.tokenizer, m.shards)
    cache = ShardCache(remote, 1 << 20, str(tmp_path / "c"), prefetch=False)
    pauses: list[float] = []
    cache.sleep = pauses.append
    if failures > len(RETRIES):
        with pytest.raises(OSError, match=r"^data\.root: could not fetch shard 'shard-00000\.bin' from s3://b/corpus "):
            cache.array(m.shards[0])
        assert pauses == list(RETRIES) and not os.listdir(tmp_path / "c")
        return
    assert np.array_equal(cache.array(m.shards[0]), np.frombuffer(data, dtype="<u2"))
    assert pauses == list(RETRIES[:failures]) and cache.fetches == 1


def test_tokens_prepare_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    from orchestrator.cli import main

    assert main(["tokens", "prepare", str(tmp_path / "nope.txt"), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: SRC: no file or folder at ") and len(err.splitlines()) == 1
    (tmp_path / "a.txt").write_text("x" * 100)
    assert main(["tokens", "prepare", str(tmp_path / "a.txt"), "--out", str(tmp_path / "o"), "--no-progress"]) == 2
    assert capsys.readouterr().err.strip().startswith("error: --shard-tokens: the corpus's 100 tokens make 1 shard")
    assert not (tmp_path / "o" / "manifest.json").exists()
    args = [str(tmp_path / "a.txt"), "--out", str(tmp_path / "o"), "--shard-tokens", "40", "--no-progress"]
    assert main(["tokens", "prepare", *args]) == 0
    assert capsys.readouterr().out.startswith("wrote 3 shards, 100 uint16 tokens (vocabulary 256)")
    assert main(["tokens", "prepare", *args]) == 0
    assert capsys.readouterr().out.startswith("up to date: 3 shards")
