r"""The checks of the GPU path on a lent GPU machine, in one call, every stage under one budget.

Each stage is a process of its own with a time limit; the figures go to ``--out`` as they come (a
call cut short still brings back what ran):

  smoke      every import, CUDA, a local Ray, ten steps of the quickstart (stops the call if it fails)
  resnet18   bench/gpu.py --models resnet18 --batch 256, a torch-profiler table of the orchestrator's worker
  resnet50   bench/gpu.py --models resnet50 --batch 256 (fewer steps), with its profile
  tests      the GPU-relevant tests (tests/unit/test_gpu_path.py runs on CUDA there; precision,
             device data, fast path, the bench's own parts)
  adaptive   configs/gpu_quickstart.yaml (ResNet-18, B 256 -> 2048 by the noise scale, W=1):
             what B_simple it measures, the throughput at each B
  augment    resnet18 with --augment random_crop,hflip (plain and orchestrator rows)
  compile    resnet18 with --compile (plain and orchestrator rows)
  lm_target  bench/time_to_target.py --only "fixed B0,noise_scale" on the GPU (configs/lm_growing.yaml, the
             1.9M GPT to validation perplexity 6): the wall ratio on a device whose step is not per-sample
             compute, and the fitted T(b) = alpha + beta b there (the cost aim's break-even is alpha/beta >=
             2.2 samples; a 2-core CPU gives 0.2).  Not in the default order: ``--only lm_target`` (~3-4 min)

Measured on one H200 (2026-11-27, docs/benchmarks.md "On a GPU"): a bench stage takes ~3 min
(each orchestrator row ~50 s to its first step there), smoke ~70 s, tests ~40 s, adaptive ~80 s.
The call that ran it (Ray, MLflow and their needs travel as one archive of CPython 3.12 wheels,
unpacked: ``.whl/site312.tar.xz``, 44-46 MB, built by ``scripts/pack_device_site.py`` in ~1 min)::

    mkdir -p /tmp/site && tar -xJf .whl/site312.tar.xz -C /tmp/site && python3 -m compileall -q -j 0 /tmp/site;
    export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 RAY_USAGE_STATS_ENABLED=0;
    python3 bench/gpu_checks.py --out $OUT --budget 480 2>&1 | grep -v "slices \["

    python bench/gpu_checks.py [--out DIR] [--budget 420] [--only smoke,tests,...] [--quick]

``--quick`` runs every stage at toy sizes on the CPU (the cnn, a few steps): what this machine can
check of the script itself.  Files in ``--out``: ``summary.txt`` (one line a stage and the
figures), ``log.txt`` (every stage's output), ``adaptive.txt``, ``profile-*.txt``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

STAGES = ("smoke", "resnet18", "resnet50", "tests", "adaptive", "augment", "compile", "lm_target")
DEFAULT = STAGES[:-1]  # lm_target on request
GPU_TESTS = (
    "tests/unit/test_gpu_path.py",
    "tests/unit/test_precision.py",
    "tests/unit/test_device.py",
    "tests/unit/test_fast_path.py",
    "tests/unit/test_bench_gpu.py",
    "tests/unit/test_profile.py",
)


class Budget:
    def __init__(self, seconds: float, out: str) -> None:
        self.deadline = time.time() + seconds
        self.out = out
        self.log = open(os.path.join(out, "log.txt"), "a")
        self.summary = os.path.join(out, "summary.txt")

    def note(self, line: str) -> None:
        print(line, flush=True)
        with open(self.summary, "a") as f:
            f.write(line + "\n")

    def run(self, name: str, cmd: list[str], limit: float, env: dict[str, str] | None = None) -> tuple[int, str]:
        """``cmd`` under ``min(limit, what is left)``; its output goes to the log (and is returned)."""
        left = self.deadline - time.time()
        t = min(limit, left)
        if t < 15:
            self.note(f"{name}: skipped ({left:.0f} s left of the budget)")
            return -1, ""
        self.log.write(f"\n=== {name}: {' '.join(cmd)} (limit {t:.0f} s)\n")
        self.log.flush()
        t0 = time.time()
        try:
            p = subprocess.run(
                cmd, cwd=ROOT, env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=t
            )
            rc, text = p.returncode, p.stdout + p.stderr
        except subprocess.TimeoutExpired as e:
            rc = 124
            text = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
            text += (e.stderr or b"").decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        self.log.write(text)
        self.log.flush()
        self.note(f"{name}: rc={rc} in {time.time() - t0:.0f} s")
        return rc, text


def figures(text: str, keys: tuple[str, ...] = ("plain_samples_per_s=", "ratio_ray=", "ratio=")) -> list[str]:
    """The bench's table and summary lines of ``text``."""
    lines = [ln.split("\r")[-1].strip() for ln in text.splitlines()]  # the progress line's redraws: the last
    heads = ("device:", "loop ", "tuned", "plain loop", "orchestrator loop", "profile:", *keys)
    out = [ln for ln in lines if ln.startswith(heads) and "slices [" not in ln]
    return out or lines[-15:]


def adaptive_summary(db: str) -> str:
    """The adaptive run's batch sizes, B_simple and throughput at each B, from its MLflow store."""
    import numpy as np
    from mlflow.tracking import MlflowClient

    from trainers.link import metrics as M

    client = MlflowClient(f"sqlite:///{db}")
    exp = client.get_experiment_by_name("gpu-quickstart")
    run = client.search_runs([exp.experiment_id], max_results=1)[0]

    def hist(key: str) -> dict[int, float]:
        return {m.step: m.value for m in client.get_metric_history(run.info.run_id, key)}

    batch, thr, gns = hist(M.BATCH_GLOBAL), hist(M.THROUGHPUT), hist(M.GNS_B_SIMPLE)
    peak = max(hist(M.MEMORY_PEAK).values(), default=0.0)
    lines = [
        f"run {run.info.run_id}: {run.info.status}, {len(batch)} steps, "
        f"val/loss {run.data.metrics.get(M.VAL_LOSS, float('nan')):.4f}, "
        f"val/accuracy {run.data.metrics.get(M.VAL_ACCURACY, float('nan')):.4f}, "
        f"peak memory {peak / 2**30:.2f} GiB, wall {(run.info.end_time - run.info.start_time) / 1000:.0f} s",
        "B      steps  from step  samples/s (median of logged)  B_simple (last at this B)",
    ]
    for b in sorted(set(batch.values())):
        steps = sorted(s for s, v in batch.items() if v == b)
        rates = [thr[s] for s in steps if s in thr]
        simple = [gns[s] for s in steps if s in gns]
        lines.append(
            f"{int(b):<6} {len(steps):<6} {steps[0]:<10} {np.median(rates) if rates else float('nan'):<29.0f} "
            f"{simple[-1] if simple else float('nan'):.0f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT") or "bench_out/gpu_checks")
    ap.add_argument("--budget", type=float, default=420.0, help="seconds for every stage together")
    ap.add_argument("--only", default=",".join(DEFAULT), help="comma-separated stages: " + ", ".join(STAGES))
    ap.add_argument("--quick", action="store_true", help="toy sizes on the CPU: a check of this script")
    a = ap.parse_args(argv)
    stages = [s.strip() for s in a.only.split(",") if s.strip()]
    bad = [s for s in stages if s not in STAGES]
    if bad:
        print(f"error: --only: unknown {bad}; choose from {', '.join(STAGES)}", file=sys.stderr)
        return 2
    os.makedirs(a.out, exist_ok=True)
    b = Budget(a.budget, a.out)
    py = sys.executable
    work = os.path.join("/tmp", f"gpu-checks-{os.getpid()}")
    os.makedirs(work, exist_ok=True)
    env = {"PYTHONPATH": os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH", "")) if p)}
    q = a.quick
    dev = ["--device", "cpu", "--quick"] if q else []
    b.note(f"gpu_checks: stages {','.join(stages)}, budget {a.budget:.0f} s, quick={q}")

    if "smoke" in stages:
        code = (
            "import sys, torch, ray, mlflow, pydantic, yaml, psutil; import ray.train.torch; "
            "import orchestrator.cli, trainers.loop.trainer; "
            "print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, "
            "'ray', ray.__version__, 'mlflow', mlflow.__version__); "
            "print('gpu', torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'none')"
        )
        rc, text = b.run("smoke/imports", [py, "-c", code], 90, env)
        b.note("  " + " | ".join(text.strip().splitlines()[-2:]))
        if rc != 0:
            b.note("smoke failed: stopping")
            return 3
        train = [py, "-m", "orchestrator", "train", "configs/quickstart.yaml", "--no-progress"]
        sets = ["train.epochs=0.25", f"tracking.uri=sqlite:///{work}/smoke.db", f"checkpoint.storage_path={work}/runs"]
        rc, text = b.run("smoke/quickstart", train + [x for s in sets for x in ("--set", s)], 150, env)
        b.note("  " + " | ".join(ln.strip() for ln in text.strip().splitlines()[-3:])[-400:])
        for ln in text.splitlines():
            if "to the first step" in ln or ln.lstrip().startswith(("finished", "wall")):
                b.note("  " + ln.strip()[:300])  # where the start went on this machine
        if rc != 0:
            b.note("smoke failed: stopping")
            return 3

    def bench(name: str, model: str, steps: int, extra: list[str], limit: float) -> None:
        # 1 s slices: a ResNet-18 step takes ~10 ms on an H100-class GPU, the orchestrator's run ~10 s
        sized = [] if q else ["--steps", str(steps), "--slice", "1"]
        cmd = [py, "bench/gpu.py", "--models", model, "--batch", "256", *sized, *extra, *dev]
        rc, text = b.run(name, cmd + ["--profile", a.out], limit, env)
        for ln in figures(text):
            b.note("  " + ln)

    if "resnet18" in stages:
        bench("resnet18", "resnet18" if not q else "cnn", 2000, [], 300)

    if "resnet50" in stages:
        bench("resnet50", "resnet50" if not q else "cnn", 400, [], 240)

    if "tests" in stages:
        tenv = {**env, "ELB_TEST_DEVICE": "cpu"} if q else env
        cmd = [py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", *GPU_TESTS]
        if q:
            cmd += ["-k", "not inductor"]
        rc, text = b.run("tests", cmd, 180, tenv)
        b.note("  " + (text.strip().splitlines() or ["(no output)"])[-1])
        for ln in text.splitlines():
            if ln.startswith(("FAILED", "ERROR")):
                b.note("  " + ln[:300])

    if "adaptive" in stages:
        db = f"{work}/adaptive.db"
        sets = [f"tracking.uri=sqlite:///{db}", f"checkpoint.storage_path={work}/runs"]
        if q:
            sets += [
                "scaling.use_gpu=false",
                "data.device=host",
                "model.name=cnn",
                "data.size=2048",
                "train.precision=fp32",
                "model.channels_last=false",
                "train.epochs=1",
                "batch.size=32",
                "optimizer.base_batch_size=32",
                "batch.max_size=256",
                "batch.check_every=4",
                "scaling.cpus_per_worker=1",
            ]
        cmd = [py, "-m", "orchestrator", "train", "configs/gpu_quickstart.yaml", "--no-progress"]
        rc, text = b.run("adaptive", cmd + [x for s in sets for x in ("--set", s)], 200, env)
        for ln in text.splitlines():
            if "batch" in ln and "->" in ln or "run finished" in ln:
                b.note("  " + ln.strip()[:200])
        if os.path.exists(db):
            try:
                summary = adaptive_summary(db)
            except Exception as e:  # noqa: BLE001 - the figures are what this stage is for: say why there are none
                summary = f"no summary: {type(e).__name__}: {e}"
            with open(os.path.join(a.out, "adaptive.txt"), "w") as f:
                f.write(summary + "\n")
            for ln in summary.splitlines():
                b.note("  " + ln)

    rows = ["--rows", "plain,orchestrator"]
    if "augment" in stages:
        bench("augment", "resnet18" if not q else "cnn", 800, rows + ["--augment", "random_crop,hflip"], 120)
    if "compile" in stages:
        bench("compile", "resnet18" if not q else "cnn", 1000, rows + ["--compile"], 200)
    if "lm_target" in stages:
        out = os.path.join(a.out, "lm_target")
        cmd = [py, "bench/time_to_target.py", "--only", "fixed B0,noise_scale", "--out", out]
        if q:
            cmd += ["--quick"]
        else:
            sets = ["scaling.use_gpu=true", "scaling.gpus_per_worker=1", "scaling.cpus_per_worker=4"]
            cmd += [x for s in sets for x in ("--set", s)]
        rc, text = b.run("lm_target", cmd, 300, env)
        keys = ("schedule", "-----", "fixed B0", "noise_scale", "projection:", "cost:", "steps_ratio=")
        for ln in text.splitlines():
            if ln.startswith(keys):
                b.note("  " + ln[:400])
    b.note("gpu_checks: done")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
