"""The worker's config: the loop's own sections (``train``, ``checkpoint``) and :class:`LoopConfig`,
which composes them with the components' config classes.

The components' sections (data, model, optimizer, batch, schedule, combine) each live in a module
of their package that imports no torch, so importing this module loads config classes and their
validators only: not torch, not the worker loop, not Ray.  Each section checks its own fields; what
relates fields to one another (within a section or across sections) is checked on the driver
(``orchestrator/config/rules.py``).  The driver's root config (``orchestrator/config/schema.py``)
extends :class:`LoopConfig` with its own sections; how configs flow through a run:
``docs/architecture.md``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from trainers.accel.config import CompileConfig, PrecisionConfig
from trainers.combine.config import CombineConfig
from trainers.data.config import DataConfig
from trainers.loop.storage import location_problem
from trainers.policies.batching import BatchConfig
from trainers.policies.config import OptimizerConfig
from trainers.policies.schedules import ScheduleConfig
from trainers.section import Section
from trainers.workload.config import ModelConfig


class AdversarialConfig(Section):
    """``train.adversarial``: adversarial training against the sharp minima of large batches."""

    method: Literal["none", "sync", "conadv"] = Field(
        default="none",
        description="none; sync: perturb batch t with the current weights, then train on it (two "
        "sequential passes); conadv: perturb batch t+1 with the weights of step t, beside batch t's "
        "weight gradient (Liu et al. 2022); the weights train on a mix of the clean and perturbed "
        "losses (clean_weight)",
    )
    epsilon: float = Field(
        default=0.03, ge=0, description="L-infinity radius of the perturbation, in the model input's units"
    )
    steps: int = Field(default=1, ge=1, description="signed gradient steps of eps/steps each (1 = FGSM)")
    clean_weight: float = Field(
        default=0.5,
        ge=0,
        le=1,
        description="c in g = c grad(clean loss) + (1 - c) grad(perturbed loss); 0 trains on the perturbed batch only",
    )


class TrainConfig(PrecisionConfig, CompileConfig):
    """The ``train`` section (``precision``: trainers/accel/precision.py; ``compile``: trainers/accel/device.py)."""

    epochs: float = Field(default=5, gt=0, description="may be fractional")
    eval_every: int = Field(
        default=0, ge=0, description="validate every N steps; 0 (and eval_every_samples 0) = at each epoch end"
    )
    eval_every_samples: int = Field(
        default=0,
        ge=0,
        description="also validate at the step whose samples seen pass a multiple of N (runs whose batch "
        "grows are then read at the same resolution in samples); 0 = off",
    )
    seed: int = Field(default=0, description="the run's seed: data order and split, initial weights, augmentation")
    log_every: int = Field(default=10, gt=0, description="fewest steps between pushes of metrics to the driver")
    push_every_s: float = Field(
        default=0.25,
        ge=0,
        description="seconds between pushes (at least log_every steps apart); 0 = every log_every steps",
    )
    sample_log_dir: str | None = Field(default=None, description="debug: each rank appends the ids it trained on")
    on_nonfinite: Literal["stop", "rollback"] = Field(
        default="stop",
        description="a non-finite loss: stop the run (FAILED), or reload the last checkpoint, halve "
        "the learning rate and go on (trainers/loop/rollback.py)",
    )
    max_rollbacks: int = Field(default=3, ge=0, description="rollbacks at most (on_nonfinite: rollback); then stop")
    adversarial: AdversarialConfig = Field(
        default_factory=AdversarialConfig,
        description="adversarial training: none, sync (two passes) or conadv (trainers/loop/adversarial.py)",
    )


class CheckpointConfig(Section):
    """The ``checkpoint`` section."""

    every_steps: int = Field(default=0, ge=0, description="0 = only at epoch ends")
    background: bool = Field(
        default=True,
        description="write the periodic checkpoints beside the loop (a thread; the state is copied to host "
        "memory first, so the steps go on); false: each step waits for the write. The last checkpoint of a "
        "group (its end, a resize) is always written before the group ends",
    )
    keep: int = Field(
        default=2, description="newest checkpoints of the run kept (at least 2: the newest and one to fall back to)"
    )
    storage_path: str = Field(
        default="ray_runs",
        description="checkpoint folder, or an object-store URI such as "
        "s3://bucket/runs (on a cluster: a shared mount or a bucket)",
    )

    @field_validator("keep")
    @classmethod
    def _a_fallback(cls, v: int) -> int:
        # With keep = 1 the write of a checkpoint deletes the only older one, so a newest one that
        # turns out corrupt leaves nothing to resume from.  Keeping one more on disk is simpler and
        # cheaper to reason about than setting the last good one aside.
        if v < 2:
            raise ValueError(
                f"checkpoint.keep: {v} leaves no older checkpoint to fall back to when the newest "
                "is corrupt; set it to at least 2"
            )
        return v

    @field_validator("storage_path")
    @classmethod
    def _a_directory(cls, v: str) -> str:
        why = location_problem(v)  # the string alone; whether the bucket answers: preflight
        if why is not None:
            raise ValueError(f"checkpoint.storage_path: {why}")
        return v


class LoopConfig(Section):
    """The sections a worker needs; the orchestrator's root config extends this."""

    data: DataConfig = Field(default_factory=DataConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig)
    batch: BatchConfig = Field(default_factory=BatchConfig)
    schedule: ScheduleConfig = Field(default_factory=ScheduleConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    combine: CombineConfig = Field(default_factory=CombineConfig)


def eval_due(train: TrainConfig, step: int, samples_seen: int, trained: int, epoch_ended: bool) -> bool:
    """Whether the step just taken (``step``, ``trained`` samples of it, ``samples_seen`` after it)
    validates: every ``eval_every`` steps; at the step whose samples seen pass a multiple of
    ``eval_every_samples`` (one pass however many multiples a large batch passes); at an epoch's end
    when neither is set."""
    every, every_samples = train.eval_every, train.eval_every_samples
    if every > 0 and step % every == 0:
        return True
    if every_samples > 0 and trained > 0 and samples_seen // every_samples > (samples_seen - trained) // every_samples:
        return True
    return every == 0 and every_samples == 0 and epoch_ended
