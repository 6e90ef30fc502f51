"""What Ray itself costs the test suite and every resize: a local Ray's start, and one bare
``TorchTrainer.fit()`` of a train function that does nothing, at W = 1, 2, 3 workers.

A floor under every end-to-end test: each ``train`` CLI process starts a local Ray, and each
phase of a run (the first group, every resize, every restart) is one ``fit()``: Ray Train's
controller actor, a placement group, W worker processes that import torch, the gloo group, and
their teardown.  Nothing of this project runs here.  Rows:

  ray.init        a local Ray started and stopped by this process (as the CLI does), no work
  fit W=n         one ``fit()`` on the Ray already up, ``n`` workers of 0.5 CPU, no-op train function

    .venv/bin/python bench/group_start.py [--repeats 3] [--workers 1,2,3] [--quick]

``--quick`` (CI): one repeat at W = 2.  Last line: ``fit_s=<median fit at the largest W>``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.common import median, parse_args, scratch_dir, table  # noqa: E402


def noop(config: dict) -> None:
    """The train function: enter and leave (the group's start and stop is what is measured)."""


def time_ray_init() -> float:
    import ray

    t = time.perf_counter()
    ray.init(num_cpus=2, include_dashboard=False, configure_logging=False, log_to_driver=False)
    ray.shutdown()
    return time.perf_counter() - t


def time_fit(workers: int, storage: str, i: int) -> float:
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    trainer = TorchTrainer(
        noop,
        scaling_config=ScalingConfig(num_workers=workers, resources_per_worker={"CPU": 0.5}),
        run_config=RunConfig(storage_path=storage, name=f"noop-w{workers}-{i}"),
    )
    t = time.perf_counter()
    trainer.fit()
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workers", default="1,2,3")
    args = parse_args(ap, quick={"repeats": 1, "workers": "2"})
    os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
    import ray

    counts = [int(w) for w in args.workers.split(",")]
    inits = [time_ray_init() for _ in range(args.repeats)]
    rows = [("ray.init + shutdown", args.repeats, f"{median(inits):.1f}", f"{min(inits):.1f}")]
    ray.init(num_cpus=2, include_dashboard=False, configure_logging=False, log_to_driver=False)
    try:
        storage = scratch_dir()
        time_fit(1, storage, -1)  # the first fit imports Ray Train's modules in this process: not counted
        fits = {}
        for w in counts:
            fits[w] = [time_fit(w, storage, i) for i in range(args.repeats)]
            rows.append((f"fit W={w} (0.5 CPU each)", args.repeats, f"{median(fits[w]):.1f}", f"{min(fits[w]):.1f}"))
    finally:
        ray.shutdown()
    print(table(rows, ("what", "runs", "median s", "min s")))
    print(f"fit_s={median(fits[counts[-1]]):.2f}")


if __name__ == "__main__":
    main()
