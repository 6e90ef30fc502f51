"""``plan``: preview a config's schedule without training.

It steps the same batch plan the workers step (:class:`trainers.policies.plan.BatchPlan`:
the data order's global batches over ``num_train`` samples per epoch, the short last batch
included, and the policy set's LR schedule, MF rule, batch policy, worker count and
accumulation steps), so for everything decided ahead of time the preview *is* the run.
What only the run can decide (an ``auto`` warmup's end, a noise-scale or norm-test batch,
AdaScale's gain) is named in ``notes`` and shown at its planned/initial value.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field

import matplotlib
import matplotlib.pyplot as plt

from orchestrator.config.schema import RootConfig
from trainers.combine.combinations import METHODS
from trainers.policies.plan import BatchPlan
from trainers.workload.build import train_size

COLUMNS = ["step", "epoch", "lr", "mf", "batch_global", "workers", "batch_local", "accum_steps", "batch_samples"]
WD_COLUMN = "weight_decay"  # added when optimizer.wd_rule sets the weight decay per step


@dataclass
class Plan:
    rows: list[dict[str, float]]
    notes: list[str] = field(default_factory=list)
    total_steps: int = 0


def goodput_note(cfg: RootConfig) -> str:
    """What ``scaling.policy: goodput`` decides at run time, and within which bounds: nothing of it can
    be planned, since it depends on measured step times and the measured noise scale."""
    s, b = cfg.scaling, cfg.batch
    chooses_b = b.policy == "fixed" and b.max_size is not None and b.max_size > b.size
    batch = (
        f"and B in {b.size}..{b.max_size} (multiples of {b.round_to})"
        if chooses_b
        else f"at the B of batch.policy '{b.policy}'"
        + (" (set batch.max_size above batch.size to let goodput grow B)" if b.policy == "fixed" else "")
    )
    pays = (
        "when the time it saves over the remaining samples is more than the resize's measured cost"
        if s.resize_when == "pays"
        else "whenever it predicts more goodput (resize_when: always)"
    )
    return (
        f"workers: scaling.policy 'goodput' chooses W in {s.min_workers}..{s.max_workers} {batch} online, "
        f"every {b.check_every} steps (batch.check_every), from the step times measured per local batch and "
        f"W and the measured noise scale B_noise (Pollux's goodput), growing or shrinking the group {pays}; "
        f"not plannable: shown are the workers the batch needs (workers_for_batch) until then"
    )


def adaptive_notes(cfg: RootConfig) -> list[str]:
    notes = []
    if cfg.schedule.warmup == "auto":
        notes.append(
            "lr: 'auto' warmup is decided at run time (Kim et al.): shown is its geometric growth "
            f"from {cfg.schedule.auto_init_lr:g} x {cfg.schedule.auto_growth:g}/step, capped at "
            f"{cfg.schedule.auto_max_lr:g}; the run stops it where the smoothed loss stops falling, "
            f"then decays ({cfg.schedule.decay})"
        )
    if cfg.schedule.scaling_rule == "adascale":
        notes.append(
            "lr: AdaScale's gain comes from the measured gradient noise scale at run time; shown without it (gain 1)"
        )
    if cfg.batch.policy in ("noise_scale", "norm_test", "cbs_warmup"):
        growth = (
            f"in powers of x{cfg.batch.cbs_growth:g} up to the critical batch averaged over "
            f"{cfg.batch.cbs_window} checks"
            if cfg.batch.policy == "cbs_warmup"
            else f"growth >= x{cfg.batch.min_growth:g}"
        )
        notes.append(
            f"batch: policy '{cfg.batch.policy}' grows B at run time from measured gradients "
            f"(checked every {cfg.batch.check_every} steps, {growth}, "
            f"cap {cfg.batch.max_size}); shown at its initial size, and workers with it"
        )
    if cfg.scaling.policy == "goodput":
        notes.append(goodput_note(cfg))
    if cfg.optimizer.mf_rule == "per_worker_batch":
        notes.append(
            "mf: per_worker_batch rule, recomputed when B or the worker count changes "
            "(a worker loss would change it too)"
        )
    return notes


def adversarial_note(cfg: RootConfig) -> str | None:
    """What ``train.adversarial`` adds to each step (trainers/loop/adversarial.py); None without it."""
    a = cfg.train.adversarial
    if a.method == "none":
        return None
    when = (
        "batch t+1's perturbation with the weights of step t (ConAdv, stale by one), beside batch t's "
        "weight gradient (a second CUDA stream on a GPU)"
        if a.method == "conadv"
        else "batch t's perturbation with the weights of step t, then the weight gradient (two sequential passes)"
    )
    return (
        f"adversarial: {a.method}, epsilon {a.epsilon:g}, {a.steps} signed input-gradient step(s): {when}; "
        f"the weights train on {a.clean_weight:g} x the clean + {1 - a.clean_weight:g} x the perturbed loss "
        f"({'1x' if a.clean_weight == 0 else '2x'} the samples through the model per step, "
        "plus the input-gradient pass); "
        "the LR, batch and worker columns are unchanged"
    )


def make_plan(cfg: RootConfig, every: int = 0) -> Plan:
    """Rows at step 1, every ``every`` steps (0 = none), each epoch end, each batch change and the last step."""
    plan = BatchPlan.from_config(cfg, dataset_size=train_size(cfg))
    rows: list[dict[str, float]] = []
    while not plan.done:
        change = plan.next_batch()  # nothing measured: a schedule's B, an adaptive policy's initial B
        if change:
            resize = plan.decide_workers()  # what a run's driver asks of the same WorkerCount
            if resize:
                plan.workers = resize.workers
        s = plan.step_settings()
        moved = plan.advance()  # no loss: an auto warmup grows on (its end is decided at run time)
        step = plan.state.step
        if step == 1 or moved.epoch_ended or change or plan.done or (every and step % every == 0):
            rows.append(
                {
                    "step": step,
                    "epoch": plan.epoch_float,
                    "lr": s.lr,
                    "mf": s.mf,
                    "batch_global": s.batch,
                    "workers": s.workers,
                    "batch_local": s.local,
                    "accum_steps": s.accum,
                    "batch_samples": s.samples,
                }
            )
            if s.weight_decay is not None:
                rows[-1][WD_COLUMN] = s.weight_decay
    notes = adaptive_notes(cfg)
    adversarial = adversarial_note(cfg)
    if adversarial is not None:
        notes.append(adversarial)
    combine = METHODS[cfg.combine.method].plan_note(cfg.combine, sorted({int(r["workers"]) for r in rows}))
    if combine is not None:
        notes.append(combine)
    return Plan(rows=rows, notes=notes, total_steps=plan.state.step)


def to_csv(plan: Plan) -> str:
    out = io.StringIO()
    wd = bool(plan.rows) and WD_COLUMN in plan.rows[0]
    w = csv.DictWriter(out, fieldnames=COLUMNS + ([WD_COLUMN] if wd else []), lineterminator="\n")
    w.writeheader()
    for r in plan.rows:
        w.writerow({k: (repr(float(v)) if k in ("epoch", "lr", "mf", WD_COLUMN) else int(v)) for k, v in r.items()})
    return out.getvalue()


def to_table(plan: Plan) -> str:
    wd = bool(plan.rows) and WD_COLUMN in plan.rows[0]
    header = ["step", "epoch", "lr", "mf", "B", "W", "b/worker", "accum", "samples"] + (["wd"] if wd else [])
    cells = [header] + [
        [
            f"{int(r['step'])}",
            f"{r['epoch']:.3f}",
            f"{r['lr']:.5g}",
            f"{r['mf']:.4f}",
            f"{int(r['batch_global'])}",
            f"{int(r['workers'])}",
            f"{int(r['batch_local'])}",
            f"{int(r['accum_steps'])}",
            f"{int(r['batch_samples'])}",
        ]
        + ([f"{r[WD_COLUMN]:.5g}"] if wd else [])
        for r in plan.rows
    ]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.append(f"{plan.total_steps} optimizer steps in all")
    lines += [f"note: {n}" for n in plan.notes]
    return "\n".join(lines)


def plot(plan: Plan, path: str) -> None:

    matplotlib.use("Agg")

    steps = [r["step"] for r in plan.rows]
    fig, (ax1, ax3) = plt.subplots(2, 1, figsize=(8, 5), sharex=True)
    ax1.plot(steps, [r["lr"] for r in plan.rows], color="tab:blue")
    ax1.set_ylabel("lr", color="tab:blue")
    ax2 = ax1.twinx()
    ax2.plot(steps, [r["mf"] for r in plan.rows], color="tab:orange")
    ax2.set_ylabel("mf", color="tab:orange")
    ax3.step(steps, [r["batch_global"] for r in plan.rows], where="post", label="global batch B")
    ax3.set_ylabel("B")
    ax4 = ax3.twinx()
    ax4.step(steps, [r["workers"] for r in plan.rows], where="post", color="tab:green")
    ax4.set_ylabel("workers", color="tab:green")
    ax3.set_xlabel("optimizer step")
    ax1.set_title("schedule preview" + (" (parts decided at run time: see notes)" if plan.notes else ""))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
