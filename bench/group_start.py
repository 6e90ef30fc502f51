"""Where a worker group's start goes: Ray's own part (a local Ray, a bare no-op ``fit()``) beside
the quickstart's way from its invocation to its first step and a bare script's, on one Ray.

A floor under every end-to-end test: each ``train`` CLI process starts a local Ray, and each
phase of a run (the first group, every resize, every restart) is one ``fit()``: Ray Train's
controller actor, a placement group, W worker processes that import torch, the gloo group, and
their teardown.  Nothing of this project runs here.  Rows:

  ray.init        a local Ray started and stopped by this process (as the CLI does), no work
  fit W=n         one ``fit()`` on the Ray already up, ``n`` workers of 0.5 CPU, no-op train function;
                  beside it the same with the driver's ``GroupTrainer`` (no Ray Data actor)
  imports         a fresh Python importing what a worker imports: Ray Train's torch part alone, and
                  with the loop's module (``trainers.loop.trainer``) after it: the difference is ours
  bare script     ``python`` of a script that imports Ray Train, joins the Ray already up and calls
                  ``fit()`` at W = 1 with a train function that steps a DDP model once and reports:
                  invocation -> that report
  quickstart      ``python -m orchestrator train configs/quickstart.yaml`` joining the same Ray:
                  invocation -> its first step, and where that time went (the run's own account,
                  ``RunSummary.start``: the command, joining Ray, the driver, Ray Train's group,
                  the worker's start, data and model, the first step)

    .venv/bin/python bench/group_start.py [--repeats 3] [--workers 1,2,3] [--import-repeats 3]
        [--quickstart-set KEY=VALUE ...] [--quick]

``--quick`` (CI): one repeat at W = 2, each import timed once, the quickstart cut to a few steps at its
first batch (no resize: only its way to the first step is timed), no untimed first ``fit()``
(``--no-warm-fit``: the first fit's imports count in it) and no ``GroupTrainer`` rows (``--no-ours``).  Last lines:
``first_step_ratio=<quickstart / bare script, invocation -> first step>`` (goal <= 1.25),
``fit_s=<median fit at the largest W>``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.common import median, parse_args, scratch_dir, table  # noqa: E402


def noop(config: dict) -> None:
    """The train function: enter and leave (the group's start and stop is what is measured)."""


def first_step(config: dict) -> None:
    """The bare script's train function: one DDP step of a small model, then a report (rank 0 notes when)."""
    import ray.train
    import torch
    from ray.train.torch import prepare_model

    model = prepare_model(torch.nn.Linear(64, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.randn(32, 64)).sum().backward()
    opt.step()
    if ray.train.get_context().get_world_rank() == 0:
        with open(config["marker"], "w") as f:
            f.write(str(time.time()))
    ray.train.report({"step": 1})


def bare_script(marker: str, storage: str) -> None:
    """``--bare-script``: what a user's script does (import Ray Train, join the Ray in ``RAY_ADDRESS``,
    ``fit()`` at W = 1 with a train function that reports at its first step)."""
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    ray.init(logging_level="ERROR", log_to_driver=False)
    TorchTrainer(
        first_step,
        train_loop_config={"marker": marker},
        scaling_config=ScalingConfig(num_workers=1, resources_per_worker={"CPU": 0.5}),
        run_config=RunConfig(storage_path=storage, name=f"bare-{time.time_ns()}"),
    ).fit()


def time_bare_script(storage: str, env: dict) -> float:
    marker = os.path.join(storage, f"bare-{time.time_ns()}.txt")
    t = time.time()
    cmd = [sys.executable, os.path.abspath(__file__), "--bare-script", marker, "--storage", storage]
    subprocess.run(cmd, env=env, check=True, capture_output=True)
    with open(marker) as f:
        return float(f.read()) - t


START = re.compile(r"first step after ([0-9.]+) s\)\n  to the first step: (.*)")


def time_quickstart(storage: str, env: dict, overrides: list[str]) -> tuple[float, dict[str, float]]:
    """The quickstart through the CLI on the Ray in ``env`` (with ``overrides``, ``--set`` items):
    invocation -> first step, and its parts."""
    cmd = [
        sys.executable,
        "-m",
        "orchestrator",
        "train",
        os.path.join(ROOT, "configs", "quickstart.yaml"),
        "--no-progress",
        "--tracking-uri",
        f"sqlite:///{storage}/mlflow.db",
        "--set",
        f"checkpoint.storage_path={storage}/runs",
        *[x for kv in overrides for x in ("--set", kv)],
    ]
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True, cwd=ROOT).stdout
    m = START.search(out)
    if m is None:
        raise RuntimeError(f"no start line in the quickstart's summary:\n{out}")
    parts = dict(re.findall(r"([A-Za-z ]+?) ([0-9.]+) s(?:, |$)", m.group(2)))
    return float(m.group(1)), {k.strip(): float(v) for k, v in parts.items()}  # from its process's start


def time_imports(repeats: int) -> tuple[float, float]:
    """Seconds a fresh Python takes to import Ray Train's torch part, and that plus the loop's module
    (medians of ``repeats`` Pythons each)."""

    def run(code: str) -> float:
        out = subprocess.run(
            [sys.executable, "-c", f"import time; t = time.time(); {code}; print(time.time() - t)"],
            capture_output=True,
            text=True,
            check=True,
            cwd=ROOT,
        )
        return float(out.stdout.strip().splitlines()[-1])

    ray_train = median([run("import ray.train.torch") for _ in range(repeats)])
    both = median([run("import ray.train.torch, trainers.loop.trainer") for _ in range(repeats)])
    return ray_train, both


def time_ray_init() -> float:
    import ray

    t = time.perf_counter()
    ray.init(address="local", num_cpus=2, include_dashboard=False, configure_logging=False, log_to_driver=False)
    ray.shutdown()
    return time.perf_counter() - t


def time_fit(workers: int, storage: str, i: int, ours: bool = False) -> float:
    """One no-op ``fit()``: Ray Train's ``TorchTrainer``, or (``ours``) the driver's ``GroupTrainer``."""
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from orchestrator.run.phases import GroupTrainer

    trainer = (GroupTrainer if ours else TorchTrainer)(
        noop,
        scaling_config=ScalingConfig(num_workers=workers, resources_per_worker={"CPU": 0.5}),
        run_config=RunConfig(storage_path=storage, name=f"noop-w{workers}-{i}{'-ours' if ours else ''}"),
    )
    t = time.perf_counter()
    trainer.fit()
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workers", default="1,2,3")
    ap.add_argument("--import-repeats", type=int, default=3, help="fresh Pythons timed for each imports row")
    ap.add_argument(
        "--quickstart-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override for the quickstart run (repeatable); only its way to the first step is timed",
    )
    ap.add_argument(
        "--no-warm-fit",
        action="store_true",
        help="no untimed fit() first (it imports Ray Train's modules in this process: counted in the first fit)",
    )
    ap.add_argument("--no-ours", action="store_true", help="without the driver's GroupTrainer rows")
    ap.add_argument("--bare-script", metavar="MARKER", help=argparse.SUPPRESS)  # the bare script itself
    ap.add_argument("--storage", help=argparse.SUPPRESS)
    args = parse_args(
        ap,
        quick={
            "repeats": 1,
            "workers": "2",
            "import_repeats": 1,
            "quickstart_set": ["train.epochs=0.1", "batch.policy=fixed"],
            "no_warm_fit": True,
            "no_ours": True,
        },
    )
    if args.bare_script:
        bare_script(args.bare_script, args.storage)
        return
    import ray

    from orchestrator.run.ray_env import RAY_SINGLE_MACHINE_SWITCH, ensure_ray
    from orchestrator.run.runner import open_tracking_store

    counts = [int(w) for w in args.workers.split(",")]
    inits = [time_ray_init() for _ in range(args.repeats)]
    rows = [("ray.init + shutdown", args.repeats, f"{median(inits):.1f}", f"{min(inits):.1f}")]
    imports = time_imports(args.import_repeats)
    rows.append(("imports: ray.train.torch", args.import_repeats, f"{imports[0]:.2f}", ""))
    rows.append(("imports: + trainers.loop.trainer", args.import_repeats, f"{imports[1]:.2f}", ""))
    user_env = dict(os.environ)  # what both scripts get: the user's environment, the Ray's address and auth
    ensure_ray(num_cpus=2)  # the Ray the CLI starts, kept for every row below (the scripts join it)
    env = dict(user_env, RAY_ADDRESS=ray.get_runtime_context().gcs_address)
    env.update(RAY_AUTH_MODE=os.environ.get("RAY_AUTH_MODE", "token"))
    env.setdefault(RAY_SINGLE_MACHINE_SWITCH, "0")  # a Ray on 127.0.0.1 only (ray_env._single_machine_ray)
    parts: list[dict[str, float]] = []
    try:
        storage = scratch_dir()
        if not args.no_warm_fit:
            time_fit(1, storage, -1)  # the first fit imports Ray Train's modules in this process: not counted
        fits, ours = {}, {}
        for w in counts:  # interleaved: Ray Train's trainer and the driver's see the same machine
            pairs = [
                (time_fit(w, storage, i), float("nan") if args.no_ours else time_fit(w, storage, i, ours=True))
                for i in range(args.repeats)
            ]
            fits[w], ours[w] = [p[0] for p in pairs], [p[1] for p in pairs]
            rows.append((f"fit W={w} (0.5 CPU each)", args.repeats, f"{median(fits[w]):.1f}", f"{min(fits[w]):.1f}"))
            if not args.no_ours:
                rows.append(
                    (
                        f"  the driver's GroupTrainer, W={w}",
                        args.repeats,
                        f"{median(ours[w]):.1f}",
                        f"{min(ours[w]):.1f}",
                    )
                )
        open_tracking_store(f"sqlite:///{storage}/mlflow.db")  # a new store's migrations: not counted
        bare, quick = [], []
        for _ in range(args.repeats):  # interleaved: both see the same machine
            bare.append(time_bare_script(storage, env))
            s, p = time_quickstart(storage, env, args.quickstart_set)
            quick.append(s)
            parts.append(p)
    finally:
        ray.shutdown()
    rows.append(("bare script: invocation -> first step", args.repeats, f"{median(bare):.1f}", f"{min(bare):.1f}"))
    rows.append(("quickstart: invocation -> first step", args.repeats, f"{median(quick):.1f}", f"{min(quick):.1f}"))
    for name in parts[0]:
        xs = [p.get(name, float("nan")) for p in parts]
        rows.append((f"  {name}", args.repeats, f"{median(xs):.1f}", f"{min(xs):.1f}"))
    print(table(rows, ("what", "runs", "median s", "min s")))
    print(json.dumps({"start_parts": parts}))
    print(f"first_step_ratio={median(quick) / median(bare):.2f}")
    print(f"fit_s={median(fits[counts[-1]]):.2f}")


if __name__ == "__main__":
    main()
