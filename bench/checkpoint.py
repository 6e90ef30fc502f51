"""Time to save and to restore a full training checkpoint (model + optimizer state + counters),
through the same atomic write / checksum / weights-only load the workers use.

    .venv/bin/python bench/checkpoint.py [--repeats 3] [--models cnn,resnet50] [--quick]

Reference in the same run: a bare ``torch.save``/``torch.load`` of the same payload (the cost
of the format itself), so the overhead of atomicity and verification shows as a ratio.
``--quick`` (CI): one repeat, the small CNN and ResNet-18.  Last line:
``save_ratio=<checkpoint save / torch.save> restore_ratio=<restore / torch.load>`` for the
largest payload.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from bench.common import median, parse_args, scratch_dir, table  # noqa: E402
from trainers.data.datasets import DatasetInfo  # noqa: E402
from trainers.loop.checkpoint import read_checkpoint, write_checkpoint  # noqa: E402
from trainers.policies.plan import TrainState  # noqa: E402
from trainers.workload.models import ModelConfig, build_model  # noqa: E402


def payload(name: str) -> dict:
    info = DatasetInfo((1, 8, 8), 10) if name == "cnn" else DatasetInfo((3, 32, 32), 10)
    model = build_model(info, ModelConfig(name=name, hidden=64))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(2, *info.shape)).sum().backward()
    opt.step()  # creates the momentum buffers: a checkpoint carries them too
    return {
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "train": TrainState(step=1).state_dict(),
        "rng": {"torch": torch.get_rng_state()},
    }


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--models", default="cnn,resnet50", help="comma-separated: cnn, mlp, resnet18, resnet50")
    a = parse_args(ap, quick={"repeats": 1, "models": "cnn,resnet18"})
    names = [n.strip() for n in a.models.split(",") if n.strip()]
    if not names or a.repeats < 1:
        print("error: --models needs at least one model and --repeats at least 1", file=sys.stderr)
        raise SystemExit(2)
    rows = []
    largest = (-1.0, float("nan"), float("nan"))  # (MiB, save ratio, restore ratio)
    for name in names:
        p = payload(name)
        root = scratch_dir("elastic-ckpt-bench-")
        saves, loads, raw_saves, raw_loads = [], [], [], []
        for i in range(a.repeats):
            d = os.path.join(root, f"ckpt{i}")
            saves.append(timed(lambda: write_checkpoint(d, p)))
            loads.append(timed(lambda: read_checkpoint(d)))
            f = os.path.join(root, f"raw{i}.pt")
            raw_saves.append(timed(lambda: torch.save(p, f)))
            raw_loads.append(timed(lambda: torch.load(f, weights_only=True)))
        size = os.path.getsize(os.path.join(root, "ckpt0", "state.pt")) / 2**20
        if size > largest[0]:
            largest = (size, median(saves) / median(raw_saves), median(loads) / median(raw_loads))
        rows.append(
            (
                name,
                f"{size:.1f}",
                f"{median(saves) * 1000:.1f}",
                f"{median(raw_saves) * 1000:.1f}",
                f"{median(loads) * 1000:.1f}",
                f"{median(raw_loads) * 1000:.1f}",
                f"{median(saves) / median(raw_saves):.2f}",
                f"{median(loads) / median(raw_loads):.2f}",
            )
        )
    print(f"CPU, median of {a.repeats}; checkpoint = atomic write + sha256 manifest / verified weights-only load")
    print(
        table(
            rows,
            ("model", "MiB", "save ms", "torch.save ms", "restore ms", "torch.load ms", "save ratio", "restore ratio"),
        )
    )
    print(f"save_ratio={largest[1]:.3f} restore_ratio={largest[2]:.3f}")


if __name__ == "__main__":
    main()
