"""The search driver: an Optuna study (ask/tell) whose trials are orchestrator runs on Ray.

* Parallel trials: each trial runs in its own ``TrialActor`` (``search.trial``, pooled by
  ``search.pool``); at most ``parallel`` at once, and only as many as the cluster's resources fit
  (``search.capacity``: a trial holds its ``max_workers`` times the per-worker CPUs/GPUs).
* Pruning (``search.pruning``): the driver polls each running trial for the objective's values at
  their global steps, ``trial.report``s them and asks ``trial.should_prune()`` after each; its
  verdict goes back to the trial's run, which waits for it at its next evaluation, so a condemned
  trial stops within one evaluation interval (every worker at the same step).  The study is told
  PRUNED, with the step and value it was judged at, once the run closed before its planned end; a
  run that reached its end first is judged on its result.
* A trial whose sampled config is invalid, or whose run raises, is told FAIL with its message
  (user attribute ``error``; tag ``search.error`` on its MLflow run); the study goes on.
* A trial whose config equals a COMPLETE trial's (``skip_duplicates``) takes that trial's value and
  trains nothing; one equal to a running trial's waits for it.
* The driver's death: it beats for every trial it has asked (``search.liveness``); at its start it
  fails the trials of a dead driver (no beat for a grace period), closes their MLflow runs KILLED,
  deletes their checkpoints and queues their configs again; a re-run of a command whose driver died
  finishes that command's ``--trials``.

Only this driver touches the study's storage (``search.study_storage``), through Optuna's public API.
What it keeps is split by concern: ``slots`` (``search.pool``: trials in flight), ``pruning``
(``search.pruning``), ``life`` (``search.liveness``), ``targets`` (where a trial's run writes),
``records``, ``tracker`` and ``bar`` (what it shows: ``search.records``, ``search.study_tracking``,
``search.study_progress``).  See ``docs/architecture.md`` (the search layer).
"""

from __future__ import annotations

import logging
import os
import time
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import optuna
import ray

from orchestrator.config.code import runtime_env
from orchestrator.config.feasibility import capacity
from orchestrator.config.preflight import check_data_files
from orchestrator.config.prepare import validated
from orchestrator.config.schema import ConfigError, validate
from orchestrator.config.uris import absolute_tracking_uri, redact_uri
from orchestrator.run.cluster_limits import read_limits
from orchestrator.run.runner import ensure_ray
from search.capacity import Capacity, trial_needs
from search.liveness import DEFAULT_HEARTBEAT_S, LOST_ERROR, DriverLife, StudyStore, request_key, requeue
from search.pool import Slots
from search.pruning import Pruning
from search.records import PendingTrial, RunningTrial, SearchSummary, TrialOutcome, TrialRecord
from search.space import DEFAULT_TRIALS, SearchSpace
from search.study import best_config_yaml, completed_twin, config_key, create_or_load_study, grid_remaining
from search.study_progress import ProgressBar, best_text, restart_line, trial_line, write_line
from search.study_storage import DEFAULT_STORAGE, describe_storage, open_storage
from search.study_tracking import PARENT_RUN_ATTR, StudyTracker, best_trials, close_lost_child
from search.trial import TrialResult, short_error
from search.view import trial_run_name
from trainers.errors import one_line
from trainers.loop.storage import join, resolve, store_for

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from optuna import Study
    from optuna.storages import BaseStorage
    from optuna.trial import FrozenTrial, Trial

    from search.trial import TrialResult

POLL_S = 0.1  # how long the driver waits for a run to return before it polls the running trials


@dataclass
class SearchOptions:
    """The ``run`` command's options."""

    trials: int | None = None
    parallel: int = 1
    timeout_s: float | None = None
    study_name: str = "search"
    storage: str = DEFAULT_STORAGE
    tracking_uri: str | None = None
    verbose: bool = False
    progress: bool = True
    heartbeat_s: int = DEFAULT_HEARTBEAT_S  # the driver's beat; a trial is stale after 3 missed beats


class Targets:
    """Where a trial's run writes: the study's MLflow experiment (``tracking_uri``), the base config's
    checkpoint folder (``storage_path``), and the user's code its actors need (``runtime_env``);
    ``storage``: where the study itself lives, as shown."""

    def __init__(self, space: SearchSpace, tracking_uri: str | None, storage_desc: str) -> None:

        base_cfg = validate(space.base)
        self.tracking_uri = absolute_tracking_uri(tracking_uri or base_cfg.tracking.resolved_uri())
        self.experiment = base_cfg.tracking.experiment
        self.runtime_env = runtime_env(base_cfg)  # the user's code, for the trial actors (orchestrator/config/code.py)
        self.storage_path = resolve(base_cfg.checkpoint.storage_path)  # a local folder made absolute, or a URI
        self.storage = storage_desc
        self.base_batch = float(base_cfg.batch.size)  # the unit of equal work (records.ReportUnit)

    def runtime(self, raw: dict[str, Any], number: int) -> dict[str, Any]:
        """Where trial ``number``'s results go: the study's MLflow experiment and the checkpoint folder."""
        raw.setdefault("tracking", {}).update(
            uri=self.tracking_uri, experiment=self.experiment, run_name=trial_run_name(number)
        )
        raw.setdefault("checkpoint", {})["storage_path"] = self.storage_path
        return raw

    def delete_checkpoints(self, run_id: str) -> None:
        """Every checkpoint folder of the training run of MLflow run ``run_id`` (all its phases)."""
        store = store_for(self.storage_path)
        try:
            for name, kind in store.children(self.storage_path):
                if kind == "dir" and name.startswith(f"elastic-{run_id}"):
                    store.remove(join(self.storage_path, name))
        except OSError as e:  # an object store that does not answer now: the folders stay
            logger.warning("could not delete the checkpoints of run %s (%s)", run_id, e)


class SearchDriver:
    """Runs ``options.trials`` trials of ``space`` in ``study``, ``options.parallel`` at a time, on Ray.

    ``run()`` is the whole life of one invocation: open (Ray, capacity, the MLflow parent run, the
    bar), loop (ask, launch, watch, finish), close (actors, parent run, Ray).  ``storage``: the
    storage the study was opened on (``search.study_storage.open_storage``); without it the driver keeps
    no heartbeat (a study in memory, as in tests).
    """

    def __init__(
        self,
        space: SearchSpace,
        study: Study,
        options: SearchOptions,
        storage_desc: str,
        storage: BaseStorage | None = None,
    ) -> None:
        self.space, self.study, self.opts = space, study, options
        self.targets = Targets(space, options.tracking_uri, storage_desc)
        self.pruning = Pruning(space, study, self.targets.base_batch)
        self.slots = Slots(options.parallel)
        self.life = DriverLife(StudyStore(study, storage) if storage is not None else None, options.heartbeat_s)
        self.records: list[TrialRecord] = []
        self.tracker: StudyTracker | None = None
        self.bar: ProgressBar | None = None

    # -- what other modules and tests read -------------------------------------------------------

    @property
    def running(self) -> dict[int, RunningTrial]:
        return self.slots.running

    @property
    def objectives(self) -> list[str]:
        return self.pruning.objectives

    # -- the run ---------------------------------------------------------------------------------

    def run(self) -> SearchSummary:
        """Called once by ``run_search``.  The running trials are told FAIL if the driver fails or
        is interrupted (the exception goes on); the parent run ends FINISHED, FAILED or KILLED."""

        t0 = time.time()
        self._recover(wait=True)  # the trials of a dead driver: FAIL, runs KILLED, configs queued again
        n_trials = self._trials_to_run()
        self.life.start_beating()
        status = "FAILED"
        try:
            started_ray = ensure_ray(self.opts.verbose, runtime_env=self.targets.runtime_env)
        except BaseException:
            self.life.end(done=False)  # a re-run of the command takes it over at once
            raise
        try:
            self._open(n_trials)
            self._loop(n_trials, t0)
            status = "FINISHED"
        except KeyboardInterrupt:
            status = "KILLED"
            self._abort("interrupted (Ctrl-C)")
            raise
        except BaseException:
            self._abort("the search driver failed")
            raise
        finally:
            self._close(status, time.time() - t0, started_ray)
        return self._summary(time.time() - t0)

    def _trials_to_run(self) -> int:
        """Called by ``run`` after ``_recover``: ``--trials`` (default ``DEFAULT_TRIALS``), and with
        the grid sampler never more than the grid points the study has not tried.  A re-run of a
        command whose driver died takes its request over and runs only what is left of it
        (``liveness.start_invocation``)."""
        n_trials = self.opts.trials
        remaining_grid = grid_remaining(self.study, self.space)
        if remaining_grid is not None:
            n_trials = remaining_grid if n_trials is None else min(n_trials, remaining_grid)
            if remaining_grid == 0:
                self._write(
                    f"the grid is done: all {self.space.grid_size()} points of study "
                    f"{self.study.study_name!r} have been tried"
                )
        n = DEFAULT_TRIALS if n_trials is None else n_trials
        taken = self.life.begin(request_key(self.space.text, self.opts.trials), n, say=self._write)
        inv = self.life.invocation
        if taken is None or inv is None:
            return n
        left = inv.left()
        if remaining_grid is not None:
            left = min(left, remaining_grid)
        self._write(
            f"continuing the same command of a driver that died: {inv.total - left} of its "
            f"{inv.total} trials were evaluated, {left} left"
        )
        return left

    def _open(self, n_trials: int) -> None:
        """Called by ``run`` once Ray is up: the cluster's capacity, the MLflow parent run (reopened
        for a continued study), the study's user attributes ``show`` needs, and the bar."""

        # what the cluster can ever hold: an autoscaling cluster may start with no workers at all

        self.slots.capacity = Capacity(capacity(ray.cluster_resources(), read_limits().max_resources))
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
        self.bar = ProgressBar(n_trials, self.opts.progress)
        self._refresh()

    def _loop(self, n_trials: int, t0: float) -> None:
        """Called by ``run`` after ``_open``: each turn asks trials into the free slot, settles a
        waiting duplicate, launches the pending trial if it fits, else watches the running trials for
        ``POLL_S``; ends when nothing runs and nothing is left to ask (or ``--timeout`` stopped the asking)."""
        self.slots.to_ask, self.slots.pending = n_trials, None
        timed_out = False
        while True:
            timed_out = self.opts.timeout_s is not None and time.time() - t0 >= self.opts.timeout_s
            self._ask_into_free_slot(timed_out)
            if self._settle_twin() or self._launch_pending():
                continue
            if self._drained(timed_out):
                break
            self._watch()
        if timed_out and self.slots.to_ask > 0:
            self._write(f"--timeout reached: {self.slots.to_ask} trial(s) not started")

    def _close(self, status: str, wall_s: float, started_ray: bool) -> None:
        """Called by ``run`` at the end, whatever happened: the bar, the actors, the heartbeat (the
        request is done unless the driver failed or was interrupted), the parent run, Ray (unless it
        was running before, or ``ELASTIC_KEEP_RAY`` is set)."""
        if self.bar is not None:
            self.bar.close()
        self.slots.pool.close()
        self.life.end(done=status == "FINISHED")  # an unfinished request is taken over at once by a re-run
        if self.tracker is not None:
            self._close_parent(status, wall_s)
        if started_ray and not os.environ.get("ELASTIC_KEEP_RAY"):
            ray.shutdown()

    def _summary(self, wall_s: float) -> SearchSummary:
        """Called by ``run`` after a normal end: what this invocation did, and the study's best."""
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

    # -- the loop's steps --------------------------------------------------------------------------

    def _ask_into_free_slot(self, timed_out: bool) -> None:
        """Ask trials while none is pending, some are left to ask, the timeout has not passed and a
        slot is free; one that fails on the spot or repeats a completed config counts as asked."""
        s = self.slots
        while s.pending is None and s.to_ask > 0 and not timed_out and s.free:
            s.to_ask -= 1
            s.pending = self._ask()

    def _settle_twin(self) -> bool:
        """Once the running twin of the pending trial has ended: take its value if it completed (``True``:
        the slot is free again), else let the pending trial run (``False``)."""
        p = self.slots.pending
        if p is None or p.twin is None or p.twin in self.running:
            return False
        same = completed_twin(self.study, p.key)
        if same is not None:
            self._reuse(p.trial, p.values, same)
            self.slots.pending = None
            return True
        p.twin = None  # the twin was pruned or failed: run this one
        return False

    def _launch_pending(self) -> bool:
        """Launch the pending trial if it waits for no twin, a slot is free and the cluster fits it."""
        p = self.slots.pending
        if p is None or p.twin is not None or not self.slots.fits(p):
            return False
        self._launch(p)
        self.slots.pending = None
        self._refresh()
        return True

    def _drained(self, timed_out: bool) -> bool:
        """Nothing runs and nothing is left to start.  A pending trial that does not fit an idle
        cluster cannot happen (``Capacity.never_fits`` failed it when asked): ``RuntimeError``."""
        if self.running:
            return False
        if self.slots.pending is None and (self.slots.to_ask == 0 or timed_out):
            return True
        if self.slots.pending is not None:
            raise RuntimeError("a trial does not fit an idle cluster")
        return False

    def _watch(self) -> None:
        """Wait up to ``POLL_S`` for runs to return, relay the running trials' values to the pruner,
        and finish the trials whose runs returned."""

        refs = [r.ref for r in self.running.values()]
        done, _ = ray.wait(refs, num_returns=len(refs), timeout=POLL_S)
        self._poll()
        for n in [n for n, r in self.running.items() if r.ref in done]:
            self._finish(self.running.pop(n))
        if self.life.recovery_due():
            self._recover(wait=False)  # another driver of the study may have died meanwhile
        self._refresh()

    # -- one trial ---------------------------------------------------------------------------------

    def _ask(self) -> PendingTrial | None:
        """A new trial with its config, or ``None`` if it failed on the spot (told FAIL) or took a
        completed twin's value."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Optuna warns that its heartbeat is meant for optimize()
            trial = self.study.ask()
        self.life.asked(trial)
        values: dict[str, Any] = {}
        capacity = self.slots.capacity
        try:
            values = self.space.sample(trial)
            trial.set_user_attr("config_values", values)
            cfg = validated(self.targets.runtime(self.space.raw_config(values), trial.number))
            check_data_files(cfg)
            need = trial_needs(cfg)
            why = capacity.never_fits(need) if capacity else None
            if why:
                raise ConfigError(f"scaling: this trial {why}; lower scaling.max_workers or cpus_per_worker")
        except (ConfigError, ValueError, TypeError) as e:
            self._fail_early(trial, values, f"invalid config: {e}")
            return None
        key = config_key(cfg)
        trial.set_user_attr("config_key", key)
        twin = None
        if self.space.skip_duplicates:
            same = completed_twin(self.study, key)
            if same is not None:
                self._reuse(trial, values, same)
                return None
            twin = next((n for n, r in self.running.items() if r.key == key), None)
        return PendingTrial(trial, values, cfg, need, key, twin)

    def _reuse(self, trial: Trial, values: dict[str, Any], same: FrozenTrial) -> None:
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
        self._record(
            TrialRecord(trial.number, "COMPLETE", list(same.values), values, run_id=run_id, duplicate_of=same.number)
        )

    def _fail_early(self, trial: Trial, values: dict[str, Any], error: str) -> None:
        """Tell FAIL a trial whose config is invalid; its MLflow child run holds the params and the error."""

        trial.set_user_attr("error", error)
        run_id = None
        if self.tracker is not None:
            run_id = self.tracker.failed_child(trial.number, values, error, run_name=trial_run_name(trial.number))
            trial.set_user_attr("mlflow_run_id", run_id)
        self.life.forget(trial.number)
        self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
        self._record(TrialRecord(trial.number, "FAIL", None, values, error=error, run_id=run_id))

    def _launch(self, p: PendingTrial) -> None:
        """Start the pending trial's run on a pooled actor, as a child of the parent run, and book its resources."""
        assert self.slots.capacity is not None
        actor = self.slots.pool.get()
        tags = self.tracker.child_tags(p.trial.number, p.values) if self.tracker else {}
        parent = self.tracker.run_id if self.tracker else None
        ref = actor.run.remote(
            p.trial.number,
            p.cfg.model_dump(mode="json"),
            parent,
            tags,
            self.pruning.metrics,
            self.space.keep_checkpoints,
            self.pruning.judged_metrics,
        )
        self.slots.capacity.take(p.need)
        self.running[p.trial.number] = RunningTrial.launched(p, actor, ref, time.time())

    def _poll(self) -> None:
        """Relay the running trials' new objective values to the pruner, and its verdicts back to
        their runs (a condemned one stops; the others may go past their next evaluation)."""

        refs = {n: r.actor.poll.remote(n) for n, r in self.running.items()}
        for n, ref in refs.items():
            r = self.running[n]
            try:
                info = ray.get(ref, timeout=30)
            except Exception:
                continue  # the actor died: its run ref reports it
            if info["run_id"] and info["run_id"] != r.run_id:
                r.trial.set_user_attr("mlflow_run_id", info["run_id"])  # found again if this driver dies
            r.run_id = info["run_id"] or r.run_id
            for note in info.get("restarts", []):
                self._write(restart_line(n, note))  # a worker's node lost: the trial goes on
            verdict = self.pruning.hear(r, info["values"])
            if verdict is not None:
                r.actor.verdict.remote(n, verdict.step, verdict.stop)

    def _finish(self, r: RunningTrial) -> None:
        """Called by ``_watch`` when a trial's run returned (or its actor died): free its actor and
        resources, judge the outcome, tell the study, close its MLflow run and record it."""
        assert self.slots.capacity is not None
        res, healthy = self._result(r)
        self.slots.pool.put(r.actor, healthy)
        self.slots.capacity.give(r.need)
        run_id = res.run_id or r.run_id
        out = r.outcome(res, self.objectives)
        pruned = r.pruned if out.state == "PRUNED" else None  # a run that reached its end was not pruned
        self._tell(r, res, out, run_id)
        self._close_child(r.trial.number, run_id, out, res.error_detail, pruned.step if pruned else None)
        self._record(
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

    def _result(self, r: RunningTrial) -> tuple[TrialResult, bool]:
        """The run's result and whether its actor is healthy (a dead actor gives a FAILED result)."""

        try:
            return TrialResult(**ray.get(r.ref)), True
        except Exception as e:  # the actor process died
            return TrialResult(
                run_id=r.run_id,
                status="FAILED",
                stopped=False,
                steps=0,
                wall_s=time.time() - r.t0,
                worker_seconds=0.0,
                error=f"trial actor died: {short_error(e)}",
            ), False

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
            self._write(f"warning: trial {number}: cannot update MLflow run {run_id} ({e})")

    # -- the end -----------------------------------------------------------------------------------

    def _abort(self, why: str) -> None:
        """Fail the trials still running or pending (the driver is going away): their MLflow runs end
        KILLED, their checkpoints go, their configs are queued again for the next ``run`` of the study
        (the same command then finishes its ``--trials``)."""

        asked = [(n, r.trial, r.values, r.run_id) for n, r in self.running.items()]
        p = self.slots.pending
        if p is not None:
            asked.append((p.trial.number, p.trial, p.values, None))
        for n, trial, values, run_id in asked:
            try:
                trial.set_user_attr("error", why)
                self.life.forget(n)
                self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
                told = next(t for t in self.study.get_trials(deepcopy=False) if t.number == n)
                self._bury(told, run_id, why)
            except Exception:
                pass
            self.records.append(TrialRecord(n, "FAIL", None, values, error=why, run_id=run_id))
        self.running.clear()
        self.slots.pending = None

    # -- a dead driver's trials ----------------------------------------------------------------------

    def _recover(self, wait: bool) -> None:
        """Fail the trials of dead drivers (no beat for a grace period; with ``wait``, first give
        fresh-looking ones a grace period to beat again), close their runs, queue them again."""
        for t in self.life.find_dead(wait, self._write):
            try:
                self._bury(t, t.user_attrs.get("mlflow_run_id"), LOST_ERROR)
            except Exception as e:  # MLflow or the disk: the trial is FAIL and queued again all the same
                self._write(f"warning: trial {t.number}: {one_line(e)}")
            self._write(f"trial {t.number}: FAIL ({LOST_ERROR}); its config is queued again")

    def _bury(self, t: FrozenTrial, run_id: str | None, why: str) -> None:
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

    def _close_parent(self, status: str, wall_s: float) -> None:
        """End the MLflow parent run with the study's figures and the best config; a failure is a warning."""
        assert self.tracker is not None
        try:
            best_yaml = best_config_yaml(self.study)
        except ConfigError:
            best_yaml = None
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self.tracker.finish(self.study, status, wall_s, best_yaml)
        except Exception as e:
            self._write(f"warning: cannot finish the MLflow parent run ({one_line(e)})")

    # -- what the driver shows -----------------------------------------------------------------------

    def _write(self, line: str) -> None:
        write_line(line, self.bar)

    def _record(self, rec: TrialRecord) -> None:
        """Keep a finished trial's record, write its line and redraw the bar."""
        self.records.append(rec)
        self._write(trial_line(rec, self.objectives))
        if self.tracker is not None and (warning := self.tracker.trial_done(self.study)):
            self._write(warning)  # the parent run's history, best-trial link and table (search.view)
        self._refresh()

    def _refresh(self) -> None:
        if self.bar is not None:
            self.bar.show(
                len(self.records),
                best_text(self.study, self.space.multi_objective),
                len(self.running),
                sum(r.state == "PRUNED" for r in self.records),
                sum(r.state == "FAIL" for r in self.records),
            )


def run_search(space: SearchSpace, options: SearchOptions) -> SearchSummary:
    """Create or continue the study and run ``options.trials`` more trials.  The space is checked."""

    if not options.verbose:
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    storage = open_storage(options.storage, heartbeat_s=options.heartbeat_s)
    study = create_or_load_study(space, options.study_name, storage)
    return SearchDriver(space, study, options, describe_storage(options.storage), storage=storage).run()
