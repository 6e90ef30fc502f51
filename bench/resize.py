"""Resize latency against the cold start of a bare Ray Train worker group, in the same run.

* cold start: ``TorchTrainer(empty loop).fit()`` from the call to the loop's first line,
  with the same worker count and resources as the grown group (the floor for any new group);
* resize: an orchestrator run whose batch schedule doubles B after one epoch, so the group
  grows 1 -> 2 workers; ``resize/latency_s`` runs from the resize checkpoint to the first
  optimizer step of the new group (the time training stands still).  Both resize modes:
  ``overlap`` (the default: the new group starts while the old one trains on, and takes
  over at a checkpoint) and ``restart`` (old group's teardown + new group's start + restore).

    .venv/bin/python bench/resize.py [--repeats 2] [--quick]

``--quick`` (CI): one repeat.  Summary lines: ``ratio=<overlap pause / cold start>``, then
``overlap_pause_s=<overlap pause, median s>`` and ``restart_ratio=<restart pause / cold start>``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import median, parse_args, scratch_dir, table, temp_config  # noqa: E402
from trainers.link import metrics as M  # noqa: E402
from trainers.link.messages import Record  # noqa: E402


def cold_start(workers: int, cpus: float, storage: str) -> float:
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    marker = os.path.join(storage, f"cold-{time.time_ns()}.txt")

    def loop(config):
        with open(config["marker"], "a") as f:
            f.write(f"{time.time()}\n")

    t0 = time.time()
    TorchTrainer(
        loop,
        train_loop_config={"marker": marker},
        scaling_config=ScalingConfig(num_workers=workers, resources_per_worker={"CPU": cpus}),
        run_config=RunConfig(name=f"cold-{time.time_ns()}", storage_path=storage),
    ).fit()
    with open(marker) as f:
        first = min(float(x) for x in f.read().split())
    os.remove(marker)
    return first - t0


def resize_once(mode: str) -> dict:
    """One resize 1 -> 2 after epoch 1; the run is stopped once the new group has trained a bit
    (with ``overlap`` the old group trains on at B=64 until the new one takes over)."""
    from orchestrator.run.runner import run_training

    cfg, _ = temp_config(
        data={"name": "digits"},
        model={"name": "mlp", "norm": "none", "hidden": 32},
        optimizer={"name": "sgd", "lr": 0.05, "base_batch_size": 32},
        batch={"size": 32, "max_local_batch": 32, "policy": "schedule", "schedule": [[1, 64]]},
        scaling={
            "min_workers": 1,
            "max_workers": 2,
            "cpus_per_worker": 0.5,
            "resize_mode": mode,
            "resize_when": "always",
        },  # measured, not judged: a short run's resize would not pay
        train={"epochs": 500, "log_every": 5, "eval_every": 0},
    )
    box = {}

    def on_records(records: list[Record]) -> None:
        if any(m.get(M.WORKERS, 1) >= 2 for _, m, _ in records):
            box["runner"].request_stop()

    s = run_training(cfg, progress=False, on_start=lambda r: box.update(runner=r), on_records=on_records)
    assert len(s.resizes) == 1, s.resizes
    return s.resizes[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=2)
    a = parse_args(ap, quick={"repeats": 1})
    os.environ["ELASTIC_KEEP_RAY"] = "1"
    from orchestrator.run.runner import ensure_ray

    ensure_ray(verbose=False)
    storage = scratch_dir()
    cold: list[float] = []
    runs: dict[str, list[dict]] = {"overlap": [], "restart": []}
    for _ in range(a.repeats):  # interleaved, so drift on a shared machine hits all three
        cold.append(cold_start(2, 0.5, storage))
        for mode in runs:
            r = resize_once(mode)
            if r["mode"] != mode:
                print(f"note: a {mode} resize ran as {r['mode']} (the new group could not start early)")
            runs[mode].append(r)
    print(
        f"Ray Train V2, local, 2 workers x 0.5 CPU; {a.repeats} repeats, interleaved; "
        f"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S={os.environ.get('RAY_TRAIN_HEALTH_CHECK_INTERVAL_S')}"
    )

    def row(label: str, xs: list[float]) -> tuple:
        return (label, *[f"{x:.2f}" for x in xs], f"{median(xs):.2f}")

    rows = [row("cold start of a bare TorchTrainer (call -> loop)", cold)]
    for mode, rs in runs.items():
        rows += [row(f"resize 1 -> 2, {mode}: checkpoint -> first step", [r["latency_s"] for r in rs])]
        parts = (
            [("overlap_s", "old group trains on while the new one starts")]
            if mode == "overlap"
            else [("teardown_s", "old group teardown (checkpoint -> fit returns)")]
        )
        parts += [
            ("start_s", "new group start (fit called -> loop entered)"),
            ("setup_s", "loop setup (data, model, restore, 1st step)"),
        ]
        rows += [row(f"  {label}", [r[key] for r in rs]) for key, label in parts]
    print(table(rows, ("", *[f"run {i + 1} s" for i in range(a.repeats)], "median s")))
    overlap = median([r["latency_s"] for r in runs["overlap"]])
    restart = median([r["latency_s"] for r in runs["restart"]]) / median(cold)
    print(f"ratio={overlap / median(cold):.3f}")
    print(f"overlap_pause_s={overlap:.2f}")
    print(f"restart_ratio={restart:.2f}")


if __name__ == "__main__":
    main()
