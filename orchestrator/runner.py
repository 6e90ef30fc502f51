"""The driver's entry point: start (or join) Ray, run training as phases of ``TorchTrainer.fit()``,
stream its metrics to MLflow and a progress bar, and close the run.

The phases: orchestrator/phases.py; the monitor actor's records reach MLflow and the bar through
orchestrator/listeners.py.

Also re-exported here for its callers: :func:`ensure_ray` (orchestrator/ray_env.py),
:func:`find_run` and :func:`write_run_info` (orchestrator/run_info.py), :class:`PhaseRunner`.
See ``docs/architecture.md``.
"""

from __future__ import annotations

import os
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

from orchestrator import command
from orchestrator.config import ConfigError, RootConfig
from orchestrator.history import earlier_timeline, resize_saver
from orchestrator.listeners import TimelineListener
from orchestrator.phases import POLL_S, PhaseRunner, resume_command
from orchestrator.reservations import TAG as RESERVATIONS_TAG
from orchestrator.reservations import release
from orchestrator.ray_env import ensure_ray, quiet_ray_env
from orchestrator.run_info import RUN_INFO, DriverLock, find_run, run_folder, write_run_info
from orchestrator.tracking import RunTracker, TrackingLost, unavailable
from orchestrator.uris import redact_text
from trainers.link import metrics as M
from trainers.link.messages import WorkloadFailed
from trainers.loop.storage import no_room

__all__ = ["POLL_S", "RUN_INFO", "Interrupted", "PhaseRunner", "RunSummary", "ensure_ray", "final_metrics",
           "find_run", "quiet_ray_env", "run_training", "write_run_info"]


@dataclass
class RunSummary:
    """What a finished (or failed) training run returns: its MLflow ids, status, steps, wall time,
    final metrics, where its checkpoints are, and its resizes (``ResizeRecord.as_dict`` each)."""

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
    resizes: list[dict[str, Any]] = field(default_factory=list)
    resizes_called_off: int = 0
    error: str | None = None  # why a FAILED run failed (one line)
    phases: list[dict[str, Any]] = field(default_factory=list)  # stretches of constant B and W (timeline.py)
    model_uri: str | None = None  # the logged MLflow PyTorch model
    registered: str | None = None  # "name/version" when registered (--register)


def final_metrics(tracker: RunTracker) -> dict[str, float]:
    out = {}
    for key in (M.TRAIN_LOSS, M.VAL_LOSS, M.VAL_ACCURACY, M.VAL_PERPLEXITY, M.SAMPLES_SEEN, M.TOKENS_SEEN, M.EPOCH):
        pts = tracker.history.get(key)
        if pts:
            out[key] = max(pts)[1]
    return out


class Interrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM stopped a run: its MLflow run ended KILLED with ``summary.error`` (how to
    continue it) as its ``elastic.failure`` tag; its checkpoints are kept."""

    def __init__(self, summary: RunSummary) -> None:
        super().__init__(summary.error)
        self.summary = summary


def interrupted_message(run_id: str, steps: int, checkpoint: int | None,
                        functions: dict[str, Callable[..., Any]] | None) -> str:
    """One line: where the run stopped (``steps`` logged, the newest ``checkpoint``'s step) and the
    command that continues it."""
    if checkpoint is None:
        return (f"stopped by Ctrl-C or SIGTERM after step {steps}, before its first checkpoint: "
                f"nothing to resume; train it anew")
    how = (f"from Python: fit(resume={run_id!r}, ...) with the same functions" if functions
           else f"{command.cli()} resume {run_id}")
    return (f"stopped by Ctrl-C or SIGTERM after step {steps}; it continues from its checkpoint at step "
            f"{checkpoint} with: {how}")


def _logged_steps(tracker: RunTracker) -> int:
    """The newest step whose training loss is logged."""
    return max((s for s, _ in tracker.history.get(M.TRAIN_LOSS, [])), default=0)


def _newest_checkpoint_step(runner: PhaseRunner | None) -> int | None:
    if runner is None:
        return None
    from trainers.loop.checkpoint import checkpoint_step, run_checkpoints

    try:
        found = run_checkpoints(runner.storage_path, runner.train_run_name)
    except OSError:
        return None
    return checkpoint_step(found[0]) if found else None


def _open_tracking_store(uri: str) -> None:
    """Import MLflow and, for a database store, create or migrate its schema (a server is not
    called here: one that does not answer would be retried twice as long)."""
    try:
        from mlflow.tracking import MlflowClient

        if uri.split(":", 1)[0].split("+", 1)[0] in ("sqlite", "postgresql", "mysql", "mssql"):
            MlflowClient(uri).search_experiments(max_results=1)
    except Exception:  # noqa: BLE001 - RunTracker reports a bad store with its own error
        pass


def _infeasible(cfg: RootConfig) -> str | None:
    """What the cluster can never give this run (GPUs, workers x CPUs), counting what an
    autoscaling cluster can grow to; None when it fits."""
    import ray

    from orchestrator.feasibility import autoscaler_max_resources, check_feasible

    return check_feasible(cfg, ray.cluster_resources(), autoscaler_max_resources())


def run_training(cfg: RootConfig, verbose: bool = False, progress: bool = True,
                 parent_run_id: str | None = None, tags: dict[str, str] | None = None,
                 on_start: Callable[[PhaseRunner], None] | None = None,
                 on_records: Callable[[list], None] | None = None,
                 t_invoked: float | None = None, resume_run_id: str | None = None,
                 driver_lock: DriverLock | None = None,
                 functions: dict[str, Callable[..., Any]] | None = None,
                 register_model: str | None = None) -> RunSummary:
    """Train ``cfg`` on Ray, tracked in MLflow.  The config is already validated.

    ``functions``: factories sent by value (``fit()`` with a lambda or a ``__main__`` function;
    trainers/workload/build.py), passed to the workers in their payload.  Factories' packages that are
    not installed are shipped to the workers (orchestrator/code.py).

    With ``resume_run_id``, continue that MLflow run from its latest checkpoint: same run,
    steps continue, nothing already logged is logged again.

    The final model is logged as an MLflow PyTorch model; ``register_model`` also registers it under
    that name in the model registry."""
    t0 = t_invoked or time.time()
    # Import MLflow and open its store (a fresh SQLite file takes seconds of schema migrations)
    # while Ray starts; the run itself is created once Ray is up.
    warm = threading.Thread(target=_open_tracking_store, args=(cfg.tracking.resolved_uri(),), daemon=True)
    warm.start()
    from orchestrator.code import runtime_env

    started_ray = ensure_ray(verbose, runtime_env=runtime_env(cfg))
    warm.join()
    why = _infeasible(cfg)
    if why:  # before any MLflow run exists: Ray Train would wait for these resources forever
        if started_ray and not os.environ.get("ELASTIC_KEEP_RAY"):
            import ray

            ray.shutdown()
        raise ConfigError(why)
    tracker = RunTracker(cfg, run_id=resume_run_id, parent_run_id=parent_run_id, tags=tags)
    status, lock, runner, interrupted = "FAILED", driver_lock, None, None
    failed: str | None = None  # why the run ended FAILED on the driver's side (tracking lost, a full disk)
    timeline = TimelineListener()
    try:  # from here on every failure ends the MLflow run with a status (FAILED, KILLED)
        runner = PhaseRunner(cfg, tracker, verbose=verbose, progress=progress, on_records=on_records,
                             functions=functions)
        if resume_run_id:  # the timeline, elastic.resizes and the summary cover every driver of the run
            timeline.timeline = earlier_timeline(tracker.client, tracker.run_id)
        timeline.on_resize = resize_saver(tracker.log_text, runner.progress.write)
        runner.listeners.append(timeline)
        if resume_run_id:
            tracker.set_running()
        tracker.start_system_metrics(resume=bool(resume_run_id))
        runner.t_start = t0
        tracker.set_tags({"elastic.train_run_name": runner.train_run_name,
                          "elastic.storage_path": runner.storage_path})
        if resume_run_id:
            earlier = tracker.client.get_run(tracker.run_id).data.tags
            runner.tracking.continue_from(earlier)
            runner.resumes = int(earlier.get("elastic.resumes", "0")) + 1
            runner.names.ray_train_runs = earlier.get(RESERVATIONS_TAG, "")
            tracker.set_tags({"elastic.resumes": runner.resumes})
        # One driver per run at a time (a resume acquired it before Ray started: see cli.cmd_resume)
        lock = lock or DriverLock(run_folder(runner.storage_path, runner.train_run_name)).acquire(tracker.run_id)
        if resume_run_id:  # no other driver of the run is alive: its groups' reservations in Ray are stale
            release(runner.names.ray_train_runs)
        write_run_info(runner, cfg)
        if on_start:
            on_start(runner)
        try:
            runner.run()
        except Exception as e:  # not the user's code (that is runner.user_error): recorded, then raised as before
            _record_failure(tracker, f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:300]}",
                            "".join(traceback.format_exception(type(e), e, e.__traceback__)))
            raise
        tracker.release_held()
        lost = runner.tracking_lost or tracker.await_store()  # a server away at the end: wait for it, bounded
        if lost is not None:
            return _summary(tracker, runner, "FAILED", t0, _lost_message(tracker, runner, lost, functions), timeline)
        tracker.log_timeline(timeline.timeline)
        if runner.user_error is not None:  # the user's code raised on a worker: one line, the traceback logged
            error = user_error_message(runner.user_error)
            _record_failure(tracker, error, runner.user_error.traceback)
            return _summary(tracker, runner, "FAILED", t0, error, timeline)
        if runner.diverged is not None or runner.failure is not None:
            # FAILED, no final model logged, the checkpoints kept (a diverged run's last finite one)
            error = runner.diverged.message if runner.diverged is not None else runner.failure
            tracker.set_tags({"elastic.failure": error})
            return _summary(tracker, runner, "FAILED", t0, error, timeline)
        status = "FINISHED"
        tracker.clear_failure()
        tracker.set_tags({"elastic.final_workers": int(tracker.last_value(M.WORKERS, 0)),
                          "elastic.resizes": len(timeline.timeline.resizes)})
        tracker.log_plots()
        from trainers.loop.checkpoint import load_newest_checkpoint

        payload = load_newest_checkpoint(runner.storage_path, runner.train_run_name, "cpu",
                                         warn=runner.progress.write)
        model_uri = registered = None
        if payload is not None:
            model_uri, registered = tracker.log_model(payload["model"], cfg, functions, register_model,
                                                      warn=runner.progress.write)
    except Exception as e:
        if runner is None or not (_tracking_gone(e) or no_room(e)):
            raise
        # The tracking server went away while the run was closed (its training is all recorded), or
        # a disk the driver writes to is full: one line, the resume command, no traceback.
        failed = _driver_failure(tracker, runner, e, functions)
    except KeyboardInterrupt:
        status = "KILLED"
        interrupted = interrupted_message(tracker.run_id, _logged_steps(tracker), _newest_checkpoint_step(runner),
                                          functions)
        try:
            tracker.set_tags({"elastic.failure": interrupted})
        except Exception:  # noqa: BLE001 - the run still ends KILLED below
            pass
    finally:
        _write_note(tracker, cfg, status, runner)
        try:
            tracker.end(status)
        except Exception:  # noqa: BLE001 - the store itself is on the full disk: the message says so
            if failed is None:
                raise
        if lock is not None:
            lock.release()
        if started_ray and not os.environ.get("ELASTIC_KEEP_RAY"):
            import ray

            ray.shutdown()
    if interrupted is not None:
        raise Interrupted(_summary(tracker, runner, status, t0, interrupted, timeline)) from None
    if failed is not None:
        return _summary(tracker, runner, "FAILED", t0, failed, timeline)
    summary = _summary(tracker, runner, status, t0, timeline=timeline)
    summary.model_uri, summary.registered = model_uri, registered
    return summary


TRACEBACK_ARTIFACT = "failure/traceback.txt"


def user_error_message(ev: WorkloadFailed) -> str:
    """One line for a run the user's code ended: where, what, why it was not retried, where the
    traceback is."""
    why = "not retried: a restart would meet it again" if ev.deterministic else "met again after a restart"
    return f"{ev.message} (rank {ev.rank}; {why}; full traceback: artifact {TRACEBACK_ARTIFACT} of the run)"


def _record_failure(tracker: RunTracker, error: str, text: str) -> None:
    """The failure on the MLflow run: the tag ``elastic.failure`` and the traceback artifact."""
    try:
        tracker.set_tags({"elastic.failure": error})
        tracker.log_text(redact_text(text), TRACEBACK_ARTIFACT)
    except Exception:  # noqa: BLE001 - the run still ends FAILED
        pass


def _tracking_gone(e: BaseException) -> bool:
    """An MLflow call that found the tracking server gone (not a worker's lost connection, which
    reaches the driver inside Ray Train's own errors)."""
    from mlflow.exceptions import MlflowException

    return isinstance(e, MlflowException) and unavailable(e)


def _lost_message(tracker: RunTracker, runner: PhaseRunner, lost: TrackingLost,
                  functions: dict[str, Callable[..., Any]] | None) -> str:
    """The tracking server stayed away: what was not recorded, where the checkpoints are, how to go on."""
    from trainers.loop.storage import join

    newest = _newest_checkpoint_step(runner)
    where = join(runner.storage_path, runner.train_run_name)
    where += f" (newest at step {newest})" if newest is not None else " (none written yet)"
    return tracker.lost_message(lost, max(tracker.newest_step, 0), where,
                                resume_command(tracker.run_id, tracker.uri, functions))


def _driver_failure(tracker: RunTracker, runner: PhaseRunner, e: Exception,
                    functions: dict[str, Callable[..., Any]] | None) -> str:
    """One line for a failure on the driver's side that a retry cannot cure: the tracking server
    gone while the run was being closed, or a full disk (``elastic_run.json``, MLflow artifacts).
    The run is marked FAILED with it where the store still answers."""
    from orchestrator.tracking import _short_error
    from trainers.loop.storage import StorageFull

    full = no_room(e)
    if full is None:  # the tracking server stopped answering after training (all of it recorded)
        tracker.lost = True
        lost = TrackingLost(f"the tracking server {redact_text(tracker.uri)} stopped answering while the run was "
                            f"being closed ({_short_error(e)})")
        return _lost_message(tracker, runner, lost, functions)
    path = full.filename if isinstance(full.filename, str) else runner.storage_path
    what = "checkpoint" if path.startswith(runner.storage_path) else "driver's"
    err = StorageFull.from_error(path, full, what=what)
    message = f"{err.message}; {err.fix}, then: {resume_command(tracker.run_id, tracker.uri, functions)}"
    try:
        tracker.set_tags({"elastic.failure": message})
    except Exception:  # noqa: BLE001 - the tracking store may be on the same full disk
        pass
    return message


def _write_note(tracker: RunTracker, cfg: RootConfig, status: str, runner: PhaseRunner | None) -> None:
    """The run's description in MLflow (orchestrator/note.py), rewritten by every driver of the run."""
    from orchestrator.note import NOTE_TAG, changes, describe

    try:
        tracker.release_held()  # the newest point of every piecewise series, B and W included
        resizes = len(changes(tracker.history.get(M.RESIZE_TO, [])))  # each resize changes resize/to
        tracker.set_tags({NOTE_TAG: describe(cfg, tracker.history, status, resizes=resizes,
                                             resumes=runner.resumes if runner is not None else 0)})
    except Exception:  # noqa: BLE001 - a description must never fail a run (a store that does not answer)
        pass


def _summary(tracker: RunTracker, runner: PhaseRunner | None, status: str, t0: float, error: str | None = None,
             timeline: TimelineListener | None = None) -> RunSummary:
    """``runner`` is None only when the run was interrupted before its runner existed."""
    summary = RunSummary(run_id=tracker.run_id, tracking_uri=tracker.uri, experiment_id=tracker.experiment_id,
                         status=status, steps=_logged_steps(tracker), wall_s=time.time() - t0, final=final_metrics(tracker),
                         error=error, phases=timeline.timeline.rows() if timeline else [])
    if runner is not None:
        summary.storage_path, summary.train_run_name = runner.storage_path, runner.train_run_name
        summary.first_step_s = runner.first_step_s()
        summary.resizes = timeline.timeline.resizes if timeline else runner.resizes  # every driver's
        summary.resizes_called_off = runner.tracking.called_off  # every driver's
    return summary
