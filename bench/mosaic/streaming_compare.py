"""MosaicML Streaming beside the token shards (bench/tokens.py, section 3): its loader's speed and
the bytes it fetches on the same windows, and what its resume does when the batch or the world changes.

The same windows are written with its ``MDSWriter``, read by its ``StreamingDataset`` /
``StreamingDataLoader``, locally and from moto's S3 server with its own ``cache_limit``.

Streaming is not a dependency of the product (its pins, ``numpy<2.2`` and ``transformers<5``, would
replace this venv's numpy and huggingface_hub).  To run this part, install it beside the venv::

    .venv/bin/pip install --no-deps --target ~/.cache/bench-streaming mosaicml-streaming xxhash zstd \\
        python-snappy brotli catalogue cramjam "transformers<5" "huggingface_hub<1" "tokenizers<0.23" safetensors
    PYTHONPATH=~/.cache/bench-streaming .venv/bin/python bench/tokens.py

(0.13.0, 2026-11-28: it imports and runs against this venv's numpy 2.4 and torch 2.14; its
``transformers`` import, for two batch types, is why transformers 4 comes along.)

Without it, bench/tokens.py prints why the rows are skipped.

Its resume, measured.  A phase is one run of its loader in its own process(es) (``RANK``,
``WORLD_SIZE``, ``LOCAL_WORLD_SIZE`` as a launcher sets them; gloo when W > 1): the first reads
``k`` batches and saves ``StreamingDataLoader.state_dict()``; the second starts from
``load_state_dict`` of that state with another per-device batch and/or W and reads to the epoch's
end.  Every process writes the sample ids it was handed (the MDS ``id`` column), so what the
epoch repeated or skipped is counted, not inferred.  Ours: the same schedule through
``RankLoader`` (every rank), resumed from ``(epoch, cursor)``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from typing import Any
from unittest import mock

import numpy as np
import torch

ID, TOKENS = "id", "tokens"


def available() -> str | None:
    """``None`` when Streaming imports, else the reason it does not (one line)."""
    try:
        import streaming  # noqa: F401
    except Exception as e:  # any import failure (a missing dependency of it included) skips the rows
        return f"{type(e).__name__}: {e}"
    return None


def write_mds(train, out: str, shard_bytes: int) -> int:
    """Write ``train``'s windows (``context + 1`` uint16 tokens each, id order) as MDS shards of about
    ``shard_bytes``; returns the bytes written.  The window ``i`` is sample ``i``, its id in ``id``."""
    from streaming import MDSWriter

    columns = {ID: "int", TOKENS: f"ndarray:uint16:{train.context + 1}"}
    with MDSWriter(out=out, columns=columns, size_limit=shard_bytes, compression=None) as w:
        for s in range(len(train.shards)):
            view = train._view(s)
            base = int(train.offsets[s])
            for j in range(len(view)):
                w.write({ID: base + j, TOKENS: np.ascontiguousarray(view[j])})
    return sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))


def _loader(local: str, remote: str | None, batch: int, cache_limit: int | None, block: int | None = None):
    from streaming import StreamingDataLoader, StreamingDataset

    ds = StreamingDataset(
        local=local,
        remote=remote,
        batch_size=batch,
        shuffle=True,
        shuffle_seed=0,
        shuffle_block_size=block,  # None: its default, 1 << 18 samples (the whole corpus here)
        cache_limit=cache_limit,
    )
    return ds, StreamingDataLoader(ds, batch_size=batch, num_workers=0)


def rate(local: str, remote: str | None, batch: int, steps: int, cache_limit: int | None, block=None) -> dict:
    """Tokens/s that ``StreamingDataLoader`` hands out at ``batch``, as the loop takes them: an int64
    ``(inputs, targets)`` pair of ``(batch, context)``; the first batch (index, first shard) apart."""
    ds, loader = _loader(local, remote, batch, cache_limit, block)
    it = iter(loader)
    t0 = time.perf_counter()
    first = next(it)
    first_s = time.perf_counter() - t0
    context = first[TOKENS].shape[1] - 1
    n = 0
    t0 = time.perf_counter()
    for batch_data in it:
        w = batch_data[TOKENS].to(torch.int64)
        x, y = w[:, :-1], w[:, 1:]
        assert x.shape[0] == y.shape[0] == batch
        n += 1
        if n >= steps:
            break
    elapsed = time.perf_counter() - t0
    return {"tokens_s": n * batch * context / max(elapsed, 1e-9), "steps": n, "first_s": first_s}


def rate_apart(local: str, remote: str | None, batch: int, steps: int, cache_limit: int | None, block=None) -> dict:
    """:func:`rate` in a process of its own (Streaming's shared memory and download threads end with it)."""
    import tempfile

    with tempfile.NamedTemporaryFile("r", suffix=".json") as f:
        spec = {"rate": [local, remote, batch, steps, cache_limit, block], "out": f.name}
        subprocess.run([sys.executable, os.path.abspath(__file__), json.dumps(spec)], check=True)
        return json.load(f)


def fetched_from_log(log: bytes, prefix: str, sizes: dict[str, int]) -> tuple[int, int]:
    """Bytes and objects served by GETs of keys under ``/prefix`` in moto's request log (one line a
    request), each counted at the object's size."""
    total = count = 0
    for m in re.finditer(rb'"GET /([^ ?"]+)[^"]*" 20[06]', log):
        key = m.group(1).decode()
        if key.startswith(prefix) and key in sizes:
            total += sizes[key]
            count += 1
    return total, count


def upload(fs, folder: str, dest: str) -> dict[str, int]:
    """Copy every file of ``folder`` to ``dest`` (``bucket/prefix``) through pyarrow; their sizes by key."""
    sizes = {}
    for name in sorted(os.listdir(folder)):
        with fs.open_output_stream(f"{dest}/{name}") as f, open(os.path.join(folder, name), "rb") as g:
            data = g.read()
            f.write(data)
        sizes[f"{dest}/{name}"] = len(data)
    return sizes


def from_store(folder: str, mds: str, *, context: int, block: int, batch: int, steps: int, bound: int) -> dict:
    """Both loaders from moto's S3 server on this machine, each with a cache of ``bound`` bytes (ours:
    ``data.cache_bytes``; Streaming: ``cache_limit``): tokens/s of the loader alone at ``batch`` for
    ``steps`` batches after the first, and the bytes each fetched from the store (ours: its cache's
    count; Streaming: the GETs in the server's request log, each at its object's size)."""
    import uuid

    from bench.common import scratch_dir
    from tests.s3_server import S3Server
    from trainers.data.sampler import RankLoader
    from trainers.data.shards.dataset import load_tokens

    server = S3Server().start()
    # the store's variables for this section only (Streaming's boto3 reads S3_ENDPOINT_URL)
    env = mock.patch.dict(os.environ, {**server.env, "S3_ENDPOINT_URL": server.endpoint})
    try:
        env.start()
        bucket = server.create_bucket(f"bench-{uuid.uuid4().hex[:8]}")
        fs = server.filesystem()
        upload(fs, folder, f"{bucket}/corpus")
        sizes = upload(fs, mds, f"{bucket}/mds")
        out: dict[str, Any] = {"bound": bound}

        train, _ = load_tokens(
            f"s3://{bucket}/corpus",
            context=context,
            val_fraction=0.1,
            block=block,
            cache_bytes=bound,
            cache_dir=scratch_dir("elastic-tokens-cache-"),
        )
        loader = RankLoader(train, seed=0, rank=0, world=1, max_local_batch=batch)
        t0 = time.perf_counter()
        loader.next_global_batch(batch)
        first_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        for _ in range(steps):
            loader.next_global_batch(batch)
        elapsed = time.perf_counter() - t0
        loader.close()
        out["ours"] = {
            "tokens_s": steps * batch * context / elapsed,
            "first_s": first_s,
            "fetched": train.cache.fetched_bytes,
            "files": train.cache.fetches,
            "peak": train.cache.peak,
        }
        # Streaming's default shuffle spans its whole shuffle block (here the corpus), and one as
        # local as ours: blocks of ``block`` shards' samples
        per_shard = max(1, len(train) // max(1, len(train.shards)))
        for name, shuffle_block, n in (
            ("streaming", None, max(1, steps // 8)),
            ("streaming_local", block * per_shard, steps),
        ):
            server.log.seek(0, os.SEEK_END)
            mark = server.log.tell()
            r = rate_apart(
                scratch_dir("elastic-streaming-cache-"), f"s3://{bucket}/mds", batch, n, bound, shuffle_block
            )
            server.log.seek(mark)
            fetched, files = fetched_from_log(server.log.read(), f"{bucket}/mds/", sizes)
            out[name] = {**r, "fetched": fetched, "files": files, "shuffle_block": shuffle_block}
        return out
    finally:
        env.stop()
        server.stop()


# ----------------------------------------------------------------------------------- resume demo


def _phase(args: dict[str, Any]) -> None:
    """One process of one phase (``python bench/streaming_compare.py '<json>'``)."""
    ds, loader = _loader(args["local"], None, args["batch"], None)
    if args.get("state"):
        with open(args["state"]) as f:
            loader.load_state_dict(json.load(f))
    seen: list[int] = []
    steps = args.get("steps")
    for i, b in enumerate(loader):
        seen.extend(int(v) for v in b[ID])
        if steps is not None and i + 1 == steps:
            if args.get("save") and int(os.environ.get("RANK", "0")) == 0:
                with open(args["save"], "w") as f:
                    json.dump(loader.state_dict(), f)
            break
    with open(args["out"], "w") as f:
        json.dump(seen, f)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_phase(local: str, world: int, batch: int, work: str, tag: str, steps=None, state=None, save=None) -> list[int]:
    """Run one phase on ``world`` processes (per-device ``batch``); the ids every rank was handed."""
    port = str(_free_port())
    procs, outs = [], []
    for rank in range(world):
        out = os.path.join(work, f"{tag}-rank{rank}.json")
        outs.append(out)
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world))
        env.update(LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        spec = {"local": local, "batch": batch, "steps": steps, "state": state, "save": save, "out": out}
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), json.dumps(spec)], env=env))
    for p in procs:
        if p.wait(timeout=600) != 0:
            raise RuntimeError(f"a Streaming phase process ({tag}) exited {p.returncode}")
    ids: list[int] = []
    for out in outs:
        with open(out) as f:
            ids.extend(json.load(f))
    return ids


def epoch_account(n: int, ids: list[int]) -> dict[str, int]:
    """What an epoch of ``n`` samples handed out: repeats (a sample more than once) and skips (never)."""
    counts = Counter(ids)
    return {
        "handed": len(ids),
        "repeated": sum(c - 1 for c in counts.values() if c > 1),
        "skipped": sum(1 for i in range(n) if i not in counts),
        "padding": sum(1 for i in ids if i < 0 or i >= n),
    }


def streaming_resume(local: str, n: int, work: str, first: tuple[int, int], then: tuple[int, int], k: int) -> dict:
    """Streaming: ``k`` batches at (W, per-device batch) = ``first``, its state saved; resumed at ``then``
    to the epoch's end."""
    state = os.path.join(work, f"state-{first}-{then}.json")
    tag = f"{first[0]}x{first[1]}-{then[0]}x{then[1]}"
    a = run_phase(local, first[0], first[1], work, f"a-{tag}", steps=k, save=state)
    b = run_phase(local, then[0], then[1], work, f"b-{tag}", state=state)
    return {"first": len(a), **epoch_account(n, a + b)}


def ours_resume(train, first: tuple[int, int], then: tuple[int, int], k: int) -> dict:
    """Ours: ``k`` global batches of ``W * b`` at ``first``, then from the checkpoint's ``(epoch, cursor)``
    at ``then`` to the epoch's end, every rank's micro-batch ids collected."""
    from trainers.data.sampler import RankLoader

    def loaders(world: int):
        return [RankLoader(train, seed=0, rank=r, world=world, max_local_batch=1 << 20) for r in range(world)]

    ids: list[int] = []
    ranks = loaders(first[0])
    for _ in range(k):
        for ld in ranks:
            ids.extend(int(i) for m in ld.next_global_batch(first[0] * first[1]).micro_ids for i in m)
    epoch, cursor = ranks[0].epoch, ranks[0].cursor  # what a checkpoint holds
    handed_first = len(ids)
    ranks = loaders(then[0])
    for ld in ranks:
        ld.seek(epoch, cursor)
    while ranks[0].epoch == epoch:
        for ld in ranks:
            ids.extend(int(i) for m in ld.next_global_batch(then[0] * then[1]).micro_ids for i in m)
    return {"first": handed_first, **epoch_account(len(train), ids)}


if __name__ == "__main__":
    import warnings

    warnings.filterwarnings("ignore", category=UserWarning)  # its collate of read-only arrays, once a batch
    spec = json.loads(sys.argv[1])
    if "rate" in spec:
        with open(spec["out"], "w") as f:
            json.dump(rate(*spec["rate"]), f)
    else:
        _phase(spec)
