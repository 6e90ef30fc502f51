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
``SearchDriver`` is the loop (ask, launch, watch, finish); what it keeps is split by job: ``runs``
(``search.trial_runs``: where trials run, the one part that calls Ray, faked in unit tests),
``slots`` (``search.pool``: trials in flight), ``pruning`` (``search.pruning``: the pruner's
verdicts), ``life`` (``search.liveness``: the heartbeat), ``targets`` (``search.targets``: where a
trial's run writes) and ``book`` (``search.study_book``: what the study, MLflow and the person are
told).  See ``docs/architecture.md`` (the search layer).
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import optuna

from orchestrator.config.preflight import check_data_files
from orchestrator.config.prepare import validated
from orchestrator.config.schema import ConfigError
from orchestrator.interrupts import raise_pending_interrupt
from search.capacity import trial_needs
from search.liveness import DEFAULT_HEARTBEAT_S, DriverLife, StudyStore, request_key
from search.pool import Slots
from search.pruning import Pruning
from search.records import PendingTrial, RunningTrial, SearchSummary
from search.space import DEFAULT_TRIALS, SearchSpace
from search.study import completed_twin, config_key, create_or_load_study, grid_remaining
from search.study_book import StudyBook
from search.study_progress import restart_line
from search.study_storage import DEFAULT_STORAGE, describe_storage, open_storage
from search.targets import Targets
from search.trial_runs import RayTrialRuns, RunWatch, TrialRuns

if TYPE_CHECKING:
    from optuna import Study
    from optuna.storages import BaseStorage

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


class SearchInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM stopped the search once it ran trials: ``stopped`` of them were running
    (recorded FAIL, their configs queued again for the next run of the same command)."""

    def __init__(self, stopped: int):
        super().__init__(stopped)
        self.stopped = stopped


class SearchDriver:
    """Runs ``options.trials`` trials of ``space`` in ``study``, ``options.parallel`` at a time, on ``runs``
    (``RayTrialRuns`` unless a test gives another).

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
        runs: TrialRuns | None = None,
    ) -> None:
        self.space, self.study, self.opts = space, study, options
        self.runs: TrialRuns = runs if runs is not None else RayTrialRuns()
        self.targets = Targets(space, options.tracking_uri, storage_desc)
        self.pruning = Pruning(space, study, self.targets.base_batch)
        self.slots = Slots(options.parallel)
        self.life = DriverLife(StudyStore(study, storage) if storage is not None else None, options.heartbeat_s)
        self.book = StudyBook(space, study, self.targets, self.life, self.slots.running, self.pruning.objectives)

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
        self.book.recover(wait=True)  # the trials of a dead driver: FAIL, runs KILLED, configs queued again
        n_trials = self._trials_to_run()
        self.life.start_beating()
        status = "FAILED"
        try:
            self.runs.connect(self.opts.verbose, self.targets.runtime_env)
        except BaseException:
            self.life.end(done=False)  # a re-run of the command takes it over at once
            raise
        try:
            self.slots.capacity = self.runs.capacity()
            self.book.open(n_trials, self.opts.progress)
            self._loop(n_trials, t0)
            status = "FINISHED"
        except KeyboardInterrupt:
            status = "KILLED"
            raise SearchInterrupted(self._abort("interrupted (Ctrl-C)")) from None
        except BaseException:
            self._abort("the search driver failed")
            raise
        finally:
            self._close(status, time.time() - t0)
        return self.book.summary(time.time() - t0)

    def _trials_to_run(self) -> int:
        """Called by ``run`` after the recovery: ``--trials`` (default ``DEFAULT_TRIALS``), and with
        the grid sampler never more than the grid points the study has not tried.  A re-run of a
        command whose driver died takes its request over and runs only what is left of it
        (``liveness.start_invocation``)."""
        n_trials = self.opts.trials
        remaining_grid = grid_remaining(self.study, self.space)
        if remaining_grid is not None:
            n_trials = remaining_grid if n_trials is None else min(n_trials, remaining_grid)
            if remaining_grid == 0:
                self.book.write(
                    f"the grid is done: all {self.space.grid_size()} points of study "
                    f"{self.study.study_name!r} have been tried"
                )
        n = DEFAULT_TRIALS if n_trials is None else n_trials
        taken = self.life.begin(request_key(self.space.text, self.opts.trials), n, say=self.book.write)
        inv = self.life.invocation
        if taken is None or inv is None:
            return n
        left = inv.left()
        if remaining_grid is not None:
            left = min(left, remaining_grid)
        self.book.write(
            f"continuing the same command of a driver that died: {inv.total - left} of its "
            f"{inv.total} trials were evaluated, {left} left"
        )
        return left

    def _loop(self, n_trials: int, t0: float) -> None:
        """Called by ``run`` once Ray is up: each turn asks trials into the free slot, settles a
        waiting duplicate, launches the pending trial if it fits, else watches the running trials for
        ``POLL_S``; ends when nothing runs and nothing is left to ask (or ``--timeout`` stopped the asking)."""
        self.slots.to_ask, self.slots.pending = n_trials, None
        timed_out = False
        while True:
            raise_pending_interrupt()  # a SIGTERM whose KeyboardInterrupt a garbage collection swallowed
            timed_out = self.opts.timeout_s is not None and time.time() - t0 >= self.opts.timeout_s
            self._ask_into_free_slot(timed_out)
            if self._settle_twin() or self._launch_pending():
                continue
            if self._drained(timed_out):
                break
            self._watch()
        if timed_out and self.slots.to_ask > 0:
            self.book.write(f"--timeout reached: {self.slots.to_ask} trial(s) not started")

    def _close(self, status: str, wall_s: float) -> None:
        """Called by ``run`` at the end, whatever happened: the bar, the trials' runs, the heartbeat
        (the request is done unless the driver failed or was interrupted), the parent run, Ray
        (``TrialRuns.disconnect``)."""
        self.book.close_bar()
        self.runs.close()
        self.life.end(done=status == "FINISHED")  # an unfinished request is taken over at once by a re-run
        self.book.close_parent(status, wall_s)
        self.runs.disconnect()

    # -- the loop's steps --------------------------------------------------------------------------

    def _ask_into_free_slot(self, timed_out: bool) -> None:
        """Ask trials while none is pending, some are left to ask, the timeout has not passed and a
        slot is free; one that fails on the spot or repeats a completed config counts as asked."""
        slots = self.slots
        while slots.pending is None and slots.to_ask > 0 and not timed_out and slots.free:
            slots.to_ask -= 1
            slots.pending = self._ask()

    def _settle_twin(self) -> bool:
        """Once the running twin of the pending trial has ended: take its value if it completed (``True``:
        the slot is free again), else let the pending trial run (``False``)."""
        p = self.slots.pending
        if p is None or p.twin is None or p.twin in self.running:
            return False
        same = completed_twin(self.study, p.key)
        if same is not None:
            self.book.reuse(p.trial, p.values, same)
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
        self.book.refresh()
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
        done = self.runs.wait(self.running, POLL_S)
        self._poll()
        for n in [n for n in self.running if n in done]:
            self._finish(self.running.pop(n))
        if self.life.recovery_due():
            self.book.recover(wait=False)  # another driver of the study may have died meanwhile
        self.book.refresh()

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
            self.book.fail_early(trial, values, f"invalid config: {e}")
            return None
        key = config_key(cfg)
        trial.set_user_attr("config_key", key)
        twin = None
        if self.space.skip_duplicates:
            same = completed_twin(self.study, key)
            if same is not None:
                self.book.reuse(trial, values, same)
                return None
            twin = next((n for n, r in self.running.items() if r.key == key), None)
        return PendingTrial(trial, values, cfg, need, key, twin)

    def _launch(self, p: PendingTrial) -> None:
        """Start the pending trial's run, as a child of the parent run, and book its resources."""
        assert self.slots.capacity is not None
        tracker = self.book.tracker
        tags = tracker.child_tags(p.trial.number, p.values) if tracker else {}
        watch = RunWatch(self.pruning.metrics, self.pruning.judged_metrics, self.space.keep_checkpoints)
        r = self.runs.start(p, tracker.run_id if tracker else None, tags, watch)
        self.slots.capacity.take(p.need)
        self.running[p.trial.number] = r

    def _poll(self) -> None:
        """Relay the running trials' new objective values to the pruner, and its verdicts back to
        their runs (a condemned one stops; the others may go past their next evaluation)."""
        for n, info in self.runs.poll(self.running).items():
            r = self.running[n]
            if info["run_id"] and info["run_id"] != r.run_id:
                r.trial.set_user_attr("mlflow_run_id", info["run_id"])  # found again if this driver dies
            r.run_id = info["run_id"] or r.run_id
            for note in info.get("restarts", []):
                self.book.write(restart_line(n, note))  # a worker's node lost: the trial goes on
            verdict = self.pruning.verdict_for(r, info["values"])
            if verdict is not None:
                self.runs.send_verdict(r, verdict)

    def _finish(self, r: RunningTrial) -> None:
        """Called by ``_watch`` when a trial's run returned (or its actor died): reap its run, free its
        resources, and let the book tell the study, close its MLflow run and record it."""
        assert self.slots.capacity is not None
        res = self.runs.reap(r)
        self.slots.capacity.give(r.need)
        self.book.finished(r, res)

    def _abort(self, why: str) -> int:
        """Fail the trials still running or pending (the driver is going away): their MLflow runs end
        KILLED, their checkpoints go, their configs are queued again for the next ``run`` of the study
        (the same command then finishes its ``--trials``).  How many were running."""
        asked = [(r.trial, r.values, r.run_id) for r in self.running.values()]
        running = len(asked)
        p = self.slots.pending
        if p is not None:
            asked.append((p.trial, p.values, None))
        self.book.fail_asked(asked, why)
        self.running.clear()
        self.slots.pending = None
        return running


def run_search(space: SearchSpace, options: SearchOptions) -> SearchSummary:
    """Create or continue the study and run ``options.trials`` more trials.  The space is checked."""

    if not options.verbose:
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    storage = open_storage(options.storage, heartbeat_s=options.heartbeat_s)
    study = create_or_load_study(space, options.study_name, storage)
    return SearchDriver(space, study, options, describe_storage(options.storage), storage=storage).run()
