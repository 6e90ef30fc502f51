"""Per-step throughput of the orchestrator's loop at W=1 against a plain PyTorch loop.

Both train the same model on the same data with the same global batch, optimizer and
thread count, in the same run of this script (absolute figures mean little on a shared
machine; the ratio is the result).  The orchestrator's figure is its own
``throughput/samples_per_s`` metric (flush-to-flush wall time of the loop, including
metric pushes, excluding validation and checkpoints); every row is the median over windows
of about the same length (``train.push_every_s``, 0.25 s).  Two more rows split the gap: the
plain loop inside a bare Ray Train worker (what the Ray worker process and Ray's own
processes on the node cost) and the orchestrator's step code in a plain process (what the
loop's own code costs).  The plain rows run in fresh processes that never join Ray.  Also
printed: the time from the ``train`` invocation to the first completed optimizer step, and the
whole run's wall time.

    .venv/bin/python bench/overhead.py [--epochs 10] [--model cnn] [--batch 64] [--threads 2]
        [--size N]   # synthetic 8x8 data of N samples instead of digits (longer epochs)
        [--repeats R] [--warmup 1]   # rounds, interleaved; warm-up rounds are not counted

Each round runs the plain loop, the orchestrator, the bare Ray Train worker, the plain loop again
and the step code; a round's ratio is the orchestrator's median over the median of that round's
two plain runs (the machine drifts by more than the effect between rounds a minute apart, so
rounds are compared within themselves), and the result is the median round.  Also printed (Linux):
the share of the machine's CPU that went to other processes than the training worker while the
orchestrator trained (Ray's daemons and actors, the driver, the monitor).

Last line: ``ratio=<orchestrator/plain>`` (goal: >= 0.95).
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from bench.common import median, scratch_dir, table, temp_config  # noqa: E402
from trainers.data import epoch_permutation, load_data  # noqa: E402
from trainers.models import build_model  # noqa: E402
from trainers.optim import build_optimizer  # noqa: E402


def windowed_rates(step, n: int, batch: int, seed: int, epochs: int, window_s: float) -> list[float]:
    """Samples/s over windows of about ``window_s`` seconds (the orchestrator's push windows) of
    ``step(ids)`` walking the run's data order; the first window (warm-up) is left out, as for the
    orchestrator.  Windows as long as the orchestrator's: short ones (say 10 steps) would let the
    median step over the stalls that other processes cause, which the orchestrator's windows
    cannot."""
    rates = []
    start = t0 = time.perf_counter()
    samples = total = 0
    for epoch in range(epochs):  # windows run on across epoch ends (a digits epoch is shorter than one)
        perm = epoch_permutation(seed, epoch, n)
        for s in range(0, n, batch):
            ids = perm[s:s + batch]
            step(ids)
            samples += len(ids)
            total += len(ids)
            now = time.perf_counter()
            if now - t0 >= window_s:
                rates.append(samples / (now - t0))
                t0, samples = now, 0
    return rates[1:] or [total / (time.perf_counter() - start)]  # too short for two windows: the whole run


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

    return windowed_rates(step, data.num_train, cfg.batch.size, cfg.train.seed, epochs, cfg.train.push_every_s)


def loop_in_process(cfg, epochs: int, threads: int) -> list[float]:
    """The orchestrator's own step code (``Trainer.train_step`` + per-step metrics) without Ray:
    separates the loop's overhead from the Ray worker environment's."""
    from trainers.loop import LoopConfig, Runtime, Trainer

    torch.set_num_threads(threads)
    t = Trainer(LoopConfig.model_validate(cfg.loop_dict()), Runtime(), rank=0, world=1, device=torch.device("cpu"))
    return windowed_rates(lambda ids: t.metrics_for_step(t.train_step(ids), len(ids)), t.n, cfg.batch.size,
                          cfg.train.seed, epochs, cfg.train.push_every_s)


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


def in_fresh_process(row: str, config_path: str, epochs: int, threads: int) -> list[float]:
    """Run ``plain_loop`` or ``loop_in_process`` (on the config saved at ``config_path``) in a new
    Python process that never joins Ray: the driver process (this one) runs Ray's client threads,
    which a reference must not pay for."""
    import json
    import subprocess

    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", row, "--child-config", config_path,
                          "--epochs", str(epochs), "--threads", str(threads)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def child(row: str, config_path: str, epochs: int, threads: int) -> None:
    import json

    from orchestrator.config import validate

    with open(config_path) as f:
        cfg = validate(json.load(f))
    print(json.dumps((plain_loop if row == "plain" else loop_in_process)(cfg, epochs, threads)))


class OtherCpu:
    """Samples, once a second, the machine's busy CPU time (``/proc/stat``) and the training
    worker process's (``ray::RayTrainWorker``); keeps, for the seconds in which the worker ran on
    more than half a core, the share of the machine used by everything else."""

    def __init__(self):
        self.shares: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def _read(path: str) -> str:
        with open(path) as f:
            return f.read()

    def _busy(self) -> int:
        v = [int(x) for x in self._read("/proc/stat").splitlines()[0].split()[1:]]
        return sum(v[:8]) - v[3] - v[4]  # all but idle and iowait (guest time is inside user)

    def _worker(self) -> int:
        ticks = 0
        for p in filter(str.isdigit, os.listdir("/proc")):
            try:
                if self._read(f"/proc/{p}/comm").startswith("ray::RayTrainWo"):
                    stat = self._read(f"/proc/{p}/stat")
                    fields = stat[stat.rfind(")") + 2:].split()  # utime, stime: fields 14, 15
                    ticks += int(fields[11]) + int(fields[12])
            except OSError:  # the process ended meanwhile
                continue
        return ticks

    def _run(self) -> None:
        hz, cpus = os.sysconf("SC_CLK_TCK"), os.cpu_count() or 1
        busy, worker = self._busy(), self._worker()
        while not self._stop.wait(1.0):
            b, w = self._busy(), self._worker()
            if w - worker > hz / 2:
                self.shares.append(max(0, (b - busy) - (w - worker)) / (hz * cpus))
            busy, worker = b, w

    def __enter__(self) -> "OtherCpu":
        if os.path.exists("/proc/stat"):
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()


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
    ap.add_argument("--warmup", type=int, default=1,
                    help="rounds run first and not counted (a Ray just started is busy for a while)")
    ap.add_argument("--child", choices=("plain", "local"), help=argparse.SUPPRESS)
    ap.add_argument("--child-config", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return child(a.child, a.child_config, a.epochs, a.threads)
    data = {"name": "synthetic", "size": a.size, "shape": [1, 8, 8]} if a.size else {"name": "digits"}
    cfg, _ = temp_config(
        data=data, model={"name": a.model, "norm": "batch", "hidden": 64},
        optimizer={"name": "sgd", "lr": 0.1, "mf": 0.9, "base_batch_size": a.batch},
        batch={"size": a.batch, "max_local_batch": a.batch},
        scaling={"min_workers": 1, "max_workers": 1, "cpus_per_worker": a.threads},
        train={"epochs": a.epochs, "eval_every": 0},
    )
    from orchestrator.runner import ensure_ray

    import json

    cfg_path = os.path.join(scratch_dir(), "cfg.json")  # for the rows run in fresh processes
    with open(cfg_path, "w") as f:
        json.dump(cfg.model_dump(mode="json"), f)
    started = ensure_ray(verbose=False, num_cpus=os.cpu_count())  # one Ray for both Ray rows
    for _ in range(a.warmup):
        orchestrator_run(cfg)
        plain_in_ray_train(cfg, a.epochs, a.threads)
    plain, in_ray, orch, local, summaries, rounds, other = [], [], [], [], [], [], []
    for _ in range(a.repeats):  # interleaved, so that a noisy minute hits every row alike
        before = in_fresh_process("plain", cfg_path, a.epochs, a.threads)
        with OtherCpu() as cpu:
            summary, rates = orchestrator_run(cfg)
        other += cpu.shares
        summaries.append(summary)
        in_ray += plain_in_ray_train(cfg, a.epochs, a.threads)
        after = in_fresh_process("plain", cfg_path, a.epochs, a.threads)
        local += in_fresh_process("local", cfg_path, a.epochs, a.threads)
        rounds.append(median(rates) / median(before + after))
        plain += before + after
        orch += rates
    if started:
        import ray

        ray.shutdown()
    p, o = median(plain), median(orch)
    what = f"synthetic 1x8x8 (n={a.size})" if a.size else "digits"
    print(f"{what}, {a.model}, B={a.batch}, {a.threads} threads, {a.epochs} epochs, {a.repeats} round(s) "
          f"after {a.warmup} warm-up round(s); "
          f"median samples/s over windows of ~{cfg.train.push_every_s} s (the orchestrator's push windows)")
    print(table([
        ("plain PyTorch loop", f"{p:,.0f}", "1.000"),
        ("plain loop in a bare Ray Train worker", f"{median(in_ray):,.0f}", f"{median(in_ray) / p:.3f}"),
        ("orchestrator step code, plain process, no Ray", f"{median(local):,.0f}", f"{median(local) / p:.3f}"),
        ("orchestrator loop, W=1", f"{o:,.0f}", f"{o / p:.3f}"),
    ], ("loop", "samples/s", "vs plain (all rounds pooled)")))
    s0 = summaries[-1]
    print(f"time from train invocation to first step: {median([s.first_step_s for s in summaries]):.1f} s; "
          f"whole run {median([s.wall_s for s in summaries]):.1f} s for {s0.steps} steps")
    if other:
        print(f"while the orchestrator trained, other processes than the training worker used "
              f"{100 * median(other):.1f}% of the machine's CPU (median of {len(other)} seconds)")
    print("orchestrator / plain by round: " + ", ".join(f"{r:.3f}" for r in rounds))
    ratio = median(rounds)
    print(f"ratio={ratio:.3f}")


if __name__ == "__main__":
    main()
