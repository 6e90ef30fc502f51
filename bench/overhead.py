"""Per-step throughput of the orchestrator's loop at W=1 against a plain PyTorch loop.

Both train the same model on the same data with the same global batch, optimizer and
thread count, in the same run of this script (absolute figures mean little on a shared
machine; the ratio is the result).  The orchestrator's figure is its own
``throughput/samples_per_s`` metric (flush-to-flush wall time of the loop, including
metric pushes, excluding validation and checkpoints).  Two more rows split the gap: the
plain loop inside a bare Ray Train worker (what the Ray worker process and Ray's own
processes on the node cost) and the orchestrator's step code in this process (what the
loop's own code costs).  Also printed: the time from the ``train`` invocation to the
first completed optimizer step, and the whole run's wall time.

    .venv/bin/python bench/overhead.py [--epochs 10] [--model cnn] [--batch 64] [--threads 2]
        [--size N]   # synthetic 8x8 data of N samples instead of digits (longer epochs)
        [--repeats R]

Last line: ``ratio=<orchestrator/plain>`` (goal: >= 0.95).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from bench.common import median, scratch_dir, table, temp_config  # noqa: E402
from trainers.data import epoch_permutation, load_data  # noqa: E402
from trainers.models import build_model  # noqa: E402
from trainers.optim import build_optimizer  # noqa: E402


def windowed_rates(step, n: int, batch: int, seed: int, epochs: int, window: int = 10) -> list[float]:
    """Samples/s over ``window``-step windows of ``step(ids)`` walking the run's data order."""
    rates = []
    for epoch in range(epochs):
        perm = epoch_permutation(seed, epoch, n)
        t0, samples = time.perf_counter(), 0
        for i, s in enumerate(range(0, n, batch)):
            ids = perm[s:s + batch]
            step(ids)
            samples += len(ids)
            if (i + 1) % window == 0:
                now = time.perf_counter()
                rates.append(samples / (now - t0))
                t0, samples = now, 0
    return rates


def plain_loop(cfg, epochs: int, threads: int) -> list[float]:
    """The ceiling: one process, tensors indexed by the permutation slice, nothing else."""
    torch.set_num_threads(threads)
    torch.manual_seed(cfg.train.seed)
    data = load_data(cfg.data, cfg.train.seed)
    model = build_model(data.info, cfg.model)
    opt = build_optimizer(model, cfg.optimizer)
    model.train()

    def step(ids) -> None:
        loss = F.cross_entropy(model(data.train_x[ids]), data.train_y[ids])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        float(loss.detach())  # the orchestrator reads its loss every step too

    return windowed_rates(step, data.num_train, cfg.batch.size, cfg.train.seed, epochs)


def loop_in_process(cfg, epochs: int, threads: int) -> list[float]:
    """The orchestrator's own step code (``Trainer.train_step`` + per-step metrics) without Ray:
    separates the loop's overhead from the Ray worker environment's."""
    from trainers.loop import LoopConfig, Runtime, Trainer

    torch.set_num_threads(threads)
    t = Trainer(LoopConfig.model_validate(cfg.loop_dict()), Runtime(), rank=0, world=1, device=torch.device("cpu"))
    return windowed_rates(lambda ids: t.metrics_for_step(t.train_step(ids), len(ids)), t.n, cfg.batch.size,
                          cfg.train.seed, epochs)


def plain_in_ray_train(cfg, epochs: int, threads: int) -> list[float]:
    """The plain loop as the train function of a bare one-worker ``TorchTrainer``."""
    import json

    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    out = os.path.join(scratch_dir(), "rates.json")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def loop(c):
        sys.path.insert(0, c["root"])
        from bench.overhead import plain_loop as plain

        with open(c["out"], "w") as f:
            json.dump(plain(c["cfg"], c["epochs"], c["threads"]), f)

    TorchTrainer(loop, train_loop_config={"cfg": cfg, "epochs": epochs, "threads": threads, "out": out, "root": root},
                 scaling_config=ScalingConfig(num_workers=1, resources_per_worker={"CPU": threads}),
                 run_config=RunConfig(storage_path=scratch_dir(), name="plain")).fit()
    with open(out) as f:
        return json.load(f)


def orchestrator_run(cfg):
    from mlflow.tracking import MlflowClient

    from orchestrator.runner import run_training

    summary = run_training(cfg, progress=False, t_invoked=time.time())
    hist = MlflowClient(cfg.tracking.uri).get_metric_history(summary.run_id, "throughput/samples_per_s")
    rates = [m.value for m in sorted(hist, key=lambda m: m.step)][1:]  # the first window holds warm-up
    return summary, rates


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--model", default="cnn")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--size", type=int, default=0, help="synthetic data of this many samples (0: digits)")
    ap.add_argument("--repeats", type=int, default=1)
    a = ap.parse_args()
    data = {"name": "synthetic", "size": a.size, "shape": [1, 8, 8]} if a.size else {"name": "digits"}
    cfg, _ = temp_config(
        data=data, model={"name": a.model, "norm": "batch", "hidden": 64},
        optimizer={"name": "sgd", "lr": 0.1, "mf": 0.9, "base_batch_size": a.batch},
        batch={"size": a.batch, "max_local_batch": a.batch},
        scaling={"min_workers": 1, "max_workers": 1, "cpus_per_worker": a.threads},
        train={"epochs": a.epochs, "eval_every": 0},
    )
    from orchestrator.runner import ensure_ray

    started = ensure_ray(verbose=False, num_cpus=os.cpu_count())  # one Ray for both Ray rows
    plain, in_ray, orch, local, summaries = [], [], [], [], []
    for _ in range(a.repeats):  # interleaved, so that a noisy minute hits every row alike
        plain += plain_loop(cfg, a.epochs, a.threads)
        summary, rates = orchestrator_run(cfg)
        orch += rates
        summaries.append(summary)
        in_ray += plain_in_ray_train(cfg, a.epochs, a.threads)
        plain += plain_loop(cfg, a.epochs, a.threads)
        local += loop_in_process(cfg, a.epochs, a.threads)
    if started:
        import ray

        ray.shutdown()
    p, o = median(plain), median(orch)
    what = f"synthetic 1x8x8 (n={a.size})" if a.size else "digits"
    print(f"{what}, {a.model}, B={a.batch}, {a.threads} threads, {a.epochs} epochs, {a.repeats} repeat(s); "
          f"median samples/s over windows (plain: 10 steps; orchestrator: its push windows, ~0.25 s)")
    print(table([
        ("plain PyTorch loop", f"{p:,.0f}", "1.000"),
        ("plain loop in a bare Ray Train worker", f"{median(in_ray):,.0f}", f"{median(in_ray) / p:.3f}"),
        ("orchestrator step code in-process, no Ray", f"{median(local):,.0f}", f"{median(local) / p:.3f}"),
        ("orchestrator loop, W=1", f"{o:,.0f}", f"{o / p:.3f}"),
    ], ("loop", "samples/s", "vs plain")))
    s0 = summaries[-1]
    print(f"time from train invocation to first step: {median([s.first_step_s for s in summaries]):.1f} s; "
          f"whole run {median([s.wall_s for s in summaries]):.1f} s for {s0.steps} steps")
    print(f"ratio={o / p:.3f}")


if __name__ == "__main__":
    main()
