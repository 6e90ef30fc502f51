"""Steps, tokens, wall time and worker-seconds to a target validation perplexity on the language model, one
run per batch schedule (same config, seed and data order), each trained until it reaches the target.

Each run goes through the product's own driver (``run_training``, what ``fit()`` runs) on a local Ray.

The product's promise: a batch that grows during training reaches a given quality sooner, without
hand-tuning.  Schedules, all from the same base learning rate tuned at B0 (the config's
``optimizer.base_batch_size``; the LR follows the config's scaling rule when B changes):

    fixed B0        batch.policy fixed at B0
    fixed 8*B0      batch.policy fixed at 8*B0 (LR by the scaling rule)
    ramp            Megatron/OLMo linear ramp B0 -> 8*B0 over the first half of the horizon
    cbs_warmup      batch warmup from the measured critical batch (Merrill et al. 2025), doubling
    seesaw          step schedule's cuts at 1/4, 1/2, 3/4 of the horizon: LR x 1/sqrt(2), B x 2 (Meterez et al. 2025)
    noise_scale     B follows c * B_simple (McCandlish et al. 2018), the config's limits
    goodput         scaling.policy goodput (Pollux) choosing B from B0 to the cap (batch.policy fixed, max_size set)

**To the target, under a stated cap.**  Each run trains until a validation reaches ``--target`` (the
driver asks the run to stop there: ``request_stop`` from its records callback), or until the cap.  Fixed
B0 runs first under ``--epochs``; the others' cap is ``--cap-factor`` (4) x fixed B0's samples to the
target, or ``--epochs`` when fixed B0 did not run or did not reach it.  "Not reached" means not within
that cap.  The schedules whose plan needs a horizon (ramp over its first half, seesaw's cuts at 1/4,
1/2, 3/4) take ``--horizon-factor`` (1) x fixed B0's samples to the target: the length a user who
knew fixed B0's run would plan (with the cap as horizon, Seesaw's first cut fell where fixed B0 had
already reached the target, and Seesaw was fixed B0 until then).

**The crossing, read fairly.**  Every schedule validates every ``--eval-samples`` samples
(``train.eval_every_samples``), so all are read at the same resolution in tokens whatever their
batch; the crossing is interpolated in log-perplexity between the two validations around it, and
steps, tokens, wall time and worker-seconds are read at that interpolated point.  Wall time on this
machine is noisy (shared cores) and includes the validations; steps and tokens are the robust figures.

**The cluster projection** fits Pollux's step-time model ``T(b, W) = alpha + beta * b``
(``trainers/policies/goodput.py`` StepTimeModel) to the step times measured here (all at W = 1), adds
the synchronisation of ``W`` workers, and replays each schedule's batch sequence up to the crossing on
``W = ceil(B / cluster_local_batch)`` workers.  The synchronisation: by default a ring all-reduce of
the model's gradient (``bench/scale.py``'s model, ``2 (W-1)/W x S / bandwidth + 2 (W-1) x latency``)
on ``--bandwidth-gbps``/``--latency-us`` (100 Gb/s, 5 us a hop: a GPU cluster's network;
``bench/scale.py`` measures this machine's gloo); or, with ``--sync-s``, Pollux's linear
``gamma x (W - 1)``.  Worker-seconds: here, what the run's worker groups held
(orchestrator/record/cost.py, the run's ``timeline/holds.json``) from its first step to the crossing; on
the cluster, each replayed step's ``W x T``: a schedule that reaches the target in fewer steps by adding
workers saves wall time, not necessarily worker-seconds.

    .venv/bin/python bench/time_to_target.py                # configs/lm_growing.yaml (1.9M GPT, B0 = 4), target 6
    .venv/bin/python bench/time_to_target.py --quick        # configs/lm_adaptive.yaml (0.1M GPT, B0 = 2), target 30
    .venv/bin/python bench/time_to_target.py --reuse --target 7     # the same runs read at a looser target
    .venv/bin/python bench/time_to_target.py --reuse --bandwidth-gbps 25 --cluster-local-batch 32   # another cluster

Summary lines: ``steps_ratio=`` and ``tokens_ratio=`` (noise_scale to the target / fixed B0's),
``goodput_wall_ratio=`` (goodput's projected wall / the best other schedule's) and ``cost_ratio=``
(noise_scale's projected worker-seconds / fixed B0's); nan when skipped or not reached.  A plot of
perplexity against steps, tokens, wall time and worker-seconds is saved under ``--out`` and logged to
the bench's own MLflow run.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from dataclasses import dataclass, field

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import parse_args, scratch_dir, table  # noqa: E402
from trainers.errors import one_line  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOISE_KEYS = ("noise_scale_factor", "check_every", "min_growth", "round_to", "ema", "max_size", "cbs_window")
PPL = "val/perplexity"


@dataclass
class Hit:
    """Where a run crossed the target, interpolated in log-perplexity between two validations."""

    step: float
    samples: float
    wall_s: float  # since the run's first step
    worker_s: float | None = None  # held from the first step to the crossing (here)


@dataclass
class Outcome:
    """One schedule's run: its curves and where it reached the target (None: not reached)."""

    name: str
    skipped: str | None = None
    run_id: str | None = None
    ppl: list[tuple[int, float, float]] = field(default_factory=list)  # (step, ppl, seconds since first step)
    batch: list[tuple[int, int]] = field(default_factory=list)  # (first step, B) of each constant stretch
    samples: list[tuple[int, float]] = field(default_factory=list)  # (step, samples seen)
    step_times: dict[int, list[float]] = field(default_factory=dict)  # B -> measured seconds per step (W = 1)
    holds: list = field(default_factory=list)  # the run's worker holds (orchestrator/record/cost.py)
    t0: float = 0.0  # the first step's time
    steps: int = 0
    hit: Hit | None = None
    projected_s: float | None = None
    projected_worker_s: float | None = None  # sum of W x T over the replayed steps (the cluster)

    def samples_at(self, step: float) -> float:
        s, v = zip(*self.samples)
        return float(np.interp(step, s, v))

    def batch_at(self, step: int) -> int:
        b = self.batch[0][1]
        for first, size in self.batch:
            if first <= step:
                b = size
        return b

    def worker_s_at(self, wall_s: float) -> float | None:
        """Worker-seconds the run's groups held from its first step to ``wall_s`` after it."""
        from orchestrator.record.cost import cost_of

        return cost_of(self.holds, lo=self.t0, hi=self.t0 + wall_s).worker_s if self.holds else None


def crossing(points: list[tuple[float, float, float, float]], target: float) -> tuple[float, float, float] | None:
    """The first crossing of ``target`` by ``points`` ((step, ppl, samples, wall s) of each validation,
    in order), interpolated linearly in log-perplexity between the validation before it and the first
    at or under the target: (step, samples, wall s).  A first validation already at the target is the
    crossing itself; None: never reached."""
    for k, (step, ppl, samples, wall) in enumerate(points):
        if ppl > target:
            continue
        if k == 0:
            return step, samples, wall
        s0, p0, n0, w0 = points[k - 1]
        f = (math.log(p0) - math.log(target)) / (math.log(p0) - math.log(ppl))
        return s0 + f * (step - s0), n0 + f * (samples - n0), w0 + f * (wall - w0)
    return None


def base_values(config: str) -> dict:
    import torch

    from orchestrator.config.prepare import load, load_config
    from trainers.workload.build import build_workload

    cfg = load_config(config, [])
    raw = load(config)
    torch.manual_seed(cfg.train.seed)
    work = build_workload(cfg)  # once: the data's size and the model's gradient
    return {
        # what a step's all-reduce moves: the trainable parameters in fp32
        "grad_bytes": sum(p.numel() * 4 for p in work.model.parameters() if p.requires_grad),
        "b0": cfg.optimizer.base_batch_size,
        "context": cfg.data.context,
        "raw": raw,
        "batch": cfg.batch,
        "eval_samples": cfg.train.eval_every_samples or max(1, cfg.train.eval_every) * cfg.optimizer.base_batch_size,
        "mlb": cfg.batch.max_local_batch,
        "train_size": work.num_train,
    }


def schedules(base: dict, horizon: float, factor: int) -> list[tuple[str, dict]]:
    """(name, sections replacing the config's) for every schedule: the ``batch`` section is rebuilt from
    the config's B0, ``max_local_batch`` and (adaptive policies) its noise-scale limits; ``horizon``
    (epochs): where the ramp and seesaw place their plans."""
    b0, bc = base["b0"], base["batch"]
    big = factor * b0
    cap = bc.max_size or big
    mlb = max(base["mlb"], b0)
    adaptive = {k: getattr(bc, k) for k in NOISE_KEYS if k != "max_size"} | {"max_size": cap}
    adaptive.pop("cbs_window")
    cuts = int(round(math.log2(factor)))
    milestones = [round(horizon * (i + 1) / (cuts + 1), 6) for i in range(cuts)]

    def batch(**kw) -> dict:
        return {"batch": {"size": b0, "max_local_batch": mlb, **kw}}

    return [
        ("fixed B0", batch(policy="fixed")),
        (f"fixed {factor}*B0", {"batch": {"size": big, "max_local_batch": mlb, "policy": "fixed"}}),
        ("ramp", batch(policy="ramp", ramp_to=big, ramp_epochs=round(horizon / 2, 6), round_to=b0, max_size=big)),
        (
            "cbs_warmup",
            batch(
                policy="cbs_warmup",
                cbs_window=bc.cbs_window,
                cbs_growth=2.0,
                **{k: v for k, v in adaptive.items() if k != "min_growth"},
            ),
        ),  # it doubles instead
        (
            "seesaw",
            batch(policy="seesaw", max_size=big)
            | {"schedule": {"decay": "seesaw", "milestones": milestones, "decay_factor": 0.5, "scaling_rule": "sqrt"}},
        ),
        ("noise_scale", batch(policy="noise_scale", **adaptive)),
        # goodput chooses B itself (from B0 up to the cap, by throughput x efficiency) when the batch
        # policy is fixed with room above B0; with an adaptive policy it would only choose W
        (
            "goodput",
            batch(policy="fixed", max_size=cap, round_to=b0, check_every=bc.check_every, ema=bc.ema)
            | {"scaling": {"policy": "goodput"}},
        ),
    ]


def with_sections(raw: dict, sections: dict) -> dict:
    import copy

    out = copy.deepcopy(raw)
    for name, values in sections.items():
        if name == "batch":
            out["batch"] = dict(values)  # replaced whole: the config's own policy fields would not apply
        else:
            out.setdefault(name, {}).update(values)
    return out


def history(client, run_id: str, key: str) -> list:
    return sorted(client.get_metric_history(run_id, key), key=lambda m: m.step)


def run_name(name: str) -> str:
    return "ttt-" + name.replace(" ", "-").replace("*", "x")


def stores(out: str) -> list[str]:
    """The bench's MLflow stores under ``out``: ``mlflow.db`` and those of ``--part`` runs."""
    import glob

    return [f"sqlite:///{p}" for p in sorted(glob.glob(os.path.join(os.path.abspath(out), "mlflow*.db")))]


def reused_run(uris: list[str], name: str) -> tuple[str, str, int] | None:
    """The newest FINISHED run of schedule ``name`` in the bench's stores: (store, run id, steps)."""
    from mlflow.tracking import MlflowClient

    best = None
    for uri in uris:
        client = MlflowClient(uri)
        exp = client.get_experiment_by_name("bench-time-to-target")
        if exp is None:
            continue
        found = client.search_runs(
            [exp.experiment_id],
            f"tags.`mlflow.runName` = '{run_name(name)}' and attributes.status = 'FINISHED'",
            order_by=["attributes.start_time DESC"],
            max_results=1,
        )
        if found and (best is None or found[0].info.start_time > best[1].info.start_time):
            best = (uri, found[0])
    if best is None:
        return None
    uri, run = best
    steps = max((m.step for m in MlflowClient(uri).get_metric_history(run.info.run_id, "train/loss")), default=0)
    return uri, run.info.run_id, steps


def train_to_target(raw: dict, overrides: list[str], uri: str, target: float) -> tuple[str, int, str | None]:
    """Train ``raw`` through the product's driver until a validation reaches ``target`` (the driver
    asks the run to stop: it ends within a push or so of that validation) or its ``train.epochs``
    (the cap): (MLflow run id, steps run, why it failed or None)."""
    from orchestrator.config.prepare import prepare
    from orchestrator.run.ray_env import quiet_libraries
    from orchestrator.run.runner import run_training

    quiet_libraries(False)
    cfg = prepare(raw, overrides, tracking_uri=uri)
    runner: list = []

    def on_records(records: list) -> None:
        reached = any(m.get(PPL, math.inf) <= target for _, m, *_ in records)
        if reached and runner:
            runner[0].request_stop()

    s = run_training(cfg, progress=False, on_start=runner.append, on_records=on_records)
    return s.run_id, s.steps, None if s.status == "FINISHED" else f"ended {s.status}: {s.error}"


def train_one(
    name: str, raw: dict, common: list[str], uri: str, target: float, reuse: list[str] | None = None
) -> Outcome:
    from mlflow.tracking import MlflowClient

    from orchestrator.config.prepare import ConfigError, load_config
    from orchestrator.record.history import earlier_holds

    out = Outcome(name)
    try:
        load_config(raw, common)
    except (ConfigError, ValueError, SystemExit) as e:
        if name == "goodput":
            out.skipped = "scaling.policy=goodput not available"
        else:
            out.skipped = f"config rejected: {one_line(e, None, name=False)}"
        return out
    old = reused_run(reuse, name) if reuse else None
    if reuse and old is None:
        out.skipped = "--reuse: no finished run of it in the stores"
        return out
    if old is not None:
        uri, out.run_id, out.steps = old
    else:
        overrides = [*common, f"tracking.run_name={run_name(name)}"]
        out.run_id, out.steps, failed = train_to_target(raw, overrides, uri, target)
        if failed:  # a diverged run, say: its curve up to there is still read
            print(f"{name}: {failed}", file=sys.stderr, flush=True)
    run_id = out.run_id
    c = MlflowClient(uri)
    loss = history(c, run_id, "train/loss")
    out.t0 = t0 = loss[0].timestamp / 1000 if loss else c.get_run(run_id).info.start_time / 1000
    out.ppl = [(m.step, m.value, m.timestamp / 1000 - t0) for m in history(c, run_id, PPL)]
    out.batch = [(m.step, int(m.value)) for m in history(c, run_id, "batch/global")]
    out.samples = [(0, 0.0)] + [(m.step, m.value) for m in history(c, run_id, "samples_seen")]
    for m in history(c, run_id, "throughput/samples_per_s"):
        if m.value > 0 and m.step > 10:  # the first pushes carry the group's start-up
            b = out.batch_at(m.step)
            out.step_times.setdefault(b, []).append(b / m.value)
    out.holds = list(earlier_holds(c, run_id).holds)  # none for a run recorded before the holds were saved
    hit = crossing([(s, v, out.samples_at(s), t) for s, v, t in out.ppl], target)
    if hit is not None:
        out.hit = Hit(*hit)
        out.hit.worker_s = out.worker_s_at(out.hit.wall_s)
    return out


def fit_step_time(outcomes: list[Outcome], sync_s: float):
    from trainers.policies.goodput import StepTimeModel

    model = StepTimeModel(prior_sync_s=sync_s)
    for o in outcomes:
        for b, ts in o.step_times.items():
            model.observe(b, 1, float(np.median(ts)), count=len(ts))
    return model.fit()


def project(o: Outcome, fit, local: int, sync=None) -> tuple[float, float] | None:
    """Seconds and worker-seconds to the crossing on a cluster: each step at ``W = ceil(B / local)``
    workers takes ``T(ceil(B / W), W) + sync(W)`` and costs ``W x`` that (the crossing's last step
    counted in part); ``sync``: seconds a step's synchronisation of W workers takes (None: only the
    fit's own ``gamma (W - 1)``)."""
    if o.hit is None or fit is None:
        return None
    seconds = worker_s = 0.0
    for step in range(1, math.ceil(o.hit.step) + 1):
        part = min(1.0, o.hit.step - (step - 1))
        b = o.batch_at(step)
        w = math.ceil(b / local)
        t = (fit.step_time(math.ceil(b / w), w) + (sync(w) if sync else 0.0)) * part
        seconds += t
        worker_s += w * t
    return seconds, worker_s


def check_numbers(a: argparse.Namespace) -> None:
    """One line naming the option and exit 2 for a number the bench cannot use."""
    rules = (
        ("--target", a.target, 0.0, False),
        ("--epochs", a.epochs, 0.0, False),
        ("--cap-factor", a.cap_factor, 0.0, False),
        ("--horizon-factor", a.horizon_factor, 0.0, False),
        ("--bandwidth-gbps", a.bandwidth_gbps, 0.0, False),
        ("--latency-us", a.latency_us, 0.0, True),
        ("--sync-s", 0.0 if a.sync_s is None else a.sync_s, 0.0, True),
    )
    for name, value, low, zero_ok in rules:
        if not math.isfinite(value) or value < low or (value == low and not zero_ok):
            print(f"{name}: give a finite number {'>=' if zero_ok else '>'} {low:g} (got {value})", file=sys.stderr)
            raise SystemExit(2)


def stated_step_time(text: str, sync_s: float):
    """``--step-time ALPHA,BETA`` as a step-time fit (``gamma``: ``sync_s``); exit 2 on a bad value."""
    from trainers.policies.goodput import StepTimeFit

    try:
        alpha, beta = (float(x) for x in text.split(","))
    except ValueError:
        alpha = beta = math.nan
    if not (math.isfinite(alpha) and math.isfinite(beta) and alpha >= 0 and beta >= 0 and alpha + beta > 0):
        print(f"--step-time: give two finite seconds >= 0, ALPHA,BETA (got {text!r})", file=sys.stderr)
        raise SystemExit(2)
    return StepTimeFit(alpha, beta, sync_s, points=0, fixed=("stated with --step-time",))


def break_even(o: Outcome, ref: Outcome, ratio_aim: float) -> float | None:
    """The smallest ``alpha / beta`` (a step's fixed time, in samples' compute) at which ``o``'s
    worker-seconds to the target on one worker (local batch = B, no sync) are at most ``ratio_aim``
    x ``ref``'s: ``(S_o r + N_o) <= aim (S_r r + N_r)`` with S steps and N samples to the target.
    None when either did not reach it; inf when no ratio is enough."""
    if o.hit is None or ref.hit is None:
        return None
    gap = ratio_aim * ref.hit.step - o.hit.step
    need = o.hit.samples - ratio_aim * ref.hit.samples
    if need <= 0:
        return 0.0
    return need / gap if gap > 0 else math.inf


def cluster_sync(a: argparse.Namespace, nbytes: int):
    """(seconds a step's synchronisation of W workers takes, or None with ``--sync-s``: the fit's own
    linear term; the sentence that says which)."""
    if a.sync_s is not None:
        return None, f"gamma = --sync-s {a.sync_s:g} s per extra worker"
    from bench.scale import Network, ring_allreduce_s

    net = Network("cluster", a.bandwidth_gbps * 1e9, a.latency_us * 1e-6)

    def sync(w: int) -> float:
        return ring_allreduce_s(w, nbytes, net)

    return sync, (
        f"plus a ring all-reduce of the {nbytes / 1e6:.2f} MB gradient at {a.bandwidth_gbps:g} Gb/s, "
        f"{a.latency_us:g} us a hop ({sync(2) * 1e3:.2f} ms at W = 2, {sync(64) * 1e3:.2f} ms at W = 64)"
    )


def plot(outcomes: list[Outcome], context: int, target: float, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    fig, axes = plt.subplots(1, 4, figsize=(19, 4.2), sharey=True)
    for o in outcomes:
        if not o.ppl:
            continue
        s = [p[0] for p in o.ppl]
        v = [p[1] for p in o.ppl]
        axes[0].plot(s, v, label=o.name)
        axes[1].plot([o.samples_at(x) * context for x in s], v, label=o.name)
        axes[2].plot([p[2] for p in o.ppl], v, label=o.name)
        if o.holds:
            axes[3].plot([o.worker_s_at(p[2]) for p in o.ppl], v, label=o.name)
    labels = (
        "optimizer steps",
        "tokens",
        "wall s since the first step (this machine)",
        "worker-s held since the first step (this machine)",
    )
    for ax, xl in zip(axes, labels):
        ax.axhline(target, color="grey", linestyle=":", linewidth=1)
        ax.set_xlabel(xl)
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())  # the minor ticks' labels overlap
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("validation perplexity")
    axes[0].set_yscale("log")
    axes[0].legend(fontsize=8)
    fig.suptitle(f"time to validation perplexity {target:g}, one run per batch schedule")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def ratio(x: float | None, y: float | None) -> float:
    return x / y if x is not None and y else float("nan")


HEADER = (
    "schedule",
    "steps",
    "tokens",
    "wall s (here)",
    "worker-s (here)",
    "projected s (cluster)",
    "projected worker-s (cluster)",
    "final ppl",
    "max B",
    "steps run",
)


def row(o: Outcome, context: int) -> tuple:
    if o.skipped:
        return (o.name, f"skipped ({o.skipped})", *["-"] * (len(HEADER) - 2))
    final = f"{o.ppl[-1][1]:.2f}" if o.ppl else "-"
    max_b = max(b for _, b in o.batch) if o.batch else "-"
    if o.hit is None:
        return (o.name, "not reached", "-", "-", "-", "-", "-", final, max_b, o.steps)
    h = o.hit
    return (
        o.name,
        f"{h.step:.0f}",
        f"{h.samples * context:.0f}",
        f"{h.wall_s:.0f}",
        "-" if h.worker_s is None else f"{h.worker_s:.1f}",
        "-" if o.projected_s is None else f"{o.projected_s:.2f}",
        "-" if o.projected_worker_s is None else f"{o.projected_worker_s:.2f}",
        final,
        max_b,
        o.steps,
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default=os.path.join(ROOT, "configs", "lm_growing.yaml"))
    ap.add_argument("--target", type=float, default=6.0, help="validation perplexity to reach")
    ap.add_argument(
        "--epochs",
        type=float,
        default=1.0,
        help="fixed B0's cap, in epochs of samples (and every schedule's when fixed B0 did not run or reach "
        "the target)",
    )
    ap.add_argument(
        "--cap-factor",
        type=float,
        default=4.0,
        help="the other schedules' cap: this x fixed B0's samples to the target",
    )
    ap.add_argument(
        "--horizon-factor",
        type=float,
        default=1.0,
        help="the ramp's and seesaw's horizon: this x fixed B0's samples to the target",
    )
    ap.add_argument(
        "--eval-samples",
        type=int,
        default=0,
        help="validate every N samples, every schedule (default: the config's train.eval_every_samples, "
        "else train.eval_every x B0)",
    )
    ap.add_argument("--factor", type=int, default=8, help="the large fixed batch and the growth cap, x B0")
    ap.add_argument("--only", default="", help="comma-separated schedule names to run (default: all)")
    ap.add_argument(
        "--sync-s",
        type=float,
        default=None,
        help="Pollux's linear sync term instead of the ring all-reduce: gamma, seconds per extra worker of a step",
    )
    ap.add_argument(
        "--bandwidth-gbps", type=float, default=100.0, help="the cluster's link, Gb/s (the ring all-reduce's)"
    )
    ap.add_argument("--latency-us", type=float, default=5.0, help="the cluster's latency per ring hop, us")
    ap.add_argument(
        "--step-time",
        default="",
        metavar="ALPHA,BETA",
        help="project on a stated device instead of the fit to this machine's steps: T(b) = ALPHA + BETA x b s",
    )
    ap.add_argument(
        "--cluster-local-batch",
        type=int,
        default=0,
        help="largest local batch a cluster worker runs (default: B0: B grows by adding workers)",
    )
    ap.add_argument("--out", default=os.path.join(ROOT, "bench_out", "time_to_target"))
    ap.add_argument(
        "--reuse",
        action="store_true",
        help="report from the newest finished run of each schedule in --out's store (no training; "
        "a looser --target is read off the same curves)",
    )
    ap.add_argument(
        "--part",
        default="",
        help="train into mlflow-PART.db under --out (several bench processes side by side, each with "
        "--only; then one --reuse reports them all)",
    )
    ap.add_argument("--set", dest="sets", action="append", default=[], help="more --set items for every run")
    a = parse_args(
        ap,
        quick={
            "config": os.path.join(ROOT, "configs", "lm_adaptive.yaml"),
            "epochs": 0.02,
            "target": 30.0,
            "only": "fixed B0,noise_scale,goodput",
            "out": os.path.join(ROOT, "bench_out", "time_to_target_quick"),
        },
        argv=argv,
    )
    check_numbers(a)  # before any run: a bad value must not cost an hour of training first
    stated = stated_step_time(a.step_time, a.sync_s or 0.0) if a.step_time else None
    os.environ["ELASTIC_KEEP_RAY"] = "1"
    os.makedirs(a.out, exist_ok=True)
    uri = f"sqlite:///{os.path.abspath(a.out)}/mlflow{'-' + a.part if a.part else ''}.db"
    base = base_values(a.config)
    b0, context, size = base["b0"], base["context"], base["train_size"]
    eval_samples = a.eval_samples or base["eval_samples"]
    local = a.cluster_local_batch or b0
    runs_dir = os.path.join(scratch_dir("elastic-ttt-"), "ray_runs")
    common = [
        f"checkpoint.storage_path={runs_dir}",
        "checkpoint.every_steps=0",
        "tracking.experiment=bench-time-to-target",
        "train.eval_every=0",
        f"train.eval_every_samples={eval_samples}",
        *a.sets,
    ]
    wanted = [s.strip() for s in a.only.split(",") if s.strip()]
    outcomes: list[Outcome] = []
    t_bench = time.time()
    cap, cap_note = a.epochs, f"--epochs {a.epochs:g} (fixed B0 not run or not at the target)"
    horizon = cap
    for k, (name, _) in enumerate(schedules(base, horizon, a.factor)):
        if wanted and name not in wanted:
            continue
        sections = schedules(base, horizon, a.factor)[k][1]  # the horizon as it stands now
        epochs = a.epochs if name == "fixed B0" else cap
        o = train_one(
            name,
            with_sections(base["raw"], sections),
            [f"train.epochs={epochs:.6g}", *common],
            uri,
            a.target,
            stores(a.out) if a.reuse else None,
        )
        outcomes.append(o)
        if name == "fixed B0" and o.hit is not None:
            cap = round(a.cap_factor * o.hit.samples / size, 6)
            cap_note = f"{a.cap_factor:g} x fixed B0's {o.hit.samples:.0f} samples to the target"
            horizon = round(a.horizon_factor * o.hit.samples / size, 6)
        reached = f"target at step {o.hit.step:.0f}" if o.hit else "target not reached"
        print(
            f"{name}: " + (f"skipped ({o.skipped})" if o.skipped else f"{o.steps} steps, {reached}"),
            file=sys.stderr,
            flush=True,
        )
    fit = stated or fit_step_time([o for o in outcomes if not o.skipped], a.sync_s or 0.0)
    sync, sync_note = cluster_sync(a, base["grad_bytes"])
    for o in outcomes:
        o.projected_s, o.projected_worker_s = project(o, fit, local, sync) or (None, None)
    rows = [row(o, context) for o in outcomes]
    print(
        f"{os.path.relpath(a.config, ROOT)}: B0={b0} sequences of {context} tokens; target val perplexity "
        f"{a.target:g}, read between validations every {eval_samples} samples; cap {cap:g} epoch "
        f"({cap * size:.0f} samples: {cap_note}); ramp's and seesaw's horizon {horizon:g} epoch "
        f"({horizon * size:.0f} samples); seed and data order the same for all"
    )
    print(table(rows, HEADER))
    print(
        f"projection: {fit.describe() if fit else 'no step times'}; each step on W = ceil(B / {local}) "
        f"workers of local batch ceil(B / W), {sync_note} (every run here had W = 1), W x that worker-seconds "
        "a step; worker-s (here): what the run's groups held from its first step to the target"
    )
    by = {o.name: o for o in outcomes}
    fixed, ns, gp = by.get("fixed B0"), by.get("noise_scale"), by.get("goodput")

    def at(o: Outcome | None, what: str) -> float | None:
        if o is None or o.hit is None:
            return None
        return {
            "steps": o.hit.step,
            "tokens": o.hit.samples * context,
            "projected_s": o.projected_s,
            "projected_worker_s": o.projected_worker_s,
        }[what]

    if fixed is not None and ns is not None and fit is not None:
        r = break_even(ns, fixed, 0.8)
        here = fit.alpha / max(fit.beta, 1e-12)
        if r is not None:
            when = f"when alpha / beta >= {r:.2f} samples" if math.isfinite(r) else "at no alpha / beta"
            print(
                f"cost: noise_scale's worker-seconds to the target on one worker (local batch = B) are <= 0.8x fixed "
                f"B0's {when} (this step-time model: {here:.2f})"
            )
    others = [o.projected_s for o in outcomes if o.name != "goodput" and o.projected_s is not None]
    steps_ratio = ratio(at(ns, "steps"), at(fixed, "steps"))
    tokens_ratio = ratio(at(ns, "tokens"), at(fixed, "tokens"))
    goodput_ratio = ratio(at(gp, "projected_s"), min(others) if others else None)
    cost_ratio = ratio(at(ns, "projected_worker_s"), at(fixed, "projected_worker_s"))
    if gp is not None and gp.skipped:
        print(f"goodput: skipped ({gp.skipped})")

    png = os.path.join(a.out, "time_to_target.png")
    plot(outcomes, context, a.target, png)
    import mlflow

    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment("bench-time-to-target")
    with mlflow.start_run(run_name="time_to_target"):
        mlflow.log_params(
            {
                "config": os.path.relpath(a.config, ROOT),
                "target": a.target,
                "epochs": a.epochs,
                "cap_epochs": cap,
                "horizon_epochs": horizon,
                "eval_every_samples": eval_samples,
                "b0": b0,
                "cluster_local_batch": local,
                "sync_s": a.sync_s if a.sync_s is not None else "ring",
                "bandwidth_gbps": a.bandwidth_gbps,
                "latency_us": a.latency_us,
            }
        )
        for key, value in (
            ("steps_ratio", steps_ratio),
            ("tokens_ratio", tokens_ratio),
            ("goodput_wall_ratio", goodput_ratio),
            ("cost_ratio", cost_ratio),
            ("bench_wall_s", time.time() - t_bench),
        ):
            if math.isfinite(value):
                mlflow.log_metric(key, value)
        mlflow.log_artifact(png, "plots")
        mlflow.log_text(table(rows, HEADER), "time_to_target.txt")
    print(f"plot: {os.path.relpath(png, ROOT)} (and in MLflow {uri}, experiment bench-time-to-target)")
    print(
        f"steps_ratio={steps_ratio:.3f} tokens_ratio={tokens_ratio:.3f} goodput_wall_ratio={goodput_ratio:.3f} "
        f"cost_ratio={cost_ratio:.3f}"
    )


if __name__ == "__main__":
    main()
