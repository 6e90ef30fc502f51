"""The policy set: the one place the training policies are combined.

A run's hyper-parameters at every optimizer step come from small pure policies, each
in its own module with its own config section:

* the LR schedule (``trainers/policies/schedules.py``): scaling rule x warmup (incl. Kim et al.'s
  ``auto`` warmup, :class:`~trainers.policies.schedules.AutoWarmup`), then decay; AdaScale's gain
  (Johnson et al. 2020) is its ``adascale`` scaling rule, fed by the noise estimator;
* the MF rule and momentum correction (``trainers/policies/optim.py``; Tang et al. 2022,
  Goyal et al. 2017 section 2.1);
* the batch policy (``trainers/policies/batching.py``): the global batch B over training;
* the worker-count policy (``trainers/policies/resize.py``): the workers W a batch needs;
* the accumulation steps of a step (``trainers/data/datasets.py`` :func:`~trainers.data.order.accum_steps`).

:class:`PolicySet` composes them, and nothing else does.  It is stateless about *where* a
run is: the batch plan (``trainers/policies/plan.py`` :class:`~trainers.policies.plan.BatchPlan`)
holds the step, epoch, cursor, B and W and asks the set before every optimizer step, in the
worker loop (``trainers/loop/trainer.py``) and in ``plan`` (``orchestrator/preview.py``) alike, so
the preview is what a run does by construction.  For one step starting after ``e``
(fractional) epochs at global batch ``B`` on ``W`` workers, :meth:`PolicySet.settings` gives::

    lr     = Schedule.lr(e, B, auto, noise)          eta0 * s(B/B0) through warmup and decay
    mf     = mf_for(optimizer, B / W)                 the MF rule at the per-worker batch
    local  = ceil(B / W)                              rank 0's slice of B (also in a short last batch)
    accum  = max(1, ceil(local / max_local_batch))    micro-batches on rank 0

and :meth:`PolicySet.decide_batch` and ``workers`` (:class:`~trainers.policies.resize.WorkerCount`)
give the batch and worker-count decisions (``trainers/policies/decisions.py``).  What only a run
can measure (the gradient-noise estimates that drive AdaScale and the adaptive batch policies,
the loss that ends an ``auto`` warmup) comes in as an argument; ``plan`` passes nothing and
shows the planned values.

Stateful parts (the batch policy's bookkeeping and the auto warmup's loss history)
checkpoint with the batch plan that holds the set (``BatchPlan.components``), plain types
only (``torch.load(weights_only=True)``).  No Ray, no MLflow: unit-tested in milliseconds.
See ``docs/architecture.md`` for where the set sits in a run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch

from trainers.data.order import accum_steps, slice_bounds
from trainers.policies.batching import BatchConfig, BatchPolicy, BatchStats, build_batch_policy
from trainers.policies.decisions import BatchDecision, NoopDecision
from trainers.policies.noise import GradientNoiseScale
from trainers.policies.optim import (
    OptimizerConfig,
    apply_momentum_correction,
    mf_for,
    set_lr,
    set_mf,
    set_weight_decay,
    weight_decay_for,
)
from trainers.policies.resize import WorkerCount, build_resize_policy
from trainers.policies.schedules import AutoDecision, AutoWarmup, Schedule, ScheduleConfig

__all__ = ["PolicySet", "StepSettings"]


@dataclass(frozen=True)
class StepSettings:
    """What one optimizer step runs with.

    ``batch`` is the global batch B in force (the policies' B), ``samples`` the samples
    this step actually takes (fewer than B for an epoch's short last batch); ``local`` and
    ``accum`` are rank 0's share of B and its micro-batches (they describe the policy's batch,
    not the short tail); ``workers`` is W.  ``weight_decay`` is set only by a weight-decay rule
    (``optimizer.wd_rule``; None: the optimizer keeps its own).
    """

    lr: float
    mf: float
    batch: int
    workers: int
    samples: int
    local: int
    accum: int
    weight_decay: float | None = None


class _LoopSections(Protocol):
    """The config sections the policies read (``LoopConfig`` and the root config have them)."""

    schedule: ScheduleConfig
    optimizer: OptimizerConfig
    batch: BatchConfig
    train: Any


class PolicySet:
    """Scaling rule, warmup, decay, MF rule, momentum correction, batch and worker-count policy: composed.

    ``dataset_size`` (training samples per epoch) caps the batch; ``min_workers`` and
    ``max_workers`` bound the worker count (the ``scaling`` section; 1 and 1 on a worker
    that never decides a resize itself); ``resize_policy`` names the worker-count policy;
    together they are ``workers``, the one :class:`~trainers.policies.resize.WorkerCount`.
    """

    def __init__(
        self,
        schedule: ScheduleConfig,
        optimizer: OptimizerConfig,
        batch: BatchConfig,
        epochs: float,
        dataset_size: int,
        min_workers: int = 1,
        max_workers: int = 1,
        resize_policy: str = "workers_for_batch",
    ):
        self.optimizer_cfg, self.batch_cfg = optimizer, batch
        self.dataset_size = int(dataset_size)
        self.epochs = float(epochs)
        self.schedule = Schedule(schedule, optimizer.lr, optimizer.base_batch_size, epochs)
        self.auto: AutoWarmup | None = self.schedule.new_auto()
        self.batch_policy: BatchPolicy = build_batch_policy(batch, dataset_size=self.dataset_size, schedule=schedule)
        self.workers = WorkerCount(
            build_resize_policy(resize_policy), batch.max_local_batch, int(min_workers), int(max_workers)
        )

    @classmethod
    def from_config(cls, cfg: _LoopSections, dataset_size: int) -> PolicySet:
        """From a config with ``schedule``, ``optimizer``, ``batch``, ``train`` and, on the
        driver, ``scaling`` (its worker bounds; without it 1..1)."""
        workers = WorkerCount.from_config(cfg)
        return cls(
            cfg.schedule,
            cfg.optimizer,
            cfg.batch,
            cfg.train.epochs,
            dataset_size,
            min_workers=workers.min_workers,
            max_workers=workers.max_workers,
            resize_policy=workers.policy.name,
        )

    # -- what the policies need measured -------------------------------------------------------

    @property
    def adapts_batch(self) -> bool:
        """Whether B can change during training (any batch policy but ``fixed``)."""
        return self.batch_policy.name != "fixed"

    # -- the settings of one step ----------------------------------------------------------------

    def lr(self, epoch: float, batch_size: int, noise: GradientNoiseScale | None = None) -> float:
        """The LR of the step taken after ``epoch`` epochs at global batch B (``Schedule.lr``),
        with AdaScale's noise signal when ``noise`` has an estimate."""
        signal = noise.adascale_signal(self.optimizer_cfg.base_batch_size) if noise is not None else None
        return self.schedule.lr(epoch, batch_size, self.auto, signal)

    def mf(self, batch_size: int, workers: int) -> float:
        """The MF at per-worker batch ``B / W`` (``mf_for``)."""
        return mf_for(self.optimizer_cfg, batch_size / workers)

    def settings(
        self,
        epoch: float,
        batch_size: int,
        workers: int,
        noise: GradientNoiseScale | None = None,
        samples: int | None = None,
    ) -> StepSettings:
        """Everything a step at ``epoch`` with global batch B on W workers runs with (see the module
        docstring); ``samples`` is the step's sample count (default B)."""
        n = batch_size if samples is None else samples
        lo, hi = slice_bounds(batch_size, 0, workers)
        return StepSettings(
            lr=self.lr(epoch, batch_size, noise),
            mf=self.mf(batch_size, workers),
            batch=batch_size,
            workers=workers,
            samples=n,
            local=hi - lo,
            accum=accum_steps(batch_size, workers, self.batch_cfg.max_local_batch),
            weight_decay=None
            if self.optimizer_cfg.wd_rule == "none"
            else weight_decay_for(self.optimizer_cfg, batch_size, self.schedule.scale(batch_size)),
        )

    @staticmethod
    def apply(opt: torch.optim.Optimizer, settings: StepSettings, first: bool) -> None:
        """Set the step's LR and MF on ``opt``; unless it is the run's first step, rescale the
        velocity of an optimizer that keeps the LR inside it by ``new_lr / old_lr`` first
        (Goyal et al. 2017 section 2.1, :func:`~trainers.policies.optim.apply_momentum_correction`)."""
        if not first:
            apply_momentum_correction(opt, opt.param_groups[0]["lr"], settings.lr)
        set_lr(opt, settings.lr)
        set_mf(opt, settings.mf)
        if settings.weight_decay is not None:
            set_weight_decay(opt, settings.weight_decay)

    # -- decisions -------------------------------------------------------------------------------

    def batch_stats(self, batch_size: int, noise: GradientNoiseScale | None) -> BatchStats:
        """What the batch policy reads from the noise estimator: ``B_simple`` and, for the
        ``norm_test`` policy, the batch the (smoothed) norm test suggests at B."""
        if noise is None:
            return BatchStats(b_simple=None, norm_test=None)
        suggested = None
        if "norm_test" in self.batch_policy.needs:
            r = noise.norm_test(batch_size, self.batch_cfg.norm_test_eta)
            suggested = r.suggested if r else None
        return BatchStats(b_simple=noise.b_simple, norm_test=suggested)

    def decide_batch(
        self,
        step: int,
        epoch: float,
        batch_size: int,
        noise: GradientNoiseScale | None = None,
        stats: BatchStats | None = None,
    ) -> BatchDecision | NoopDecision:
        """The batch policy's answer for the step about to run (``step`` steps taken, starting
        at ``epoch``, B in force now), from ``noise``'s statistics or, where given, ``stats``
        measured elsewhere (local SGD's own norm test)."""
        return self.batch_policy.decide(
            step, epoch, batch_size, self.batch_stats(batch_size, noise) if stats is None else stats
        )

    # -- the auto warmup's hooks -------------------------------------------------------------------

    def after_step(self, lr: float, loss: float | None) -> None:
        """Feed the auto warmup the LR the step used and its rank-averaged loss (``None`` in a
        preview: the warmup's LR grows as long as nothing ends it)."""
        if self.auto is not None:
            self.auto.record(lr, loss)

    def at_epoch_end(self, epoch: float, batch_size: int) -> AutoDecision | None:
        """Let a running auto warmup check whether the loss stopped falling; None when there is
        no running auto warmup."""
        if self.auto is None or self.auto.done:
            return None
        return self.auto.check(epoch, batch_size)
