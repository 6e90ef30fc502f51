"""The combination protocol: what the worker loop and the driver ask of a ``combine.method``.

Each method is one class deriving from :class:`Combination` (``trainers/combine/combinations.py``),
chosen once from the config by name (``combinations.METHODS``).  The loop
(``trainers/loop/learner.py``, ``trainers/loop/trainer.py``) holds the chosen one and calls the
hooks below, in the order a step meets them; it never asks which method is in force.  The driver's
config check calls the method's rules (``trainers/combine/config.py`` :class:`MethodRules`, which
:class:`Combination` and each method's class derive from): :meth:`~MethodRules.check_fields` and
:meth:`~MethodRules.check`, which raise ``ValueError`` with one line ``field: problem; fix``.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import torch

from trainers.combine.config import CombineConfig, MethodRules
from trainers.policies.batching import BatchConfig, BatchStats

__all__ = ["Combination"]


class Combination(MethodRules, ABC):
    """One ``combine.method``: how the workers' work becomes one update.

    A method keeps one model on every rank unless it says otherwise, so the defaults here are
    that case's: the loss scaled by ``W / B``, checkpoints when due, nothing to add to a save, a
    validation of the model as it is, no metrics and no checkpoint component of its own."""

    def __init__(self, cfg: CombineConfig, world: int, batch: BatchConfig | None = None) -> None:
        """``cfg``: the ``combine`` section; ``world``: the group's size W; ``batch``: the ``batch``
        section (a method that decides with the batch policy reads it)."""
        self.world = world

    # -- the driver's plan (its config check: MethodRules) ---------------------------------------

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
