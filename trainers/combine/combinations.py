"""One class per ``combine.method`` behind the protocol of ``trainers/combine/base.py``, and the
registry that chooses one from the config (:data:`METHODS`, :func:`build_combination`).

Each class says what its method does around the optimizer step; what it refuses in a config comes
from its rules class (``trainers/combine/config.py``), which it derives from.  The math and state it
drives are in ``trainers/combine/methods.py`` (Adasum, local SGD) and
``trainers/combine/decentral.py`` (DmSGD, DecentLaM).  Every optimizer works with mean, Adasum
(which combines gradients) and local SGD (which averages any per-parameter optimizer state).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import torch

from trainers.combine.base import Combination
from trainers.combine.config import (
    AdasumRules,
    CombineConfig,
    DecentLaMRules,
    DecentralizedRules,
    DmSGDRules,
    LocalSGDRules,
    MeanRules,
)
from trainers.combine.decentral import Decentralized, neighbour_offsets
from trainers.combine.methods import AdasumCombiner, LocalSGD
from trainers.link import metrics as M
from trainers.policies.batching import BatchConfig, BatchStats

__all__ = [
    "METHODS",
    "AdasumCombination",
    "DecentLaMCombination",
    "DecentralizedCombination",
    "DmSGDCombination",
    "LocalSGDCombination",
    "MeanCombination",
    "build_combination",
]


class MeanCombination(MeanRules, Combination):
    """``mean``: DDP's all-reduce average of the gradients, during the backward; with the loss
    scaled by ``W / B`` it is exactly the global batch's mean gradient (``trainers/loop/learner.py``).
    Every hook is the protocol's default or nothing, and nothing in the rest of the config is refused."""

    def attach(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Nothing to hold: DDP wraps the model."""

    def before_step(self, local_count: int, batch_size: int) -> None:
        """Nothing: DDP combined the gradients in the backward."""

    def after_step(self, step: int, local_count: int) -> None:
        """Nothing: every rank stepped on the same gradient."""


class AdasumCombination(AdasumRules, Combination):
    """``adasum``: no DDP (every micro-batch's gradient stays local); the loss keeps the ``W / B``
    scale; :meth:`before_step` replaces ``.grad`` by the Adasum of the workers' mean gradients and
    broadcasts rank 0's buffers (:class:`~trainers.combine.methods.AdasumCombiner`), so every rank
    steps identically and rank 0's checkpoint is every rank's."""

    def __init__(self, cfg: CombineConfig, world: int, batch: BatchConfig | None = None) -> None:
        super().__init__(cfg, world, batch)
        self.combiner: AdasumCombiner | None = None

    def attach(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.combiner = AdasumCombiner(model.parameters(), buffers=model.buffers())

    def before_step(self, local_count: int, batch_size: int) -> None:
        """Adasum's collective: ``.grad`` becomes the Adasum of the workers' mean gradients."""
        assert self.combiner is not None, "AdasumCombination needs the model (attach)"
        self.combiner.combine(local_count=local_count, loss_scale=self.loss_scale(batch_size, local_count))

    def after_step(self, step: int, local_count: int) -> None:
        """Nothing: every rank stepped on the same combined gradient."""


class LocalSGDCombination(LocalSGDRules, Combination):
    """``local_sgd``: no DDP; each worker's loss is scaled by ``1 / b_i`` (its own mean gradient);
    :meth:`after_step` averages the models every H steps (:class:`~trainers.combine.methods.LocalSGD`),
    running the local norm test on ``batch.check_every`` steps when ``batch.policy: norm_test``,
    whose answer the batch policy reads (:meth:`batch_stats`).  Checkpoints are deferred to sync
    steps (:meth:`should_checkpoint`), and a save at any other step (the run's end, a resize's
    hand-over) first syncs (:meth:`before_save`).  Validation between syncs scores the average model."""

    def __init__(self, cfg: CombineConfig, world: int, batch: BatchConfig | None = None) -> None:
        super().__init__(cfg, world, batch)
        batch = batch if batch is not None else BatchConfig()
        self.local_sgd = LocalSGD(cfg, norm_test_eta=batch.norm_test_eta if batch.policy == "norm_test" else None)
        self.check_every = batch.check_every
        self.model: torch.nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None

    def attach(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model, self.optimizer = model, optimizer

    def _model_and_optimizer(self) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        assert self.model is not None and self.optimizer is not None, "LocalSGDCombination needs the model (attach)"
        return self.model, self.optimizer

    def loss_scale(self, batch_size: int, local_count: int) -> float:
        """``1 / b_i``: each worker steps on its own mean gradient."""
        return 1.0 / max(1, local_count)

    def before_step(self, local_count: int, batch_size: int) -> None:
        """Nothing: each worker steps on its own gradient."""

    def after_step(self, step: int, local_count: int) -> None:
        """The models averaged when a sync is due (with the local norm test on a check step)."""
        if not self.local_sgd.should_sync(step):
            return
        model, optimizer = self._model_and_optimizer()
        self.local_sgd.sync(model, optimizer, step, local_count=local_count, norm_test=step % self.check_every == 0)

    def batch_stats(self) -> BatchStats | None:
        """The local norm test of the last sync."""
        return BatchStats(b_simple=None, norm_test=self.local_sgd.suggested)

    def should_checkpoint(self, due: bool, step: int) -> bool:
        """At sync steps only: one that falls due between syncs is taken at the next."""
        return self.local_sgd.checkpoint_now(due, step)

    def before_save(self, step: int, final: bool = False) -> None:
        """A sync when the last one was not at ``step`` (the run's end, a resize); else the
        per-worker optimizer state averaged, where syncs leave it apart."""
        model, optimizer = self._model_and_optimizer()
        if self.local_sgd.last_sync_step != step:
            self.local_sgd.sync(model, optimizer, step, checkpoint=True, norm_test=False)
        elif not self.local_sgd.average_momentum:
            self.local_sgd.average_optimizer_state(model, optimizer)

    def evaluating(self, step: int) -> contextlib.AbstractContextManager[None]:
        """The workers' average model, between syncs."""
        model, _ = self._model_and_optimizer()
        return self.local_sgd.averaged(model, step)

    def metrics(self) -> dict[str, float]:
        return self.local_sgd.metrics()

    def states(self) -> dict[str, Any]:
        """``combine``: the syncs, the byte counts and the last norm test's answer."""
        return {"combine": self.local_sgd}


class DecentralizedCombination(DecentralizedRules, Combination):
    """DmSGD and DecentLaM (``trainers/combine/decentral.py``): no DDP; the loss keeps the ``W / B``
    scale; each worker keeps its own parameters and exchanges them with its graph neighbours every
    step (:class:`~trainers.combine.decentral.Decentralized`), where the subclass says.
    :meth:`before_save` gathers every rank's state for rank 0's checkpoint; validation scores the
    average model; :meth:`metrics` adds the bytes per step and the consensus distance."""

    def __init__(self, cfg: CombineConfig, world: int, batch: BatchConfig | None = None) -> None:
        super().__init__(cfg, world, batch)
        self.exchange = Decentralized(self.name, cfg.graph, world)

    @classmethod
    def plan_note(cls, cfg: CombineConfig, workers: Sequence[int]) -> str | None:
        """The graph each W forms, and what a worker sends per step against an all-reduce."""
        graphs = "; ".join(
            f"W={w}: neighbours i+-{{{','.join(str(d) for d in neighbour_offsets(cfg.graph, w))}}}, "
            f"{len(neighbour_offsets(cfg.graph, w))} x P values sent per step vs {2 * (w - 1) / w:.2g} x P "
            "for an all-reduce"
            for w in workers
            if w >= 2
        )
        return (
            f"combine: {cls.name} on the {cfg.graph} graph, each worker its own parameters mixed with its "
            f"neighbours' every step (weights 1/(neighbours+1)); {graphs}; the result depends on W, and a resize "
            "restarts every worker from the workers' average"
        )

    def attach(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """The exchange reads the model, and the optimizer's LR and momentum."""
        self.exchange.model, self.exchange.optimizer = model, optimizer

    def before_save(self, step: int, final: bool = False) -> None:
        """Every rank's state gathered to rank 0 (``final``: the workers set to their average first)."""
        self.exchange.gather(final=final)

    def evaluating(self, step: int) -> contextlib.AbstractContextManager[None]:
        """The workers' average model."""
        return self.exchange.averaged()

    def metrics(self) -> dict[str, float]:
        """Collective (the consensus distance): every rank calls it each step."""
        return {
            M.COMBINE_BYTES_PER_STEP: float(self.exchange.bytes_per_step),
            M.COMBINE_ALLREDUCE_BYTES_PER_STEP: float(self.exchange.allreduce_bytes_per_step),
            M.COMBINE_BYTES_SENT: float(self.exchange.bytes_sent),
            M.COMBINE_CONSENSUS_DISTANCE: self.exchange.consensus(),
        }

    def states(self) -> dict[str, Any]:
        """``combine``: every rank's parameters, momentum and buffers, and the counters."""
        return {"combine": self.exchange}


class DmSGDCombination(DmSGDRules, DecentralizedCombination):
    """``dmsgd``: the optimizer's local step, then the stepped parameters mixed with the neighbours'."""

    def before_step(self, local_count: int, batch_size: int) -> None:
        """Nothing: the optimizer steps on this worker's own gradient."""

    def after_step(self, step: int, local_count: int) -> None:
        self.exchange.mix_parameters()


class DecentLaMCombination(DecentLaMRules, DecentralizedCombination):
    """``decentlam``: the neighbours' correction added to ``.grad``, then the optimizer's step."""

    def before_step(self, local_count: int, batch_size: int) -> None:
        self.exchange.correct_gradients()

    def after_step(self, step: int, local_count: int) -> None:
        """Nothing: the optimizer's step was the recursion."""


METHODS: dict[str, type[Combination]] = {
    method.name: method
    for method in (MeanCombination, AdasumCombination, LocalSGDCombination, DmSGDCombination, DecentLaMCombination)
}
"""Every ``combine.method`` by name (the config's ``CombineMethod`` values)."""


def build_combination(cfg: CombineConfig, world: int, batch: BatchConfig | None = None) -> Combination:
    """The chosen method's object for a group of ``world`` workers (see :class:`Combination`)."""
    return METHODS[cfg.method](cfg, world, batch)
