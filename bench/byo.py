"""Your own data and the language model against their references, time-sliced side by side with a
plain loop as in bench/overhead.py (its docstring explains the method).

(a) map-style data: the orchestrator loop at W=1 on the same model (a CNN named by a
    ``model.factory``) and the same synthetic 1x8x8 samples, once from the built-in in-memory set
    (tensor indexing) and once from a ``data.factory`` returning map-style datasets with a batched
    ``__getitems__`` (the ``DataLoader`` path, ``data.loader.workers: 0``).  Both rows are sliced
    against the same plain in-memory loop; ``map_ratio`` is the map-style row's samples/s over the
    in-memory row's (aim: >= 0.9).
(b) the language model: ``configs/lm_quickstart.yaml`` (GPT, context 128, B=32, 2 threads) as a
    plain single-process loop, as that plain loop in a bare one-worker Ray Train ``TorchTrainer``,
    and as ``python -m orchestrator train`` (validation only at the epoch end, which the measured
    steps leave out).  Tokens/s = samples/s x 128.  ``lm_ratio`` is the orchestrator's tokens/s
    over the bare Ray Train worker's (aim: >= 0.9); ``lm_plain_ratio`` over the plain loop's.

    .venv/bin/python bench/byo.py [--steps 6000] [--lm-steps 1500] [--slice 2] [--size 200000]
        [--threads 2] [--parts map,lm] [--unsliced-ends] [--quick]

``--quick`` (CI): 1000 image steps on 20,000 samples, 120 LM steps of a 2-layer width-64 GPT, each
loop under test alone until its first steps and its plain loop then until its own, two slices of each
as long as their pace needs, then the loop under test alone to its end (``--unsliced-ends --pairs 2``,
bench/overhead.py): rough ratios, which only show the paths run.  Last line: ``map_ratio=... lm_ratio=...
lm_plain_ratio=...``.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


# -- the factories of part (a) (imported by the orchestrator's workers: keep this module light) -------


def cnn(shape: list[int], classes: int, hidden: int = 64, norm: str = "group") -> Any:
    """The built-in CNN as a ``model.factory`` (the same model for both data paths; GroupNorm: no
    BatchNorm warning, and no dependence on how a batch is cut)."""
    from trainers.data.datasets import DatasetInfo
    from trainers.workload.models import ModelConfig, build_model

    return build_model(DatasetInfo(tuple(shape), classes), ModelConfig(name="cnn", hidden=hidden, norm=norm))


class Pairs:
    """A map-style dataset over two tensors: ``__getitem__(i)`` and a batched ``__getitems__``."""

    def __init__(self, x: Any, y: Any) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return int(self.y.shape[0])

    def __getitem__(self, i: int) -> tuple[Any, Any]:
        return self.x[i], self.y[i]

    def __getitems__(self, indices: list[int]) -> tuple[Any, Any]:
        import torch

        idx = torch.as_tensor(indices, dtype=torch.long)
        return self.x[idx], self.y[idx]


def synthetic_pairs(size: int, shape: list[int], classes: int = 10, seed: int = 0) -> tuple[Pairs, Pairs]:
    """The built-in ``synthetic`` set (same samples, same train/val split) as map-style datasets."""
    from trainers.data.datasets import DataConfig, load_data

    d = load_data(DataConfig(name="synthetic", size=size, shape=shape, num_classes=classes), seed)
    return Pairs(d.train_x, d.train_y), Pairs(d.val_x, d.val_y)


# -- the bench -------------------------------------------------------------------------------------------

LEAD_S = 20.0  # each row's loop runs alone this long first: a local Ray's start has 30 s of wall time
MAP_ROWS = {"memory": "orchestrator, in-memory data", "map": "orchestrator, map-style data (factory)"}
LM_ROWS = {
    "plain": "plain loop (method check)",
    "ray": "plain loop in a bare Ray Train worker",
    "orchestrator": "orchestrator (lm_quickstart)",
}


def part_map(a: argparse.Namespace) -> float:
    from bench.common import slices_text, table, temp_config
    from bench.overhead import measure, write_config
    from trainers.data.datasets import DataConfig, load_data

    shape, classes = [1, 8, 8], 10
    model = {"factory": "bench.byo:cnn", "params": {"shape": shape, "classes": classes, "hidden": 64}}
    common = dict(
        model=model,
        optimizer={"name": "sgd", "lr": 0.1, "mf": 0.9, "base_batch_size": a.batch},
        batch={"size": a.batch, "max_local_batch": a.batch},
        scaling={"min_workers": 1, "max_workers": 1, "cpus_per_worker": a.threads},
        train={"epochs": 1, "eval_every": 0},
    )
    data_mem = {"name": "synthetic", "size": a.size, "shape": shape, "num_classes": classes}
    data_map = {
        "factory": "bench.byo:synthetic_pairs",
        "loader": {"workers": 0},
        "params": {"size": a.size, "shape": shape, "classes": classes, "seed": 0},
    }
    results = {}
    print(
        f"(a) synthetic 1x8x8 (n={a.size}), cnn factory, B={a.batch}, {a.threads} threads, {a.steps} steps a "
        f"loop, {slices_text(a)}",
        flush=True,
    )
    for row, data in (("memory", data_mem), ("map", data_map)):
        cfg, tmp = temp_config(data=data, **common)
        n_train = load_data(DataConfig(**data_mem), 0).num_train
        cfg = cfg.model_copy(update={"train": cfg.train.model_copy(update={"epochs": a.steps * a.batch / n_train})})
        cfg_json, cfg_yaml = write_config(cfg, tmp)
        res, _ = measure(
            ["orchestrator"],
            cfg,
            cfg_json,
            cfg_yaml,
            n_train,
            a.threads,
            a.steps,
            a.slice,
            [],
            tmp,
            names={"orchestrator": MAP_ROWS[row]},
            lead_s=LEAD_S,
            unsliced_ends=a.unsliced_ends,
            pairs=a.pairs,
        )
        results[row] = res["orchestrator"]
    print(
        table(
            [
                (
                    MAP_ROWS[k],
                    f"{r['a']:,.0f}",
                    f"{r['b']:,.0f}",
                    f"{r['a'] / r['b']:.3f}",
                    r["pairs"],
                    f"{100 * r['beside']:.1f}%",
                )
                for k, r in results.items()
            ],
            ("loop", "samples/s", "plain samples/s", "of plain", "pairs", "CPU beside"),
        )
    )
    rel = {k: r["a"] / r["b"] for k, r in results.items()}
    ratio = rel["map"] / rel["memory"]
    print(f"map-style / in-memory samples/s (each against its plain slices): {ratio:.3f}", flush=True)
    return ratio


def part_lm(a: argparse.Namespace) -> tuple[float, float]:
    from bench.common import scratch_dir, slices_text, table
    from bench.overhead import measure, write_config
    from orchestrator.config.prepare import load_config
    from trainers.workload.build import train_size

    tmp = scratch_dir()
    sets = [
        f"tracking.uri=sqlite:///{tmp}/mlflow.db",
        f"checkpoint.storage_path={tmp}/ray_runs",
        "train.eval_every=0",
        f"scaling.cpus_per_worker={a.threads}",
    ] + list(a.lm_set)
    cfg = load_config(os.path.join(ROOT, "configs", "lm_quickstart.yaml"), sets)
    n_train, batch = train_size(cfg), cfg.batch.size
    tokens = cfg.data.context
    cfg = cfg.model_copy(update={"train": cfg.train.model_copy(update={"epochs": a.lm_steps * batch / n_train})})
    cfg_json, cfg_yaml = write_config(cfg, tmp)
    rows = ["plain", "ray", "orchestrator"] if a.plain_row else ["ray", "orchestrator"]
    print(
        f"(b) lm_quickstart {cfg.model.params}, context {tokens}, B={batch}, {a.threads} threads, {a.lm_steps} "
        f"steps a loop, {slices_text(a)}",
        flush=True,
    )
    res, orch = measure(
        rows,
        cfg,
        cfg_json,
        cfg_yaml,
        n_train,
        a.threads,
        a.lm_steps,
        a.slice,
        [],
        tmp,
        names=LM_ROWS,
        lead_s=LEAD_S,
        unsliced_ends=a.unsliced_ends,
        pairs=a.pairs,
    )
    print(
        table(
            [
                (
                    LM_ROWS[k],
                    f"{r['a'] * tokens:,.0f}",
                    f"{r['b'] * tokens:,.0f}",
                    f"{r['a'] / r['b']:.3f}",
                    r["pairs"],
                    f"{100 * r['beside']:.1f}%",
                )
                for k, r in res.items()
            ],
            ("loop", "tokens/s", "plain tokens/s", "of plain", "pairs", "CPU beside"),
        )
    )
    rel = {k: r["a"] / r["b"] for k, r in res.items()}
    if orch is not None:
        print(
            f"orchestrator: first step {orch[0]:.1f} s after the train invocation; whole run {orch[1]:.1f} s "
            f"for {orch[2]} steps (time it ran)"
        )
    ratio, plain_ratio = rel["orchestrator"] / rel["ray"], rel["orchestrator"]
    print(
        f"orchestrator / bare Ray Train worker tokens/s: {ratio:.3f}; orchestrator / plain loop: {plain_ratio:.3f}",
        flush=True,
    )
    return ratio, plain_ratio


def main() -> None:
    from bench.common import parse_args

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=6000, help="optimizer steps of each image loop under test")
    ap.add_argument("--lm-steps", type=int, default=1500, help="optimizer steps of each LM loop under test")
    ap.add_argument(
        "--slice",
        type=float,
        default=2.0,
        help="seconds each loop runs before the other's turn (with --pairs: from the loops' pace)",
    )
    ap.add_argument("--size", type=int, default=200000, help="samples of the synthetic 1x8x8 data")
    ap.add_argument("--batch", type=int, default=64, help="global batch of part (a)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--parts", default="map,lm", help="map, lm or both")
    ap.add_argument("--plain-row", action="store_true", help="(b): also the plain loop against itself")
    ap.add_argument(
        "--unsliced-ends",
        action="store_true",
        help="the loops under test run alone until their Ray Train worker starts and after their last step "
        "(bench/overhead.py)",
    )
    ap.add_argument(
        "--pairs",
        type=int,
        default=0,
        help="a quick check: each loop alone until its first steps, then this many slices of each (their "
        "length from the loops' pace), then the loop under test alone to its end (0: sliced to its last "
        "step; bench/overhead.py)",
    )
    ap.add_argument(
        "--lm-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override for the LM config (repeatable), e.g. model.params.n_layer=2",
    )
    a = parse_args(
        ap,
        quick={
            "steps": 1000,
            "lm_steps": 120,
            "size": 20000,
            "lm_set": ["model.params.n_layer=2", "model.params.n_head=2", "model.params.d_model=64"],
            "unsliced_ends": True,
            "pairs": 2,
        },
    )
    parts = {p.strip() for p in a.parts.split(",") if p.strip()}
    if not parts or parts - {"map", "lm"} or min(a.steps, a.lm_steps) < 40 or a.slice <= 0 or a.pairs < 0:
        print("error: --parts: map and/or lm; --steps and --lm-steps >= 40; --slice > 0; --pairs >= 0", file=sys.stderr)
        raise SystemExit(2)
    out = {}
    if "map" in parts:
        out["map_ratio"] = part_map(a)
    if "lm" in parts:
        out["lm_ratio"], out["lm_plain_ratio"] = part_lm(a)
    print(" ".join(f"{k}={v:.3f}" if math.isfinite(v) else f"{k}=nan" for k, v in out.items()))


if __name__ == "__main__":
    main()
