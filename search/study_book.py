"""The search driver's books: what it tells the study, its MLflow runs and the person watching.

``StudyBook`` is the only part of the driver that tells the study a trial's state (``tell``), closes
the trials' MLflow child runs and the study's parent run (``search.study_tracking``), keeps this
invocation's ``TrialRecord`` s and writes the lines and the bar (``search.study_progress``).  A lost
trial (its driver died, or this one is going away) is told FAIL, its config queued again, its run
closed KILLED and its checkpoints deleted (``close_trial_run``).  The driver (``search.driver``)
decides what happens when; the book says it.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import optuna

from orchestrator.config.schema import ConfigError
from orchestrator.config.uris import redact_uri
from search.liveness import LOST_ERROR, DriverLife, requeue
from search.records import RunningTrial, SearchSummary, TrialOutcome, TrialRecord
from search.space import SearchSpace
from search.study import best_config_yaml
from search.study_progress import ProgressBar, best_text, trial_line, write_line
from search.study_tracking import PARENT_RUN_ATTR, StudyTracker, best_trials, close_lost_child
from search.targets import Targets
from search.view import trial_run_name
from trainers.errors import one_line

if TYPE_CHECKING:
    from optuna import Study
    from optuna.trial import FrozenTrial, Trial

    from search.trial import TrialResult


class StudyBook:
    """What one invocation tells ``study`` and shows: ``records`` (the trials it finished), the
    parent run (``tracker``, once ``open``), the ``bar``.  ``running``: the driver's trials in flight
    (read for the bar, never changed)."""

    def __init__(
        self,
        space: SearchSpace,
        study: Study,
        targets: Targets,
        life: DriverLife,
        running: Mapping[int, RunningTrial],
        objectives: list[str],
    ) -> None:
        self.space, self.study, self.targets, self.life = space, study, targets, life
        self.running, self.objectives = running, objectives
        self.records: list[TrialRecord] = []
        self.tracker: StudyTracker | None = None
        self.bar: ProgressBar | None = None

    # -- the invocation ----------------------------------------------------------------------------

    def open(self, n_trials: int, progress: bool) -> None:
        """The MLflow parent run (reopened for a continued study), the study's user attributes
        ``show`` needs, and the bar."""
        self.tracker = StudyTracker(
            self.targets.tracking_uri,
            self.targets.experiment,
            self.study.study_name,
            self.targets.storage,
            self.space,
            existing_run_id=self.study.user_attrs.get(PARENT_RUN_ATTR),
        )
        self.study.set_user_attr(PARENT_RUN_ATTR, self.tracker.run_id)
        self.study.set_user_attr("tracking_uri", redact_uri(self.targets.tracking_uri))  # never credentials
        self.study.set_user_attr("base_config", self.space.base)
        self.study.set_user_attr("space", self.space.summary())
        self.bar = ProgressBar(n_trials, progress)
        self.refresh()

    def close_bar(self) -> None:
        if self.bar is not None:
            self.bar.close()

    def close_parent(self, status: str, wall_s: float) -> None:
        """End the MLflow parent run with the study's figures and the best config; a failure is a warning."""
        if self.tracker is None:
            return
        try:
            best_yaml = best_config_yaml(self.study)
        except ConfigError:
            best_yaml = None
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self.tracker.finish(self.study, status, wall_s, best_yaml)
        except Exception as e:
            self.write(f"warning: cannot finish the MLflow parent run ({one_line(e)})")

    def summary(self, wall_s: float) -> SearchSummary:
        """What this invocation did, and the study's best."""
        assert self.tracker is not None
        return SearchSummary(
            self.study.study_name,
            self.targets.storage,
            self.tracker.run_id,
            self.targets.tracking_uri,
            self.tracker.experiment_id,
            self.records,
            len(self.study.trials),
            best_trials(self.study),
            wall_s,
            list(self.objectives),
        )

    # -- one trial ---------------------------------------------------------------------------------

    def reuse(self, trial: Trial, values: dict[str, Any], same: FrozenTrial) -> None:
        """Tell a duplicate trial the value of the trial it repeats; it trains nothing (0 steps)."""
        trial.set_user_attr("duplicate_of", same.number)
        trial.set_user_attr("steps", 0)
        run_id = None
        if self.tracker is not None:
            run_id = self.tracker.duplicate_child(
                trial.number, values, same, self.objectives, run_name=trial_run_name(trial.number)
            )
            trial.set_user_attr("mlflow_run_id", run_id)
        self.life.forget(trial.number)
        self.study.tell(trial, list(same.values) if self.space.multi_objective else same.value)
        self.record(
            TrialRecord(trial.number, "COMPLETE", list(same.values), values, run_id=run_id, duplicate_of=same.number)
        )

    def fail_early(self, trial: Trial, values: dict[str, Any], error: str) -> None:
        """Tell FAIL a trial whose config is invalid; its MLflow child run holds the params and the error."""

        trial.set_user_attr("error", error)
        run_id = None
        if self.tracker is not None:
            run_id = self.tracker.failed_child(trial.number, values, error, run_name=trial_run_name(trial.number))
            trial.set_user_attr("mlflow_run_id", run_id)
        self.life.forget(trial.number)
        self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
        self.record(TrialRecord(trial.number, "FAIL", None, values, error=error, run_id=run_id))

    def finished(self, r: RunningTrial, res: TrialResult) -> None:
        """A trial whose run returned: judge the outcome, tell the study, close its MLflow run and record it."""
        run_id = res.run_id or r.run_id
        out = r.outcome(res, self.objectives)
        pruned = r.pruned if out.state == "PRUNED" else None  # a run that reached its end was not pruned
        self._tell(r, res, out, run_id)
        self._close_child(r.trial.number, run_id, out, res.error_detail, pruned.step if pruned else None)
        self.record(
            TrialRecord(
                r.trial.number,
                out.state,
                out.values,
                r.values,
                steps=res.steps,
                samples=res.samples,
                wall_s=res.wall_s,
                worker_seconds=res.worker_seconds,
                error=out.error,
                run_id=run_id,
                pruned_at=pruned.step if pruned else None,
                pruned_samples=pruned.samples if pruned else None,
            )
        )

    def _tell(self, r: RunningTrial, res: TrialResult, out: TrialOutcome, run_id: str | None) -> None:
        """The run's figures as the trial's user attributes, then its state (and values) to the study.
        A PRUNED trial's value is the one it was judged at (its last intermediate value)."""

        t = r.trial
        pruned_at = r.pruned_at if out.state == "PRUNED" else None
        for key, v in (
            ("mlflow_run_id", run_id),
            ("steps", res.steps),
            ("samples", res.samples),
            ("wall_s", round(res.wall_s, 3)),
            ("worker_seconds", round(res.worker_seconds, 3)),
            ("error", out.error),
            ("pruned_at_step", pruned_at),
        ):
            if v is not None:
                t.set_user_attr(key, v)
        self.life.forget(t.number)
        if out.state == "COMPLETE":
            assert out.values is not None
            self.study.tell(t, out.values if self.space.multi_objective else out.values[0])
        else:
            self.study.tell(t, state=getattr(optuna.trial.TrialState, out.state))

    def _close_child(
        self, number: int, run_id: str | None, out: TrialOutcome, detail: str | None, pruned_at: int | None = None
    ) -> None:
        """The trial's MLflow run gets its final state; MLflow trouble is a warning, not a stop."""
        if not run_id or self.tracker is None:
            return
        try:
            self.tracker.finish_child(run_id, out.state, out.values, out.error, detail, pruned_at=pruned_at)
        except Exception as e:  # MLflow trouble must not stop the study
            self.write(f"warning: trial {number}: cannot update MLflow run {run_id} ({e})")

    # -- lost trials -------------------------------------------------------------------------------

    def fail_asked(self, asked: list[tuple[Trial, dict[str, Any], str | None]], why: str) -> None:
        """The driver is going away: tell FAIL each ``(trial, values, run_id)`` it asked and has not
        told, and close it as a lost trial (``close_trial_run``)."""
        for trial, values, run_id in asked:
            n = trial.number
            try:
                trial.set_user_attr("error", why)
                self.life.forget(n)
                self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
                told = next(t for t in self.study.get_trials(deepcopy=False) if t.number == n)
                self.close_trial_run(told, run_id, why)
            except Exception:
                pass
            self.records.append(TrialRecord(n, "FAIL", None, values, error=why, run_id=run_id))

    def recover(self, wait: bool) -> None:
        """Fail the trials of dead drivers (no beat for a grace period; with ``wait``, first give
        fresh-looking ones a grace period to beat again), close their runs, queue them again."""
        for t in self.life.find_dead(wait, self.write):
            try:
                self.close_trial_run(t, t.user_attrs.get("mlflow_run_id"), LOST_ERROR)
            except Exception as e:  # MLflow or the disk: the trial is FAIL and queued again all the same
                self.write(f"warning: trial {t.number}: {one_line(e)}")
            self.write(f"trial {t.number}: FAIL ({LOST_ERROR}); its config is queued again")

    def close_trial_run(self, t: FrozenTrial, run_id: str | None, why: str) -> None:
        """A lost trial (told FAIL): queue its config again, close its MLflow run KILLED and delete
        its checkpoints (unless the space keeps them)."""
        requeue(self.study, t)
        run_id = close_lost_child(
            self.targets.tracking_uri,
            self.study.user_attrs.get(PARENT_RUN_ATTR),
            self.study.study_name,
            t.number,
            run_id,
            why,
        )
        if run_id and not self.space.keep_checkpoints:
            self.targets.delete_checkpoints(run_id)

    # -- what the driver shows ---------------------------------------------------------------------

    def write(self, line: str) -> None:
        write_line(line, self.bar)

    def record(self, rec: TrialRecord) -> None:
        """Keep a finished trial's record, write its line and redraw the bar."""
        self.records.append(rec)
        self.write(trial_line(rec, self.objectives))
        if self.tracker is not None and (warning := self.tracker.trial_done(self.study)):
            self.write(warning)  # the parent run's history, best-trial link and table (search.view)
        self.refresh()

    def refresh(self) -> None:
        if self.bar is not None:
            self.bar.show(
                len(self.records),
                best_text(self.study, self.space.multi_objective),
                len(self.running),
                sum(r.state == "PRUNED" for r in self.records),
                sum(r.state == "FAIL" for r in self.records),
            )
