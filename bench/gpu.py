"""Throughput of the GPU fast path: a tuned plain PyTorch loop, samples/s, peak memory.

The tuned plain loop is the reference of issue #20: the model of ``trainers/models.py``
(``build_model``: ResNet-18/50 with the CIFAR stem) on synthetic 3x32x32 uint8 images held on
the device (``trainers/device.py:DeviceData``, normalised per batch with the CIFAR mean/std),
bf16 autocast (``trainers/precision.py``), channels_last, SGD with momentum, the loss read
back every step (the orchestrator reads its loss every step too).  Optional: ``--compile``,
``--augment`` (``trainers/augment.py``), ``--data host`` (pinned host tensors copied with
``non_blocking`` every step, the issue's "data on the host" figure).

Rows run in rounds: each round times every row for ``--steps`` steps after ``--warmup`` steps
of its own (compilation and cuDNN autotuning fall in the warm-up), so rows see the same machine
within a round; a row's figure is the median over the rounds.  A row is a function
``(Setup, warmup, steps) -> Measurement`` in ``ROWS``: the plain loop here; the lead adds the
bare Ray Train worker and the orchestrator at W=1 (same ``Setup``), and ``report`` then prints
``ratio=<orchestrator / plain>``.

    python bench/gpu.py [--models resnet18,resnet50] [--batch 256] [--steps 50] [--warmup 10]
        [--rounds 3] [--device cuda|cpu] [--precision bf16] [--no-channels-last] [--data device|host]
        [--compile] [--augment random_crop,hflip] [--quick]

``--device cpu --quick`` runs a tiny form in seconds (8x8 images, B=4; what CI exercises).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time
from dataclasses import dataclass, field, replace
from typing import Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from trainers.augment import Augment  # noqa: E402
from trainers.data import CIFAR_MEAN, CIFAR_STD, DatasetInfo, epoch_permutation  # noqa: E402
from trainers.device import DeviceData, compile_model, to_channels_last  # noqa: E402
from trainers.models import ModelConfig, build_model  # noqa: E402
from trainers.precision import Precision, check_precision  # noqa: E402


@dataclass(frozen=True)
class Setup:
    """What every row trains: the same model, batch, data and settings."""

    model: str = "resnet18"
    batch: int = 256
    device: str = "cuda"
    precision: str = "bf16"
    channels_last: bool = True
    data: str = "device"  # device: the set lives on the accelerator; host: pinned, copied each step
    compile: bool = False
    augment: tuple[str, ...] = ()
    size: int = 8192  # synthetic samples
    image: int = 32  # side of the synthetic square images (the quick form uses 8)
    seed: int = 0
    lr: float = 0.1
    momentum: float = 0.9


@dataclass
class Measurement:
    row: str
    model: str
    samples_per_s: float
    steps: int
    seconds: float
    peak_memory_bytes: int
    extra: dict[str, float] = field(default_factory=dict)


# -- the data and the tuned plain loop ---------------------------------------------------------------

def synthetic_images(n: int, seed: int, side: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` random uint8 3 x side x side images and labels in 0..9 (CPU tensors)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, 3, side, side), dtype=torch.uint8, generator=g), \
        torch.randint(0, 10, (n,), generator=g)


def plain_step(setup: Setup) -> tuple[Callable[[np.ndarray, int], float], int]:
    """The tuned plain loop's step ``step(ids, epoch) -> loss`` and the number of samples."""
    dev = torch.device(setup.device)
    torch.manual_seed(setup.seed)
    x, y = synthetic_images(setup.size, setup.seed, setup.image)
    model = build_model(DatasetInfo((3, setup.image, setup.image), 10), ModelConfig(name=setup.model))
    if setup.channels_last:
        model = to_channels_last(model)
    model = model.to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=setup.lr, momentum=setup.momentum)
    net = compile_model(model) if setup.compile else model
    prec = Precision(setup.precision, dev)
    aug = Augment(setup.augment, setup.seed) if setup.augment else None
    if setup.data == "device":
        data = DeviceData(x, y, dev, CIFAR_MEAN, CIFAR_STD, channels_last=setup.channels_last)
        fetch = lambda ids, epoch: data.batch(ids, aug, epoch)  # noqa: E731
    else:  # the host path: normalise once on the host, pin, copy each batch
        host = DeviceData(x, y, "cpu", CIFAR_MEAN, CIFAR_STD)
        xs, ys = host.normalize(host.x), host.y
        if dev.type == "cuda":
            xs, ys = xs.pin_memory(), ys.pin_memory()

        def fetch(ids, epoch):
            idx = torch.as_tensor(ids)
            xb = xs.index_select(0, idx)
            yb = ys.index_select(0, idx)
            if dev.type == "cuda":
                xb, yb = xb.pin_memory(), yb.pin_memory()
            xb = xb.to(dev, non_blocking=True)
            if aug is not None:  # host data is already normalised: crop padding is the mean colour here
                xb = aug(xb, idx, epoch)
            if setup.channels_last:
                xb = xb.contiguous(memory_format=torch.channels_last)
            return xb, yb.to(dev, non_blocking=True)
    model.train()

    def step(ids: np.ndarray, epoch: int) -> float:
        xb, yb = fetch(ids, epoch)
        with prec.autocast():
            out = net(xb)
            per_sample = F.cross_entropy(out, yb, reduction="none")
        loss = per_sample.float().sum() / len(ids)
        opt.zero_grad(set_to_none=True)
        prec.backward(loss)
        prec.step(opt)
        return float(loss.detach())  # one host sync a step, as the orchestrator's loop

    return step, setup.size


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed_steps(step: Callable[[np.ndarray, int], float], n: int, setup: Setup, warmup: int,
                steps: int) -> tuple[int, float]:
    """Run ``warmup`` then ``steps`` steps along the data order; (samples, seconds) of the latter."""
    epoch, cursor, done, samples, t0 = 0, 0, 0, 0, 0.0
    perm = epoch_permutation(setup.seed, epoch, n)
    while done < warmup + steps:
        if cursor + setup.batch > n:  # whole batches only: every timed step has the same size
            epoch, cursor = epoch + 1, 0
            perm = epoch_permutation(setup.seed, epoch, n)
        if done == warmup:
            _sync(setup.device)
            t0 = time.perf_counter()
        step(perm[cursor:cursor + setup.batch], epoch)
        cursor += setup.batch
        done += 1
        if done > warmup:
            samples += setup.batch
    _sync(setup.device)
    return samples, time.perf_counter() - t0


def reset_peak_memory(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()


def peak_memory(device: str) -> int:
    """Peak bytes: the accelerator's allocated memory, or on CPU the process's max RSS."""
    if device.startswith("cuda"):
        return int(torch.cuda.max_memory_allocated())
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def device_name(device: str) -> str:
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    import platform

    return f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def measure_plain(setup: Setup, warmup: int, steps: int) -> Measurement:
    """The row ``plain``: the tuned plain PyTorch loop in this process."""
    reset_peak_memory(setup.device)
    step, n = plain_step(setup)
    samples, seconds = timed_steps(step, n, setup, warmup, steps)
    return Measurement("plain", setup.model, samples / max(seconds, 1e-9), steps, seconds, peak_memory(setup.device))


#: row name -> (label, runner).  Runners of rows in other processes (a bare Ray Train worker, the
#: orchestrator at W=1) return a Measurement of the same Setup; ``report`` prints the ratio of
#: ``orchestrator`` (and ``ray``) to ``plain`` when they are present.
ROWS: dict[str, tuple[str, Callable[[Setup, int, int], Measurement]]] = {
    "plain": ("tuned plain PyTorch loop", measure_plain),
}


def run_rounds(setup: Setup, rows: list[str], warmup: int, steps: int, rounds: int) -> dict[str, list[Measurement]]:
    """Every row once per round, in order; the measurements by row."""
    out: dict[str, list[Measurement]] = {r: [] for r in rows}
    for _ in range(rounds):
        for r in rows:
            out[r].append(ROWS[r][1](setup, warmup, steps))
    return out


def summarize(ms: list[Measurement]) -> Measurement:
    """A row's figure over its rounds: the median rate, the largest peak memory."""
    rate = statistics.median(m.samples_per_s for m in ms)
    return replace(ms[0], samples_per_s=rate, seconds=sum(m.seconds for m in ms),
                   peak_memory_bytes=max(m.peak_memory_bytes for m in ms))


def report(setup: Setup, results: dict[str, list[Measurement]]) -> str:
    """The table of one model's rows and, where the rows exist, ``ratio=`` lines."""
    from bench.common import table

    summ = {r: summarize(ms) for r, ms in results.items()}
    base = summ.get("plain")
    rows = [(ROWS[r][0], f"{m.samples_per_s:,.0f}",
             f"{m.samples_per_s / base.samples_per_s:.3f}" if base else "-",
             f"{m.peak_memory_bytes / 2 ** 20:,.0f} MiB", len(results[r])) for r, m in summ.items()]
    lines = [table(rows, ("loop", "samples/s", "of plain", "peak memory", "rounds"))]
    if base:
        lines.append(f"plain_samples_per_s={base.samples_per_s:.1f}")
    if base and "ray" in summ:
        lines.append(f"ratio_ray={summ['ray'].samples_per_s / base.samples_per_s:.3f}")
    if base and "orchestrator" in summ:
        lines.append(f"ratio={summ['orchestrator'].samples_per_s / base.samples_per_s:.3f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="resnet18,resnet50")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--steps", type=int, default=50, help="timed steps per row and round")
    ap.add_argument("--warmup", type=int, default=10, help="untimed steps first (compile, autotuning)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--precision", default="bf16", choices=("fp32", "bf16", "fp16"))
    ap.add_argument("--no-channels-last", action="store_true")
    ap.add_argument("--data", default="device", choices=("device", "host"))
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--augment", default="", help="comma-separated, e.g. random_crop,hflip")
    ap.add_argument("--size", type=int, default=8192, help="synthetic samples")
    ap.add_argument("--rows", default="plain", help="comma-separated: " + ", ".join(ROWS))
    ap.add_argument("--quick", action="store_true", help="a tiny form: 8x8 images, B<=4, 2 steps, 1 warm-up, "
                    "1 round")
    a = ap.parse_args(argv)
    rows = [r.strip() for r in a.rows.split(",") if r.strip()]
    models = [m.strip() for m in a.models.split(",") if m.strip()]
    try:
        bad = [r for r in rows if r not in ROWS]
        if bad or not rows:
            raise ValueError(f"--rows: unknown {bad}; choose from {', '.join(ROWS)}")
        bad = [m for m in models if m not in ("resnet18", "resnet50", "cnn")]
        if bad or not models:
            raise ValueError(f"--models: unknown {bad}; choose from resnet18, resnet50, cnn")
        check_precision(a.precision, torch.device(a.device).type)
        if a.device.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError("--device: no CUDA GPU here; use --device cpu")
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2)
    if a.quick:
        a.batch, a.steps, a.warmup, a.rounds, a.size = min(a.batch, 4), 2, 1, 1, min(a.size, 32)
    print(f"device: {device_name(a.device)}; {'3x8x8' if a.quick else '3x32x32'} synthetic, B={a.batch}, "
          f"{a.precision}, "
          f"{'NCHW' if a.no_channels_last else 'channels_last'}, data on {a.data}, "
          f"compile={'on' if a.compile else 'off'}, augment={a.augment or 'none'}; "
          f"{a.warmup} warm-up + {a.steps} timed steps, {a.rounds} round(s)", flush=True)
    for model in models:
        setup = Setup(model=model, batch=a.batch, device=a.device, precision=a.precision,
                      channels_last=not a.no_channels_last, data=a.data, compile=a.compile,
                      augment=tuple(x for x in a.augment.split(",") if x), size=max(a.size, a.batch),
                      image=8 if a.quick else 32)
        results = run_rounds(setup, rows, a.warmup, a.steps, a.rounds)
        print(f"\n{model}:")
        print(report(setup, results), flush=True)


if __name__ == "__main__":
    main()
