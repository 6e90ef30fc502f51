"""Where the CPU of one ``python -m orchestrator train`` run goes, process by process, and (with
``--against``) the same run of another checkout side by side.

The run is the loop of ``bench/overhead.py`` (synthetic 1x8x8 data, the small CNN, B=64, one
worker) started as a process; every 0.3 s the bench reads the CPU time of each process of its tree
from /proc (the driver, the local Ray it starts, Ray Train's actors, the training worker, the
monitor actor), keeping each process's last reading.  CPU seconds are counted by the kernel, so
unlike a throughput ratio they hardly depend on what else the machine runs: the table says what
the driver and the monitor take beside the worker, per 1000 steps.

``--against PATH`` runs the same config from the checkout at ``PATH`` (e.g. ``git worktree add
/tmp/before <commit>``) at the same time, so both see the same machine; the rows then compare
the two trees' processes and their throughput (samples over the time from the first to the last
step, from MLflow).  This is how a change to the driver or the link is checked for a slowdown
on a shared machine, where runs minutes apart differ by more than the change.

    .venv/bin/python bench/cpu.py [--steps 4000] [--against /tmp/before] [--quick]

``--quick`` (CI): 300 steps.  Last line: ``beside_worker=<(driver + monitor CPU) / worker CPU>``;
with ``--against``: ``side_by_side_ratio=<this tree's samples/s / the other's>`` before it.
Linux only (/proc).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections import Counter

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.common import parse_args, scratch_dir, table  # noqa: E402
from bench.overhead import tree  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")
N = 200_000  # synthetic samples; 90% train


def _read(pid: int) -> tuple[int, int, str] | None:
    """(parent, CPU ticks, command line) of one process; None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            s = f.read()
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return None
    fields = s[s.rfind(")") + 2 :].split()
    return int(fields[1]), int(fields[11]) + int(fields[12]), cmd


def kind(pid: int, root: int, cmd: str) -> str:
    """The class a process is counted under."""
    if pid == root:
        return "driver (train CLI)"
    if "RayTrainWorker" in cmd:
        return "training worker"
    if "Monitor" in cmd:
        return "monitor actor"
    if cmd.startswith("ray::"):
        return cmd.split()[0].split(".")[0]
    first = (cmd.split() or ["?"])[0]
    return os.path.basename(first) or "?"


def config(tmp: str, steps: int) -> str:
    path = os.path.join(tmp, "cfg.yaml")
    with open(path, "w") as f:
        f.write(f"""data: {{name: synthetic, size: {N}}}
model: {{name: cnn, norm: batch, hidden: 64}}
optimizer: {{name: sgd, lr: 0.1, mf: 0.9, base_batch_size: 64}}
batch: {{size: 64, max_local_batch: 64}}
scaling: {{min_workers: 1, max_workers: 1, cpus_per_worker: 2}}
train: {{epochs: {steps * 64 / (N * 0.9)}, eval_every: 0}}
checkpoint: {{storage_path: {tmp}/ray_runs}}
tracking: {{uri: "sqlite:///{tmp}/mlflow.db", experiment: bench}}
""")
    return path


class Watched:
    """One ``train`` run of the checkout at ``root``, with its processes' CPU."""

    def __init__(self, root: str, steps: int):
        self.root, self.tmp = root, scratch_dir()
        python = os.path.join(root, ".venv", "bin", "python")
        env = {**os.environ, "PYTHONPATH": root}
        env.pop("RAY_ADDRESS", None)
        self.log = open(os.path.join(self.tmp, "out.log"), "w")
        self.proc = subprocess.Popen(
            [
                python if os.path.exists(python) else sys.executable,
                "-m",
                "orchestrator",
                "train",
                config(self.tmp, steps),
            ],
            cwd=root,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        self.last: dict[int, tuple[int, str]] = {}

    def sample(self) -> None:
        procs: dict[int, tuple[int, int]] = {}
        info: dict[int, tuple[int, str]] = {}
        for p in filter(str.isdigit, os.listdir("/proc")):
            r = _read(int(p))
            if r is not None:
                procs[int(p)] = (r[0], r[1])
                info[int(p)] = (r[1], r[2])
        for pid in tree(self.proc.pid, procs):
            if pid in info:
                ticks, cmd = info[pid]
                self.last[pid] = (ticks, cmd or self.last.get(pid, (0, "?"))[1])

    def cpu(self) -> Counter:
        out: Counter = Counter()
        for pid, (ticks, cmd) in self.last.items():
            out[kind(pid, self.proc.pid, cmd)] += ticks / TICK
        return out

    def throughput(self) -> tuple[int, float]:
        """(steps, samples/s from the first to the last step) from the run's MLflow rows."""
        from mlflow.tracking import MlflowClient

        client = MlflowClient(f"sqlite:///{self.tmp}/mlflow.db")
        exp = client.get_experiment_by_name("bench")
        run = client.search_runs([exp.experiment_id], max_results=1)[0]
        loss = sorted(client.get_metric_history(run.info.run_id, "train/loss"), key=lambda m: m.step)
        span = (loss[-1].timestamp - loss[0].timestamp) / 1000
        return len(loss), 64 * (len(loss) - 1) / span if span > 0 else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=4000)
    ap.add_argument("--against", help="another checkout, run side by side (e.g. a git worktree of an older commit)")
    a = parse_args(ap, quick={"steps": 300})
    runs = {"this tree": Watched(ROOT, a.steps)}
    if a.against:
        runs[os.path.abspath(a.against)] = Watched(os.path.abspath(a.against), a.steps)
    t0 = time.time()
    while any(w.proc.poll() is None for w in runs.values()):
        for w in runs.values():
            if w.proc.poll() is None:
                w.sample()
        time.sleep(0.3)
    for name, w in runs.items():
        if w.proc.returncode != 0:
            with open(w.log.name) as f:
                sys.exit(f"{name}: train exited {w.proc.returncode}:\n{f.read()[-2000:]}")
    cpus = {name: w.cpu() for name, w in runs.items()}
    speed = {name: w.throughput() for name, w in runs.items()}
    classes = sorted(set().union(*cpus.values()), key=lambda k: -max(c[k] for c in cpus.values()))
    steps = {name: s for name, (s, _) in speed.items()}
    print(f"synthetic 1x8x8 (n={N}), cnn, B=64, W=1; {a.steps} steps asked; {time.time() - t0:.0f} s wall")
    print(
        table(
            [(k, *(f"{cpus[n][k]:.2f} ({1000 * cpus[n][k] / max(steps[n], 1):.2f})" for n in runs)) for k in classes]
            + [("samples/s (first to last step)", *(f"{speed[n][1]:,.0f}" for n in runs))],
            ("CPU s (per 1000 steps)", *runs),
        )
    )
    this = cpus["this tree"]
    if a.against:
        other = speed[os.path.abspath(a.against)][1]
        print(f"side_by_side_ratio={speed['this tree'][1] / other:.3f}")
    beside = this["driver (train CLI)"] + this["monitor actor"]
    print(f"beside_worker={beside / max(this['training worker'], 1e-9):.3f}")


if __name__ == "__main__":
    main()
