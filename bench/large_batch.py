"""The large-batch papers' claims on a small problem, run with the product's own policy code: three tables.

1. **Goyal et al. 2017** ("Accurate, large minibatch SGD"): final validation accuracy at B0 and at
   8*B0 with (a) no LR scaling, (b) linear scaling without warmup, (c) linear scaling with gradual
   warmup, (d) sqrt scaling with LEGW (You et al.).  The paper's claim: (c) stays within about a
   point of B0 while (a) and (b) lose more.  Per-worker batch 32 as in the paper: B0 runs on one
   worker, 8*B0 on eight, each with its own BatchNorm statistics.
2. **Tang et al. 2022** (MF, the momentum-like factor): final training loss at a fixed global batch
   split over 1, 2 and 4 workers with per-worker BatchNorm, against MF 0.8, 0.9, 0.95, 0.99 and
   the per-worker-batch rule ``mu(b) = 0.9 ** (b / B)`` (``optimizer.mf_rule: per_worker_batch``).
3. **Gradient combination**: mean vs Adasum (Maleki et al. 2020) at 2 and 4 workers at a large
   batch, and local SGD (Stich 2019; Lau et al. 2024) with H = 1, 4, 16, with and without the
   norm-test batch, against per-step averaging: validation accuracy, steps, samples, bytes each
   worker contributes to its collectives, and syncs.
4. **Decentralized momentum SGD** (``--tables decentlam``; Yuan et al. 2021, DecentLaM): PmSGD
   (``combine.method: mean``) vs DmSGD vs DecentLaM at a small and a large global batch on 8
   simulated workers on a ring, on a synthetic teacher task (digits does not show the large-batch
   loss), with each worker's slice of one permutation (``iid``, the product's data order) and with
   label-sorted shards (the heterogeneous split where the inconsistency bias is large): the
   average model's validation accuracy, the final consensus distance, the bytes one worker sends
   per step (a ring all-reduce's ``2 (W-1)/W P`` for PmSGD, ``|neighbours| P`` otherwise).  The
   workers are rows of one tensor stepped by ``trainers/combine/decentral.py``'s own recursions.
5. **ConAdv** (Liu et al. 2022; ``--tables conadv``, not in the default set): at a large B, plain
   training vs adversarial training with the perturbation from the current weights (``sync``, two
   sequential passes) and from the weights of the previous step (``conadv``), with a B = 64
   reference: validation accuracy and step time, through the worker loop itself (``Trainer``, one
   CPU worker) on a harder synthetic image set (``conadv_config``).  Measured here (2 seeds, 20
   epochs, B = 1024, epsilon 0.05): none 45.1 ± 7.9 %, sync 46.4 ± 2.0 %, conadv 49.1 ± 2.5 %
   (B = 64: 60.3 ± 0.8 %); step 60 / 197 / 210 ms: on a CPU the two passes run in sequence, so
   conadv costs what sync does (the overlap needs a GPU's second stream).

**How it runs: in one process, simulating W workers** (not through Ray).  The tables need 90
training runs; each through Ray Train would cost ~15 s of worker-group start on this machine
before its first step, and W real workers on 2 cores would time-share anyway, so the bench runs
the product's own math in-process instead: the workload, the data order and each worker's slice
(``trainers/workload/build.py`` ``make_batches`` with ``rank=r, world=W``), the LR and MF of every step
(``trainers/policies/policy_set.py`` ``PolicySet.settings``, the same object the loop asks), the optimizer
(``trainers/policies/optim.py``), Adasum (``trainers/combine/methods.py`` ``adasum_layers``), the local norm test
(``trainers/combine/methods.py`` ``local_variance`` with ``trainers/policies/noise.py`` ``norm_test``) and the
``norm_test`` batch policy (``trainers/policies/batching.py``).  Worker r's forward pass sees only its
slice, so BatchNorm is per worker as in a DDP run; ``mean`` sums the slices' gradients scaled by
``1 / B`` (what DDP's all-reduce gives the loop); local SGD keeps W model copies with their own
optimizers and averages parameters, buffers and momentum every H steps.  The loop's wiring of
the same methods is tested on real process groups and a real Ray (``tests/distributed/
test_combine_loop.py``, ``tests/integration/test_combine_e2e.py``).

Bytes: the payload one worker contributes per collective, as ``LocalSGD`` counts it in a run
(``combine/bytes_sent``): a gradient (4 P bytes) per step for mean and Adasum (Adasum's
all-gather also receives (W-1) times that; the ring all-reduce's ~2(W-1)/W wire factor is left out
for all), parameters + floating buffers + momentum per local-SGD sync, plus the norm test's
float64 vector (P + 3 values) where it runs.

Workload: scikit-learn's 8x8 digits (1,438 training, 359 validation images; no download), the
built-in MLP with BatchNorm (``model.name: mlp``, ``norm: batch``; the CNN is ~5x slower per step
here for the same effects).  Each row is the mean over ``--seeds`` seeds (the spread is printed).
One torch thread by default (these tensors are too small to gain from more).  ``--quick``: one
seed, 6 epochs, a narrower model (same code path; ~8 s here); the full form about a minute.
"""

from __future__ import annotations

import argparse
import copy
import math
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any

import torch

from trainers.combine.methods import adasum_layers, local_variance
from trainers.loop.config import LoopConfig
from trainers.policies.batching import BatchStats
from trainers.policies.noise import norm_test
from trainers.policies.optim import build_optimizer
from trainers.policies.policy_set import PolicySet
from trainers.workload.build import build_workload, correct, make_batches, summed_loss

METHODS = ("mean", "adasum", "local_sgd")


@dataclass
class Result:
    val_acc: float
    train_loss: float  # mean training loss over the last epoch's steps
    steps: int
    samples: int
    bytes_sent: int
    syncs: int
    final_batch: int
    diverged: bool


def config(hidden: int, epochs: float, seed: int, **sections: dict[str, Any]) -> LoopConfig:
    raw: dict[str, Any] = {
        "data": {"name": "digits"},
        "model": {"name": "mlp", "norm": "batch", "hidden": hidden},
        "optimizer": {"name": "sgd", "lr": 0.05, "mf": 0.9, "base_batch_size": 32, "weight_decay": 1e-4},
        "batch": {"size": 32},
        "schedule": {"scaling_rule": "linear", "decay": "cosine"},
        "train": {"epochs": epochs, "seed": seed},
    }
    for name, values in sections.items():
        raw.setdefault(name, {}).update(values)
    b = raw["batch"]
    b["max_local_batch"] = max(b["size"], b.get("max_size") or 0)  # a worker's whole slice in one pass
    return LoopConfig.model_validate(raw)


def _opt_state(opt: torch.optim.Optimizer, p: torch.Tensor) -> list[torch.Tensor]:
    st = opt.state.get(p, {})
    return [
        v
        for _, v in sorted(st.items(), key=lambda kv: str(kv[0]))
        if isinstance(v, torch.Tensor) and v.is_floating_point() and v.shape == p.shape
    ]


def _float_bytes(ts: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in ts)


@torch.no_grad()
def _average_into(models: list[torch.nn.Module], opts: list[torch.optim.Optimizer]) -> int:
    """Local SGD's sync over the simulated workers; returns one worker's payload in bytes."""
    groups = [list(m.parameters()) + [b for b in m.buffers() if b.is_floating_point()] for m in models]
    groups = [g + [t for p in m.parameters() for t in _opt_state(o, p)] for g, m, o in zip(groups, models, opts)]
    for tensors in zip(*groups):
        mean = torch.stack([t.detach() for t in tensors]).mean(0)
        for t in tensors:
            t.copy_(mean)
    return _float_bytes(groups[0])


def _buffers(model: torch.nn.Module) -> list[torch.Tensor]:
    return [b.detach().clone() for b in model.buffers()]


@torch.no_grad()
def _restore(model: torch.nn.Module, saved: list[torch.Tensor]) -> None:
    for b, v in zip(model.buffers(), saved):
        b.copy_(v)


def _worker_grad(model: torch.nn.Module, work: Any, micro: list, scale: float) -> torch.Tensor:
    """Backward of one worker's slice with each per-sample loss sum scaled by ``scale``; its loss sum."""
    total = torch.zeros((), dtype=torch.float64)
    for x, y in micro:
        loss = summed_loss(work.loss_fn, model(x), y)
        (loss * scale).backward()
        total += loss.detach().double()
    return total


@torch.no_grad()
def _accuracy(model: torch.nn.Module, batches: Any) -> float:
    model.eval()
    hits = n = 0
    for x, y in batches.val_batches(1024):
        hits += int(correct(model(x), y))
        n += len(y)
    model.train()
    return hits / n


def train(cfg: LoopConfig, workers: int, method: str = "mean", local_steps: int = 1) -> Result:
    """One training run of ``cfg`` simulated on ``workers`` workers with ``method``."""
    torch.manual_seed(cfg.train.seed)
    work = build_workload(cfg)
    n = work.num_train
    policies = PolicySet.from_config(cfg, dataset_size=n)
    batches = [
        make_batches(
            work,
            seed=cfg.train.seed,
            rank=r,
            world=workers,
            max_local_batch=cfg.batch.max_local_batch,
            split_single=False,
        )
        for r in range(workers)
    ]
    copies = workers if method == "local_sgd" else 1
    models = [work.model] + [copy.deepcopy(work.model) for _ in range(copies - 1)]
    opts = [build_optimizer(m, cfg.optimizer) for m in models]
    for m in models:
        m.train()
    params = [list(m.parameters()) for m in models]
    grad_bytes = _float_bytes(params[0])
    B, epoch, cursor, step, samples, sent, syncs = cfg.batch.size, 0, 0, 0, 0, 0, 0
    epoch_losses: list[float] = []
    last_epoch_losses: list[float] = []
    nt_eta = cfg.batch.norm_test_eta if cfg.batch.policy == "norm_test" else None
    suggested: int | None = None
    while epoch + cursor / n < cfg.train.epochs - 1e-12:
        if policies.adapts_batch:
            d = policies.batch_policy.decide(step, epoch + cursor / n, B, BatchStats(norm_test=suggested))
            B = d.size if d else B
        slices = [b.next(epoch, cursor, B) for b in batches]
        bsz = len(slices[0].ids)
        s = policies.settings(epoch + cursor / n, B, workers, samples=bsz)
        for o in opts:
            policies.apply(o, s, first=step == 0)
        loss_sum = torch.zeros((), dtype=torch.float64)
        if method == "mean":
            models[0].zero_grad()
            for r, sl in enumerate(slices):
                loss_sum += _worker_grad(models[0], work, sl.micro, 1.0 / bsz)
                if r == 0:
                    kept = _buffers(models[0])
            _restore(models[0], kept)  # rank 0's BatchNorm statistics, as DDP's broadcast_buffers
            sent += grad_bytes
        elif method == "adasum":
            grads = []
            for r, sl in enumerate(slices):
                models[0].zero_grad()
                loss_sum += _worker_grad(models[0], work, sl.micro, 1.0 / max(1, sl.mine_len))
                grads.append([p.grad.detach().clone() if sl.mine_len else torch.zeros_like(p) for p in params[0]])
                if r == 0:
                    kept = _buffers(models[0])
            _restore(models[0], kept)  # rank 0's, as AdasumCombiner.sync_buffers
            for p, g in zip(params[0], adasum_layers(grads)):
                p.grad = g
            sent += grad_bytes
        else:
            for m, sl in zip(models, slices):
                m.zero_grad()
                loss_sum += _worker_grad(m, work, sl.micro, 1.0 / max(1, sl.mine_len))
        loss = float(loss_sum) / bsz
        if not math.isfinite(loss):
            return Result(float("nan"), float("nan"), step, samples, sent, syncs, B, True)
        for o in opts:
            o.step()
        step += 1
        if method == "local_sgd" and step % local_steps == 0:
            if nt_eta is not None and step % cfg.batch.check_every == 0:  # the local norm test at this sync
                g = [torch.cat([p.grad.double().reshape(-1) for p in ps]) for ps in params]
                b = [sl.mine_len for sl in slices]
                g_big = sum(bi * gi for bi, gi in zip(b, g)) / sum(b)
                var = local_variance(b, [float(gi.dot(gi)) for gi in g], float(g_big.dot(g_big)))
                r = norm_test(var, float(g_big.dot(g_big)), sum(b), nt_eta) if var is not None else None
                suggested = r.suggested if r is not None else None
                sent += (grad_bytes // 4 + 3) * 8
            sent += _average_into(models, opts)
            syncs += 1
        samples += bsz
        cursor += bsz
        epoch_losses.append(loss)
        if cursor >= n:
            epoch, cursor = epoch + 1, 0
            last_epoch_losses, epoch_losses = epoch_losses, []
    if method == "local_sgd" and step % local_steps:  # the run ends at a sync (trainers/combine/methods.py)
        sent += _average_into(models, opts)
        syncs += 1
    tail = epoch_losses or last_epoch_losses
    return Result(
        _accuracy(models[0], batches[0]),
        statistics.fmean(last_epoch_losses or tail),
        step,
        samples,
        sent,
        syncs,
        B,
        False,
    )


# --------------------------------------------------------------------------- the tables


RUNS = [0]


def repeat(make: Any, seeds: list[int], **kw: Any) -> list[Result]:
    RUNS[0] += len(seeds)
    return [train(make(seed), **kw) for seed in seeds]


def fmt_acc(rs: list[Result]) -> str:
    if any(r.diverged for r in rs):
        return f"diverged ({sum(r.diverged for r in rs)}/{len(rs)})"
    accs = [100 * r.val_acc for r in rs]
    spread = f" ± {statistics.stdev(accs):.1f}" if len(accs) > 1 else ""
    return f"{statistics.fmean(accs):5.1f}{spread}"


def mean_of(rs: list[Result], attr: str) -> float:
    vals = [getattr(r, attr) for r in rs if not r.diverged]
    return statistics.fmean(vals) if vals else float("nan")


def goyal(args: argparse.Namespace, seeds: list[int]) -> tuple[float, float]:
    b0, k = 32, 8
    E, ew = args.epochs, args.warmup_epochs
    print(
        f"\n## Goyal et al.: B0 = {b0} (1 worker) vs 8*B0 = {k * b0} ({k} workers, 32 each), {E:g} epochs, "
        f"lr {args.lr} at B0, SGD momentum 0.9, cosine decay; val accuracy % (mean ± sd over {len(seeds)} seeds)"
    )
    rows = [
        ("B0", b0, {"scaling_rule": "linear", "warmup": "none"}),
        ("8*B0 (a) no LR scaling", k * b0, {"scaling_rule": "none", "warmup": "none"}),
        ("8*B0 (b) linear, no warmup", k * b0, {"scaling_rule": "linear", "warmup": "none"}),
        (
            f"8*B0 (c) linear + gradual warmup {ew:g} ep",
            k * b0,
            {"scaling_rule": "linear", "warmup": "gradual", "warmup_epochs": ew},
        ),
        (
            f"8*B0 (d) sqrt + LEGW ({ew / k:g} ep x k)",
            k * b0,
            {"scaling_rule": "sqrt", "warmup": "legw", "warmup_epochs": ew / k},
        ),
    ]
    print(f"| {'setting':42} | {'val acc %':>12} | {'lr peak':>7} | {'steps':>5} |")
    print(f"|{'-' * 44}|{'-' * 14}|{'-' * 9}|{'-' * 7}|")
    acc = {}
    for name, B, sched in rows:

        def make(seed: int, B: int = B, sched: dict = sched) -> LoopConfig:
            return config(args.hidden, E, seed, optimizer={"lr": args.lr}, batch={"size": B}, schedule=sched)

        rs = repeat(make, seeds, workers=B // b0)
        peak = PolicySet.from_config(make(0), dataset_size=1438).schedule.peak_lr(B)
        acc[name[:8]] = mean_of(rs, "val_acc")
        print(f"| {name:42} | {fmt_acc(rs):>12} | {peak:7.3f} | {rs[0].steps:5d} |", flush=True)
    base = acc["B0"]
    gap_c = 100 * (base - acc["8*B0 (c)"])
    gap_b = 100 * (base - acc["8*B0 (b)"])
    return gap_c, gap_b


def tang(args: argparse.Namespace, seeds: list[int]) -> float:
    B = args.tang_batch
    print(
        f"\n## Tang et al.: final training loss (mean over the last epoch) at global batch {B} split over 1, 2, 4 "
        f"workers, per-worker BatchNorm, {args.epochs:g} epochs, lr {args.lr * B / 32:g} (linear from B0 = 32), "
        "warmup 2 epochs"
    )
    mfs: list[tuple[str, dict]] = [(f"MF {m}", {"mf": m}) for m in (0.8, 0.9, 0.95, 0.99)]
    mfs.append(("per-worker rule 0.9^(b/B)", {"mf": 0.9, "mf_rule": "per_worker_batch", "mf_ref_batch": B}))
    ws = (1, 2, 4)
    print("| MF | " + " | ".join(f"W={w} (b={B // w})" for w in ws) + " |")
    print("|---|" + "---|" * len(ws))
    losses = {}
    for name, opt in mfs:
        cells = []
        for w in ws:

            def make(seed: int, opt: dict = opt) -> LoopConfig:
                return config(
                    args.hidden,
                    args.epochs,
                    seed,
                    optimizer={"lr": args.lr, **opt},
                    batch={"size": B},
                    schedule={"warmup": "gradual", "warmup_epochs": 2},
                )

            rs = repeat(make, seeds, workers=w)
            tl = mean_of(rs, "train_loss")
            losses[(name, w)] = tl
            cells.append("diverged" if math.isnan(tl) else f"{tl:.4f}")
        print(f"| {name} | " + " | ".join(cells) + " |", flush=True)
    return losses[("MF 0.9", 4)] - losses[("MF 0.9", 1)]


def combination(args: argparse.Namespace, seeds: list[int]) -> float:
    B = args.comb_batch
    E = args.epochs
    print(
        f"\n## Gradient combination at global batch {B}, {E:g} epochs, SGD momentum 0.9 "
        f"(mean, local SGD: lr {args.lr} at B0 = 32 scaled linearly, gradual warmup {args.warmup_epochs:g} ep; "
        f"Adasum: lr tuned at the per-worker batch b, i.e. {args.lr} * b / 32, no scaling by W)"
    )
    print(
        f"| {'method':36} | {'W':>2} | {'val acc %':>12} | {'steps':>5} | {'samples':>7} | {'final B':>7} | "
        f"{'MB sent/worker':>14} | {'syncs':>5} |"
    )
    print(f"|{'-' * 38}|----|{'-' * 14}|-------|---------|---------|{'-' * 16}|-------|")
    warm = {"warmup": "gradual", "warmup_epochs": args.warmup_epochs}
    acc = {}

    def row(name: str, w: int, rs: list[Result]) -> None:
        acc[(name, w)] = mean_of(rs, "val_acc")
        print(
            f"| {name:36} | {w:2d} | {fmt_acc(rs):>12} | {rs[0].steps:5d} | {rs[0].samples:7d} | "
            f"{rs[0].final_batch:7d} | {mean_of(rs, 'bytes_sent') / 1e6:14.2f} | {rs[0].syncs:5d} |",
            flush=True,
        )

    for w in (2, 4):

        def mean_cfg(seed: int) -> LoopConfig:
            return config(args.hidden, E, seed, optimizer={"lr": args.lr}, batch={"size": B}, schedule=warm)

        def ada_cfg(seed: int, w: int = w) -> LoopConfig:
            b = B // w
            return config(
                args.hidden,
                E,
                seed,
                optimizer={"lr": args.lr * b / 32, "base_batch_size": b},
                batch={"size": B},
                schedule={"scaling_rule": "none"},
                combine={"method": "adasum"},
            )

        row("mean (per-step averaging)", w, repeat(mean_cfg, seeds, workers=w))
        row("adasum", w, repeat(ada_cfg, seeds, workers=w, method="adasum"))
    w = 4
    for H in (1, 4, 16):

        def loc_cfg(seed: int, H: int = H) -> LoopConfig:
            return config(
                args.hidden,
                E,
                seed,
                optimizer={"lr": args.lr},
                batch={"size": B},
                schedule=warm,
                combine={"method": "local_sgd", "local_steps": H},
            )

        row(f"local SGD H={H}", w, repeat(loc_cfg, seeds, workers=w, method="local_sgd", local_steps=H))
    start = max(32 * w, B // 4)
    for H in (1, 4, 16):

        def nt_cfg(seed: int, H: int = H) -> LoopConfig:
            return config(
                args.hidden,
                E,
                seed,
                optimizer={"lr": args.lr},
                schedule=warm,
                batch={
                    "size": start,
                    "policy": "norm_test",
                    "norm_test_eta": args.norm_test_eta,
                    "check_every": max(16, H),
                    "max_size": 4 * B,
                    "round_to": 32,
                },
                combine={"method": "local_sgd", "local_steps": H},
            )

        row(
            f"local SGD H={H} + norm test (B from {start})",
            w,
            repeat(nt_cfg, seeds, workers=w, method="local_sgd", local_steps=H),
        )
    return 100 * (acc[("adasum", 4)] - acc[("mean (per-step averaging)", 4)])


# --------------------------------------------------------------------------- ConAdv (a separate table)


def conadv_config(args: argparse.Namespace, seed: int, batch: int, method: str) -> LoopConfig:
    """The ConAdv table's task: a harder synthetic image set (3x8x8 Gaussian inputs in 4 classes
    labelled by a random two-layer teacher; the digits MLP shows no large-batch gap, and at 3x16x16
    the CNN does not learn the teacher in these epochs), the built-in CNN with BatchNorm, SGD with
    linear LR scaling from B0 = 32, gradual warmup and cosine decay; validated only at the end."""
    raw: dict[str, Any] = {
        "data": {"name": "synthetic", "shape": [3, 8, 8], "num_classes": 4, "size": args.adv_size},
        "model": {"name": "cnn", "norm": "batch", "hidden": args.adv_hidden},
        "optimizer": {"name": "sgd", "lr": args.adv_lr, "mf": 0.9, "base_batch_size": 32, "weight_decay": 5e-4},
        "batch": {"size": batch, "max_local_batch": batch},
        "schedule": {"scaling_rule": "linear", "warmup": "gradual", "warmup_epochs": args.adv_epochs / 6},
        "train": {
            "epochs": args.adv_epochs,
            "seed": seed,
            "eval_every": 10**9,  # validate at the end only: the step times are the steps'
            "adversarial": {"method": method, "epsilon": args.adv_epsilon},
        },
    }
    return LoopConfig.model_validate(raw)


def _loop_trainer(cfg: LoopConfig) -> Any:
    from trainers.link.runtime import Runtime  # noqa: PLC0415 - the ConAdv table alone runs the worker loop
    from trainers.loop.trainer import Trainer  # noqa: PLC0415 - the ConAdv table alone runs the worker loop

    return Trainer(cfg, Runtime(), rank=0, world=1, device=torch.device("cpu"))


def conadv_run(cfg: LoopConfig) -> tuple[float, int]:
    """One run through the worker loop itself (``Trainer`` on this CPU, one worker): the final
    validation accuracy and the steps."""
    t = _loop_trainer(cfg)
    metrics: dict[str, float] = {}
    while not t.plan.done:
        _, metrics = t.advance()
    t.close()
    return metrics["val/accuracy"], t.state.step


def conadv_step_ms(cfgs: dict[str, LoopConfig], steps: int) -> dict[str, float]:
    """Median step time (ms) of each config, its steps interleaved with the others' (a shared
    machine's load then weighs on each alike), after one step each."""
    trainers = {name: _loop_trainer(cfg) for name, cfg in cfgs.items()}
    times: dict[str, list[float]] = {name: [] for name in cfgs}
    for t in trainers.values():
        t.advance()
    for _ in range(steps):
        for name, t in trainers.items():
            t0 = time.perf_counter()
            t.advance()
            times[name].append(time.perf_counter() - t0)
    for t in trainers.values():
        t.close()
    return {name: 1000 * statistics.median(ts) for name, ts in times.items()}


def conadv_table(args: argparse.Namespace, seeds: list[int]) -> float:
    """none vs sync (two passes) vs ConAdv (stale by one) at a large B, and B0-scale reference."""
    big, small = args.adv_batch, 64
    print(
        f"\n## ConAdv (Liu et al. 2022): synthetic 3x8x8 ({args.adv_size} samples, 4 random-teacher classes), "
        f"CNN+BatchNorm hidden {args.adv_hidden}, {args.adv_epochs:g} epochs, SGD lr {args.adv_lr} at B0 = 32 "
        f"(linear scaling, gradual warmup, cosine), epsilon {args.adv_epsilon}; through the worker loop "
        f"(Trainer, 1 CPU worker, {torch.get_num_threads()} torch threads); val accuracy % over {len(seeds)} seed(s)"
    )
    print(f"| {'setting':28} | {'val acc %':>12} | {'step ms (median)':>16} | {'steps':>5} |")
    print(f"|{'-' * 30}|{'-' * 14}|{'-' * 18}|{'-' * 7}|")
    rows = [
        (f"B = {small}, none", small, "none"),
        (f"B = {big}, none", big, "none"),
        (f"B = {big}, sync (two passes)", big, "sync"),
        (f"B = {big}, conadv", big, "conadv"),
    ]
    ms = conadv_step_ms({name: conadv_config(args, 0, b, method) for name, b, method in rows}, args.adv_time_steps)
    acc: dict[str, float] = {}
    for name, b, method in rows:
        runs = [conadv_run(conadv_config(args, seed, b, method)) for seed in seeds]
        RUNS[0] += len(runs)
        accs = [100 * r[0] for r in runs]
        spread = f" ± {statistics.stdev(accs):.1f}" if len(accs) > 1 else ""
        acc[name] = statistics.fmean(accs)
        print(f"| {name:28} | {acc[name]:5.1f}{spread:7} | {ms[name]:16.1f} | {runs[0][1]:5d} |")
    print(f"(step times: medians of {args.adv_time_steps} steps, the four settings' steps interleaved)")
    return acc[f"B = {big}, conadv"] - acc[f"B = {big}, none"]


# --------------------------------------------------------------------------- table 4: decentralized momentum SGD


def _teacher_task(seed: int, n_train: int, n_val: int, dim: int = 32, classes: int = 10) -> tuple[torch.Tensor, ...]:
    """A synthetic task harder than digits: inputs N(0, I), labels the argmax of a random two-layer
    teacher (tanh, width 128) plus label noise; a fixed epoch budget with few steps shows the
    large-batch loss."""
    g = torch.Generator().manual_seed(1000 + seed)
    x = torch.randn(n_train + n_val, dim, generator=g)
    w1, w2 = torch.randn(dim, 128, generator=g) / dim**0.5, torch.randn(128, classes, generator=g)
    logits = torch.tanh(x @ w1) @ w2
    y = (logits + 0.3 * torch.randn(logits.shape, generator=g)).argmax(1)
    return x[:n_train], y[:n_train], x[n_train:], y[n_train:]


def _mlp(flat: torch.Tensor, x: torch.Tensor, dim: int, hidden: int, classes: int) -> torch.Tensor:
    """A one-hidden-layer ReLU MLP's logits as a function of its flat parameter vector."""
    a = dim * hidden
    w1, b1 = flat[:a].view(dim, hidden), flat[a : a + hidden]
    w2 = flat[a + hidden : a + hidden + hidden * classes].view(hidden, classes)
    return torch.relu(x @ w1 + b1) @ w2 + flat[a + hidden + hidden * classes :]


def _mlp_loss(
    flat: torch.Tensor, x: torch.Tensor, y: torch.Tensor, dim: int, hidden: int, classes: int
) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(_mlp(flat, x, dim, hidden, classes), y)  # vmap-able over workers


def decentral_run(
    method: str, batch: int, workers: int, data: str, epochs: float, lr0: float, seed: int, topology: str = "ring"
) -> dict[str, float]:
    """W workers simulated as rows of one tensor (``torch.func.vmap`` of each worker's gradient on its
    local batch), stepped by the product's recursions (``trainers/combine/decentral.py``
    ``dmsgd_step`` / ``decentlam_step``; ``mean``: PmSGD, every worker the mean gradient).  LR
    ``lr0 * B / 128`` (linear scaling) after a one-epoch linear warmup, momentum 0.9.  ``data``:
    ``iid`` (each worker its slice of one permutation per epoch, the product's data order) or
    ``shards`` (the training set sorted by label, worker i drawing only from shard i: the
    heterogeneous split under which the paper's inconsistency bias is large)."""
    from torch.func import grad, vmap  # noqa: PLC0415 - only this table uses torch.func

    from trainers.combine.decentral import (  # noqa: PLC0415 - keeps the other tables' imports as they were
        allreduce_bytes,
        consensus_distance,
        decentlam_step,
        dmsgd_step,
        mixing_matrix,
        neighbour_offsets,
    )

    dim, hidden, classes, n_train = 32, 64, 10, 8192
    xt, yt, xv, yv = _teacher_task(seed, n_train, 2048, dim, classes)
    torch.manual_seed(seed)
    p1, p2 = torch.randn(dim * hidden) * (2 / dim) ** 0.5, torch.randn(hidden * classes) * (1 / hidden) ** 0.5
    x0 = torch.cat([p1, torch.zeros(hidden), p2, torch.zeros(classes)])
    P = x0.numel()
    x = x0.repeat(workers, 1)  # the same initial weights on every worker, as in the product
    m = torch.zeros_like(x)
    mix = mixing_matrix(topology, workers).float()
    per = batch // workers
    gfun = vmap(grad(_mlp_loss), in_dims=(0, 0, 0, None, None, None))
    g = torch.Generator().manual_seed(seed)
    if data == "shards":
        order = yt.argsort()
        shards = order.view(workers, -1)
    steps_per_epoch = n_train // batch
    total = int(epochs * steps_per_epoch)
    warm = steps_per_epoch
    lr_peak = lr0 * batch / 128
    step, distances = 0, []
    while step < total:
        if data == "iid":
            perm = torch.randperm(n_train, generator=g)
            epoch_ids = [perm[i * batch : (i + 1) * batch].view(workers, per) for i in range(steps_per_epoch)]
        else:
            inner = torch.stack([s[torch.randperm(s.numel(), generator=g)] for s in shards])
            epoch_ids = [inner[:, i * per : (i + 1) * per] for i in range(steps_per_epoch)]
        for ids in epoch_ids:
            if step >= total:
                break
            lr = lr_peak * min(1.0, (step + 1) / warm)
            grads = gfun(x, xt[ids], yt[ids], dim, hidden, classes)
            if method == "mean":
                grads = grads.mean(0, keepdim=True).expand_as(grads)
                m = 0.9 * m + grads
                x = x - lr * m
            else:
                x, m = (decentlam_step if method == "decentlam" else dmsgd_step)(x, m, grads, lr, 0.9, mix)
            step += 1
            if not torch.isfinite(x).all():
                break
        distances.append(consensus_distance(x))
    logits = _mlp(x.mean(0), xv, dim, hidden, classes)  # the workers' average model
    acc = float((logits.argmax(1) == yv).float().mean()) if torch.isfinite(logits).all() else float("nan")
    sent = allreduce_bytes(P, 4, workers) if method == "mean" else len(neighbour_offsets(topology, workers)) * P * 4
    return {"acc": acc, "consensus": distances[-1], "max_consensus": max(distances), "bytes": sent, "steps": step}


def decentlam_table(args: argparse.Namespace, seeds: list[int]) -> float:
    """Table 4: PmSGD (combine.method mean) vs DmSGD vs DecentLaM at a small and a large global
    batch on W simulated workers: the average model's validation accuracy, the final consensus
    distance, the bytes one worker sends per step.  Returns DecentLaM's minus DmSGD's accuracy
    (points) at the large batch on label-sorted shards."""
    W, epochs = 8, args.dl_epochs
    print(
        f"\n4. Decentralized momentum SGD (Yuan et al. 2021), W={W} simulated workers, ring, synthetic "
        f"teacher task (8192 samples, 10 classes), MLP 32-64-10, {epochs:g} epochs, LR {args.dl_lr:g} x B/128"
    )
    print(f"{'data':7} {'B':>5} {'method':10} {'val acc %':>14} {'consensus':>10} {'bytes/step':>11}")
    acc: dict[tuple[str, int, str], float] = {}
    for data in ("iid", "shards"):
        for batch in args.dl_batches:
            for method in ("mean", "dmsgd", "decentlam"):
                rs = [decentral_run(method, batch, W, data, epochs, args.dl_lr, s) for s in seeds]
                accs = [100 * r["acc"] for r in rs]
                acc[(data, batch, method)] = statistics.fmean(accs)
                spread = f"+-{statistics.pstdev(accs):.1f}" if len(accs) > 1 else ""
                RUNS[0] += len(rs)
                consensus = statistics.fmean(r["consensus"] for r in rs)
                print(
                    f"{data:7} {batch:5d} {'PmSGD' if method == 'mean' else method:10} "
                    f"{acc[(data, batch, method)]:8.1f}{spread:>6} {consensus:10.2e} {rs[0]['bytes']:11d}"
                )
    big = max(args.dl_batches)
    return acc[("shards", big, "decentlam")] - acc[("shards", big, "dmsgd")]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="1 seed, 6 epochs, hidden 32: the same code path, seconds")
    p.add_argument("--seeds", type=int, default=None, help="seeds per row (default 3; quick 1)")
    p.add_argument("--epochs", type=float, default=None, help="epochs per run (default 24; quick 6)")
    p.add_argument("--hidden", type=int, default=None, help="MLP width (default 64; quick 32)")
    p.add_argument("--lr", type=float, default=0.05, help="LR tuned at B0 = 32")
    p.add_argument("--warmup-epochs", type=float, default=None, help="gradual warmup length (default 4; quick 1.5)")
    p.add_argument("--tang-batch", type=int, default=128, help="the Tang table's fixed global batch")
    p.add_argument("--comb-batch", type=int, default=256, help="the combination table's global batch")
    p.add_argument("--norm-test-eta", type=float, default=0.5, help="eta of the local norm test")
    p.add_argument(
        "--tables", default="goyal,tang,combine", help="which tables, comma-separated (also: decentlam, conadv)"
    )
    p.add_argument("--dl-batches", type=int, nargs=2, default=[128, 2048], help="decentlam table: small and large B")
    p.add_argument("--dl-lr", type=float, default=0.05, help="decentlam table: LR at B = 128")
    p.add_argument("--dl-epochs", type=float, default=None, help="decentlam table: epochs (default 20; quick 4)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--adv-batch", type=int, default=None, help="ConAdv table: the large B (default 1024; quick 512)")
    p.add_argument("--adv-epochs", type=float, default=None, help="ConAdv table: epochs (default 20; quick 4)")
    p.add_argument(
        "--adv-size", type=int, default=None, help="ConAdv table: synthetic samples (default 8192; quick 2048)"
    )
    p.add_argument("--adv-hidden", type=int, default=16, help="ConAdv table: CNN width")
    p.add_argument("--adv-lr", type=float, default=0.025, help="ConAdv table: LR at B0 = 32")
    p.add_argument("--adv-epsilon", type=float, default=0.05, help="ConAdv table: perturbation radius")
    p.add_argument("--adv-time-steps", type=int, default=None, help="ConAdv table: timed steps (default 20; quick 5)")
    args = p.parse_args(argv)
    quick = args.quick
    args.seeds = args.seeds or (1 if quick else 3)
    args.epochs = args.epochs or (6 if quick else 24)
    args.hidden = args.hidden or (32 if quick else 64)
    args.warmup_epochs = args.warmup_epochs or (1.5 if quick else 4)
    args.adv_batch = args.adv_batch or (512 if quick else 1024)
    args.adv_epochs = args.adv_epochs or (4 if quick else 20)
    args.adv_size = args.adv_size or (2048 if quick else 8192)
    args.adv_time_steps = args.adv_time_steps or (5 if quick else 20)
    args.dl_epochs = args.dl_epochs or (4 if quick else 20)
    if args.threads:
        torch.set_num_threads(args.threads)
    seeds = list(range(args.seeds))
    tables = set(args.tables.split(","))
    t0 = time.time()
    print(
        f"bench/large_batch.py: digits, MLP+BatchNorm hidden {args.hidden}, {args.epochs:g} epochs, seeds {seeds}; "
        "in one process simulating W workers (see the docstring)"
    )
    summary = {}
    if "goyal" in tables:
        summary["goyal_gap_c_points"], summary["goyal_gap_b_points"] = goyal(args, seeds)
    if "tang" in tables:
        summary["tang_loss_gap_w4"] = tang(args, seeds)
    if "combine" in tables:
        summary["adasum_minus_mean_points_w4"] = combination(args, seeds)
    if "conadv" in tables:  # not in the default --tables: --tables conadv
        summary["conadv_minus_none_points"] = conadv_table(args, seeds)
    if "decentlam" in tables:
        summary["decentlam_minus_dmsgd_points_shards_large_b"] = decentlam_table(args, seeds)
    print()
    print(" ".join(f"{k}={v:.3f}" for k, v in summary.items()))  # nan where a row diverged
    print(f"runs={RUNS[0]} wall_s={time.time() - t0:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
