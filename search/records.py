"""A trial's bookkeeping in the search driver, from asked to recorded.

A trial goes ``PendingTrial`` (asked, config sampled and validated, waiting for a slot) ->
``RunningTrial`` (its run on a ``TrialActor``) -> ``TrialRecord`` (finished by this invocation,
with the state told to the study).  A trial that fails on the spot (invalid config) or repeats a
completed config goes straight to a ``TrialRecord``.  ``SearchSummary`` is what ``run_search``
returns.  See ``docs/architecture.md`` (the search layer).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from orchestrator.config.schema import RootConfig
from search.capacity import Resources

if TYPE_CHECKING:
    from optuna.trial import FrozenTrial, Trial

    from search.trial import TrialResult

TrialStateName = Literal["COMPLETE", "PRUNED", "FAIL"]
"""The states the driver tells the study (Optuna's ``TrialState`` names); also MLflow tag ``search.state``."""


@dataclass
class ReportUnit:
    """Where a trial's intermediate values are reported to the pruner (Optuna's ``step``).

    Median and Hyperband pruning compare trials at equal ``step``.  At the global step, a trial with
    a batch 4x larger has seen 4x more samples at the same step, so small batches look worse and are
    pruned early.  ``by = "samples"`` (the default, space key ``report_against``) reports at the work
    done instead, in *base steps*: ``round(samples seen / B_base)`` with ``B_base`` the base config's
    global batch (for a language model ``round(tokens seen / (B_base T))``, ``T`` the tokens per
    sequence of the first trial that reported tokens), so a trial at the base batch reports at its
    global step (an epoch's short last batch aside) and a pruner's ``n_warmup_steps``/``min_resource`` keep their
    meaning for it.
    ``by = "steps"``: the global optimizer step (favours large batches: they see more samples per step)."""

    by: str = "samples"
    samples_per_step: float = 1.0
    tokens_per_step: float | None = None

    def step(self, step: int, samples: int | None, tokens: int | None) -> int:
        """Optuna's step for a value measured at global ``step`` after ``samples`` (``tokens``)."""
        if self.by == "steps" or samples is None:
            return int(step)
        if tokens is not None and self.tokens_per_step:
            return int(tokens / self.tokens_per_step + 0.5)
        return int(samples / self.samples_per_step + 0.5)


@dataclass(frozen=True)
class Pruned:
    """Where the pruner condemned a trial: the global ``step`` of the value it judged, that
    ``value`` (as the run logged it at that step) and the training samples seen by then."""

    step: int
    value: float
    samples: int | None = None


@dataclass
class PendingTrial:
    """An asked trial whose config is valid, waiting for a free slot and for the cluster to fit it."""

    trial: Trial
    values: dict[str, Any]  # the sampled values, by config path
    cfg: RootConfig  # the validated training config the trial will run
    need: Resources  # what it holds at its largest (``capacity.trial_needs``)
    key: str  # ``study.config_key(cfg)``: equal keys train the same run
    twin: int | None = None  # a running trial with the same key: wait for it, then reuse its value


@dataclass
class RunningTrial:
    """A launched trial: its actor, the ref of its run, and what the pruner has seen of it."""

    trial: Trial
    values: dict[str, Any]
    cfg: RootConfig
    need: Resources
    key: str
    actor: Any  # the ``TrialActor`` handle
    ref: Any  # the ``ObjectRef`` of ``actor.run``
    t0: float  # launch time (``time.time()``)
    run_id: str | None = None  # its MLflow run, once the actor knows it
    last_step: int = -1  # the global step of the last value relayed
    last_value: float | None = None  # the last value reported to the study
    pruned: Pruned | None = None  # where the pruner condemned it (nothing is reported after)
    reported: int = -1  # the last Optuna step reported (``ReportUnit.step``)

    @classmethod
    def launched(cls, p: PendingTrial, actor: Any, ref: Any, t0: float) -> RunningTrial:
        """The running form of pending trial ``p``, started on ``actor`` at ``t0``."""
        return cls(p.trial, p.values, p.cfg, p.need, p.key, actor, ref, t0)

    @property
    def pruned_at(self) -> int | None:
        """The global step of the value the pruner condemned the trial at (``None``: not condemned)."""
        return self.pruned.step if self.pruned is not None else None

    def report(
        self,
        values: Sequence[tuple[Any, ...]],
        unit: ReportUnit | None = None,
        should_prune: Callable[[], bool] | None = None,
    ) -> bool:
        """Report the objective's new ``(step, metric, value[, samples, tokens])`` to the study
        (``trial.report``) at ``unit.step(...)`` (the global step without a unit); global steps at
        or before ``last_step`` were relayed already and are skipped, and of several values that
        fall on one Optuna step the first is reported (Optuna keeps one per step).

        With ``should_prune`` (the trial's ``should_prune``), the pruner judges each reported
        value: once it condemns one, the trial is ``pruned`` at that value's step and nothing after
        it is reported (Optuna's value for a PRUNED trial is its last intermediate value).
        Returns whether the trial is condemned."""
        unit = unit or ReportUnit(by="steps")
        for step, _key, value, *work in values:
            if step <= self.last_step:
                continue
            self.last_step = step
            if self.pruned is not None:
                continue  # relayed after the verdict: the trial stops, nothing more reaches the study
            samples, tokens = (work + [None, None])[:2]
            at = unit.step(int(step), samples, tokens)
            if at <= self.reported:
                continue
            self.trial.report(float(value), at)
            self.reported, self.last_value = at, float(value)
            if should_prune is not None and should_prune():
                self.pruned = Pruned(int(step), float(value), None if samples is None else int(samples))
        return self.pruned is not None

    def outcome(self, res: TrialResult, metrics: Sequence[str]) -> TrialOutcome:
        """The trial's final state from its run's result, in this order: the run raised -> FAIL;
        condemned by the pruner and stopped before its planned end -> PRUNED (value: the one it
        was judged at); an objective missing or not finite, or the run not FINISHED -> FAIL; else
        COMPLETE with the objectives' values.  A run that reached its planned end before the stop
        reached it is judged on its result, never PRUNED."""
        if res.error is not None:
            return TrialOutcome("FAIL", None, res.error)
        if self.pruned is not None and res.stopped:
            v = self.pruned.value
            return TrialOutcome("PRUNED", [v] if math.isfinite(v) else None, None)
        figures = [res.figure(m) for m in metrics]
        missing = [m for m, v in zip(metrics, figures) if v is None]
        bad = [m for m, v in zip(metrics, figures) if v is not None and not math.isfinite(v)]
        if missing:
            return TrialOutcome(
                "FAIL",
                None,
                f"objective {missing[0]} was never reported by the run; check train.eval_every / the metric name",
            )
        if bad:
            return TrialOutcome("FAIL", None, f"objective {bad[0]} is not finite (the run diverged)")
        if res.status != "FINISHED":
            return TrialOutcome("FAIL", None, f"the run ended {res.status}")
        return TrialOutcome("COMPLETE", [float(v) for v in figures if v is not None], None)


@dataclass(frozen=True)
class TrialOutcome:
    """How a run ended, as the study and MLflow are told: ``values`` are the objectives' values
    (COMPLETE) or the last intermediate value (PRUNED), ``error`` one line (FAIL)."""

    state: TrialStateName
    values: list[float] | None
    error: str | None


@dataclass
class TrialRecord:
    """A trial finished by this invocation."""

    number: int
    state: TrialStateName
    values: list[float] | None
    params: dict[str, Any]
    steps: int = 0
    samples: int = 0
    wall_s: float = 0.0
    worker_seconds: float = 0.0
    error: str | None = None
    run_id: str | None = None
    pruned_at: int | None = None  # PRUNED: the global step of the value it was judged at
    pruned_samples: int | None = None  # PRUNED: training samples seen at that step
    duplicate_of: int | None = None


@dataclass
class SearchSummary:
    """What one ``run`` invocation did: its records, the study's size and best trials afterwards."""

    study_name: str
    storage: str
    parent_run_id: str
    tracking_uri: str
    experiment_id: str
    records: list[TrialRecord]
    trials_in_study: int
    best: list[FrozenTrial]
    wall_s: float
    objectives: list[str] = field(default_factory=list)

    def count(self, state: TrialStateName) -> int:
        """Trials of this invocation that ended in ``state``."""
        return sum(r.state == state for r in self.records)

    @property
    def total_steps(self) -> int:
        """Optimizer steps trained by this invocation's trials."""
        return sum(r.steps for r in self.records)
