"""The worker's config: the sections a worker needs, composed from the components' own config
classes, each kept beside its code (data, model, optimizer, batch, schedule, checkpoint, combine).

Importing this module loads the components' config classes and their validators only: not the
worker loop, not Ray.  Each section checks its own fields; what relates fields to one another
(within a section or across sections) is checked on the driver (``orchestrator/config/rules.py``).  The
driver's root config (``orchestrator/config/schema.py``) extends
:class:`LoopConfig` with its own sections; how configs flow through a run: ``docs/architecture.md``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from trainers.accel.device import CompileConfig
from trainers.accel.precision import PrecisionConfig
from trainers.combine.methods import CombineConfig
from trainers.data.datasets import DataConfig
from trainers.loop.adversarial import AdversarialConfig
from trainers.loop.checkpoint import CheckpointConfig
from trainers.policies.batching import BatchConfig
from trainers.policies.optim import OptimizerConfig
from trainers.policies.schedules import ScheduleConfig
from trainers.section import Section
from trainers.workload.models import ModelConfig


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
