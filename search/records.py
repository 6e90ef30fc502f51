"""A trial's bookkeeping in the search driver, from asked to recorded.

A trial goes ``PendingTrial`` (asked, config sampled and validated, waiting for a slot) ->
``RunningTrial`` (its run on a ``TrialActor``) -> ``TrialRecord`` (finished by this invocation,
with the state told to the study).  A trial that fails on the spot (invalid config) or repeats a
completed config goes straight to a ``TrialRecord``.  ``SearchSummary`` is what ``run_search``
returns.  See ``docs/architecture.md`` (the search layer).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Sequence

from orchestrator.config import RootConfig
from search.capacity import Resources

if TYPE_CHECKING:
    from optuna.trial import FrozenTrial, Trial

    from search.trial import TrialResult

TrialStateName = Literal["COMPLETE", "PRUNED", "FAIL"]
"""The states the driver tells the study (Optuna's ``TrialState`` names); also MLflow tag ``search.state``."""


@dataclass
class PendingTrial:
    """An asked trial whose config is valid, waiting for a free slot and for the cluster to fit it."""

    trial: Trial
    values: dict[str, Any]           # the sampled values, by config path
    cfg: RootConfig                  # the validated training config the trial will run
    need: Resources                  # what it holds at its largest (``capacity.trial_needs``)
    key: str                         # ``study.config_key(cfg)``: equal keys train the same run
    twin: int | None = None          # a running trial with the same key: wait for it, then reuse its value


@dataclass
class RunningTrial:
    """A launched trial: its actor, the ref of its run, and what the pruner has seen of it."""

    trial: Trial
    values: dict[str, Any]
    cfg: RootConfig
    need: Resources
    key: str
    actor: Any                       # the ``TrialActor`` handle
    ref: Any                         # the ``ObjectRef`` of ``actor.run``
    t0: float                        # launch time (``time.time()``)
    run_id: str | None = None        # its MLflow run, once the actor knows it
    last_step: int = -1              # the last step reported to the study
    last_value: float | None = None  # the objective's value at ``last_step``
    pruned_at: int | None = None     # the step at which the pruner stopped it

    @classmethod
    def launched(cls, p: PendingTrial, actor: Any, ref: Any, t0: float) -> RunningTrial:
        """The running form of pending trial ``p``, started on ``actor`` at ``t0``."""
        return cls(p.trial, p.values, p.cfg, p.need, p.key, actor, ref, t0)

    def report(self, values: Sequence[tuple[int, str, float]]) -> None:
        """Report the objective's new ``(step, metric, value)`` triples to the study (``trial.report``);
        steps at or before ``last_step`` were reported already and are skipped."""
        for step, _key, value in values:
            if step <= self.last_step:
                continue
            self.trial.report(float(value), int(step))
            self.last_step, self.last_value = step, float(value)

    def outcome(self, res: TrialResult, metrics: Sequence[str]) -> TrialOutcome:
        """The trial's final state from its run's result, in this order: the run raised -> FAIL;
        pruned -> PRUNED (value: the last reported one, as Optuna keeps it); an objective missing or
        not finite, or the run not FINISHED -> FAIL; else COMPLETE with the objectives' values."""
        if res.error is not None:
            return TrialOutcome("FAIL", None, res.error)
        if self.pruned_at is not None:
            last = self.last_value
            return TrialOutcome("PRUNED", [last] if last is not None and math.isfinite(last) else None, None)
        figures = [res.figure(m) for m in metrics]
        missing = [m for m, v in zip(metrics, figures) if v is None]
        bad = [m for m, v in zip(metrics, figures) if v is not None and not math.isfinite(v)]
        if missing:
            return TrialOutcome("FAIL", None, f"objective {missing[0]} was never reported by the run; "
                                              f"check train.eval_every / the metric name")
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
    pruned_at: int | None = None
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
