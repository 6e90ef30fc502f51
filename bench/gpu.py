"""Throughput of the GPU fast path: the orchestrator at W=1 against a tuned plain PyTorch loop.

Three loops train the same model on the same data with the same batch and settings: the model
of ``trainers/workload/models.py`` (``build_model``: ResNet-18/50 with the CIFAR stem, or the small cnn),
synthetic uint8 3x32x32 images written in CIFAR-10's own file format (so the orchestrator reads
them as ``data.name: cifar10``), held on the device (``data.device: accelerator``;
``trainers/accel/device.py:DeviceData``), normalised per batch with the CIFAR mean/std, bf16 autocast,
channels_last, SGD with momentum, the loss read back every step; optional ``--compile`` and
``--augment`` (both loops then use ``trainers/accel/device.py``/``trainers/data/augment.py``).

  tuned plain PyTorch loop            the reference: ten lines around the same building blocks
  plain loop in a bare Ray Train      the same loop as the train function of a one-worker TorchTrainer
    worker                            (what Ray Train itself costs)
  orchestrator loop, W=1              ``python -m orchestrator train`` on the equivalent config

Time-sliced like ``bench/overhead.py``: each loop under test runs beside its own plain loop (a
process of its own), never together: every ``--slice`` seconds one process tree is stopped
(SIGSTOP) and the other goes on, so both see the same machine (and GPU).  Rates come from the
wall times at which steps ended (the orchestrator's: its MLflow timestamps), leaving out the
steps at and after an epoch end; each slice of the loop under test is paired with the plain
slices beside it (``bench/overhead.py:paired``).  The loop under test runs alone until its first
step (Ray's start, compilation), and cuDNN autotuning falls before the first paired slice.  Peak memory: on a GPU,
``torch.cuda.max_memory_allocated`` of
the training process (the orchestrator's from its ``memory/peak_bytes`` metric); on CPU its peak
RSS (the orchestrator's: the largest peak RSS among the processes it started, an upper bound).

Prints, per model: the table, the device name, ``plain_samples_per_s=``, ``ratio_ray=<bare Ray
Train / plain>`` and ``ratio=<orchestrator / plain>`` (aims: >= 0.97 and >= 0.95).

    python bench/gpu.py [--models resnet18,resnet50] [--batch 256] [--steps 600] [--slice 3]
        [--rows plain,ray,orchestrator] [--device cuda|cpu] [--precision bf16] [--no-channels-last]
        [--data device|host] [--compile] [--augment random_crop,hflip] [--size 8192] [--profile DIR] [--quick]

``--rows plain`` alone times the plain loop in this process instead (``--rounds`` rounds of
``--warmup`` + ``--steps`` steps, the median; ``--data host`` measures pinned host data copied
each step).  ``--quick`` (CI, ``--device cpu``): the cnn, B=4, 512 samples, 1200 steps, 1 s slices, 1 thread,
``--unsliced-ends``, ``--pairs 2`` (two slices of each loop after both have started, then the loop
under test alone to its end: a rough ratio that only shows the path runs).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import pickle
import resource
import shutil
import signal
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from functools import partial

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from trainers.accel.device import compile_model, to_channels_last  # noqa: E402
from trainers.accel.precision import Precision, check_precision  # noqa: E402
from trainers.data.augment import Augment  # noqa: E402
from trainers.data.datasets import CIFAR_MEAN, CIFAR_STD, DataConfig, DatasetInfo, load_data
from trainers.data.order import epoch_permutation  # noqa: E402
from trainers.data.pipeline import DeviceData
from trainers.workload.models import ModelConfig, build_model  # noqa: E402


@dataclass(frozen=True)
class Setup:
    """What every row trains: the same model, batch, data and settings."""

    model: str = "resnet18"
    batch: int = 256
    device: str = "cuda"
    precision: str = "bf16"
    channels_last: bool = True
    data: str = "device"  # device: the set lives on the accelerator; host: pinned, copied each step
    compile: bool = False
    augment: tuple[str, ...] = ()
    size: int = 8192  # synthetic training samples
    seed: int = 0
    lr: float = 0.1
    momentum: float = 0.9
    threads: int = 0  # torch threads of each loop on CPU (0: torch's default)


@dataclass
class Measurement:
    row: str
    model: str
    samples_per_s: float
    steps: int
    seconds: float
    peak_memory_bytes: int
    extra: dict[str, float] = field(default_factory=dict)


ROW_LABELS = {
    "plain": "tuned plain PyTorch loop",
    "ray": "plain loop in a bare Ray Train worker",
    "orchestrator": "orchestrator loop, W=1",
}


# -- the data: synthetic images in CIFAR-10's file format ----------------------------------------------


def synthetic_images(n: int, seed: int, side: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` random uint8 3 x side x side images and labels in 0..9 (CPU tensors)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, 3, side, side), dtype=torch.uint8, generator=g), torch.randint(
        0, 10, (n,), generator=g
    )


def write_cifar_files(root: str, n: int, seed: int, n_test: int = 256) -> str:
    """``n`` training and ``n_test`` test images of :func:`synthetic_images` as CIFAR-10's python
    pickles (``data_batch_1..5``, ``test_batch``, ``batches.meta``) under ``root``; returns ``root``."""
    folder = os.path.join(root, "cifar-10-batches-py")
    os.makedirs(folder, exist_ok=True)
    x, y = synthetic_images(n + n_test, seed)
    rows = x.reshape(len(x), -1).numpy()  # CIFAR's row layout: 1024 red, 1024 green, 1024 blue
    cuts = np.array_split(np.arange(n), 5)
    parts = [(f"data_batch_{i + 1}", c) for i, c in enumerate(cuts)] + [("test_batch", np.arange(n, n + n_test))]
    for name, ids in parts:
        with open(os.path.join(folder, name), "wb") as f:
            pickle.dump({"data": rows[ids], "labels": y[ids].tolist()}, f)
    with open(os.path.join(folder, "batches.meta"), "wb") as f:
        pickle.dump({"label_names": [f"class{i}" for i in range(10)]}, f)
    return root


def data_config(root: str) -> DataConfig:
    return DataConfig(name="cifar10", root=root, val_split="test")


# -- the tuned plain loop --------------------------------------------------------------------------------


def plain_step(setup: Setup, root: str, device: str | None = None) -> tuple[Callable[[np.ndarray, int], float], int]:
    """The tuned plain loop's step ``step(ids, epoch) -> loss`` and the number of samples, on the
    files under ``root`` (``device``: where it runs, default ``setup.device``)."""
    dev = torch.device(device or setup.device)
    if setup.threads:
        torch.set_num_threads(setup.threads)
    torch.manual_seed(setup.seed)
    d = load_data(data_config(root), setup.seed, raw=True)
    x, y = d.train_x, d.train_y
    model = build_model(DatasetInfo((3, 32, 32), 10), ModelConfig(name=setup.model))
    if setup.channels_last:
        model = to_channels_last(model)
    model = model.to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=setup.lr, momentum=setup.momentum)
    net = compile_model(model) if setup.compile else model
    prec = Precision(setup.precision, dev)
    aug = Augment(setup.augment, setup.seed) if setup.augment else None
    if setup.data == "device":
        data = DeviceData(x, y, dev, CIFAR_MEAN, CIFAR_STD, channels_last=setup.channels_last)
        fetch = lambda ids, epoch: data.batch(ids, aug, epoch)  # noqa: E731
    else:  # the host path: raw uint8 rows pinned, copied each step, then augmented and normalised there
        xs, ys = (x.pin_memory(), y.pin_memory()) if dev.type == "cuda" else (x, y)
        norm = DeviceData(x[:1], y[:1], dev, CIFAR_MEAN, CIFAR_STD, channels_last=setup.channels_last)

        def fetch(ids, epoch):
            idx = torch.as_tensor(ids)
            xb, yb = xs.index_select(0, idx), ys.index_select(0, idx)
            if dev.type == "cuda":
                xb, yb = xb.pin_memory(), yb.pin_memory()
            xb = xb.to(dev, non_blocking=True)
            if aug is not None:
                xb = aug(xb, idx, epoch)
            return norm.normalize(xb), yb.to(dev, non_blocking=True)

    model.train()

    def step(ids: np.ndarray, epoch: int) -> float:
        xb, yb = fetch(ids, epoch)
        with prec.autocast():
            out = net(xb)
            per_sample = F.cross_entropy(out, yb, reduction="none")
        loss = per_sample.float().sum() / len(ids)
        opt.zero_grad(set_to_none=True)
        prec.backward(loss)
        prec.step(opt)
        return float(loss.detach())  # one host sync a step, as the orchestrator's loop

    return step, int(y.shape[0])


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed_steps(
    step: Callable[[np.ndarray, int], float], n: int, setup: Setup, warmup: int, steps: int
) -> tuple[int, float]:
    """Run ``warmup`` then ``steps`` steps along the data order; (samples, seconds) of the latter."""
    epoch, cursor, done, samples, t0 = 0, 0, 0, 0, 0.0
    perm = epoch_permutation(setup.seed, epoch, n)
    while done < warmup + steps:
        if cursor + setup.batch > n:  # whole batches only: every timed step has the same size
            epoch, cursor = epoch + 1, 0
            perm = epoch_permutation(setup.seed, epoch, n)
        if done == warmup:
            _sync(setup.device)
            t0 = time.perf_counter()
        step(perm[cursor : cursor + setup.batch], epoch)
        cursor += setup.batch
        done += 1
        if done > warmup:
            samples += setup.batch
    _sync(setup.device)
    return samples, time.perf_counter() - t0


def walk(
    step: Callable[[np.ndarray, int], float],
    n: int,
    setup: Setup,
    steps: int,
    stopped: Callable[[], bool] = lambda: False,
) -> list[float]:
    """The run's data order as the orchestrator walks it (the short last batch of an epoch too):
    ``steps`` steps (0: until ``stopped()``); the wall time at which each ended."""
    times: list[float] = []
    epoch = 0
    while True:
        perm = epoch_permutation(setup.seed, epoch, n)
        for s in range(0, n, setup.batch):
            step(perm[s : s + setup.batch], epoch)
            times.append(time.time())
            if len(times) == steps or stopped():
                return times
        epoch += 1


def run_plain(setup: Setup, root: str, steps: int, out: str, device: str | None = None) -> None:
    """``steps`` steps of the plain loop (0: until SIGTERM); the step end times to ``out``."""
    stop: list[int] = []
    if steps == 0:
        signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    step, n = plain_step(setup, root, device)

    def first(ids: np.ndarray, epoch: int) -> float:  # the first step marks the loop as started
        loss = step(ids, epoch)
        if not os.path.exists(out + ".started"):
            open(out + ".started", "w").close()
        return loss

    times = walk(first, n, setup, steps, lambda: bool(stop))
    with open(out, "w") as f:
        json.dump({"times": times, "peak_bytes": peak_memory(device or setup.device)}, f)


def run_in_ray_train(setup: Setup, root: str, steps: int, out: str) -> None:
    """The plain loop as the train function of a bare one-worker ``TorchTrainer`` on a local Ray
    started here (as the orchestrator's CLI starts one), on the worker's device."""
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from bench.common import scratch_dir
    from orchestrator.run.ray_env import ensure_ray

    def loop(c):
        sys.path.insert(0, c["root"])
        import ray.train.torch

        from bench.gpu import Setup as S
        from bench.gpu import run_plain as run

        dev = ray.train.torch.get_device()
        run(S(**{**c["setup"], "augment": tuple(c["setup"]["augment"])}), c["data"], c["steps"], c["out"], str(dev))

    cuda = setup.device.startswith("cuda")
    started = ensure_ray(verbose=False, num_cpus=os.cpu_count())
    TorchTrainer(
        loop,
        train_loop_config={"setup": asdict(setup), "data": root, "steps": steps, "out": out, "root": ROOT},
        scaling_config=ScalingConfig(
            num_workers=1, use_gpu=cuda, resources_per_worker={"CPU": max(1, setup.threads or 1)}
        ),
        run_config=RunConfig(storage_path=scratch_dir(), name="plain"),
    ).fit()
    if started:
        import ray

        ray.shutdown()


def orchestrator_config(setup: Setup, root: str, tmp: str, steps: int) -> dict:
    """The config under which ``python -m orchestrator train`` trains what the plain loop does:
    the same data, model, batch, optimizer (no LR scaling, warmup or decay) and fast-path settings."""
    n = load_data(data_config(root), setup.seed).num_train
    cuda = setup.device.startswith("cuda")
    return {
        "data": {
            "name": "cifar10",
            "root": root,
            "val_split": "test",
            "device": "accelerator" if setup.data == "device" and cuda else "host",
            "augment": list(setup.augment),
        },
        "model": {"name": setup.model, "norm": "batch", "channels_last": setup.channels_last},
        "optimizer": {"name": "sgd", "lr": setup.lr, "mf": setup.momentum, "base_batch_size": setup.batch},
        "batch": {"size": setup.batch, "max_local_batch": setup.batch},
        "schedule": {"scaling_rule": "none", "warmup": "none", "decay": "none"},
        "scaling": {
            "min_workers": 1,
            "max_workers": 1,
            "use_gpu": cuda,
            "cpus_per_worker": max(1, setup.threads or (os.cpu_count() or 1)),
        },
        "train": {
            "epochs": steps * setup.batch / n,
            "eval_every": 0,
            "seed": setup.seed,
            "precision": setup.precision,
            "compile": setup.compile,
        },
        "checkpoint": {"storage_path": os.path.join(tmp, "ray_runs")},
        "tracking": {"uri": f"sqlite:///{tmp}/mlflow.db", "experiment": "bench-gpu"},
    }


# -- memory --------------------------------------------------------------------------------------------------


def reset_peak_memory(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()


def peak_memory(device: str) -> int:
    """Peak bytes of this process: the accelerator's allocated memory, or on CPU the max RSS."""
    if device.startswith("cuda"):
        return int(torch.cuda.max_memory_allocated())
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def peak_rss(pid: int) -> int:
    """A process's peak resident memory (``VmHWM``), 0 if it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class TreePeakRSS:
    """While running, samples every ``every_s`` seconds the largest peak RSS among the processes
    of ``root``'s tree (:attr:`peak`): a process's own peak survives the sampling gaps."""

    def __init__(self, root: int, every_s: float = 0.5):
        self.root, self.every_s, self.peak = root, every_s, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> None:
        from bench.overhead import tree

        self.peak = max([self.peak, *(peak_rss(p) for p in tree(self.root))])

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.sample()

    def __enter__(self) -> TreePeakRSS:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def device_name(device: str) -> str:
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    import platform

    return f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


# -- rows ----------------------------------------------------------------------------------------------------


def measure_plain(setup: Setup, root: str, warmup: int, steps: int) -> Measurement:
    """The plain loop in this process (``--rows plain``)."""
    reset_peak_memory(setup.device)
    step, n = plain_step(setup, root)
    samples, seconds = timed_steps(step, n, setup, warmup, steps)
    return Measurement("plain", setup.model, samples / max(seconds, 1e-9), steps, seconds, peak_memory(setup.device))


def run_rounds(setup: Setup, root: str, warmup: int, steps: int, rounds: int) -> dict[str, list[Measurement]]:
    return {"plain": [measure_plain(setup, root, warmup, steps) for _ in range(rounds)]}


def _child(kind: str, setup: Setup, root: str, steps: int, out: str) -> list[str]:
    return [
        sys.executable,
        os.path.abspath(__file__),
        "--child",
        kind,
        "--child-setup",
        json.dumps(asdict(setup)),
        "--child-data",
        root,
        "--steps",
        str(steps),
        "--out",
        out,
    ]


PROFILED_STEPS = 20


def profile_name(setup: Setup) -> str:
    """The file ``--profile`` writes for ``setup``'s orchestrator row."""
    variant = ("-compile" if setup.compile else "") + ("-augment" if setup.augment else "")
    return f"profile-{setup.model}-b{setup.batch}{variant}.txt"


def measure_sliced(
    setup: Setup,
    root: str,
    tmp: str,
    rows: list[str],
    steps: int,
    slice_s: float,
    profile: str | None = None,
    unsliced_ends: bool = False,
    pairs: int = 0,
) -> dict[str, list[Measurement]]:
    """Each row of ``rows`` ("ray", "orchestrator") time-sliced against its own plain loop;
    the plain loop's measurement pools its slices beside every row.  ``profile`` (a folder): the
    orchestrator's rank 0 records :data:`PROFILED_STEPS` steps near its end with the torch profiler
    (``trainers/accel/profile.py``) and the table lands there as :func:`profile_name`; those
    steps are left out of its rate.  ``unsliced_ends``: a row runs alone after its last step too
    (its teardown; bench/overhead.py ``measure``).  ``pairs`` (a quick form; 0: off): after this many
    slices of each, the loop under test runs alone to its end (a rough ratio in a few seconds sliced)."""
    from bench.overhead import logged_at_least, orchestrator_cmd, paired, step_gaps
    from orchestrator.config.schema import to_yaml, validate
    from trainers.link import metrics as M

    n = load_data(data_config(root), setup.seed).num_train
    os.makedirs(tmp, exist_ok=True)
    out: dict[str, list[Measurement]] = {"plain": []}
    cuda = setup.device.startswith("cuda")
    for row in rows:
        a_out, b_out = os.path.join(tmp, f"{row}-a.json"), os.path.join(tmp, f"{row}-b.json")
        if row == "orchestrator":
            cfg = validate(orchestrator_config(setup, root, tmp, steps))
            cfg_yaml = os.path.join(tmp, "orchestrator.yaml")
            with open(cfg_yaml, "w") as f:
                f.write(to_yaml(cfg))
            cmd = orchestrator_cmd(cfg_yaml, [])
            db = cfg.tracking.uri[len("sqlite:///") :]
            started = lambda: mlflow_has_steps(db)  # noqa: E731
        else:
            cmd = _child(row, setup, root, steps, a_out)
            started = lambda: os.path.exists(a_out + ".started")  # noqa: E731
        profiled_from = 0
        if profile and row == "orchestrator":  # the worker inherits this environment (a local Ray)
            profiled_from = max(1, steps - PROFILED_STEPS - 5)
            os.environ.update(
                ELB_PROFILE_DIR=os.path.join(tmp, "profile"),
                ELB_PROFILE_SKIP=str(profiled_from),
                ELB_PROFILE_STEPS=str(PROFILED_STEPS),
            )
        try:
            run = sliced_after_start(
                cmd,
                _child("plain", setup, root, 0, b_out),
                slice_s,
                os.path.join(tmp, f"{row}.log"),
                started,
                b_started=lambda: os.path.exists(b_out + ".started"),
            )
        finally:
            for k in ("ELB_PROFILE_DIR", "ELB_PROFILE_SKIP", "ELB_PROFILE_STEPS"):
                os.environ.pop(k, None)
        done = None
        if unsliced_ends and row == "orchestrator":
            done = partial(logged_at_least, db, steps - 1)
        elif unsliced_ends:
            done = partial(os.path.exists, a_out)  # written once its steps are made
        if pairs:
            done = partial(made_or_paired, done or (lambda: False), run, pairs)
        with TreePeakRSS(run.a.pid) as rss:
            run.run(ROW_LABELS[row], done)
        if row == "orchestrator":
            from mlflow.tracking import MlflowClient

            client = MlflowClient(cfg.tracking.uri)
            exp = client.get_experiment_by_name(cfg.tracking.experiment)
            run_id = client.search_runs([exp.experiment_id], max_results=1)[0].info.run_id
            hist = sorted(client.get_metric_history(run_id, M.TRAIN_LOSS), key=lambda m: m.step)
            a_times = [m.timestamp / 1000 for m in hist]
            if profiled_from:  # the profiled steps (and those after them) are not timed
                a_times = a_times[:profiled_from]
                got_profile = sorted(glob.glob(os.path.join(tmp, "profile", "profile-*.txt")))
                if got_profile:
                    os.makedirs(profile, exist_ok=True)
                    shutil.copy(got_profile[0], os.path.join(profile, profile_name(setup)))
                    print(f"  profile: {os.path.join(profile, profile_name(setup))}", file=sys.stderr, flush=True)
                else:
                    print("  profile: the worker wrote none", file=sys.stderr, flush=True)
            a_peak = (
                max((m.value for m in client.get_metric_history(run_id, M.MEMORY_PEAK)), default=0)
                if cuda
                else rss.peak
            )
        else:
            with open(a_out) as f:
                got = json.load(f)
            a_times, a_peak = got["times"], got["peak_bytes"]
        with open(b_out) as f:
            got = json.load(f)
        b_times, b_peak = got["times"], got["peak_bytes"]
        r = paired(run, step_gaps(a_times, n, setup.batch), step_gaps(b_times, n, setup.batch))
        label = {"ratio": r["a"] / r["b"], "pairs": float(r["pairs"]), "median_pair": r["median"]}
        out[row] = [Measurement(row, setup.model, r["a"], len(a_times), 0.0, int(a_peak), label)]
        out["plain"].append(Measurement("plain", setup.model, r["b"], len(b_times), 0.0, int(b_peak)))
        print(
            f"  {ROW_LABELS[row]}: {r['a'] / r['b']:.3f} of the plain loop ({r['pairs']} pairs)",
            file=sys.stderr,
            flush=True,
        )
    return out


def made_or_paired(made: Callable[[], bool], run, pairs: int) -> bool:
    """Whether the loop under test made its steps, or ``run`` (started after both loops' first steps)
    has ``pairs`` slices of each."""
    return made() or len(run.slices) >= 2 * pairs


def mlflow_has_steps(db: str) -> bool:
    """Whether the sqlite MLflow store ``db`` holds a ``train/loss`` row yet (read only)."""
    import sqlite3

    if not os.path.isfile(db):
        return False
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            return con.execute("SELECT 1 FROM metrics WHERE key = ? LIMIT 1", ("train/loss",)).fetchone() is not None
        finally:
            con.close()
    except sqlite3.Error:
        return False


def sliced_after_start(
    a: list[str],
    b: list[str],
    slice_s: float,
    log: str,
    started: Callable[[], bool],
    limit_s: float = 900.0,
    b_started: Callable[[], bool] | None = None,
):
    """``bench/overhead.py``'s :class:`Slices`, with the loop under test running alone until
    ``started()`` (its first step): Ray's own start has wall-clock timeouts (30 s for a raylet to
    register) that a stopped process tree misses on a busy machine, and no slice before the
    first step is measured anyway.  Then, with ``b_started``, the reference runs alone until its
    own first step (its CUDA context, data and cuDNN autotuning: seconds on a GPU, during which a
    fast loop under test would otherwise finish its steps with no slice to pair)."""
    from bench.overhead import Slices, send, tree

    def wait(until: Callable[[], bool], proc) -> None:
        deadline = time.time() + limit_s
        while not until() and proc.poll() is None and time.time() < deadline:
            time.sleep(0.2)

    class AfterStart(Slices):
        def run(self, desc: str = "", done: Callable[[], bool] | None = None) -> Slices:
            os.kill(self.b.pid, signal.SIGSTOP)
            wait(started, self.a)
            if b_started is not None and self.a.poll() is None:
                send(tree(self.a.pid), signal.SIGSTOP)
                send([self.b.pid], signal.SIGCONT)
                wait(b_started, self.b)
                send([self.b.pid], signal.SIGSTOP)
                send(tree(self.a.pid), signal.SIGCONT)
            return super().run(desc, done=done)

    return AfterStart(a, b, slice_s, log)


def summarize(ms: list[Measurement]) -> Measurement:
    """A row's figure over its measurements: the median rate, the largest peak memory."""
    rate = statistics.median(m.samples_per_s for m in ms)
    return replace(
        ms[0],
        samples_per_s=rate,
        seconds=sum(m.seconds for m in ms),
        peak_memory_bytes=max(m.peak_memory_bytes for m in ms),
    )


def report(setup: Setup, results: dict[str, list[Measurement]]) -> str:
    """The table of one model's rows and the summary lines.  A sliced row's ratio is its paired
    ratio against the plain loop beside it (``extra["ratio"]``); otherwise rate over plain's rate."""
    from bench.common import table

    summ = {r: summarize(ms) for r, ms in results.items()}
    base = summ.get("plain")

    def ratio(r: str) -> float | None:
        m = summ[r]
        if "ratio" in m.extra:
            return m.extra["ratio"]
        return m.samples_per_s / base.samples_per_s if base else None

    rows = []
    for r, m in summ.items():
        q = ratio(r)
        rows.append(
            (
                ROW_LABELS.get(r, r),
                f"{m.samples_per_s:,.0f}",
                "-" if q is None else f"{q:.3f}",
                f"{m.peak_memory_bytes / 2**20:,.0f} MiB",
                len(results[r]),
            )
        )
    lines = [table(rows, ("loop", "samples/s", "of plain", "peak memory", "measurements"))]
    if base:
        lines.append(f"plain_samples_per_s={base.samples_per_s:.1f}")
    if base and "ray" in summ:
        lines.append(f"ratio_ray={ratio('ray'):.3f}")
    if base and "orchestrator" in summ:
        lines.append(f"ratio={ratio('orchestrator'):.3f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--models",
        default=None,
        help="comma-separated: resnet18, resnet50, cnn (default resnet18,resnet50; cnn with --quick)",
    )
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument(
        "--steps",
        type=int,
        default=None,
        help="steps of each loop under test (sliced rows; default "
        "600) or timed steps per round (--rows plain; default 50)",
    )
    ap.add_argument("--slice", type=float, default=3.0, help="seconds each loop runs before the other's turn")
    ap.add_argument("--warmup", type=int, default=10, help="--rows plain: untimed steps first (compile, autotuning)")
    ap.add_argument("--rounds", type=int, default=3, help="--rows plain: rounds")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--precision", default="bf16", choices=("fp32", "bf16", "fp16"))
    ap.add_argument("--no-channels-last", action="store_true")
    ap.add_argument("--data", default="device", choices=("device", "host"))
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--augment", default="", help="comma-separated, e.g. random_crop,hflip")
    ap.add_argument("--size", type=int, default=8192, help="synthetic training samples")
    ap.add_argument("--threads", type=int, default=0, help="torch threads of each loop (0: torch's default)")
    ap.add_argument("--rows", default="plain,ray,orchestrator", help="comma-separated: " + ", ".join(ROW_LABELS))
    ap.add_argument(
        "--quick",
        action="store_true",
        help="CI: the cnn, B<=4, 512 samples, 1200 steps, 1 s slices, --unsliced-ends, --pairs 2, "
        "1 thread on CPU (--rows plain: 2 steps, 1 warm-up, 1 round)",
    )
    ap.add_argument(
        "--profile",
        default="",
        help="a folder: the orchestrator row's worker writes a torch-profiler table of "
        f"{PROFILED_STEPS} steps near its end there (those steps are not timed)",
    )
    ap.add_argument(
        "--unsliced-ends",
        action="store_true",
        help="a sliced row runs alone after its last step too (its teardown; it runs alone until its first "
        "step anyway)",
    )
    ap.add_argument(
        "--pairs",
        type=int,
        default=None,
        help="a quick check: this many slices of each sliced loop, then the loop under test alone to its end "
        "(default 0: sliced to its last step; 2 with --quick)",
    )
    ap.add_argument("--child", choices=("plain", "ray"), help=argparse.SUPPRESS)
    ap.add_argument("--child-setup", help=argparse.SUPPRESS)
    ap.add_argument("--child-data", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        raw = json.loads(a.child_setup)
        setup = Setup(**{**raw, "augment": tuple(raw["augment"])})
        if a.child == "ray":
            return run_in_ray_train(setup, a.child_data, a.steps, a.out)
        return run_plain(setup, a.child_data, a.steps, a.out)
    rows = [r.strip() for r in a.rows.split(",") if r.strip()]
    models = [m.strip() for m in (a.models or ("cnn" if a.quick else "resnet18,resnet50")).split(",") if m.strip()]
    try:
        bad = [r for r in rows if r not in ROW_LABELS]
        if bad or not rows:
            raise ValueError(f"--rows: unknown {bad}; choose from {', '.join(ROW_LABELS)}")
        bad = [m for m in models if m not in ("resnet18", "resnet50", "cnn")]
        if bad or not models:
            raise ValueError(f"--models: unknown {bad}; choose from resnet18, resnet50, cnn")
        check_precision(a.precision, torch.device(a.device).type)
        if a.device.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError("--device: no CUDA GPU here; use --device cpu")
        if a.slice <= 0:
            raise ValueError("--slice: must be > 0")
        if a.pairs is not None and a.pairs < 0:
            raise ValueError("--pairs: must be >= 0")
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    sliced = [r for r in rows if r != "plain"]
    if a.quick:
        a.batch, a.size, a.slice, a.unsliced_ends = min(a.batch, 4), min(a.size, 512), min(a.slice, 1.0), True
        a.pairs = 2 if a.pairs is None else a.pairs
        if not a.device.startswith("cuda"):
            a.threads = a.threads or 1  # one thread a loop: a busy small machine, and Ray's own processes
        if not sliced:
            a.steps, a.warmup, a.rounds = 2, 1, 1
    a.pairs = a.pairs or 0
    steps = a.steps or (1200 if a.quick else 600 if sliced else 50)  # quick: enough steps for a few slices
    from bench.common import scratch_dir

    tmp = scratch_dir("elastic-bench-gpu-")
    root = write_cifar_files(os.path.join(tmp, "data"), max(a.size, a.batch), seed=0)
    print(
        f"device: {device_name(a.device)}; 3x32x32 synthetic uint8 (n={max(a.size, a.batch)}), B={a.batch}, "
        f"{a.precision}, {'NCHW' if a.no_channels_last else 'channels_last'}, data on {a.data}, "
        f"compile={'on' if a.compile else 'off'}, augment={a.augment or 'none'}; "
        + (
            f"{steps} steps a loop under test, {a.slice:g} s slices"
            if sliced
            else f"{a.warmup} warm-up + {steps} timed steps, {a.rounds} round(s)"
        ),
        flush=True,
    )
    for model in models:
        setup = Setup(
            model=model,
            batch=a.batch,
            device=a.device,
            precision=a.precision,
            channels_last=not a.no_channels_last,
            data=a.data,
            compile=a.compile,
            augment=tuple(x for x in a.augment.split(",") if x),
            size=max(a.size, a.batch),
            threads=a.threads,
        )
        if sliced:
            results = measure_sliced(
                setup,
                root,
                os.path.join(tmp, model),
                sliced,
                steps,
                a.slice,
                a.profile or None,
                a.unsliced_ends,
                a.pairs,
            )
        else:
            results = run_rounds(setup, root, a.warmup, steps, a.rounds)
        print(f"\n{model}:")
        print(report(setup, results), flush=True)


if __name__ == "__main__":
    main()
