"""A projection to many workers: throughput and the cost of losing a node at W = 8, 64 and 512,
from step times measured here at W = 1..3 and a stated network model.

Measured on this machine (CPU, gloo; a worker is one core: one torch thread):

* **compute** ``T_comp(b)``: forward, backward and optimizer step of the config's model on a
  local batch of ``b`` samples, in this process alone, at several ``b`` (the fastest of
  ``--steps``: a cluster's worker has its core to itself, here others' load only adds), fitted
  as ``a + c*b``.  This, not the compute inside the W-process groups, is what the model uses:
  3 processes on 2 cores oversubscribe them (the table shows by how much);
* **steps of a W-process gloo group** (W = 1..3, ``torch.distributed`` in spawned processes, the
  global batch ``B`` fixed and split over the ranks): compute, then one all-reduce of the whole
  flattened gradient (DDP with one bucket, no overlap), then the optimizer step; barriers around
  the all-reduce separate its time from the wait for the slowest rank;
* **all-reduce alone**, at W = 2..3 and a sweep of sizes (the fastest of its repeats), fitted to
  the ring model below: the bandwidth and latency that gloo shows on this machine (loopback TCP);
* **cold start of a bare Ray Train group** (``bench/resize.py:cold_start``) at W = 1 and 2
  (0.5 CPU each), fitted as a constant plus a per-node term (``--cold-start-s C0,C1`` skips it).

The model (every assumption is printed with the figures):

  T_step(W) = T_comp(b) / compute_speedup + T_ar(W, S) - overlap * min(T_ar, 2/3 T_comp)
  T_ar(W, S) = 2 (W-1)/W * S / bandwidth + 2 (W-1) * latency          (ring all-reduce)
  samples/s = B / T_step;  speedup(W) = samples/s at W over samples/s at W = 1

in two regimes: the local batch ``b`` fixed and ``B = b W`` (this project's: the batch grows and
the group follows it) and ``B`` fixed (``--strong-batch``).  Losing one node costs

  detection (Ray's GCS health check: period x failure threshold, + Ray Train's poll)
  + group restart (cold start: C0 + C1 x nodes left) + checkpoint load (every worker reads the
  state: W x state / storage bandwidth) + lost work (half the checkpoint interval on average)

    .venv/bin/python bench/scale.py [--config configs/quickstart.yaml] [--set KEY=VALUE ...]
        [--batch 96] [--local-batch 32] [--steps 30] [--bandwidth-gbps 100] [--latency-us 5]
        [--overlap 0] [--compute-speedup 1] [--checkpoint-every-s 600] [--cold-start-s C0,C1] [--quick]

``--quick`` (CI): groups of 1 and 2 processes, 4 measured steps a size, a short all-reduce sweep, one cold
start per W.
Summary lines: ``gloo_bandwidth_gbps=``, ``gloo_latency_us=``, ``cold_start_s=`` (W = 1),
``projected_speedup_{8,64,512}=`` (local batch fixed, on the ``--bandwidth-gbps``/``--latency-us``
network), ``strong_speedup_64=`` and ``recovery_s_{8,64,512}=``.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import NoReturn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.common import median, parse_args, scratch_dir, table  # noqa: E402
from trainers.errors import one_line  # noqa: E402

PROJECTED = (8, 64, 512)
UNRESOLVED_BPS = 1e14  # a fitted bandwidth this high means the sizes did not show it (see fit_network)
WARMUP = 3  # steps not timed before the measured ones (allocations, first-call paths)
BACKWARD_SHARE = 2 / 3  # backward ~ 2x forward: the part of compute an all-reduce can hide behind

# Ray's GCS health check of every node (src/ray/common/ray_config_def.h in ray-project/ray, 2.x):
# a node is marked dead after `failure_threshold` checks in a row fail; a check is sent
# `period_ms` after the previous one ended and fails at once when the node refuses the connection,
# or after `timeout_ms` when it hangs.
RAY_HEALTH_CHECK = {
    "health_check_initial_delay_ms": 5000,
    "health_check_period_ms": 3000,
    "health_check_timeout_ms": 10000,
    "health_check_failure_threshold": 5,
}
SHORTEN = (
    'ray start --head --system-config=\'{"health_check_period_ms": 1000, '
    '"health_check_failure_threshold": 3}\'  (on the head, where the GCS runs; or '
    "ray.init(_system_config={...}) for a local cluster, or RAY_health_check_period_ms=1000 "
    "RAY_health_check_failure_threshold=3 in the head's environment); Ray Train's own poll of "
    "its workers: RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"
)


# -- the model (pure: tests/unit/test_bench_scale.py) -------------------------------------------------


@dataclass(frozen=True)
class Network:
    """A network for the ring all-reduce: ``bandwidth_bps`` in bits/s per link, ``latency_s`` a hop."""

    name: str
    bandwidth_bps: float
    latency_s: float


def ring_allreduce_s(workers: int, nbytes: float, net: Network) -> float:
    """A ring all-reduce of ``nbytes`` over ``workers``: reduce-scatter then all-gather, each
    ``W-1`` steps that move ``S/W`` bytes a link and cost a latency (Patarasuk and Yuan 2009;
    what NCCL's ring does for large messages)."""
    if workers <= 1:
        return 0.0
    return 2 * (workers - 1) / workers * nbytes * 8 / net.bandwidth_bps + 2 * (workers - 1) * net.latency_s


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least squares ``y = a + c x`` with ``a, c >= 0`` (a time: a fixed part and a part per
    sample): ``(a, c)``.  A negative intercept (noise on a shared machine) refits through the
    origin, a negative slope (or a single ``x``) gives the mean and ``c = 0``."""
    if len(set(xs)) < 2:
        return max(statistics.fmean(ys), 0.0), 0.0
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    c = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    if c <= 0:
        return max(my, 0.0), 0.0
    if my - c * mx < 0:
        return 0.0, max(sum(x * y for x, y in zip(xs, ys)) / sum(x * x for x in xs), 0.0)
    return my - c * mx, c


def fit_network(points: list[tuple[int, float, float]], name: str = "fitted") -> Network:
    """The ring model's bandwidth and latency that best fit measured all-reduces ``(W, bytes,
    seconds)`` (least squares without an intercept on the two terms ``2(W-1)/W*bits`` and
    ``2(W-1)``; a term that comes out negative is dropped and the other refitted)."""
    rows = [(2 * (w - 1) / w * b * 8, 2 * (w - 1), t) for w, b, t in points if w > 1]
    if not rows:
        raise ValueError("fit_network: no all-reduce with W > 1")
    sxx = sum(x * x for x, _, _ in rows)
    syy = sum(y * y for _, y, _ in rows)
    sxy = sum(x * y for x, y, _ in rows)
    sxt = sum(x * t for x, _, t in rows)
    syt = sum(y * t for _, y, t in rows)
    det = sxx * syy - sxy * sxy
    inv_bw, lat = ((syy * sxt - sxy * syt) / det, (sxx * syt - sxy * sxt) / det) if det > 0 else (-1.0, -1.0)
    if inv_bw <= 0 or lat < 0:
        if inv_bw <= 0:  # latency alone explains it (tiny sizes): bandwidth as if unlimited
            inv_bw, lat = 1e-15, max(syt / syy, 0.0)
        else:
            inv_bw, lat = max(sxt / sxx, 1e-15), 0.0
    return Network(name, 1 / inv_bw, lat)


@dataclass(frozen=True)
class Compute:
    """``T_comp(b) = a + c b`` seconds for a local batch of ``b``, divided by ``speedup`` (a faster
    device than one core here)."""

    a: float
    c: float
    speedup: float = 1.0

    def __call__(self, b: float) -> float:
        return (self.a + self.c * b) / self.speedup


def step_s(
    workers: int, local_batch: float, comp: Compute, grad_bytes: float, net: Network, overlap: float = 0.0
) -> tuple[float, float, float]:
    """``(T_step, T_comp, T_ar)`` of one synchronous data-parallel step; ``overlap`` (0..1) is the
    share of the all-reduce hidden behind backward (at most backward's time, 2/3 of compute)."""
    tc = comp(local_batch)
    ta = ring_allreduce_s(workers, grad_bytes, net)
    return tc + ta - overlap * min(ta, BACKWARD_SHARE * tc), tc, ta


def projection(
    workers: list[int],
    comp: Compute,
    grad_bytes: float,
    net: Network,
    *,
    local_batch: int,
    strong_batch: int,
    overlap: float = 0.0,
) -> list[dict]:
    """Per W: the step and throughput with the local batch fixed (``B = local_batch W``) and with
    the global batch fixed (``strong_batch``; ``None`` where ``B/W < 1``), speedups over W = 1."""
    base_weak = step_s(1, local_batch, comp, grad_bytes, net, overlap)[0]
    base_strong = step_s(1, strong_batch, comp, grad_bytes, net, overlap)[0]
    out = []
    for w in workers:
        t, tc, ta = step_s(w, local_batch, comp, grad_bytes, net, overlap)
        row = {
            "workers": w,
            "local_batch": local_batch,
            "batch": local_batch * w,
            "step_s": t,
            "comp_s": tc,
            "ar_s": ta,
            "samples_per_s": local_batch * w / t,
            "speedup": w * base_weak / t,
            "efficiency": base_weak / t,
        }
        if strong_batch / w >= 1:
            ts = step_s(w, strong_batch / w, comp, grad_bytes, net, overlap)[0]
            row.update(strong_step_s=ts, strong_speedup=base_strong / ts)
        else:
            row.update(strong_step_s=None, strong_speedup=None)
        out.append(row)
    return out


@dataclass(frozen=True)
class Recovery:
    """What losing one node costs, in seconds of the whole group standing still."""

    detect_period_s: float = RAY_HEALTH_CHECK["health_check_period_ms"] / 1000
    detect_threshold: int = RAY_HEALTH_CHECK["health_check_failure_threshold"]
    train_poll_s: float = 2.0  # Ray Train V2's controller polls its worker group this often
    restart_s: float = 15.0  # cold start of a group: constant ...
    restart_per_node_s: float = 0.0  # ... plus this per node of the new group
    state_bytes: float = 0.0  # model + optimizer state, read by every worker
    storage_Bps: float = 1e9  # aggregate read bandwidth of the shared checkpoint storage, bytes/s
    checkpoint_every_s: float = 600.0
    workers_per_node: int = 8
    node_mtbf_h: float = 6000.0

    @property
    def detect_s(self) -> float:
        return self.detect_period_s * self.detect_threshold + self.train_poll_s

    def nodes(self, workers: int) -> int:
        return math.ceil(workers / self.workers_per_node)

    def cost(self, workers: int) -> dict:
        """The parts of the pause after one node of a ``workers`` group is lost; the group restarts
        on the nodes left (one at least: a one-node group waits for its replacement)."""
        nodes = self.nodes(workers)
        left_nodes = max(nodes - 1, 1)
        left = min(workers, left_nodes * self.workers_per_node) if nodes > 1 else workers
        parts = {
            "detect_s": self.detect_s,
            "restart_s": self.restart_s + self.restart_per_node_s * left_nodes,
            "load_s": left * self.state_bytes / self.storage_Bps,
            "lost_work_s": self.checkpoint_every_s / 2,
        }
        total = sum(parts.values())
        failures_per_h = nodes / self.node_mtbf_h
        return {
            **parts,
            "workers": workers,
            "nodes": nodes,
            "total_s": total,
            "failures_per_day": 24 * failures_per_h,
            "time_lost": failures_per_h * total / 3600,
        }


def ray_train_poll_s() -> float:
    """Ray Train V2's worker-group poll interval: ``RAY_TRAIN_HEALTH_CHECK_INTERVAL_S`` or its default."""
    env = os.environ.get("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S")
    if env:
        return float(env)
    try:
        from ray.train.v2._internal.constants import DEFAULT_HEALTH_CHECK_INTERVAL_S
    except ImportError:  # a Ray without Train V2's constants there: the value of Ray 2.5x
        return 2.0
    return float(DEFAULT_HEALTH_CHECK_INTERVAL_S)


# -- measuring ---------------------------------------------------------------------------------------


class Workload:
    """The config's model, loss, optimizer and data in this process, one step at a time."""

    def __init__(self, cfg, threads: int = 1):
        import torch

        from trainers.policies.optim import build_optimizer
        from trainers.workload.build import build_workload

        torch.set_num_threads(threads)
        torch.manual_seed(cfg.train.seed)
        self.torch = torch
        self.cfg = cfg
        self.work = build_workload(cfg)
        self.model = self.work.model
        self.model.train()
        self.opt = build_optimizer(self.model, cfg.optimizer)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.n = self.work.num_train

    @property
    def grad_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.params)

    def state_bytes(self) -> int:
        """Bytes of ``torch.save`` of the model's and the optimizer's state (after a step: momentum)."""
        buf = io.BytesIO()
        self.torch.save({"model": self.model.state_dict(), "optimizer": self.opt.state_dict()}, buf)
        return buf.tell()

    def load(self, ids):
        from trainers.data.sampler import fetch

        if self.work.tensors is not None:
            idx = self.torch.from_numpy(ids)
            return self.work.tensors.train_x[idx], self.work.tensors.train_y[idx]
        return fetch(self.work.train, ids.tolist())

    def compute(self, ids, global_batch: int) -> None:
        """Forward and backward of this rank's samples (the loss: the per-sample sum over ``B``)."""
        from trainers.workload.build import summed_loss

        x, y = self.load(ids)
        self.opt.zero_grad(set_to_none=True)
        loss = summed_loss(self.work.loss_fn, self.model(x), y) / global_batch
        loss.backward()

    def batches(self, batch: int):
        """The global batches of the run's data order, one after another (wrapping at an epoch end)."""
        from trainers.data.order import epoch_permutation

        epoch, pos = 0, 0
        perm = epoch_permutation(self.cfg.train.seed, epoch, self.n)
        while True:
            if pos + batch > self.n:
                epoch, pos = epoch + 1, 0
                perm = epoch_permutation(self.cfg.train.seed, epoch, self.n)
            yield perm[pos : pos + batch]
            pos += batch


def measure_compute(w: Workload, sizes: list[int], steps: int, warmup: int = WARMUP) -> dict[int, float]:
    """Seconds of forward + backward + optimizer step per local batch size, the fastest of
    ``steps`` (a worker of a cluster has its core to itself; on a shared machine the others' load
    only adds), the sizes interleaved step by step (drift hits them all alike)."""
    times: dict[int, list[float]] = {b: [] for b in sizes}
    batches = w.batches(max(sizes))
    for i in range(warmup + steps):
        for b in sizes:
            ids = next(batches)[:b]
            t0 = time.perf_counter()
            w.compute(ids, b)
            w.opt.step()
            if i >= warmup:
                times[b].append(time.perf_counter() - t0)
    return {b: min(ts) for b, ts in times.items()}


def _gloo_rank(
    rank: int, world: int, port: int, cfg, batch: int, steps: int, sweep: list[int], reps: int, out_dir: str
) -> None:
    """One rank of a W-process gloo group: ``steps`` timed steps, then the all-reduce sweep; its
    figures to ``out_dir/rank<r>.json``."""
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    w = Workload(cfg, threads=1)
    flat = torch.zeros(sum(p.numel() for p in w.params))
    rows = []
    batches = w.batches(batch)
    for i in range(WARMUP + steps):
        ids = next(batches)[rank::world]
        dist.barrier()
        t0 = time.perf_counter()
        w.compute(ids, batch)
        t1 = time.perf_counter()
        dist.barrier()  # the wait for the slowest rank, apart from the all-reduce
        t2 = time.perf_counter()
        for p in w.params:  # a parameter this batch did not reach still takes part in the all-reduce
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        torch.cat([p.grad.reshape(-1) for p in w.params], out=flat)
        t3 = time.perf_counter()
        dist.all_reduce(flat)
        t4 = time.perf_counter()
        off = 0
        for p in w.params:
            p.grad.copy_(flat[off : off + p.numel()].view_as(p))
            off += p.numel()
        w.opt.step()
        t5 = time.perf_counter()
        if i >= WARMUP:
            rows.append({"comp": t1 - t0, "wait": t2 - t1, "ar": t4 - t3, "step": t5 - t0})
    ars = []
    if world > 1:
        for nbytes in sweep:
            buf = torch.zeros(max(1, nbytes // 4))
            ts = []
            for r in range(reps + 1):
                dist.barrier()
                t0 = time.perf_counter()
                dist.all_reduce(buf)
                if r:
                    ts.append(time.perf_counter() - t0)
            ars.append([buf.numel() * 4, min(ts)])  # the wire's time: others' load on a shared machine only adds
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump({"steps": rows, "sweep": ars, "grad_bytes": w.grad_bytes}, f)
    dist.barrier()
    dist.destroy_process_group()
    # leave without the interpreter's teardown: gloo's threads torn down with the C++ statics at
    # exit now and then abort a rank that has finished (tests/helpers.py:_gloo_rank)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def measure_group(cfg, world: int, batch: int, steps: int, sweep: list[int], reps: int) -> dict:
    """Steps and the all-reduce sweep of a ``world``-process gloo group (spawned processes)."""
    import socket

    import torch.multiprocessing as mp

    import bench.scale as me  # by module name, so the spawned processes import it (not __main__)

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory(prefix="elastic-scale-") as out:
        mp.spawn(me._gloo_rank, args=(world, port, cfg, batch, steps, sweep, reps, out), nprocs=world, join=True)
        ranks = []
        for r in range(world):
            with open(os.path.join(out, f"rank{r}.json")) as f:
                ranks.append(json.load(f))
    per_step = list(zip(*(r["steps"] for r in ranks)))  # each step's rows of every rank
    steps_s = [max(x["step"] for x in st) for st in per_step]
    return {
        "workers": world,
        "step_s": median(steps_s),
        "fastest_step_s": min(steps_s),
        "comp_s": min(max(x["comp"] for x in st) for st in per_step),  # the slowest rank's, fastest step
        "ar_s": min(statistics.fmean(x["ar"] for x in st) for st in per_step),
        "sweep": [(world, b, t) for b, t in ranks[0]["sweep"]],
    }


def cold_starts(workers: list[int], repeats: int) -> dict[int, float]:
    """Median cold start (call -> loop entered) of a bare Ray Train group of each size, 0.5 CPU a
    worker, on a local Ray started here."""
    os.environ["ELASTIC_KEEP_RAY"] = "1"
    from bench.resize import cold_start
    from orchestrator.run.runner import ensure_ray

    started = ensure_ray(verbose=False)
    storage = scratch_dir()
    try:
        got: dict[int, list[float]] = {w: [] for w in workers}
        for _ in range(repeats):
            for w in workers:
                got[w].append(cold_start(w, 0.5, storage))
    finally:
        if started:
            import ray

            ray.shutdown()
    return {w: median(ts) for w, ts in got.items()}


# -- the report --------------------------------------------------------------------------------------


def fmt_s(x: float | None) -> str:
    if x is None:
        return "-"
    if x < 1e-3:
        return f"{x * 1e6:.1f} us"
    if x < 1:
        return f"{x * 1e3:.2f} ms"
    return f"{x:.1f} s"


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def projection_table(rows: list[dict], strong_batch: int) -> str:
    return table(
        [
            (
                r["workers"],
                r["batch"],
                fmt_s(r["comp_s"]),
                fmt_s(r["ar_s"]),
                fmt_s(r["step_s"]),
                f"{r['samples_per_s']:,.0f}",
                f"{r['speedup']:.1f}",
                f"{r['efficiency']:.0%}",
                fmt_s(r["strong_step_s"]),
                "-" if r["strong_speedup"] is None else f"{r['strong_speedup']:.1f}",
            )
            for r in rows
        ],
        (
            "W",
            "B = b W",
            "T_comp",
            "T_allreduce",
            "T_step",
            "samples/s",
            "speedup",
            "efficiency",
            f"T_step B={strong_batch}",
            f"speedup B={strong_batch}",
        ),
    )


def recovery_table(rec: Recovery, workers: list[int]) -> str:
    rows = []
    for w in workers:
        c = rec.cost(w)
        rows.append(
            (
                w,
                c["nodes"],
                fmt_s(c["detect_s"]),
                fmt_s(c["restart_s"]),
                fmt_s(c["load_s"]),
                fmt_s(c["lost_work_s"]),
                fmt_s(c["total_s"]),
                f"{c['failures_per_day']:.2f}",
                f"{c['time_lost']:.2%}",
            )
        )
    return table(
        rows,
        (
            "W",
            "nodes",
            "detection",
            "restart",
            "checkpoint load",
            "lost work",
            "recovery",
            "node losses/day",
            "time lost",
        ),
    )


WEAKEST = """\
Where the model is weakest:
* Stragglers.  A synchronous step waits for the slowest of W workers; the model has every worker
  at the mean speed.  With per-worker jitter the expected maximum of W step times grows about
  like sqrt(2 ln W) standard deviations: invisible at W = 3, a few percent at 64, and at 512 a
  slow host, a throttled GPU or a noisy neighbour sets the pace of the whole group.
* Topology.  One flat ring with one bandwidth and one latency per hop.  Real clusters are
  hierarchical (NVLink inside a node, 100-400 Gb/s between nodes, oversubscribed spines above):
  the ring's 2 (W-1) latency term is what hurts at 512 for small gradients, and NCCL avoids it
  with trees (log W hops) and hierarchical rings, so this over-states the all-reduce of a small
  model at 512 and under-states congestion of a large one on a shared fabric.
* gloo here vs NCCL there.  The measured gloo figures are loopback TCP between processes on one
  machine, latency dominated by the kernel and Python; they say little about a GPU cluster, which
  is why the projection uses the stated network instead.
* Compute/communication overlap.  DDP launches a bucket's all-reduce while backward still runs;
  the model takes a fixed share (--overlap, default none) of at most backward's time.  The true
  overlap depends on bucket size and layer order, and the optimizer step cannot overlap.
* Compute.  T_comp is linear in the local batch from measurements on one core of this machine;
  a GPU is not linear (it is under-used at small b and flat until it fills), and
  --compute-speedup scales it uniformly.  With the local batch fixed this matters little; with B
  fixed the small local batches at 512 are where a GPU is least efficient.
* Recovery.  The restart's per-node term comes from W = 1 and 2 worker processes on this 2-core
  machine, where workers start one after another for the CPU; on a cluster nodes start in
  parallel (what grows is the scheduling, the rendezvous and pulling the image), so the term is
  pessimistic at 64 nodes.  Detection assumes a node that refuses connections; a hung one costs
  threshold x (timeout + period).  Failures grow linearly with the nodes while the checkpoint
  interval here is fixed: at a fixed interval the time lost grows with W, and the interval that
  minimises it (Young/Daly: sqrt(2 x save time x MTBF / nodes)) shrinks like 1/sqrt(nodes)."""


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--config",
        default=os.path.join(ROOT, "configs", "quickstart.yaml"),
        help="the workload (model, data, optimizer) to measure",
    )
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config overrides")
    ap.add_argument("--batch", type=int, default=96, help="global batch of the measured W = 1..3 steps")
    ap.add_argument("--workers", default="1,2,3", help="measured group sizes")
    ap.add_argument("--steps", type=int, default=30, help="measured steps per size")
    ap.add_argument(
        "--sweep", default="4096,65536,1048576,4194304,16777216", help="all-reduce sizes in bytes (+ the gradient's)"
    )
    ap.add_argument("--sweep-reps", type=int, default=20)
    ap.add_argument("--local-batch", type=int, default=32, help="the projection's local batch (B = b W)")
    ap.add_argument("--strong-batch", type=int, default=8192, help="the projection's fixed global batch")
    ap.add_argument("--bandwidth-gbps", type=float, default=100.0, help="per link, Gb/s (GPU cluster: 100)")
    ap.add_argument("--latency-us", type=float, default=5.0, help="per ring hop, us (GPU cluster: 5)")
    ap.add_argument("--overlap", type=float, default=0.0, help="share of the all-reduce hidden behind backward")
    ap.add_argument(
        "--compute-speedup",
        type=float,
        default=1.0,
        help="a projected worker computes this many times faster than one core here",
    )
    ap.add_argument("--workers-per-node", type=int, default=8)
    ap.add_argument("--checkpoint-every-s", type=float, default=600.0)
    ap.add_argument("--storage-gbs", type=float, default=1.0, help="aggregate checkpoint read bandwidth, GB/s")
    ap.add_argument(
        "--node-mtbf-h",
        type=float,
        default=6000.0,
        help="hours between failures of one node (Llama 3's report: 419 unexpected "
        "interruptions in 54 days on 2,048 nodes of 8 GPUs, ~6,300)",
    )
    ap.add_argument(
        "--cold-start-s",
        help="C0,C1: the group restart's constant and per-node seconds (skips measuring cold starts on a local Ray)",
    )
    ap.add_argument("--cold-repeats", type=int, default=2)
    a = parse_args(
        ap,
        quick={"workers": "1,2", "steps": 4, "sweep": "4096,4194304", "sweep_reps": 5, "cold_repeats": 1},
        argv=argv,
    )

    def bad(field: str, why: str) -> NoReturn:
        print(f"{field}: {why}", file=sys.stderr)
        sys.exit(2)

    try:
        measured = sorted({int(x) for x in a.workers.split(",")})
        sweep = [int(x) for x in a.sweep.split(",") if x]
    except ValueError:
        bad("--workers/--sweep", "give integers separated by commas, e.g. --workers 1,2,3")
    if not measured or measured[0] < 1 or a.batch < 2 * measured[-1]:
        bad(
            "--batch",
            f"{a.batch} gives a rank fewer than 2 samples at W = {measured[-1]}; give at least {2 * measured[-1]}",
        )
    if not 0 <= a.overlap <= 1:
        bad("--overlap", f"{a.overlap} is not a share; give 0..1")
    for name in (
        "steps",
        "local_batch",
        "strong_batch",
        "bandwidth_gbps",
        "compute_speedup",
        "workers_per_node",
        "storage_gbs",
        "node_mtbf_h",
        "sweep_reps",
        "cold_repeats",
    ):
        if getattr(a, name) <= 0:
            bad(f"--{name.replace('_', '-')}", f"{getattr(a, name)} must be positive")
    if a.latency_us < 0 or a.checkpoint_every_s < 0:
        bad("--latency-us/--checkpoint-every-s", "must not be negative")
    cold_given = None
    if a.cold_start_s:
        try:
            cold_given = tuple(float(x) for x in a.cold_start_s.split(","))
            assert len(cold_given) == 2 and min(cold_given) >= 0
        except (ValueError, AssertionError):
            bad("--cold-start-s", f"{a.cold_start_s!r}: give the constant and the per-node seconds, e.g. 15,3")

    from orchestrator.config.prepare import load_config

    try:
        cfg = load_config(a.config, a.set)
    except Exception as e:  # a one-line config error
        bad("--config", one_line(e, None, name=False))

    t_start = time.time()
    # 1. compute alone, one core
    w = Workload(cfg, threads=1)
    if w.n < a.batch:
        bad("--batch", f"{a.batch} is more than the {w.n} training samples of {a.config}")
    sizes = sorted({max(2, -(-a.batch // k)) for k in measured} | {min(a.local_batch, a.batch), max(2, a.batch // 8)})
    comp_points = measure_compute(w, sizes, a.steps)
    ca, cc = fit_line(list(comp_points), list(comp_points.values()))
    here = Compute(ca, cc)
    grad_bytes, state_bytes = w.grad_bytes, w.state_bytes()
    n_params = sum(p.numel() for p in w.params)
    del w

    # 2. groups of 1..3 processes, gloo
    groups = [
        measure_group(cfg, k, a.batch, a.steps, sorted(set(sweep) | {grad_bytes}), a.sweep_reps) for k in measured
    ]
    points = [p for g in groups for p in g["sweep"]]
    gloo = fit_network(points, "gloo on this machine (fitted)") if points else None

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    model_name = cfg.model.factory or cfg.model.name
    print(
        f"workload: {os.path.relpath(a.config, ROOT) if os.path.isabs(a.config) else a.config} "
        f"({cfg.data.factory or cfg.data.name}, {model_name}, optimizer {cfg.optimizer.name}); "
        f"{n_params:,} parameters, gradient S = {fmt_bytes(grad_bytes)}, model + optimizer state "
        f"{fmt_bytes(state_bytes)}"
    )
    load = f"load average {os.getloadavg()[0]:.1f}; " if hasattr(os, "getloadavg") else ""
    print(
        f"this machine: {cores} cores, CPU, gloo over loopback; a worker = 1 torch thread; {load}"
        f"{time.time() - t_start:.0f} s of measuring"
    )
    print()
    print(
        f"Measured: W-process gloo groups, global batch B = {a.batch} split over the ranks, {a.steps} steps: the "
        "median step; compute and all-reduce of the fastest step (what a dedicated core sees)"
    )
    rows = []
    for g in groups:
        b = -(-a.batch // g["workers"])
        model_step = step_s(g["workers"], b, here, grad_bytes, gloo)[0] if gloo else here(b)
        rows.append(
            (
                g["workers"],
                b,
                fmt_s(g["step_s"]),
                fmt_s(g["fastest_step_s"]),
                fmt_s(g["comp_s"]),
                fmt_s(here(b)),
                f"{g['comp_s'] / here(b):.2f}",
                fmt_s(g["ar_s"]),
                fmt_s(model_step),
                f"{a.batch / g['step_s']:,.0f}",
            )
        )
    print(
        table(
            rows,
            (
                "W",
                "local b",
                "step",
                "fastest",
                "compute (slowest rank)",
                "T_comp(b) alone",
                "group / alone",
                "all-reduce",
                "model step (gloo fit)",
                "samples/s",
            ),
        )
    )
    over = [g for g in groups if g["workers"] > cores]
    if over:
        print(
            f"  W = {', '.join(str(g['workers']) for g in over)}: more processes than the {cores} cores: their "
            "compute runs slower than alone (beyond the noise of a shared machine that 'group / alone' shows at "
            f"W <= {cores}); the model takes compute from T_comp(b) measured alone and the all-reduce from the "
            "sweep, where the ranks wait on sockets"
        )
    print()
    print(
        f"Fits:  T_comp(b) = {fmt_s(ca)} + {fmt_s(cc)} x b  (one core, fastest of {a.steps}; points "
        + ", ".join(f"b={b}: {fmt_s(t)}" for b, t in comp_points.items())
        + ")"
    )
    resolved = gloo is not None and gloo.bandwidth_bps < UNRESOLVED_BPS
    if gloo:
        bw = f"{gloo.bandwidth_bps / 1e9:.2f} Gb/s" if resolved else "not resolved (the times did not grow with size)"
        print(
            f"       gloo ring fit: bandwidth {bw}, latency {gloo.latency_s * 1e6:.0f} us"
            f"  (fastest all-reduce of {a.sweep_reps} at each of {len(points)} (W, size) points: "
            + ", ".join(f"W={k} {fmt_bytes(nb)} {fmt_s(t)}" for k, nb, t in points)
            + ")"
        )
    sys.stdout.flush()  # the figures so far stay printed if Ray cannot start

    # 3. cold start of a bare Ray Train group
    if cold_given is None:
        try:
            cold = cold_starts([1, 2], a.cold_repeats)
        except Exception as e:  # a local Ray that does not come up (an overloaded machine)
            print(
                f"cold start: no Ray Train group started ({one_line(e, None)}); give --cold-start-s C0,C1 to project "
                "without measuring it",
                file=sys.stderr,
            )
            sys.exit(1)
        c1 = max(0.0, cold[2] - cold[1])
        c0 = cold[1] - c1
        cold_note = (
            f"measured here: W=1 {cold[1]:.1f} s, W=2 {cold[2]:.1f} s (median of {a.cold_repeats}, 0.5 CPU a worker)"
        )
    else:
        c0, c1 = cold_given
        cold = {1: c0 + c1}
        cold_note = "given (--cold-start-s)"
    print(f"       group restart = {c0:.1f} s + {c1:.1f} s x nodes  ({cold_note})")

    poll = ray_train_poll_s()
    rec = Recovery(
        train_poll_s=poll,
        restart_s=c0,
        restart_per_node_s=c1,
        state_bytes=state_bytes,
        storage_Bps=a.storage_gbs * 1e9,
        checkpoint_every_s=a.checkpoint_every_s,
        workers_per_node=a.workers_per_node,
        node_mtbf_h=a.node_mtbf_h,
    )
    hc = RAY_HEALTH_CHECK
    hung = hc["health_check_failure_threshold"] * (hc["health_check_timeout_ms"] + hc["health_check_period_ms"]) / 1000
    print()
    print("Ray's failure detection (GCS health check of every node; defaults of src/ray/common/ray_config_def.h):")
    print("  " + ", ".join(f"{k}={v}" for k, v in hc.items()))
    print(
        f"  a node is dead after {hc['health_check_failure_threshold']} failed checks in a row: "
        f"{rec.detect_period_s * rec.detect_threshold:.0f} s when the lost node refuses connections, up to "
        f"{hung:.0f} s when it hangs (each check waits its timeout); then Ray Train's controller sees its "
        f"worker gone at its next poll (RAY_TRAIN_HEALTH_CHECK_INTERVAL_S={poll:g} s).  Modelled: "
        f"{rec.detect_s:.0f} s"
    )
    print(
        f"  shorten it: {SHORTEN}.  Shorter means a busy or briefly unreachable node is declared dead "
        "(and the group restarted) when it was only slow"
    )

    nets = [
        Network(
            f"stated: {a.bandwidth_gbps:g} Gb/s, {a.latency_us:g} us a hop", a.bandwidth_gbps * 1e9, a.latency_us * 1e-6
        ),
        Network("ethernet: 10 Gb/s, 50 us", 10e9, 50e-6),
    ]
    if gloo:
        nets.append(gloo)
    comp = Compute(ca, cc, a.compute_speedup)
    ws = measured + [k for k in PROJECTED if k not in measured]
    projections = {}
    for net in nets:
        print()
        print(
            f"Projection, network {net.name}; local batch b = {a.local_batch} (B = b W) and B = {a.strong_batch} fixed:"
        )
        projections[net.name] = projection(
            ws, comp, grad_bytes, net, local_batch=a.local_batch, strong_batch=a.strong_batch, overlap=a.overlap
        )
        print(projection_table(projections[net.name], a.strong_batch))
    print()
    print(f"Recovery from losing one node ({a.workers_per_node} workers a node), seconds the group stands still:")
    print(recovery_table(rec, ws))
    print()
    print("Assumptions:")
    for line in (
        f"synchronous data parallel, one all-reduce of the whole gradient ({fmt_bytes(grad_bytes)}, fp32) a step, "
        "ring algorithm: T = 2 (W-1)/W S / bandwidth + 2 (W-1) latency",
        f"compute T_comp(b) = a + c b from one core here, divided by --compute-speedup {a.compute_speedup:g}; "
        "the same for every worker (no stragglers), independent of W",
        f"overlap of the all-reduce with backward: {a.overlap:g} of it, at most backward's 2/3 of compute",
        f"networks: the stated one ({a.bandwidth_gbps:g} Gb/s, {a.latency_us:g} us: a GPU cluster's; "
        "ethernet: 10 Gb/s, 50 us), every hop alike (no hierarchy, no congestion)",
        f"detection: period x threshold + Ray Train's poll = {rec.detect_s:.0f} s (a node that refuses "
        f"connections; a hung one: up to {hung:.0f} s)",
        f"restart: {c0:.1f} s + {c1:.1f} s x nodes of the new group (on the nodes left; a one-node group "
        "on its replacement)",
        f"checkpoint load: every worker reads the {fmt_bytes(state_bytes)} state from storage with "
        f"{a.storage_gbs:g} GB/s in all",
        f"lost work: half the checkpoint interval ({a.checkpoint_every_s:g} s) on average",
        f"node failures: independent, one per {a.node_mtbf_h:g} h a node (order of the Llama 3 report's "
        "~6,300 node-hours per unexpected interruption)",
    ):
        print(f"* {line}")
    print()
    print(WEAKEST)
    print()
    main_rows = {r["workers"]: r for r in projections[nets[0].name]}
    if gloo:
        print(
            f"gloo_bandwidth_gbps={gloo.bandwidth_bps / 1e9 if resolved else math.nan:.3f} "
            f"gloo_latency_us={gloo.latency_s * 1e6:.1f}"
        )
    print(f"cold_start_s={cold[1]:.2f}")
    strong = main_rows[64]["strong_speedup"]
    print(f"strong_speedup_64={strong:.1f}" if strong is not None else "strong_speedup_64=nan")
    print(" ".join(f"recovery_s_{k}={rec.cost(k)['total_s']:.1f}" for k in PROJECTED))
    print(" ".join(f"projected_speedup_{k}={main_rows[k]['speedup']:.1f}" for k in PROJECTED))


if __name__ == "__main__":
    main()
