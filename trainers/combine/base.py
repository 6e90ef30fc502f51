"""The combination protocol: what the worker loop and the driver's config check ask of a
``combine.method``.

Each method is one class deriving from :class:`Combination` (``trainers/combine/combinations.py``),
chosen once from the config by name (``combinations.METHODS``).  The loop
(``trainers/loop/learner.py``, ``trainers/loop/trainer.py``) holds the chosen one and calls the
hooks below, in the order a step meets them; it never asks which method is in force.  The driver's
config check (``orchestrator/config/rules.py``) calls the chosen class's :meth:`Combination.check_fields`
and :meth:`Combination.check`, which raise ``ValueError`` with one line ``field: problem; fix``
(the driver turns it into its ``ConfigError``, as it does ``trainers.accel.precision.check_precision``'s).
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from trainers.combine.methods import CombineConfig
from trainers.policies.batching import BatchConfig, BatchStats

__all__ = ["Combination", "OtherSettings"]


@dataclass(frozen=True)
class OtherSettings:
    """The settings outside the ``combine`` section that a method is checked against."""

    scaling_rule: str  # schedule.scaling_rule
    batch_policy: str  # batch.policy
    check_every: int  # batch.check_every
    min_workers: int  # scaling.min_workers
    max_workers: int  # scaling.max_workers
    scaling_policy: str  # scaling.policy
    optimizer: str  # optimizer.name
    precision: str  # train.precision


class Combination(ABC):
    """One ``combine.method``: how the workers' work becomes one update.

    A method keeps one model on every rank unless it says otherwise, so the defaults here are
    that case's: the loss scaled by ``W / B``, checkpoints when due, nothing to add to a save, a
    validation of the model as it is, no metrics and no checkpoint component of its own."""

    #: the value of ``combine.method`` that chooses this class
    name: ClassVar[str]
    #: whether DDP wraps the model and averages the gradients in the backward (and so whether the
    #: gradient-noise probe, which hooks into DDP's all-reduce, can measure anything)
    uses_ddp: ClassVar[bool] = False
    #: the ``combine`` fields this method reads, each with the fix that says so when another
    #: method is in force (``combinations.check_section`` refuses them there)
    fields: ClassVar[dict[str, str]] = {}

    def __init__(self, cfg: CombineConfig, world: int, batch: BatchConfig | None = None) -> None:
        """``cfg``: the ``combine`` section; ``world``: the group's size W; ``batch``: the ``batch``
        section (a method that decides with the batch policy reads it)."""
        self.world = world

    # -- the driver's config check ----------------------------------------------------------------

    @classmethod
    def check_fields(cls, cfg: CombineConfig) -> None:
        """Raise ``ValueError`` for a field of the ``combine`` section this method needs and lacks
        (the default: it needs none)."""
        return None

    @classmethod
    def check(cls, cfg: CombineConfig, other: OtherSettings) -> None:
        """Raise ``ValueError`` for what the rest of the config asks that this method cannot honour.

        Without DDP two requests are refused whatever the method: ``scaling.policy: goodput`` reads
        the gradient noise scale the probe measures on DDP's all-reduce; and fp16's loss scaler
        skips a step on one rank's inf/NaN gradients, which without a combined gradient need not be
        every rank's (the step would still be combined or counted toward a sync).  A method's own
        refusals (:meth:`refuse`) come between them."""
        if not cls.uses_ddp and other.scaling_policy == "goodput":
            raise ValueError(
                f"scaling.policy: goodput reads the gradient noise scale, which combine.method "
                f"{cls.name} does not measure; use combine.method: mean or scaling.policy: "
                f"workers_for_batch"
            )
        cls.refuse(cfg, other)
        if not cls.uses_ddp and other.precision == "fp16":
            raise ValueError(
                f"train.precision: fp16 cannot be used with combine.method {cls.name}; "
                "use bf16 or fp32, or combine.method: mean"
            )

    @classmethod
    def refuse(cls, cfg: CombineConfig, other: OtherSettings) -> None:
        """Raise ``ValueError`` for what this method alone cannot honour (see :meth:`check`; the
        default: nothing)."""
        return None

    @classmethod
    def plan_note(cls, cfg: CombineConfig, workers: Sequence[int]) -> str | None:
        """What ``plan`` says of this method at the worker counts ``workers`` (None: nothing)."""
        return None

    # -- the worker loop, in the order a step meets it ------------------------------------------

    @abstractmethod
    def attach(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """The model (on its device, not wrapped) and its optimizer, once both are built."""

    def loss_scale(self, batch_size: int, local_count: int) -> float:
        """The factor on each per-sample loss sum of a rank that holds ``local_count`` of the
        global batch's ``batch_size`` samples."""
        return self.world / batch_size

    @abstractmethod
    def before_step(self, local_count: int, batch_size: int) -> None:
        """Right before ``optimizer.step()``, the gradients of the step in ``.grad``."""

    @abstractmethod
    def after_step(self, step: int, local_count: int) -> None:
        """Right after ``optimizer.step()``, before ``zero_grad`` (``step``: steps done, this one included)."""

    def batch_stats(self) -> BatchStats | None:
        """What the batch policy decides with instead of the noise probe's estimate (None: the probe's)."""
        return None

    def should_checkpoint(self, due: bool, step: int) -> bool:
        """Whether to save at ``step`` when a checkpoint is ``due`` there (or not)."""
        return due

    def before_save(self, step: int, final: bool = False) -> None:
        """Before every save at ``step`` (``final``: the run's end): make the state rank 0 saves
        the whole state (the default: it is, every rank holding the same model)."""
        return None

    def evaluating(self, step: int) -> contextlib.AbstractContextManager[None]:
        """The context validation runs in at ``step``."""
        return contextlib.nullcontext()

    def metrics(self) -> dict[str, float]:
        """This method's metrics of the step (every rank calls it each step)."""
        return {}

    def states(self) -> dict[str, Any]:
        """The checkpoint components this method adds, by name."""
        return {}
