"""Search with pruning against an exhaustive grid of the same space, in the same run.

* reference: the grid sampler over every point of a small space (16 points), no pruning;
* searched: TPE with a pruner (median, and hyperband), a fixed budget of trials.

Each pruned search runs twice with the same seed (``--report both``): intermediate values reported
at the global step (``report_against: steps``, which favours large batches) and at equal work (``samples``:
samples seen in base steps, the default), so one run shows whether comparing trials at equal work
keeps the best value at no more compute.

Both run on a local Ray with the same parallelism.  For each: the best validation accuracy found,
and the compute used: optimizer steps and training samples summed over all trials, and wall time.
Aim: the pruned search within 1 accuracy point of the grid's best, at no more than 35% of its
steps.  Wall time is reported but on one small machine it is dominated by each trial's fixed cost
(a Ray Train worker group starting and stopping, ~20 s), which pruning does not remove.

What pruning saved, per search: what its pruned trials trained past the step they were judged at
(steps and samples; a pruned trial stops by its next evaluation, ``train.eval_every`` = 10 steps
here), what the search trained, what it would have trained had every trial run to its end
(``orchestrator.preview``: each trial's planned steps and samples), and the share pruning saved.

    .venv/bin/python bench/search.py [--trials 8] [--parallel 2] [--pruners median,hyperband]
        [--space full] [--epochs 4] [--report both|samples|steps] [--quick]

``--quick`` (CI): the 2-point space (lr 0.03 or 0.3; momentum 0.9, B=32), 1 epoch, one trial
of the median-pruned TPE search reporting at samples seen.

Last line: ``steps_ratio=<best pruned search's steps / grid's steps> gap_points=<grid best - its best>
saved_samples=<share of the samples that search's trials would have trained to their ends, saved by
pruning> past_judged_steps=<most steps a pruned trial of any search trained past its judged step>``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import parse_args, scratch_dir, table  # noqa: E402

SPACES = {
    "full": {
        "optimizer.lr": {"choices": [0.003, 0.03, 0.3, 3.0]},
        "optimizer.mf": {"choices": [0.0, 0.9]},
        "batch.size": {"choices": [32, 128]},
    },
    "small": {  # --quick: one round of trials with --parallel 2
        "optimizer.lr": {"choices": [0.03, 0.3]},
    },
}


def points(params: dict) -> int:
    n = 1
    for spec in params.values():
        n *= len(spec["choices"])
    return n


def base_config(tmp: str, epochs: float) -> dict:
    return {
        "data": {"name": "digits"},
        "model": {"name": "mlp", "norm": "none", "hidden": 64},
        "optimizer": {"name": "sgd", "lr": 0.1, "mf": 0.9, "base_batch_size": 32},
        "batch": {"size": 32, "max_local_batch": 32},
        "schedule": {"scaling_rule": "none"},
        "scaling": {"min_workers": 1, "max_workers": 1, "cpus_per_worker": 0.5, "max_failures": 0},
        "train": {"epochs": epochs, "seed": 0, "log_every": 5, "eval_every": 10},
        "checkpoint": {"storage_path": os.path.join(tmp, "ray_runs")},
        "tracking": {"uri": f"sqlite:///{tmp}/mlflow.db", "experiment": "bench-search"},
    }


PRUNERS = {
    "median": {"name": "median", "n_startup_trials": 2, "n_warmup_steps": 20},
    "hyperband": {"name": "hyperband", "min_resource": 10, "reduction_factor": 3},
}


def run_study(
    name: str,
    tmp: str,
    sampler: dict,
    pruner: dict | str,
    trials: int | None,
    parallel: int,
    params: dict,
    epochs: float,
    report_against: str = "samples",
):
    from search.driver import SearchOptions, run_search
    from search.space import parse_space

    space = parse_space(
        {
            "base": base_config(tmp, epochs),
            "objective": {"metric": "val/accuracy", "direction": "maximize"},
            "sampler": sampler,
            "pruner": pruner,
            "params": params,
            "report_against": report_against,
        },
        source=f"bench:{name}",
    )
    t0 = time.time()
    summary = run_search(
        space,
        SearchOptions(
            trials=trials,
            parallel=parallel,
            study_name=name,
            storage=os.path.join(tmp, "optuna.journal"),
            progress=False,
        ),
    )
    wall = time.time() - t0
    recs = summary.records
    best = summary.best[0].value if summary.best else float("nan")
    return {
        "name": name,
        "trials": len(recs),
        "complete": summary.count("COMPLETE"),
        "pruned": summary.count("PRUNED"),
        "failed": summary.count("FAIL"),
        "best": best,
        "steps": sum(r.steps for r in recs),
        "samples": sum(r.samples for r in recs),
        "wall_s": wall,
        "best_params": summary.best[0].params if summary.best else {},
        **pruning_saved(recs, tmp, epochs),
    }


_PLANNED: dict[tuple, tuple[int, int]] = {}


def planned(tmp: str, epochs: float, values: dict) -> tuple[int, int]:
    """The steps and samples a trial of these sampled values trains when it runs to its end."""
    key = (epochs, tuple(sorted(values.items())))
    if key not in _PLANNED:
        from orchestrator.config.prepare import validated
        from orchestrator.preview import make_plan
        from orchestrator.record.progress_bar import total_samples
        from search.space import set_path

        raw = base_config(tmp, epochs)
        for path, v in values.items():
            set_path(raw, path, v)
        cfg = validated(raw)
        _PLANNED[key] = (make_plan(cfg).total_steps, total_samples(cfg))
    return _PLANNED[key]


def pruning_saved(recs: list, tmp: str, epochs: float) -> dict:
    """What pruning saved in one search: past the judged step (pruned trials: the steps and samples
    trained after the step their value was judged at) and against running every trial to its end."""
    ran = [r for r in recs if r.state != "FAIL" and r.duplicate_of is None]
    pruned = [r for r in ran if r.state == "PRUNED" and r.pruned_at is not None]
    past_steps = [r.steps - r.pruned_at for r in pruned]
    past_samples = [r.samples - r.pruned_samples for r in pruned if r.pruned_samples is not None]
    full = [planned(tmp, epochs, r.params) for r in ran]
    to_end_steps, to_end_samples = sum(f[0] for f in full), sum(f[1] for f in full)
    trained_steps, trained_samples = sum(r.steps for r in ran), sum(r.samples for r in ran)
    return {
        "past_steps": sum(past_steps),
        "past_steps_max": max(past_steps, default=0),
        "past_samples": sum(past_samples),
        "to_end_steps": to_end_steps,
        "to_end_samples": to_end_samples,
        "saved_steps": to_end_steps - trained_steps,
        "saved_samples": to_end_samples - trained_samples,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=8, help="trials of each pruned search (the grid runs every point)")
    p.add_argument("--parallel", type=int, default=2)
    p.add_argument("--pruners", default="median,hyperband", help="comma-separated: median, hyperband")
    p.add_argument("--seed", type=int, default=0, help="the TPE sampler's seed")
    p.add_argument(
        "--space",
        choices=sorted(SPACES),
        default="full",
        help="full: 16 points (lr x momentum x batch); small: 2 points (lr)",
    )
    p.add_argument("--epochs", type=float, default=4, help="epochs of digits a trial trains")
    p.add_argument(
        "--report",
        choices=("both", "samples", "steps"),
        default="both",
        help="where intermediate values go: both (before/after, default), samples (equal work), steps",
    )
    args = parse_args(p, quick={"space": "small", "epochs": 1, "trials": 1, "pruners": "median", "report": "samples"})
    params = SPACES[args.space]
    os.environ["ELASTIC_KEEP_RAY"] = "1"  # one Ray for every study of the benchmark
    from orchestrator.run.runner import ensure_ray

    ensure_ray()
    import ray

    tmp = scratch_dir("elastic-bench-search-")
    described = ", ".join(f"{k} {v['choices']}" for k, v in params.items())
    print(
        f"space: {described}  ({points(params)} points); "
        f"{args.epochs:g} epochs of digits, MLP; {args.parallel} trials at a time",
        file=sys.stderr,
    )
    results = [run_study("grid", tmp, {"name": "grid", "seed": 0}, "none", None, args.parallel, params, args.epochs)]
    reports = ("steps", "samples") if args.report == "both" else (args.report,)
    for name in [n.strip() for n in args.pruners.split(",") if n.strip()]:
        for against in reports:
            results.append(
                run_study(
                    f"tpe+{name}@{against}",
                    tmp,
                    {"name": "tpe", "seed": args.seed, "n_startup_trials": 3, "constant_liar": True},
                    PRUNERS[name],
                    args.trials,
                    args.parallel,
                    params,
                    args.epochs,
                    against,
                )
            )
    ray.shutdown()

    grid = results[0]
    rows = []
    for r in results:
        gap = (grid["best"] - r["best"]) * 100
        rows.append(
            (
                r["name"],
                r["trials"],
                r["complete"],
                r["pruned"],
                r["failed"],
                f"{r['best']:.4f}",
                f"{gap:+.2f}" if r is not grid else "-",
                r["steps"],
                f"{r['steps'] / grid['steps']:.2f}",
                r["samples"],
                f"{r['samples'] / grid['samples']:.2f}",
                f"{r['wall_s']:.0f}",
                f"{r['wall_s'] / grid['wall_s']:.2f}",
            )
        )
    print(
        table(
            rows,
            (
                "search",
                "trials",
                "complete",
                "pruned",
                "failed",
                "best_val_acc",
                "gap_points",
                "steps",
                "steps_ratio",
                "samples",
                "samples_ratio",
                "wall_s",
                "wall_ratio",
            ),
        )
    )
    print()
    rows = []
    for r in results:
        share = r["saved_samples"] / r["to_end_samples"] if r["to_end_samples"] else 0.0
        rows.append(
            (
                r["name"],
                r["pruned"],
                r["past_steps"],
                r["past_steps_max"],
                r["past_samples"],
                r["samples"],
                r["to_end_samples"],
                r["saved_samples"],
                f"{share:.0%}",
                r["saved_steps"],
            )
        )
    print(
        "compute saved by pruning (past_judged: trained by pruned trials after the step they were judged at; "
        "to_end: every trial run to its end)"
    )
    print(
        table(
            rows,
            (
                "search",
                "pruned",
                "past_judged_steps",
                "max_per_trial",
                "past_judged_samples",
                "samples",
                "to_end_samples",
                "saved_samples",
                "saved",
                "saved_steps",
            ),
        )
    )
    print()
    for r in results:
        print(f"{r['name']:<16} best params: {r['best_params']}")
    by_name = {r["name"]: r for r in results}
    for name in [n.strip() for n in args.pruners.split(",") if n.strip()]:
        before, after = by_name.get(f"tpe+{name}@steps"), by_name.get(f"tpe+{name}@samples")
        if before and after:
            ok = after["best"] >= before["best"] and after["samples"] <= before["samples"]
            print(
                f"{name}: before (at global steps) best {before['best']:.4f} with {before['samples']} samples; "
                f"after (at equal samples) best {after['best']:.4f} with {after['samples']} samples: "
                f"{'unchanged or better at no more compute' if ok else 'NOT unchanged-or-better at no more compute'}"
            )
    searched = results[1:]
    if searched:
        pick = min(searched, key=lambda r: ((grid["best"] - r["best"]) * 100 > 1.0, r["steps"]))
        gap = (grid["best"] - pick["best"]) * 100
        ratio = pick["steps"] / grid["steps"]
        ok = gap <= 1.0 and ratio <= 0.35
        print(
            f"\n{pick['name']}: {gap:.2f} points below the grid's best at {ratio:.0%} of its steps "
            f"({pick['wall_s'] / grid['wall_s']:.0%} of its wall time); aim: <= 1 point at <= 35% of the steps: "
            f"{'met' if ok else 'not met'}"
        )
        saved = pick["saved_samples"] / pick["to_end_samples"] if pick["to_end_samples"] else 0.0
        past = max(r["past_steps_max"] for r in searched)
        print(
            f"{pick['name']}: pruning saved {saved:.0%} of the samples its trials would have trained to their "
            f"ends; a pruned trial trained at most {past} steps past the step it was judged at "
            f"(bound: one evaluation interval, {base_config(tmp, args.epochs)['train']['eval_every']} steps)"
        )
        print(f"steps_ratio={ratio:.3f} gap_points={gap:.2f} saved_samples={saved:.3f} past_judged_steps={past}")


if __name__ == "__main__":
    main()
