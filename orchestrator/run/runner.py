"""The driver's entry point: start (or join) Ray, run training as phases of ``TorchTrainer.fit()``,
stream its metrics to MLflow and a progress bar, and close the run.

:func:`run_training` is open, run, close: :meth:`_Driver.open` reads once what a resumed run brings
(:class:`RunStart`) and builds the :class:`PhaseRunner`; the runner steps its states to a terminal
one (orchestrator/run/phases.py); :meth:`_Driver.close` and :meth:`_Driver.end` record what that end
leaves and close the MLflow run with what orchestrator/run/outcome.py says it means.  The phases'
records reach MLflow and the bar through orchestrator/record/listeners.py.

Also re-exported here for its callers: :func:`ensure_ray` (orchestrator/run/ray_env.py),
:func:`find_run` and :func:`write_run_info` (orchestrator/run/run_info.py), :class:`PhaseRunner`.
See ``docs/architecture.md``.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import ray
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from orchestrator.config.code import runtime_env
from orchestrator.config.feasibility import judge
from orchestrator.config.schema import ConfigError, RootConfig, ScalingConfig
from orchestrator.config.uris import redact_text
from orchestrator.interrupts import deferred_interrupts
from orchestrator.record.history import drain_saver, holds_saver, resize_saver
from orchestrator.record.listeners import RecordsCallback, TimelineListener
from orchestrator.record.model_log import seeded_workload
from orchestrator.record.params import ConfigRecord
from orchestrator.record.progress_bar import Progress
from orchestrator.record.run_tracker import RunTracker, TrackingLost
from orchestrator.record.run_writer import short_error, unavailable
from orchestrator.run.autoscaling import NodeSupply
from orchestrator.run.cluster_limits import ClusterLimits, read_limits
from orchestrator.run.outcome import (
    TRACEBACK_ARTIFACT,
    DriverFailed,
    Finished,
    Interrupted,
    Outcome,
    OutOfStorage,
    RayTrainFailed,
    Resume,
    Stopped,
    TrackingGone,
    ending,
)
from orchestrator.run.phases import POLL_S, PhaseRunner
from orchestrator.run.ray_env import ensure_ray, quiet_ray_env, stop_ray
from orchestrator.run.reservations import release
from orchestrator.run.run_books import GroupPlan, RunStart
from orchestrator.run.run_info import RUN_INFO, DriverLock, find_run, write_run_info
from trainers.link import metrics as M
from trainers.link import tags as T
from trainers.loop.checkpoint import load_newest_checkpoint
from trainers.loop.storage import StorageFull, no_room
from trainers.policies.plan import workers_ahead

__all__ = [
    "POLL_S",
    "RUN_INFO",
    "PhaseRunner",
    "RunInterrupted",
    "RunOptions",
    "RunSummary",
    "ensure_ray",
    "find_run",
    "quiet_ray_env",
    "run_training",
    "write_run_info",
]


@dataclass
class RunSummary:
    """What a finished (or failed) training run returns: its MLflow ids, status, steps, wall time,
    final metrics, where its checkpoints are, and its resizes (``ResizeRecord.as_dict`` each);
    ``outcome``: the terminal state it ended in, ``exit_code`` the CLI's exit status for it
    (orchestrator/run/outcome.py)."""

    run_id: str
    tracking_uri: str
    experiment_id: str
    status: str
    steps: int
    wall_s: float
    final: dict[str, float] = field(default_factory=dict)
    storage_path: str = ""
    train_run_name: str = ""
    first_step_s: float | None = None
    start: dict[str, float] = field(default_factory=dict)  # where first_step_s went (EventBook.start_parts)
    resizes: list[dict[str, Any]] = field(default_factory=list)
    resizes_called_off: int = 0
    error: str | None = None  # why a FAILED run failed (one line)
    phases: list[dict[str, Any]] = field(default_factory=list)  # stretches of constant B and W (timeline.py)
    # what the run cost (every driver's worker groups, from each fit() call to its return: record/cost.py)
    worker_seconds: float = 0.0
    gpu_seconds: float | None = None  # where the workers held GPUs
    model_uri: str | None = None  # the logged MLflow PyTorch model
    registered: str | None = None  # "name/version" when registered (--register)
    exit_code: int = 0
    outcome: Outcome | None = None


@dataclass
class RunOptions:
    """What :func:`run_training` takes besides the config (as keyword arguments)."""

    verbose: bool = False  # Ray's own logs too
    progress: bool = True  # the progress bar
    parent_run_id: str | None = None  # the MLflow run to nest this one under (a search's study)
    tags: dict[str, str] | None = None  # the new MLflow run's tags
    on_start: Callable[[PhaseRunner], None] | None = None  # given the runner once the run is open
    on_records: Callable[[list], None] | None = None  # given each batch of step records
    on_event: Callable[[Any], None] | None = None  # given each event, the workers' and the driver's
    t_invoked: float | None = None  # when the command was invoked (the wall time counts from it)
    own_ray: bool = False  # the caller started Ray for this run (cli.py, while the driver loaded): stop it at the end
    t_launched: float | None = None  # when the caller began starting Ray for this run (RunSummary.start)
    resume_run_id: str | None = None  # continue this MLflow run from its newest checkpoint
    driver_lock: DriverLock | None = None  # the run's driver lock, held already (cli.cmd_resume)
    functions: dict[str, Callable[..., Any]] | None = None  # factories sent by value (fit())
    register_model: str | None = None  # register the final model under this name
    poll_s: float = POLL_S  # how often the monitor is drained (a search trial: more often, to prune sooner)
    judged: Sequence[str] = ()  # metrics whose values the driver judges (a search trial's pruning)


# the metrics whose last logged values a run's summary holds (RunSummary.final)
FINAL_METRICS = (M.TRAIN_LOSS, M.VAL_LOSS, M.VAL_ACCURACY, M.VAL_PERPLEXITY, M.SAMPLES_SEEN, M.TOKENS_SEEN, M.EPOCH)


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM stopped a run: its MLflow run ended KILLED with ``summary.error`` (how to
    continue it) as its ``elastic.failure`` tag; its checkpoints are kept."""

    def __init__(self, summary: RunSummary) -> None:
        super().__init__(summary.error)
        self.summary = summary


def run_training(cfg: RootConfig, **options: Any) -> RunSummary:
    """Train ``cfg`` on Ray, tracked in MLflow.  The config is already validated; ``options`` are
    :class:`RunOptions`' fields.

    ``functions``: factories sent by value (``fit()`` with a lambda or a ``__main__`` function;
    trainers/workload/build.py), passed to the workers in their payload.  Factories' packages that are
    not installed are shipped to the workers (orchestrator/config/code.py).

    With ``resume_run_id``, continue that MLflow run from its latest checkpoint: same run,
    steps continue, nothing already logged is logged again.

    The final model is logged as an MLflow PyTorch model; ``register_model`` also registers it under
    that name in the model registry.

    Every way the run ends is a terminal state (orchestrator/run/outcome.py), in ``summary.outcome``;
    Ctrl-C or SIGTERM raises :class:`RunInterrupted` with the summary, and an error that is not the
    user's goes on up once the MLflow run is closed FAILED."""
    opts = RunOptions(**options)
    launched = opts.t_launched or time.time()
    t0 = opts.t_invoked or launched
    # a cluster that can never hold the run is refused before anything else starts
    started_ray, limits = _start_ray(
        cfg.tracking.resolved_uri(), runtime_env(cfg), cfg.scaling, opts.verbose, opts.own_ray
    )
    ray_up = time.time()
    try:
        # the rest of the config read once, into what each part takes: the MLflow record, the groups'
        # plan, the nodes asked of an autoscaling cluster (none for a search's trial: the cluster keeps
        # one request, which one trial's would replace another's), the final model rebuilt to be logged
        record = ConfigRecord.from_config(cfg)
        plan = GroupPlan.from_config(cfg, opts.functions)
        ahead = partial(workers_ahead, cfg)
        nodes = NodeSupply(plan.scaling, limits, ahead=ahead) if opts.parent_run_id is None else None
        build_model = partial(seeded_workload, cfg, opts.functions)
        # the MLflow run exists from here: every way out closes it
        driver = _Driver(record, plan, opts, t0, nodes, build_model, (launched, ray_up))
        try:
            driver.open()
            end = driver.close(driver.runner.run())
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM (orchestrator/interrupts.py), wherever it came
            end = driver.interrupted()
        except Exception as e:
            end = driver.failed(e)
        summary = driver.end(end)
    finally:
        if started_ray:
            stop_ray()
    if isinstance(end, Interrupted):
        raise RunInterrupted(summary) from None
    if isinstance(end, (RayTrainFailed, DriverFailed)):  # recorded on the run; its traceback for the caller
        raise end.error
    return summary


def _start_ray(
    tracking_uri: str, code: dict[str, Any] | None, scaling: ScalingConfig, verbose: bool, own: bool = False
) -> tuple[bool, ClusterLimits]:
    """Start (or join) Ray, with the user's ``code`` for its workers (``config.code.runtime_env``),
    while the MLflow store at ``tracking_uri`` opens; refuse, before any MLflow run exists, a run
    whose ``scaling`` the cluster can never hold.  Whether this process started Ray (``own``: its
    caller did, for this run), and what the cluster's autoscaler may grow it to
    (orchestrator/run/cluster_limits.py)."""
    # Import MLflow and open its store (a fresh SQLite file takes seconds of schema migrations)
    # while Ray starts; the run itself is created once Ray is up.
    warm = threading.Thread(target=open_tracking_store, args=(tracking_uri,), daemon=True)
    warm.start()

    try:
        started = ensure_ray(verbose, runtime_env=code) or own
    finally:  # a stop while Ray starts waits for the store's schema: never cut mid-migration at exit
        with deferred_interrupts():
            warm.join()
    limits = read_limits()
    assumed, why = judge(scaling, ray.cluster_resources(), limits)
    if assumed is not None:  # an autoscaling cluster whose limits cannot be read is not refused
        print(f"note: {assumed}", file=sys.stderr, flush=True)
    if why:  # Ray Train would wait for these resources forever
        if started:
            stop_ray()
        raise ConfigError(why)
    return started, limits


class _Driver:
    """This driver's part of one training run, from the creation (or reopening) of its MLflow run
    to its end: :meth:`open`, then the runner's loop, :meth:`close`, :meth:`end`.  It never sees the
    config: what each part takes of it was read once by :func:`run_training`."""

    def __init__(
        self,
        record: ConfigRecord,
        plan: GroupPlan,
        opts: RunOptions,
        t0: float,
        nodes: NodeSupply | None = None,
        build_model: Callable[[], Any] | None = None,
        marks: tuple[float, float] | None = None,
    ) -> None:
        self.plan, self.opts, self.t0 = plan, opts, t0
        self.nodes = nodes or NodeSupply()  # the run's requests to an autoscaling cluster (none: a search's trial)
        self.build_model = build_model  # the final model's workload, rebuilt on the driver (record/model_log.py)
        self.marks = marks or (None, None)  # when training was called, when Ray was up (RunSummary.start)
        # no total until the workers' PhaseStart says how many samples their training set holds
        self.progress = Progress(None, enabled=opts.progress)
        # the tracking server's "does not answer" lines go under the bar, not through it
        self.tracker = RunTracker(
            record,
            run_id=opts.resume_run_id,
            parent_run_id=opts.parent_run_id,
            tags=opts.tags,
            warn=self.progress.write,
        )
        self.resume = Resume(self.tracker.run_id, self.tracker.uri, from_python=bool(opts.functions))
        self.lock = opts.driver_lock
        self.runner: PhaseRunner | None = None
        self.timeline = TimelineListener()
        self.model: tuple[str | None, str | None] = (None, None)  # the logged model's URI, its registered name

    def open(self) -> None:
        """Before training: what the run brings (read once), the runner built on it, the tags that
        find the run again, the driver lock, ``elastic_run.json``."""
        opts, tracker = self.opts, self.tracker
        start = read_start(tracker, self.t0, resumed=opts.resume_run_id is not None)
        progress = self.progress
        self.timeline = TimelineListener(
            start.timeline,
            on_resize=resize_saver(tracker.log_text, progress.write),
            on_holds=holds_saver(tracker.log_text, progress.write),
            on_drain=drain_saver(tracker.log_text, progress.write),
        )
        wanted = opts.on_records is not None or opts.on_event is not None
        listeners = [RecordsCallback(opts.on_records, opts.on_event)] if wanted else []
        self.runner = runner = PhaseRunner(
            self.plan,
            tracker,
            start,
            progress,
            [*listeners, self.timeline],
            poll_s=opts.poll_s,
            judged=opts.judged,
            nodes=self.nodes,
        )
        names = runner.names
        tracker.start(resumed=start.resumed)
        tracker.set_tags(
            {
                T.TRAIN_RUN_NAME: names.train_run_name,
                T.STORAGE_PATH: names.storage_path,
                **({T.RESUMES: names.resumes} if start.resumed else {}),
            }
        )
        # One driver per run at a time (a resume acquired it before Ray started: see cli.cmd_resume)
        self.lock = self.lock or DriverLock(names.folder).acquire(tracker.run_id)
        if start.resumed:  # no other driver of the run is alive: its groups' reservations in Ray are stale
            release(start.ray_train_runs)
        write_run_info(names.folder, tracker.run_id, tracker.uri, tracker.record.public)
        if opts.on_start:
            opts.on_start(runner)

    def interrupted(self) -> Interrupted:
        """Ctrl-C or SIGTERM: where the run stopped (the runner stopped its group at a checkpoint)."""
        newest = self.runner.names.newest_checkpoint_step() if self.runner is not None else None
        return Interrupted(steps=self.tracker.trained_steps, checkpoint=newest)

    def failed(self, e: Exception) -> Outcome:
        """The end an exception brought: the tracking server gone while the run was closed (its
        training all recorded), or a full disk the driver writes to (``elastic_run.json``, MLflow's
        artifacts), each one line with the resume command; else the driver's own error."""
        runner = self.runner
        if runner is None:
            return DriverFailed(e)
        if _tracking_gone(e):
            self.tracker.lost = True
            return runner.tracking_gone(
                TrackingLost(
                    f"the tracking server {redact_text(self.tracker.uri)} stopped answering while the run was being "
                    f"closed ({short_error(e)})"
                )
            )
        full = no_room(e)
        if full is not None:
            storage = runner.names.storage_path
            path = full.filename if isinstance(full.filename, str) else storage
            return OutOfStorage(
                StorageFull.from_error(path, full, what="checkpoint" if path.startswith(storage) else "driver's")
            )
        return DriverFailed(e)

    def close(self, end: Outcome) -> Outcome:
        """After training: what is left to record for ``end`` (the records held back, the timeline;
        a run that finished or stopped: its plots and final model, ``RunTracker.log_final_model``).
        A tracking server that is away now and stays away ends the run TrackingGone instead."""
        if isinstance(end, (TrackingGone, RayTrainFailed)):
            return end
        tracker, runner, timeline = self.tracker, self.runner, self.timeline.timeline
        lost = tracker.await_store()  # every held point; a server away at the end: wait for it, bounded
        if lost is not None:
            return runner.tracking_gone(lost)
        timeline.holds.close_open(time.time())  # a group called off and not waited for
        tracker.log_timeline(timeline)
        if isinstance(end, (Finished, Stopped)):
            warn, names = self.progress.write, runner.names
            payload = load_newest_checkpoint(names.storage_path, names.train_run_name, "cpu", warn=warn)
            state = payload["model"] if payload is not None else None
            resizes, register = len(timeline.resizes), self.opts.register_model
            self.model = tracker.log_final_model(state, self.build_model, resizes, register, warn=warn)
        return end

    def end(self, end: Outcome) -> RunSummary:
        """Close the MLflow run as ``end`` says (orchestrator/run/outcome.py; what the end leaves:
        ``RunTracker.end``), release the driver lock, and sum the run up."""
        tracker, runner, timeline = self.tracker, self.runner, self.timeline.timeline
        steps = tracker.trained_steps  # the training loss is logged as it comes, never held back
        said = ending(end, self.resume)
        timeline.holds.close_open(time.time())  # the groups this driver still holds end now
        cost = timeline.cost()
        if not tracker.lost:  # the holds, for a resume (they make its cost)
            with suppress(Exception):
                self.timeline.save_holds()
        try:
            tracker.end(
                said.status,
                failure={said.tag: said.message} if said.message is not None else None,
                texts={TRACEBACK_ARTIFACT: said.traceback} if said.message and said.traceback else None,
                cost=cost,
                resumes=runner.names.resumes if runner is not None else 0,
            )
        except Exception:  # the store is on the full disk, or gone: the message says so
            if not isinstance(end, (OutOfStorage, TrackingGone)):
                raise
        finally:
            if self.lock is not None:
                self.lock.release()
        history = tracker.history
        summary = RunSummary(
            run_id=tracker.run_id,
            tracking_uri=tracker.uri,
            experiment_id=tracker.experiment_id,
            status=said.status,
            steps=steps,
            wall_s=time.time() - self.t0,
            final={key: max(history[key])[1] for key in FINAL_METRICS if history.get(key)},
            error=said.message,
            phases=timeline.rows(),
            worker_seconds=cost.worker_s,
            gpu_seconds=cost.gpu_s if any(h.gpus for h in timeline.holds.snapshot()) else None,
            model_uri=self.model[0],
            registered=self.model[1],
            exit_code=said.exit_code,
            outcome=end,
        )
        if runner is not None:  # None only when the run ended before its runner existed
            summary.storage_path, summary.train_run_name = runner.names.storage_path, runner.names.train_run_name
            summary.first_step_s = runner.book.first_step_s()
            summary.start = runner.book.start_parts(*self.marks)
            summary.resizes = timeline.resizes  # every driver's
            summary.resizes_called_off = runner.tracking.called_off  # every driver's
        return summary


def read_start(tracker: RunTracker, t0: float, resumed: bool) -> RunStart:
    """What the run brings to this driver, read once: for a resumed run, what its earlier drivers
    left in MLflow (their tags, timeline, restarts and last worker count)."""
    if not resumed:
        return RunStart(t0=t0)
    tags, timeline = tracker.earlier_run()
    return RunStart(
        t0=t0,
        resumes=int(tags.get(T.RESUMES, "0")) + 1,
        ray_train_runs=tags.get(T.RAY_TRAIN_RUNS, ""),
        restarts=int(tracker.last_value(M.RESTARTS, 0)),
        workers=int(tracker.last_value(M.WORKERS, 0)),
        tags=dict(tags),
        timeline=timeline,
    )


def open_tracking_store(uri: str) -> None:
    """Import MLflow and, for a database store, create or migrate its schema (a server is not
    called here: one that does not answer would be retried twice as long)."""
    try:
        if uri.split(":", 1)[0].split("+", 1)[0] in ("sqlite", "postgresql", "mysql", "mssql"):
            MlflowClient(uri).search_experiments(max_results=1)
    except Exception:  # RunTracker reports a bad store with its own error
        pass


def _tracking_gone(e: BaseException) -> bool:
    """An MLflow call that found the tracking server gone (not a worker's lost connection, which
    reaches the driver inside Ray Train's own errors)."""

    return isinstance(e, MlflowException) and unavailable(e)
