"""What the pruner hears of the running trials, and the verdicts the driver sends back to them.

The driver relays each running trial's objective values to Optuna (``Trial.report`` at equal work,
``records.ReportUnit``) and asks ``Trial.should_prune`` after each one.  Its verdict on the values up
to a step (go on, or stop there) goes back to the trial's run (``TrialActor.verdict`` ->
``PhaseRunner.verdict`` -> the monitor).  For an evaluation metric the run waits for that verdict
at its next evaluation (``Runtime.judged_metrics``, trainers/link/channel.py), so a condemned trial
stops within one evaluation interval of the value it was judged at, however fast it trains.  A
per-step training metric is judged without that wait (the run would wait at every step): its
stop arrives a push or two later.  See ``docs/architecture.md`` (the search layer).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from search.records import ReportUnit, RunningTrial
from trainers.link import metrics as M

if TYPE_CHECKING:
    from optuna import Study

    from search.space import SearchSpace

# Metrics a run logs only when it evaluates: the run can wait for their verdict at the next one.
EVAL_METRICS = (M.VAL_ACCURACY, M.VAL_LOSS, M.VAL_PERPLEXITY)


@dataclass(frozen=True)
class Verdict:
    """The driver's verdict on a trial's values up to global ``step``: ``stop`` there, or go on."""

    step: int
    stop: bool


class Pruning:
    """The objectives of a search, what the trial actors relay of them, and the pruner's verdicts."""

    def __init__(self, space: SearchSpace, study: Study, samples_per_step: float) -> None:
        self.study = study
        self.objectives = [o.metric for o in space.objectives]
        self.metrics = [o.metric for o in space.objectives if o.per_step]  # what trial actors relay per step
        # Intermediate values reach the pruner only for a single objective reported per step ...
        self.reports = not space.multi_objective and bool(self.metrics) and self.metrics[0] == self.objectives[0]
        self.prunes = self.reports and space.prunes
        # ... at equal work (samples, or tokens, in base steps) unless the space asks for global steps
        stored = study.user_attrs.get("report_unit") or {}
        self.unit = ReportUnit(
            space.report_against,
            float(samples_per_step),
            stored.get("tokens_per_step") if space.report_against == "samples" else None,
        )

    @property
    def judged_metrics(self) -> list[str]:
        """The metrics a trial's run waits for the verdict on (an evaluation metric, when pruning)."""
        return [m for m in self.metrics[:1] if self.prunes and m in EVAL_METRICS]

    def verdict_for(self, r: RunningTrial, values: Sequence[tuple[Any, ...]]) -> Verdict | None:
        """Report ``r``'s new values; the pruner judges each.  The verdict on all of them (the
        step of the newest, and whether the trial is condemned), or ``None`` when there is nothing
        to judge (no new value, or no pruning)."""
        if not self.reports or not values:
            return None
        self._learn_tokens(values)
        condemned = r.report(values, self.unit, r.trial.should_prune if self.prunes else None)
        if not self.prunes:
            return None
        return Verdict(step=max(int(v[0]) for v in values), stop=condemned)

    def _learn_tokens(self, values: Sequence[tuple[Any, ...]]) -> None:
        """A language model reports tokens: the tokens of one base step (``B_base`` sequences of the
        first reporting trial's ``T``) become the unit for good, kept in the study."""
        if self.unit.by != "samples" or self.unit.tokens_per_step is not None:
            return
        for _step, _key, _value, *work in values:
            samples, tokens = (list(work) + [None, None])[:2]
            if tokens and samples:
                self.unit.tokens_per_step = self.unit.samples_per_step * tokens / samples
                self.study.set_user_attr("report_unit", {"by": "tokens", "tokens_per_step": self.unit.tokens_per_step})
                return
