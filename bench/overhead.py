"""Per-step throughput of the orchestrator's loop at W=1 against a plain PyTorch loop, time-sliced.

Both train the same model on the same data with the same global batch, optimizer and thread
count.  They run at the same time but never together: every ``--slice`` seconds the bench stops
one of them (SIGSTOP to every process of its tree; for the orchestrator that is the ``train``
CLI and the local Ray it starts: daemons, actors, the training worker) and lets the other go on
(SIGCONT).  On a shared machine, where two runs of the same plain loop a minute apart differ by
30-70%, runs one after another compare minutes rather than loops; slices seconds apart see the
same machine.

A loop's rate in a slice comes from the wall times at which its steps ended (for the
orchestrator: the MLflow timestamps of its ``train/loss`` rows, stamped on the worker): the
samples of the steps that end inside the slice over the time they took, leaving out the steps
at an epoch end and just after one (validation, checkpoint) and the last.  Each slice of the loop
under test is paired with the plain slices just before and after it.  A row's ratio is the
pooled rate of its paired slices over the plain loop's; the median of the pairs' ratios is
printed beside it.  Rows, each against its own plain loop:

  plain PyTorch loop                       the method's own error (ideally 1.000)
  orchestrator step code, no Ray           Trainer.train_step and per-step metrics, plain process
  plain loop in a bare Ray Train worker    what Ray costs (worker process, daemons, Train's actors)
  orchestrator loop, W=1                   ``python -m orchestrator train``: the result

``CPU beside`` is the share of the machine that other processes than the loop's own (the busiest
of its tree) used during its slices; ``first step`` and ``whole run``: the time from the ``train``
invocation to its first step and to its exit, counting only the time it ran.

    .venv/bin/python bench/overhead.py [--steps 12000] [--slice 2] [--size 200000] [--model cnn]
        [--batch 64] [--threads 2] [--rows plain,local,ray,orchestrator] [--set KEY=VALUE ...] [--quick]

``--quick`` (CI): the step-code and orchestrator rows (the bare Ray row's code is the plain
loop's), 1000 steps a loop on 20,000 samples, ``--unsliced-ends`` and ``--pairs 2``: each loop under
test runs alone until its first steps, its plain loop then alone until its own, two slices of each
(as long as the slower loop's pace needs for a measured slice), and the loop under test alone to its
end: its ratio is rough (two or three pairs), and only shows the path runs.

With the ``ray`` and ``orchestrator`` rows: ``first_step_ratio=<orchestrator's invocation to
first step / the bare Ray Train worker's>`` (both start their own local Ray; goal <= 1.1).
Last line: ``ratio=<orchestrator/plain>`` (goal: >= 0.95).  Linux only (signals, /proc).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from bench.common import (  # noqa: E402
    PACE_STEPS,
    median,
    parse_args,
    read_pace,
    scratch_dir,
    slices_text,
    started_file,
    table,
    temp_config,
    write_pace,
)
from trainers.data.datasets import load_data  # noqa: E402
from trainers.data.order import epoch_permutation
from trainers.policies.optim import build_optimizer  # noqa: E402
from trainers.workload.models import build_model  # noqa: E402

ROWS = {
    "plain": "plain PyTorch loop",
    "local": "orchestrator step code, no Ray",
    "ray": "plain loop in a bare Ray Train worker",
    "orchestrator": "orchestrator loop, W=1",
}
MIN_STEPS = 10  # a slice with fewer measured steps is not paired
ALONE_LEAD_S = 60.0  # unsliced ends: the most a Ray row runs alone before its Ray Train worker starts
PACED_SLICE_S = 0.5  # a quick form's rows: the shortest slice once the loops' pace is known
ALONE_START_S = 600.0  # a quick form's rows: the most a loop runs alone before its first PACE_STEPS steps


# -- the loops (each runs in a process of its own) -------------------------------------------------


def walk_steps(
    step, n: int, batch: int, seed: int, steps: int, stopped=lambda: False, paced=lambda times: None
) -> list[float]:
    """Run ``step(ids)`` along the run's data order for ``steps`` steps (0: until ``stopped()``);
    the wall time at which each step ended.  ``paced(times)`` is called once, after
    :data:`PACE_STEPS` steps."""
    times: list[float] = []
    epoch = 0
    while True:
        perm = epoch_permutation(seed, epoch, n)
        for s in range(0, n, batch):
            step(perm[s : s + batch])
            times.append(time.time())
            if len(times) == PACE_STEPS:
                paced(times)
            if len(times) == steps or stopped():
                return times
        epoch += 1


def plain_step(cfg, threads: int):
    """The ceiling: one process, tensors indexed by the permutation slice, nothing else (a
    workload that is not a built-in image one: :func:`plain_workload_step`)."""
    torch.set_num_threads(threads)
    torch.manual_seed(cfg.train.seed)
    if not cfg.data.in_memory or cfg.model.factory is not None or cfg.model.loss:
        return plain_workload_step(cfg)
    data = load_data(cfg.data, cfg.train.seed)
    model = build_model(data.info, cfg.model)
    opt = build_optimizer(model, cfg.optimizer)
    model.train()

    def step(ids) -> None:
        loss = F.cross_entropy(model(data.train_x[ids]), data.train_y[ids])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        float(loss.detach())  # the orchestrator reads its loss every step too

    return step, data.num_train


def plain_workload_step(cfg):
    """A plain loop of any workload (a factory's, the language model): the model, loss and datasets
    the orchestrator would build, each step's samples loaded in one ``__getitems__`` (or indexed
    tensors), the mean of the per-sample loss, backward, step."""
    from trainers.data.sampler import fetch
    from trainers.workload.build import build_workload

    work = build_workload(cfg)
    model, loss_fn = work.model, work.loss_fn
    opt = build_optimizer(model, cfg.optimizer)
    model.train()
    if work.tensors is not None:

        def load(ids):
            return work.tensors.train_x[ids], work.tensors.train_y[ids]
    else:

        def load(ids):
            return fetch(work.train, ids.tolist())

    def step(ids) -> None:
        x, y = load(ids)
        loss = loss_fn(model(x), y).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        float(loss.detach())

    return step, work.num_train


def local_step(cfg, threads: int):
    """The orchestrator's own step code (``Trainer.train_step`` + per-step metrics) without Ray."""
    from trainers.loop.config import LoopConfig
    from trainers.loop.trainer import Runtime, Trainer

    torch.set_num_threads(threads)
    t = Trainer(LoopConfig.model_validate(cfg.loop_dict()), Runtime(), rank=0, world=1, device=torch.device("cpu"))
    return (lambda ids: t.metrics_for_step(t.train_step(ids))), t.plan.n


def run_loop(cfg_json: dict, kind: str, threads: int, steps: int, out: str, mark: bool = False) -> None:
    """``steps`` steps of a plain or local loop (0: until SIGTERM); the step end times to ``out``;
    ``mark``: its pace after its first steps to ``out + ".started"`` (:func:`started_file`)."""
    from orchestrator.config.schema import validate

    cfg = validate(cfg_json)
    stop: list[int] = []
    if steps == 0:
        signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    step, n = (plain_step if kind == "plain" else local_step)(cfg, threads)
    paced = partial(write_pace, started_file(out)) if mark else (lambda times: None)
    times = walk_steps(step, n, cfg.batch.size, cfg.train.seed, steps, lambda: bool(stop), paced)
    with open(out, "w") as f:
        json.dump(times, f)


def run_in_ray_train(cfg_json: dict, threads: int, steps: int, out: str, mark: bool = False) -> None:
    """The plain loop as the train function of a bare one-worker ``TorchTrainer`` on a local Ray
    started here (as the orchestrator's CLI starts one)."""
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from orchestrator.run.runner import ensure_ray

    def loop(c):
        sys.path.insert(0, c["root"])
        from bench.overhead import run_loop as run

        run(c["cfg"], "plain", c["threads"], c["steps"], c["out"], c["mark"])

    started = ensure_ray(verbose=False, num_cpus=os.cpu_count())
    TorchTrainer(
        loop,
        train_loop_config={"cfg": cfg_json, "threads": threads, "steps": steps, "out": out, "root": ROOT, "mark": mark},
        scaling_config=ScalingConfig(num_workers=1, resources_per_worker={"CPU": threads}),
        run_config=RunConfig(storage_path=scratch_dir(), name="plain"),
    ).fit()
    if started:
        import ray

        ray.shutdown()


# -- slicing -----------------------------------------------------------------------------------------


def _proc_stat(pid) -> list[str]:
    with open(f"/proc/{pid}/stat") as f:
        s = f.read()
    return s[s.rfind(")") + 2 :].split()  # fields from the 3rd on: state, ppid, ..., utime (14th), stime


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:  # ended meanwhile
        return b""


def label(pid: int) -> str:
    """What a process is, for the side-CPU table: a Ray worker's title (``ray::MonitorActor``), a
    daemon's name (``raylet``), a Python command's module or script (``python -m orchestrator``)."""
    argv = [a.decode(errors="replace") for a in _cmdline(pid).split(b"\0") if a]
    if not argv:
        return "?"
    if argv[0].startswith("ray::"):
        return argv[0].split()[0].split(".")[0]
    name = os.path.basename(argv[0])
    if name.startswith("python") and len(argv) > 1:
        rest = argv[1:]
        while len(rest) > 1 and rest[0].startswith("-") and rest[0] not in ("-m", "-c"):
            rest = rest[1:]  # python's own flags (-u, -X ...)
        if rest[0] == "-m" and len(rest) > 1:
            return f"python -m {rest[1]}"
        return f"python {os.path.basename(rest[0])}"
    return name


def processes() -> dict[int, tuple[int, int]]:
    """Every process's (parent, CPU ticks), from one pass over /proc."""
    out = {}
    for p in filter(str.isdigit, os.listdir("/proc")):
        try:
            f = _proc_stat(p)
        except OSError:  # ended meanwhile
            continue
        out[int(p)] = (int(f[1]), int(f[11]) + int(f[12]))
    return out


def tree(root: int, procs: dict[int, tuple[int, int]] | None = None) -> list[int]:
    """``root`` and every process below it."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in (processes() if procs is None else procs).items():
        children.setdefault(ppid, []).append(pid)
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def send(pids: list[int], sig: int) -> None:
    for p in pids:
        try:
            os.kill(p, sig)
        except ProcessLookupError:
            pass


def busy_ticks() -> int:
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return sum(v[:8]) - v[3] - v[4]  # all but idle and iowait


class Slices:
    """Runs command ``a`` to its end and the reference ``b`` beside it, never together, switching
    every ``slice_s`` seconds; ``b`` gets SIGTERM when ``a`` has ended."""

    def __init__(self, a: list[str], b: list[str], slice_s: float, log: str):
        self.slices: list[tuple[str, float, float]] = []  # (who, start, end)
        self.cpu: list[tuple[str, int, int]] = []  # (who, machine's busy ticks, the loop's own) per slice
        self.side: dict[int, int] = {}  # CPU ticks of each process of ``a``'s tree but its loop, in ``a``'s slices
        self.labels: dict[int, str] = {}  # what each of them is (:func:`label`), as last seen
        self.a_running_s = 0.0  # the length of ``a``'s sliced slices
        with open(log, "w") as out:
            self.a = subprocess.Popen(a, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
            self.b = subprocess.Popen(b, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
        self.slice_s = slice_s
        self.log = log

    def run(
        self,
        desc: str = "",
        lead_s: float = 0.0,
        done: Callable[[], bool] | None = None,
        started: Callable[[], float | None] | None = None,
        b_started: Callable[[], float | None] | None = None,
    ) -> Slices:
        """Slice until ``a`` ends; its first slice lasts until a Ray Train worker runs, at most
        ``lead_s`` (Ray's node start allows the raylet 30 s of wall time, which stopped slices
        would eat).  ``done``: once it says ``a`` made all its steps, ``a`` runs on alone to its end
        (no step of it is left to measure).  ``started`` and ``b_started`` (instead of ``lead_s``; the
        quick forms): ``a``'s first slice lasts until ``started()`` gives its pace (seconds a step after
        its first :data:`PACE_STEPS`; at most :data:`ALONE_START_S`), the reference's first slice
        until ``b_started()`` gives its own, and the slices after them (not ``slice_s``) are long
        enough for :data:`MIN_STEPS` measured steps of the slower of the two twice over, at least
        :data:`PACED_SLICE_S`: no slice is spent on either's start, and each slice can be paired
        whatever the machine's speed."""
        from tqdm import tqdm

        send([self.b.pid], signal.SIGSTOP)
        who, start = "a", time.time()
        before = self._snapshot()
        bar = tqdm(desc=desc, file=sys.stderr, leave=False, bar_format="{desc}: {n_fmt} slices [{elapsed}]")
        try:
            while True:
                bar.update()
                if who == "a" and not self.slices and started is not None:
                    self._alone(started, self.a)
                elif who == "b" and len(self.slices) == 1 and b_started is not None:
                    self._alone(b_started, self.b)
                    self.slice_s = paced_slice(started(), b_started(), self.slice_s)
                elif who == "a" and not self.slices and lead_s > self.slice_s:
                    self._lead(lead_s)
                elif who == "a":
                    try:
                        self.a.wait(timeout=self.slice_s)
                    except subprocess.TimeoutExpired:
                        pass
                else:
                    time.sleep(self.slice_s)
                end = time.time()
                self.slices.append((who, start, end))
                after = self._snapshot()  # also the next slice's start
                self.cpu.append(
                    (
                        who,
                        after[0] - before[0],
                        max(
                            (after[2][p] - before[2].get(p, after[2][p]) for p in after[1][who] if p in after[2]),
                            default=0,
                        ),
                    )
                )
                if who == "a" and len(self.slices) > 1:
                    self._count_side(before, after, end - start)
                if self.a.poll() is not None:
                    break
                if done is not None and done():
                    if who == "b":
                        send(after[1]["b"], signal.SIGSTOP)
                        send(after[1]["a"], signal.SIGCONT)
                    start = time.time()
                    self.a.wait()
                    self.slices.append(("a", start, time.time()))
                    self.cpu.append(("a", busy_ticks() - after[0], 0))
                    break
                nxt = "b" if who == "a" else "a"
                send(after[1][who], signal.SIGSTOP)
                send(after[1][nxt], signal.SIGCONT)
                who, start, before = nxt, time.time(), after
        finally:
            bar.close()
            send(tree(self.a.pid), signal.SIGCONT)
            if self.a.poll() is None:  # interrupted: let the orchestrator shut its Ray down
                self.a.send_signal(signal.SIGINT)
                self.a.wait()
            self.b.send_signal(signal.SIGTERM)
            send([self.b.pid], signal.SIGCONT)
            self.b.wait()
        if self.a.returncode != 0:
            with open(self.log) as f:
                raise SystemExit(f"the loop under test failed ({self.a.returncode}):\n{f.read()[-3000:]}")
        return self

    @staticmethod
    def _alone(until: Callable[[], float | None], proc: subprocess.Popen) -> None:
        """One process tree runs alone until ``until()`` gives its pace, ``proc`` ends, or
        :data:`ALONE_START_S` has passed."""
        end = time.time() + ALONE_START_S
        while until() is None and proc.poll() is None and time.time() < end:
            time.sleep(0.2)

    def _lead(self, lead_s: float) -> None:
        """The first slice of ``a``: until a Ray Train worker runs in its tree (Ray's node start is
        then over) or ``lead_s`` has passed, or ``a`` has ended.  A fixed lead is not enough: a fast
        Ray start lets a short loop finish inside it, leaving no slice to pair."""
        end = time.time() + lead_s
        while time.time() < end and self.a.poll() is None:
            if any(b"RayTrainWorker" in _cmdline(p) for p in tree(self.a.pid)):
                return
            time.sleep(0.25)

    def _snapshot(self) -> tuple[int, dict[str, list[int]], dict[int, int]]:
        """(the machine's busy ticks, each side's processes, their CPU ticks), from one /proc pass."""
        procs = processes()
        trees = {"a": tree(self.a.pid, procs), "b": tree(self.b.pid, procs)}
        return busy_ticks(), trees, {p: procs[p][1] for p in trees["a"] + trees["b"] if p in procs}

    def _count_side(self, before, after, seconds: float) -> None:
        """Adds one slice of ``a`` to each side process's CPU ticks (all of ``a``'s tree but its
        busiest process, the loop's)."""
        deltas = {p: after[2][p] - before[2].get(p, after[2][p]) for p in after[1]["a"] if p in after[2]}
        if not deltas:
            return
        loop = max(deltas, key=deltas.get)
        for p, d in deltas.items():
            if p != loop:
                self.side[p] = self.side.get(p, 0) + d
                self.labels[p] = label(p)
        self.a_running_s += seconds

    def side_shares(self, top: int = 8) -> list[tuple[str, float]]:
        """The side processes' CPU, summed by :func:`label`, as a share of one core during ``a``'s
        slices (its first, lead slice left out), busiest first."""
        if self.a_running_s <= 0:
            return []
        by: dict[str, int] = {}
        for p, ticks in self.side.items():
            by[self.labels[p]] = by.get(self.labels[p], 0) + ticks
        per_s = os.sysconf("SC_CLK_TCK") * self.a_running_s
        return sorted(((k, v / per_s) for k, v in by.items() if v), key=lambda kv: -kv[1])[:top]

    def ran_for(self, upto: float) -> float:
        """Seconds ``a`` ran from its launch to the wall time ``upto``."""
        return sum(max(0.0, min(hi, upto) - lo) for who, lo, hi in self.slices if who == "a")


def paced_slice(a_pace: float | None, b_pace: float | None, slice_s: float) -> float:
    """A quick form's slices: long enough for :data:`MIN_STEPS` measured steps of the slower loop
    twice over, at least :data:`PACED_SLICE_S`.  A loop under test whose pace is 0 (the orchestrator:
    its MLflow rows come too late to time its first steps) is taken as half as fast as the plain
    loop; no pace known: ``slice_s``."""
    if b_pace is None or a_pace is None:
        return slice_s
    return max(PACED_SLICE_S, 2 * (MIN_STEPS + 2) * max(a_pace or 2 * b_pace, b_pace))


def first_logged(db: str) -> float | None:
    """0.0 (its pace unknown: :func:`paced_slice`) once the sqlite MLflow store ``db`` holds a
    ``train/loss`` row, None before."""
    return 0.0 if logged_at_least(db, 1) else None


def logged_at_least(db: str, n: int) -> bool:
    """Whether the sqlite MLflow store ``db`` holds ``n`` ``train/loss`` rows yet (read only)."""
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            return con.execute("SELECT COUNT(*) FROM metrics WHERE key = 'train/loss'").fetchone()[0] >= n
        finally:
            con.close()
    except sqlite3.Error:  # not there yet, or no metrics table yet
        return False


def step_gaps(times: list[float], n_train: int, batch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(end, start, samples) of each measured step: every step but the first, the last, those at
    an epoch end and those just after one (validation and checkpoint fall in them)."""
    t = np.asarray(times, dtype=np.float64)
    per_epoch = math.ceil(n_train / batch)
    k = np.arange(1, len(t) + 1)  # 1-based step numbers
    pos = (k - 1) % per_epoch + 1  # step within its epoch
    size = np.where(pos == per_epoch, n_train - (per_epoch - 1) * batch, batch)
    keep = (k > 1) & (k < len(t)) & (pos != per_epoch) & (pos != 1)
    return t[1:][keep[1:]], t[:-1][keep[1:]], size[1:][keep[1:]]


def slice_rate(gaps, lo: float, hi: float) -> tuple[float, float] | None:
    """(samples, seconds) of the measured steps that ran wholly inside ``(lo, hi)``."""
    end, start, size = gaps
    inside = (start > lo) & (end < hi)
    if inside.sum() < MIN_STEPS:
        return None
    return float(size[inside].sum()), float((end - start)[inside].sum())


def paired(run: Slices, a_gaps, b_gaps) -> dict:
    """Each slice of ``a`` with measured steps against the reference's slices beside it."""
    rates_a, rates_b, ratios, beside = [], [], [], []
    machine = os.sysconf("SC_CLK_TCK") * (os.cpu_count() or 1)  # ticks a second
    for i, (who, lo, hi) in enumerate(run.slices):
        ra = slice_rate(a_gaps, lo, hi) if who == "a" else None
        if ra is None:
            continue
        near = [slice_rate(b_gaps, l2, h2) for w2, l2, h2 in run.slices[max(0, i - 1) : i + 2] if w2 == "b"]
        near = [r for r in near if r is not None]
        if not near:
            continue
        rates_a.append(ra)
        rates_b += near
        ratios.append((ra[0] / ra[1]) / np.mean([s / d for s, d in near]))
        _, busy, own = run.cpu[i]
        beside.append(max(0, busy - own) / ((hi - lo) * machine))

    def pooled(rates):
        return sum(s for s, _ in rates) / sum(d for _, d in rates) if rates else float("nan")

    return {
        "a": pooled(rates_a),
        "b": pooled(rates_b),
        "pairs": len(ratios),
        "median": median(ratios),
        "beside": median(beside),
        "side": run.side_shares(),
    }


# -- main --------------------------------------------------------------------------------------------


def orchestrator_cmd(cfg_yaml: str, overrides: list[str]) -> list[str]:
    """The orchestrator row's command: the ``train`` CLI on the bench's config, with ``--set``s."""
    return [
        sys.executable,
        "-m",
        "orchestrator",
        "train",
        cfg_yaml,
        "--no-progress",
        *[x for kv in overrides for x in ("--set", kv)],
    ]


def write_config(cfg, tmp: str) -> tuple[str, str]:
    """The config as JSON (for the child loops) and YAML (for the ``train`` CLI) in ``tmp``."""
    from orchestrator.config.schema import to_yaml

    cfg_json, cfg_yaml = os.path.join(tmp, "cfg.json"), os.path.join(tmp, "cfg.yaml")
    with open(cfg_json, "w") as f:
        json.dump(cfg.model_dump(mode="json"), f)
    with open(cfg_yaml, "w") as f:
        f.write(to_yaml(cfg))
    return cfg_json, cfg_yaml


def measure(
    rows: list[str],
    cfg,
    cfg_json: str,
    cfg_yaml: str,
    n_train: int,
    threads: int,
    steps: int,
    slice_s: float,
    overrides: list[str],
    tmp: str,
    names: dict[str, str] | None = None,
    lead_s: float = 0.0,
    unsliced_ends: bool = False,
    pairs: int = 0,
) -> tuple[dict[str, dict], tuple[float, float, int] | None]:
    """Each row's loop time-sliced against its own plain loop of ``cfg``: ``{row: paired(...)}`` and,
    for the orchestrator row, (time to its first step, whole run, steps) counting only the time it ran.
    ``names``: the rows' labels (default :data:`ROWS`); ``lead_s``: the first slice of each row
    (:meth:`Slices.run`); ``unsliced_ends``: a Ray row runs alone until its Ray Train worker starts
    (at most :data:`ALONE_LEAD_S`) and after its last step (the orchestrator's: its MLflow rows; the bare
    Ray row's: its output file): Ray's start and teardown, unmeasured either way, which sliced take
    twice their time.  ``pairs`` (a quick form; 0: off): each loop runs alone until its first steps, its
    plain loop then alone until its own (:meth:`Slices.run`), and after ``pairs`` slices of each the
    loop under test runs alone to its end: a few seconds sliced, whatever the steps (a rough ratio)."""
    names = names or ROWS
    batch = cfg.batch.size
    mark = ["--mark-start"] if pairs else []

    def child(kind: str, n_steps: int, out: str) -> list[str]:
        return [
            sys.executable,
            os.path.abspath(__file__),
            "--child",
            kind,
            "--child-config",
            cfg_json,
            "--threads",
            str(threads),
            "--steps",
            str(n_steps),
            "--out",
            out,
            *mark,
        ]

    results, orch = {}, None
    for row in rows:
        a_out, b_out = os.path.join(tmp, f"{row}-a.json"), os.path.join(tmp, f"{row}-b.json")
        cmd = orchestrator_cmd(cfg_yaml, overrides) if row == "orchestrator" else child(row, steps, a_out)
        done = None  # unsliced ends: whether the loop under test has made its steps
        if unsliced_ends and row == "orchestrator":
            done = partial(logged_at_least, cfg.tracking.uri[len("sqlite:///") :], steps - 1)
        elif unsliced_ends and row == "ray":
            done = partial(os.path.exists, a_out)  # written once its steps are made
        lead = lead_s if done is None else max(lead_s, ALONE_LEAD_S)
        run = Slices(cmd, child("plain", 0, b_out), slice_s, os.path.join(tmp, f"{row}.log"))
        if pairs:
            db = cfg.tracking.uri[len("sqlite:///") :]
            started = partial(first_logged, db) if row == "orchestrator" else partial(read_pace, started_file(a_out))
            made = done or (lambda: False)
            run.run(
                names[row],
                done=lambda: made() or len(run.slices) >= 2 + 2 * pairs,
                started=started,
                b_started=partial(read_pace, started_file(b_out)),
            )
        else:
            run.run(names[row], lead, done)
        if row == "orchestrator":
            from mlflow.tracking import MlflowClient

            client = MlflowClient(cfg.tracking.uri)
            exp = client.get_experiment_by_name(cfg.tracking.experiment)
            run_id = client.search_runs([exp.experiment_id], max_results=1)[0].info.run_id
            hist = sorted(client.get_metric_history(run_id, "train/loss"), key=lambda m: m.step)
            a_times = [m.timestamp / 1000 for m in hist]
            orch = (run.ran_for(a_times[0]), run.ran_for(run.slices[-1][2]), len(a_times))
        else:
            with open(a_out) as f:
                a_times = json.load(f)
        with open(b_out) as f:
            b_times = json.load(f)
        results[row] = r = paired(run, step_gaps(a_times, n_train, batch), step_gaps(b_times, n_train, batch))
        r["first"] = run.ran_for(a_times[0]) if a_times else None  # invocation -> first step (time it ran)
        print(
            f"  {names[row]}: {r['a'] / r['b']:.3f} of the plain loop ({r['pairs']} pairs)", file=sys.stderr, flush=True
        )
    return results, orch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=12000, help="optimizer steps of each loop under test")
    ap.add_argument(
        "--slice",
        type=float,
        default=2.0,
        help="seconds each loop runs before the other's turn (with --pairs: from the loops' pace)",
    )
    ap.add_argument("--size", type=int, default=200000, help="samples of the synthetic 1x8x8 data (0: digits)")
    ap.add_argument("--model", default="cnn")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", default=",".join(ROWS), help="which rows, comma-separated: " + ", ".join(ROWS))
    ap.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="config override for the orchestrator row, e.g. train.push_every_s=1.0 (repeatable)",
    )
    ap.add_argument(
        "--unsliced-ends",
        action="store_true",
        help="the Ray rows run alone until their Ray Train worker starts and after their last step (Ray's "
        "start and teardown, unmeasured either way)",
    )
    ap.add_argument("--child", choices=("plain", "local", "ray"), help=argparse.SUPPRESS)
    ap.add_argument("--child-config", help=argparse.SUPPRESS)
    ap.add_argument(
        "--pairs",
        type=int,
        default=0,
        help="a quick check: each loop alone until its first steps, then this many slices of each (their "
        "length from the loops' pace), then the loop under test alone to its end (0: sliced to its last step)",
    )
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--mark-start", action="store_true", help=argparse.SUPPRESS)
    a = parse_args(
        ap,
        quick={
            "steps": 1000,
            "size": 20000,
            "rows": "local,orchestrator",
            "unsliced_ends": True,
            "pairs": 2,
        },
    )
    if a.child:
        with open(a.child_config) as f:
            cfg_json = json.load(f)
        if a.child == "ray":
            return run_in_ray_train(cfg_json, a.threads, a.steps, a.out, a.mark_start)
        return run_loop(cfg_json, a.child, a.threads, a.steps, a.out, a.mark_start)
    rows = [r.strip() for r in a.rows.split(",") if r.strip()]
    bad = [r for r in rows if r not in ROWS]
    if bad or not rows or a.steps < 4 * MIN_STEPS or a.slice <= 0 or a.pairs < 0:
        what = (
            f"--rows: unknown {bad}; choose from {', '.join(ROWS)}"
            if bad or not rows
            else f"--steps must be at least {4 * MIN_STEPS}"
            if a.steps < 4 * MIN_STEPS
            else "--pairs must be >= 0"
            if a.pairs < 0
            else "--slice must be > 0"
        )
        print(f"error: {what}", file=sys.stderr)
        raise SystemExit(2)
    if not os.path.exists("/proc/stat"):
        print("error: bench/overhead.py needs Linux (/proc and SIGSTOP)", file=sys.stderr)
        raise SystemExit(2)

    data = {"name": "synthetic", "size": a.size, "shape": [1, 8, 8]} if a.size else {"name": "digits"}
    cfg, tmp = temp_config(
        data=data,
        model={"name": a.model, "norm": "batch", "hidden": 64},
        optimizer={"name": "sgd", "lr": 0.1, "mf": 0.9, "base_batch_size": a.batch},
        batch={"size": a.batch, "max_local_batch": a.batch},
        scaling={"min_workers": 1, "max_workers": 1, "cpus_per_worker": a.threads},
        train={"epochs": 1, "eval_every": 0},
    )
    n_train = load_data(cfg.data, cfg.train.seed).num_train
    cfg = cfg.model_copy(update={"train": cfg.train.model_copy(update={"epochs": a.steps * a.batch / n_train})})
    cfg_json, cfg_yaml = write_config(cfg, tmp)
    if a.overrides:  # a bad --set stops here, before any loop runs
        from orchestrator.config.prepare import load_config
        from orchestrator.config.schema import ConfigError

        try:
            load_config(cfg_yaml, a.overrides)
        except ConfigError as e:
            print(f"error: --set: {e}", file=sys.stderr)
            raise SystemExit(2) from None

    what = f"synthetic 1x8x8 (n={a.size})" if a.size else "digits"
    print(f"{what}, {a.model}, B={a.batch}, {a.threads} threads, {a.steps} steps a loop, {slices_text(a)}", flush=True)
    results, orch = measure(
        rows,
        cfg,
        cfg_json,
        cfg_yaml,
        n_train,
        a.threads,
        a.steps,
        a.slice,
        a.overrides,
        tmp,
        unsliced_ends=a.unsliced_ends,
        pairs=a.pairs,
    )
    print(
        table(
            [
                (
                    ROWS[k],
                    f"{r['a']:,.0f}",
                    f"{r['b']:,.0f}",
                    f"{r['a'] / r['b']:.3f}",
                    f"{r['median']:.3f}",
                    r["pairs"],
                    f"{100 * r['beside']:.1f}%",
                )
                for k, r in results.items()
            ],
            ("loop", "samples/s", "plain samples/s", "ratio", "median pair", "pairs", "CPU beside"),
        )
    )
    for k, r in results.items():
        if k in ("ray", "orchestrator") and r.get("side"):
            shares = ", ".join(f"{name} {100 * v:.1f}%" for name, v in r["side"])
            print(f"{ROWS[k]}, its own processes beside the loop (share of a core in its slices): {shares}")
    if orch is not None:
        print(
            f"time from train invocation to first step: {orch[0]:.1f} s; whole run {orch[1]:.1f} s "
            f"for {orch[2]} steps (time it ran)"
        )
        ray_first = results.get("ray", {}).get("first")
        if ray_first:
            print(f"bare Ray Train worker, invocation (Ray start, TorchTrainer) to first step: {ray_first:.1f} s")
            print(f"first_step_ratio={orch[0] / ray_first:.3f}")
    if "orchestrator" in results:
        r = results["orchestrator"]
        print(f"ratio={r['a'] / r['b']:.3f}")


if __name__ == "__main__":
    main()
