"""Steps, samples and wall time to a target validation accuracy: fixed B0, fixed 8*B0 and the
``noise_scale`` batch policy (B follows c * B_simple, the group grows with it), in one run.

McCandlish et al.'s prediction: training near the critical batch (~B_simple) needs far fewer
steps than a small batch and not many more samples than it; a batch far above it wastes
samples.  Everything else is equal (model, data order, sqrt LR scaling from the same eta0 at B0).

    .venv/bin/python bench/adaptive.py [--target 0.95] [--epochs 6] [--max-local-batch 64]
        [--rows fixed,large,noise_scale] [--quick]

``--quick`` (CI): 2 epochs, target 0.8, a worker takes up to 256 samples (every row at W = 1: one
group start a run), without the fixed 8*B0 row (``--rows fixed,noise_scale``: the summary's two).
Last line: ``steps_ratio=<noise_scale's steps to the target / fixed B0's> samples_ratio=<the same for
samples>`` (nan where a row missed the target).
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import parse_args, table, temp_config  # noqa: E402

B0 = 32
# row -> (its label, its batch section)
ROWS = {
    "fixed": (f"fixed B0={B0}", {"size": B0}),
    "large": (f"fixed 8*B0={8 * B0}", {"size": 8 * B0}),
    "noise_scale": (
        "noise_scale (c=2)",
        {"size": B0, "policy": "noise_scale", "noise_scale_factor": 2.0, "check_every": 10, "max_size": 8 * B0},
    ),
}


def run(name: str, batch: dict, epochs: float, target: float, max_local: int = 64) -> tuple:
    from mlflow.tracking import MlflowClient

    from orchestrator.run.runner import run_training

    cfg, _ = temp_config(
        data={"name": "digits"},
        model={"name": "cnn", "norm": "group", "hidden": 64},
        optimizer={"name": "sgd", "lr": 0.05, "base_batch_size": B0, "mf": 0.9},
        batch={"max_local_batch": min(max_local, batch.get("max_size", batch["size"])), **batch},
        schedule={"scaling_rule": "sqrt"},
        scaling={"min_workers": 1, "max_workers": 4, "cpus_per_worker": 0.5},
        train={"epochs": epochs, "eval_every": 5, "log_every": 5},
    )
    s = run_training(cfg, progress=False)
    c = MlflowClient(cfg.tracking.uri)
    start = c.get_run(s.run_id).info.start_time / 1000
    acc = sorted(c.get_metric_history(s.run_id, "val/accuracy"), key=lambda m: m.step)
    # samples_seen is logged where it bends (orchestrator/record/run_tracker.py): read it off the lines between
    seen_pts = sorted((m.step, m.value) for m in c.get_metric_history(s.run_id, "samples_seen"))
    hit = next((m for m in acc if m.value >= target), None)
    final_b = max(m.value for m in c.get_metric_history(s.run_id, "batch/global"))
    workers = max(m.value for m in c.get_metric_history(s.run_id, "workers"))
    if hit is None:
        return (name, "not reached", "-", "-", f"{acc[-1].value:.3f}", f"{int(final_b)}", int(workers))
    seen = int(np.interp(hit.step, *zip(*seen_pts)))
    return (
        name,
        hit.step,
        seen,
        f"{hit.timestamp / 1000 - start:.0f}",
        f"{acc[-1].value:.3f}",
        f"{int(final_b)}",
        int(workers),
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", type=float, default=0.95)
    ap.add_argument("--epochs", type=float, default=6)
    ap.add_argument(
        "--max-local-batch", type=int, default=64, help="the most samples a worker takes (W = ceil(B / this))"
    )
    ap.add_argument(
        "--rows",
        default=",".join(ROWS),
        help="comma-separated, of: " + ", ".join(ROWS) + " (the summary needs fixed and noise_scale)",
    )
    a = parse_args(ap, quick={"epochs": 2, "target": 0.8, "max_local_batch": 256, "rows": "fixed,noise_scale"})
    names = [r.strip() for r in a.rows.split(",") if r.strip()]
    if not names or set(names) - set(ROWS):
        print(f"--rows: {a.rows!r}: give a comma-separated list of {', '.join(ROWS)}", file=sys.stderr)
        raise SystemExit(2)
    os.environ["ELASTIC_KEEP_RAY"] = "1"
    done = {k: run(*ROWS[k], a.epochs, a.target, a.max_local_batch) for k in ROWS if k in names}
    rows = list(done.values())
    print(
        f"digits, small CNN (group norm), sqrt LR scaling from lr=0.05 at B0={B0}; target val accuracy "
        f"{a.target}; validation every 5 steps; a worker takes up to {a.max_local_batch} samples"
    )
    print(table(rows, ("policy", "steps", "samples", "wall s (incl. start)", "final val acc", "max B", "max workers")))
    missing = (None, "-", "-")
    (_, b0_steps, b0_samples, *_), (_, ns_steps, ns_samples, *_) = (
        done.get(k, missing) for k in ("fixed", "noise_scale")
    )

    def ratio(x, y) -> float:
        return x / y if isinstance(x, int) and isinstance(y, int) and y else float("nan")

    print(f"steps_ratio={ratio(ns_steps, b0_steps):.3f} samples_ratio={ratio(ns_samples, b0_samples):.3f}")


if __name__ == "__main__":
    main()
