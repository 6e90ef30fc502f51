"""Token shards (``data.name: token_shards``): what the loader delivers to the step, locally and from
an S3-compatible store through the bounded cache.

    .venv/bin/python bench/tokens.py [--steps 120] [--local-steps 600] [--batch 32] [--repeats 3] [--quick]

Corpus: the ``text`` set's bytes (Python's standard library sources) prepared by ``tokens prepare``
into shards of ``--shard-tokens`` uint16 tokens; context 128, shard blocks of 2.

1. Local shards, one worker: tokens per second that :class:`~trainers.data.sampler.RankLoader`
   (the loop's loader: the sampler, the DataLoader, ``__getitems__``) hands out, against a plain
   ``numpy.memmap`` reader of the same windows in the same order (one memmap per shard, one fancy
   index per shard per batch), alternated, median of ``--repeats``; and the dataset's
   ``__getitems__`` alone on the same index lists (what the loader adds is the difference).  Aim:
   ratio >= 0.95.
2. The shards in moto's S3 server on this machine (tests/s3_server.py), each worker's cache at
   2 blocks + 1 shard (smaller than the corpus): the 1.9M GPT of configs/lm_shards.yaml trained for
   ``--steps`` steps at B = ``--batch`` (AdamW, fp32, this CPU), the time each step waits for its
   data measured apart from its compute.  Aim: after the first shard, waiting <= 5% of step time;
   the cache's peak at most its bound.  The store is local (no network latency): what it shows is
   that fetch, verification and eviction stay off the step's path, not a WAN's behaviour.

3. MosaicML Streaming beside ours (bench/mosaic/streaming_compare.py; skipped, with the reason,
   when ``streaming`` does not import: it is not a dependency, the install line is there): the
   same windows written by its ``MDSWriter``, tokens/s of its ``StreamingDataLoader`` at B, locally
   and from moto's S3 server with ``cache_limit`` = our cache bound (its default shuffle block, and
   one as local as ours), the bytes each fetched; then its resume when the per-device batch or W
   changes mid-epoch (``state_dict`` / ``load_state_dict``, each phase its own processes) beside
   ours (``(epoch, cursor)``): the samples of that epoch repeated and skipped.

Last line: ``local_ratio=<ours / plain memmap at B> local_ratio_8b=<the same at 8 B>
wait_share=<data wait / step time after the first shard> cache_peak_ratio=<peak / bound>``, then
``streaming_local_ratio=<ours / Streaming, local, at B>`` where Streaming imports (else the line
above says why its rows are skipped).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from bench.common import median, parse_args, scratch_dir, table  # noqa: E402
from trainers.data.sampler import RankLoader  # noqa: E402
from trainers.data.shards.dataset import load_tokens  # noqa: E402
from trainers.data.shards.order import shard_of  # noqa: E402
from trainers.data.shards.prepare import prepare  # noqa: E402
from trainers.data.text import default_corpus  # noqa: E402

CONTEXT, BLOCK = 128, 2


def plain_reader(folder: str, train, order: np.ndarray, batch: int, steps: int) -> float:
    """Tokens/s of a plain memmap reader: the same windows, same order, int64 tensors as the loop takes.

    One memmap per shard seen as its windows (a strided ``(windows, context + 1)`` view), one row
    gather per shard per batch: the same gather the dataset does, so the ratio is what our order,
    plan and loader add (before 2026-11-28 it gathered token by token, ~1.5x slower at B = 32)."""
    maps = [np.memmap(os.path.join(folder, s.name), dtype="<u2", mode="r") for s in train.shards]
    rows = np.diff(train.offsets)
    views = [np.ndarray((int(rows[i]), CONTEXT + 1), m.dtype, m, 0, (2 * CONTEXT, 2)) for i, m in enumerate(maps)]
    t0 = time.perf_counter()
    for step in range(steps):
        ids = order[step * batch : (step + 1) * batch]
        shard = shard_of(train.offsets, ids)
        local = ids - train.offsets[shard]
        out = np.empty((len(ids), CONTEXT + 1), dtype=np.int64)
        for s in np.unique(shard):
            rows = np.nonzero(shard == s)[0]
            out[rows] = views[s][local[rows]]
        w = torch.from_numpy(out)
        x, y = w[:, :-1], w[:, 1:]
        assert x.shape[0] == len(ids) and y.shape[0] == len(ids)
    return steps * batch * CONTEXT / (time.perf_counter() - t0)


def ours(train, batch: int, steps: int) -> float:
    loader = RankLoader(train, seed=0, rank=0, world=1, max_local_batch=batch)
    t0 = time.perf_counter()
    for _ in range(steps):
        gb = loader.next_global_batch(batch)
        assert gb.micro[0][0].shape == (batch, CONTEXT)
    rate = steps * batch * CONTEXT / (time.perf_counter() - t0)
    loader.close()
    return rate


def dataset_alone(train, order: np.ndarray, batch: int, steps: int) -> float:
    """Tokens/s of ``TokenWindows.__getitems__`` on the same index lists, without the sampler and DataLoader."""
    lists = [order[i * batch : (i + 1) * batch].tolist() for i in range(steps)]
    t0 = time.perf_counter()
    for ids in lists:
        train.__getitems__(ids)
    return steps * batch * CONTEXT / (time.perf_counter() - t0)


def local(folder: str, batch: int, steps: int, repeats: int) -> tuple[float, float, float]:
    """Median tokens/s of the loop's loader, the dataset alone and the plain reader, alternated."""
    train, _ = load_tokens(folder, context=CONTEXT, val_fraction=0.1, block=BLOCK)
    order = train.epoch_order(0, 0, len(train))
    steps = min(steps, len(order) // batch)
    for shard in train.shards:  # first opens (a sha256 check once per shard) outside the timer, as the plain reader's
        train.cache.array(shard)
    ours(train, batch, 2), plain_reader(folder, train, order, batch, 2)  # first opens (sha256) and page cache
    a, d, b = [], [], []
    for _ in range(repeats):
        a.append(ours(train, batch, steps))
        d.append(dataset_alone(train, order, batch, steps))
        b.append(plain_reader(folder, train, order, batch, steps))
    return median(a), median(d), median(b)


def remote(folder: str, batch: int, steps: int) -> dict:
    from tests.s3_server import S3Server
    from trainers.workload.lm_models import gpt

    server = S3Server().start()
    try:
        os.environ.update(server.env)
        bucket = server.create_bucket(f"bench-{uuid.uuid4().hex[:8]}")
        fs = server.filesystem()
        names = sorted(n for n in os.listdir(folder) if n.endswith(".bin") or n == "manifest.json")
        for name in names:
            with fs.open_output_stream(f"{bucket}/corpus/{name}") as f, open(os.path.join(folder, name), "rb") as g:
                f.write(g.read())
        shard_bytes = max(os.path.getsize(os.path.join(folder, n)) for n in names if n.endswith(".bin"))
        corpus = sum(os.path.getsize(os.path.join(folder, n)) for n in names if n.endswith(".bin"))
        bound = (2 * BLOCK + 1) * shard_bytes
        train, _ = load_tokens(
            f"s3://{bucket}/corpus",
            context=CONTEXT,
            val_fraction=0.1,
            block=BLOCK,
            cache_bytes=bound,
            cache_dir=scratch_dir("elastic-tokens-cache-"),
        )
        torch.manual_seed(0)
        model = gpt(n_layer=4, n_head=6, d_model=192, context=CONTEXT)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        loader = RankLoader(train, seed=0, rank=0, world=1, max_local_batch=batch)
        waits, totals, first_shard = [], [], None
        for step in range(steps):
            t0 = time.perf_counter()
            gb = loader.next_global_batch(batch)
            t1 = time.perf_counter()
            x, y = gb.micro[0]
            loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
            opt.zero_grad()
            loss.backward()
            opt.step()
            waits.append(t1 - t0)
            totals.append(time.perf_counter() - t0)
            if first_shard is None and train.cache.fetches >= 1:
                first_shard = step + 1
        loader.close()
        after = slice(first_shard or 1, None)
        return {
            "steps": steps,
            "step_s": median(totals[after]),
            "wait_share": sum(waits[after]) / max(sum(totals[after]), 1e-9),
            "first_wait_s": waits[0],
            "peak": train.cache.peak,
            "bound": bound,
            "corpus": corpus,
            "fetched": train.cache.fetched_bytes,
            "fetches": train.cache.fetches,
        }
    finally:
        server.stop()


def mosaic(folder: str, batch: int, steps: int, quick: bool) -> str:
    """Section 3: MosaicML Streaming beside ours; the summary's last pair."""
    from bench.mosaic import streaming_compare as sc

    reason = sc.available()
    if reason is not None:
        print(
            f"\nMosaicML Streaming: skipped, it does not import ({reason}); install: bench/mosaic/streaming_compare.py"
        )
        return ""  # no pair: the summary's values are numbers (tests/integration/test_benches.py)
    train, _ = load_tokens(folder, context=CONTEXT, val_fraction=0.1, block=BLOCK)
    shard_bytes = max(s.bytes for s in train.shards)
    mds = os.path.join(scratch_dir("elastic-mds-"), "mds")
    mds_bytes = sc.write_mds(train, mds, shard_bytes * (CONTEXT + 1) // CONTEXT + 4096)
    n_mds = sum(1 for f in os.listdir(mds) if f.endswith(".mds"))
    mine = max(ours(train, batch, steps) for _ in range(2))
    theirs = sc.rate_apart(mds, None, batch, steps, None)
    bound = (2 * BLOCK + 1) * shard_bytes
    store = sc.from_store(folder, mds, context=CONTEXT, block=BLOCK, batch=batch, steps=steps, bound=bound)
    print(
        f"\nMosaicML Streaming beside ours: the same {len(train):,} windows "
        f"({n_mds} MDS shards, {mds_bytes:,} B), B={batch}"
    )
    rows = [
        ("ours (RankLoader)", "local", f"{mine:,.0f}", "-", "-"),
        ("Streaming", "local", f"{theirs['tokens_s']:,.0f}", f"{theirs['first_s'] * 1000:.0f}", "-"),
    ]
    for key, name in (
        ("ours", "ours"),
        ("streaming", "Streaming, its shuffle"),
        ("streaming_local", "Streaming, blocks"),
    ):
        r = store[key]
        fetched = f"{r['fetched']:,} ({r['files']})"
        rows.append((name, f"S3, cache {bound:,} B", f"{r['tokens_s']:,.0f}", f"{r['first_s'] * 1000:.0f}", fetched))
    print(table(rows, ("loader", "source", "tokens/s", "first batch ms", "fetched B (files)")))
    print(
        f"(Streaming from S3: its default shuffle block over {store['streaming']['steps']} batches; "
        f"'blocks': shuffle_block_size={store['streaming_local']['shuffle_block']} samples, {BLOCK} shards' worth)"
    )
    scenarios = [((1, 16), (1, 64)), ((1, 32), (2, 16))] + ([] if quick else [((2, 8), (2, 32)), ((1, 16), (3, 16))])
    work = scratch_dir("elastic-streaming-resume-")
    rows = []
    for first, then in scenarios:
        for name, r in (
            ("Streaming", sc.streaming_resume(mds, len(train), work, first, then, 10)),
            ("ours", sc.ours_resume(train, first, then, 10)),
        ):
            label = f"W={first[0]} b={first[1]} -> W={then[0]} b={then[1]}"
            rows.append((label, name, r["first"], r["handed"], r["repeated"], r["skipped"]))
    print(
        f"\nresume mid-epoch after 10 batches with another per-device batch b or W (an epoch of {len(train):,} windows)"
    )
    print(table(rows, ("change", "loader", "before", "handed in the epoch", "repeated", "skipped")))
    return f"streaming_local_ratio={mine / theirs['tokens_s']:.2f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=120, help="GPT steps trained from the store")
    ap.add_argument("--local-steps", type=int, default=600, help="global batches read from local shards, per reader")
    ap.add_argument("--batch", type=int, default=32, help="global batch B (sequences of 128 tokens)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--shard-tokens", type=int, default=32768, help="tokens per shard")
    a = parse_args(ap, quick={"steps": 16, "local_steps": 200, "repeats": 1})
    os.environ["ELASTIC_CACHE_DIR"] = scratch_dir("elastic-tokens-cache-")  # the verification markers too
    folder = os.path.join(scratch_dir("elastic-tokens-bench-"), "shards")
    m, _ = prepare([str(p) for p in default_corpus()], folder, shard_tokens=a.shard_tokens, progress=False)
    print(f"corpus: {len(m.shards)} shards, {m.total_tokens:,} uint16 tokens; context {CONTEXT}, blocks of {BLOCK}")
    rows, ratios = [], {}
    for b in (a.batch, 8 * a.batch):
        mine, alone, plain = local(folder, b, a.local_steps, a.repeats)
        ratios[b] = mine / plain
        us = [f"{b * CONTEXT / r * 1e6:.0f}" for r in (mine, alone, plain)]
        rows.append((b, f"{mine:,.0f}", f"{plain:,.0f}", f"{mine / plain:.3f}", *us))
    print(f"\nlocal shards, one worker, median of {a.repeats} runs of {a.local_steps} global batches (or an epoch)")
    header = ("B", "ours tokens/s", "plain memmap tokens/s", "ratio", "us/batch: ours", "dataset alone", "plain")
    print(table(rows, header))
    r = remote(folder, a.batch, a.steps)
    print(f"\nmoto S3 on this machine, cache bound {r['bound']:,} B (corpus {r['corpus']:,} B), 1.9M GPT, B={a.batch}")
    print(
        table(
            [
                (
                    r["steps"],
                    f"{r['step_s'] * 1000:.0f}",
                    f"{r['first_wait_s'] * 1000:.0f}",
                    f"{100 * r['wait_share']:.2f}%",
                    f"{r['peak']:,}",
                    f"{r['fetched']:,} ({r['fetches']})",
                )
            ],
            ("steps", "step ms", "first wait ms", "wait after 1st shard", "cache peak B", "fetched B (shards)"),
        )
    )
    last = mosaic(folder, a.batch, a.local_steps, a.quick)
    print(
        f"local_ratio={ratios[a.batch]:.3f} local_ratio_8b={ratios[8 * a.batch]:.3f} "
        f"wait_share={r['wait_share']:.4f} cache_peak_ratio={r['peak'] / r['bound']:.3f} {last}".rstrip()
    )


if __name__ == "__main__":
    main()
