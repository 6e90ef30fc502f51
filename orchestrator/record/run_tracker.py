"""MLflow run life: create the run (its source, params and config) or reopen it, hand what is logged
to the part that logs it, and close it with a status.

The parts, one job each: orchestrator/record/series.py (per-step metrics reduced to where they bend),
orchestrator/record/run_writer.py (rows and tags in batches, a tracking outage), orchestrator/record/plots.py
(the curves and the timeline), orchestrator/record/model_log.py (the final model, registered),
orchestrator/record/system_metrics.py (the driver's machine).  The params that apply:
orchestrator/record/params.py; the source is the git commit."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import suppress
from typing import Any

import mlflow
import yaml
from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient

from orchestrator.config.uris import experiment_artifact_location, mlflow_uri, redact_text, redact_uri
from orchestrator.interrupts import deferring
from orchestrator.record.checkpoint_models import CheckpointModels
from orchestrator.record.cost import Cost
from orchestrator.record.datasets import log_datasets
from orchestrator.record.history import earlier_timeline, logged_history
from orchestrator.record.model_log import ModelLogger
from orchestrator.record.note import changes, describe
from orchestrator.record.params import ConfigRecord
from orchestrator.record.plots import RunPlots
from orchestrator.record.run_writer import (
    RunWriter,
    TrackingLost,
    bound_http_requests,
)
from orchestrator.record.series import SeriesCompressor
from orchestrator.record.system_metrics import DriverSystemMetrics
from orchestrator.record.timeline import Timeline
from orchestrator.record.ui import open_experiment
from trainers.link import metrics as M
from trainers.link import tags as T

HOLD_S = 5.0  # a held point of a piecewise metric is logged at least this often, so the MLflow UI stays current
PROJECT_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", PROJECT_ROOT, *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def source_tags() -> dict[str, str]:
    """MLflow's source tags for the project's code: the git commit (and whether the checkout had
    uncommitted changes, ``elastic.git.dirty``), the remote when there is one, and the entry point
    (the script run, as MLflow itself records it, or this package's CLI).  Empty when the project
    is not a git checkout (an installed package)."""
    commit = _git("rev-parse", "HEAD")
    if not commit:
        return {}
    script = os.path.abspath(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    if not os.path.isfile(script) or os.sep + "ray" + os.sep in script:  # a Ray worker (a search's trial)
        script = os.path.join(PROJECT_ROOT, "orchestrator", "__main__.py")
    tags = {
        "mlflow.source.git.commit": commit,
        "mlflow.source.name": script,
        "mlflow.source.type": "LOCAL",
        T.GIT_DIRTY: str(bool(_git("status", "--porcelain", "--untracked-files=no"))).lower(),
    }
    remote = _git("remote", "get-url", "origin")
    if remote:
        tags["mlflow.source.git.repoURL"] = redact_uri(remote)
    return tags


class RunTracker:
    """One training's MLflow run: open it (new or resumed) and hand each kind of logging to its part.

    ``series`` (:class:`~orchestrator.record.series.SeriesCompressor`) picks the metric points, ``writer``
    (:class:`~orchestrator.record.run_writer.RunWriter`) writes them and the tags, through an outage too,
    ``system`` (:class:`~orchestrator.record.system_metrics.DriverSystemMetrics`) samples the driver's
    machine; the plots and the final model are logged by :class:`~orchestrator.record.plots.RunPlots` and
    :class:`~orchestrator.record.model_log.ModelLogger`.  ``uri``: the tracking URI as given (its
    credentials, redacted, tell resume to ask again); MLflow itself sees it without a password."""

    def __init__(
        self,
        record: ConfigRecord,
        run_id: str | None = None,
        parent_run_id: str | None = None,
        tags: dict[str, str] | None = None,
        warn: Callable[[str], None] | None = None,
    ):
        """Open the MLflow run (``run_id``: reopen it) with what ``record`` read of the config once
        (orchestrator/record/params.py); a new run logs its params, ``config.yaml`` and datasets."""
        self.uri = record.uri
        seen_by_mlflow = mlflow_uri(self.uri)  # never a password (MLflow prints its URI)
        mlflow.set_tracking_uri(seen_by_mlflow)
        client = deferring(MlflowClient(seen_by_mlflow))  # a stop never lands inside a store's transaction
        bound_http_requests(seen_by_mlflow)
        if run_id is None:
            # a new experiment's artifacts beside the store (not in ./mlruns of the current folder);
            # MLflow's UI opens it in the model-training view
            location = experiment_artifact_location(self.uri, record.experiment)
            self.experiment_id = open_experiment(client, record.experiment, location)
            all_tags = {**source_tags(), **(tags or {})}
            if parent_run_id:
                all_tags["mlflow.parentRunId"] = parent_run_id
            run = client.create_run(self.experiment_id, run_name=record.run_name, tags=all_tags)
        else:
            run = client.get_run(run_id)
            self.experiment_id = run.info.experiment_id
        self.record = record
        self.client, self.run_id = client, run.info.run_id
        if run_id is None:
            # a new run: the params a reviewer compares (only the fields this run reads), the whole
            # config as config.yaml (credentials in the tracking URI never logged), "Datasets used"
            params = [Param(k, str(v)[:6000]) for k, v in sorted(record.params.items())]
            for i in range(0, len(params), 90):
                client.log_batch(self.run_id, params=params[i : i + 90])
            client.log_text(self.run_id, yaml.safe_dump(record.public, sort_keys=False), "config.yaml")
            log_datasets(client, self.run_id, record.datasets)
        # a resumed run: what is already logged, so that nothing is logged twice
        logged = logged_history(client, self.run_id) if run_id is not None else {}
        self.series = SeriesCompressor()
        self.series.restore({key: [(m.step, m.value) for m in rows] for key, rows in logged.items()})
        # warn: where the outage's lines go (under the progress bar while one shows)
        self.writer = RunWriter(client, self.run_id, self.uri, record.outage_timeout_s, warn)
        # the LoggedModels of the run's checkpoints (their linked rows after the writer's buffered ones)
        self.checkpoints = CheckpointModels(client, self.run_id, self.experiment_id, self.writer.flush, logged)
        # a search's trial samples its own machine only (its study's trials share the nodes)
        self.system = DriverSystemMetrics(run.info.run_id, seen_by_mlflow, nodes=parent_run_id is None)
        self.writer.on_back = self.system.revive  # its thread ended at the outage's first failed call
        self._released = time.monotonic()  # the held points were last logged (HOLD_S)

    def log_text(self, text: str, name: str) -> None:
        self.client.log_text(self.run_id, text, name)

    def earlier_run(self) -> tuple[dict[str, str], Timeline]:
        """What a resumed run's earlier drivers left: its tags as the store holds them, and its
        timeline (orchestrator/record/history.py)."""
        return dict(self.client.get_run(self.run_id).data.tags), earlier_timeline(self.client, self.run_id)

    # -- what is logged so far ----------------------------------------------------------------

    @property
    def history(self) -> dict[str, list[tuple[int, float]]]:
        """Every metric's logged points so far, ``(step, value)`` by key (a resumed run's included)."""
        return self.series.history

    @property
    def trained_steps(self) -> int:
        """The newest step whose training loss is logged (0: none; a resumed run's included)."""
        return trained_steps(self.series.history)

    @property
    def newest_step(self) -> int:
        """The newest step any record reached (-1: none yet)."""
        return self.series.newest_step

    @property
    def written_upto(self) -> int:
        """Every step record up to this step is in the store (what the driver acks to rank 0)."""
        return self.writer.written_upto

    @property
    def lost(self) -> bool:
        """The store stayed away too long: nothing more is written, and :meth:`end` leaves the run as
        it is.  Set by the driver that found the store gone itself."""
        return self.writer.lost

    @lost.setter
    def lost(self, gone: bool) -> None:
        self.writer.lost = gone

    # -- metrics -----------------------------------------------------------------------

    def log_metrics(self, records: list[tuple], flush: bool = False) -> None:
        """Log per-step records ``(step, metrics, time)``: the points that keep each series exact
        (:class:`~orchestrator.record.series.SeriesCompressor`; a held point at least every :data:`HOLD_S`
        and at the end), each row stamped with when its step ran (without a
        time, when it is logged).  Rows are written about every
        :data:`~orchestrator.record.run_writer.FLUSH_S` (or now, with ``flush``); :attr:`written_upto`
        says up to which step every record is written."""
        self.writer.cover(records)
        self.writer.add_points(self.series.add(records, time.time()))
        if time.monotonic() - self._released >= HOLD_S:
            self._release_held()
        elif flush or self.writer.due():
            self.writer.flush()

    def _release_held(self) -> None:
        """Log every piecewise metric's newest point and write every row (the UI catches up; at
        the end of a run)."""
        self._released = time.monotonic()
        self.writer.add_points(self.series.release(time.time()))
        self.writer.flush()

    def flush(self, force: bool = False) -> None:
        """Write the buffered rows and tags (:meth:`orchestrator.record.run_writer.RunWriter.flush`)."""
        self.writer.flush(force)

    def last_value(self, key: str, default: float = 0.0) -> float:
        return self.series.last_value(key, default)

    def log_rows(self, rows: list[Any]) -> None:
        """MLflow ``Metric`` rows as they are (two at one step stay two)."""
        self.writer.log_rows(rows)

    def set_tags(self, tags: dict[str, Any]) -> None:
        """Tags, any credential redacted; kept through an outage."""
        self.writer.set_tags(tags)

    # -- a tracking store that does not answer (the writer's) -------------------------------------

    def outage_expired(self) -> TrackingLost | None:
        """The error to stop the run with, once the store has stayed away too long (else None)."""
        return self.writer.outage_expired()

    def await_store(self) -> TrackingLost | None:
        """At the end of training: every held point, then wait (bounded) for the store to take it all."""
        self._release_held()
        return self.writer.await_store()

    def lost_message(self, lost: TrackingLost, stopped_at: int, checkpoints: str, resume: str) -> str:
        """One line for a run whose tracking store stayed away (:meth:`RunWriter.lost_message`)."""
        return self.writer.lost_message(lost, stopped_at, checkpoints, resume)

    # -- artifacts -----------------------------------------------------------------------

    def log_timeline(self, timeline: Any) -> None:
        """``timeline.json`` and ``plots/timeline.png`` (:meth:`RunPlots.timeline`)."""
        RunPlots(self.client, self.run_id).timeline(timeline)

    def log_final_model(
        self,
        state: dict[str, Any] | None,
        build: Callable[[], Any],
        resizes: int,
        register: str | None = None,
        warn: Any = print,
    ) -> tuple[str | None, str | None]:
        """A run that reached its planned end: no earlier driver's failure on it, its final worker
        count and its ``resizes`` as tags, its curves, and its final model: the weights ``state``
        (its newest checkpoint's) and the MLflow model at the newest step, rebuilt by ``build``
        (:func:`~orchestrator.record.model_log.seeded_workload`), registered under ``register`` or
        ``tracking.register_model`` (:meth:`ModelLogger.log`).  Its URI and registered version."""
        if T.FAILURE in self.client.get_run(self.run_id).data.tags:
            self.client.delete_tag(self.run_id, T.FAILURE)
        self.set_tags({T.FINAL_WORKERS: int(self.last_value(M.WORKERS, 0)), T.RESIZES: resizes})
        RunPlots(self.client, self.run_id).curves(self.series.history)
        if state is None:
            return None, None
        record = self.record
        models = ModelLogger(self.client, self.run_id, self.experiment_id, self.set_tags)
        register = register or record.register_model
        step = max(self.newest_step, 0)
        return models.log(state, build, record.public, register, record.register_pick, warn, step=step)

    # -- training starts on this driver ----------------------------------------------------------

    def start(self, resumed: bool = False) -> bool:
        """Training starts on this driver: a resumed run is RUNNING again, and the driver's machine
        is sampled as ``system/<metric>`` (:class:`DriverSystemMetrics`; False: not sampled)."""
        if resumed:
            self.client.update_run(self.run_id, status="RUNNING")
        return self.system.start(resumed)

    # -- the run's status ------------------------------------------------------------------------

    def end(
        self,
        status: str = "FINISHED",
        failure: dict[str, str] | None = None,
        texts: dict[str, str] | None = None,
        cost: Cost | None = None,
        resumes: int = 0,
    ) -> None:
        """Close the run with ``status``; a run whose store stayed away (:attr:`lost`) is left as it
        is (RUNNING), for ``resume`` to go on with.

        First what the end leaves, each write tried alone (the run still ends with its status where
        one fails: a store on a full disk): ``failure`` (its one line as a tag: ``elastic.failure``,
        or a drain of the driver's node's own) with ``texts`` (artifact name -> text: a traceback,
        redacted); with ``cost`` (the driver's end), what the run cost (every driver's groups,
        orchestrator/record/cost.py: ``cost/worker_seconds``, and ``cost/gpu_seconds`` where workers
        held GPUs, at the last step) and the run's description (orchestrator/record/note.py: its
        B and W, its ``resumes``)."""
        if failure:
            with suppress(Exception):
                self.set_tags(failure)
                for name, text in (texts or {}).items():
                    self.log_text(redact_text(text), name)
        if cost is not None:
            self._log_cost(cost)
        self.system.stop(lost=self.writer.lost)
        if self.writer.lost:
            return
        self._release_held()  # the newest point of every piecewise series, B and W included
        if cost is not None:
            with suppress(Exception):  # a description must never fail a run (a store that does not answer)
                history = self.series.history
                resizes = len(changes(history.get(M.RESIZE_TO, [])))  # each resize changes resize/to
                note = describe(self.record.public, history, status, resizes=resizes, resumes=resumes, cost=cost)
                self.set_tags({T.NOTE: note})
        self.writer.close(status)

    def _log_cost(self, cost: Cost) -> None:
        """The run's cost as rows at the last step; a later driver that ends at the same step (a resume
        with nothing left to train) logs its total at the next free step: no (metric, step) twice."""
        if self.writer.lost:  # nothing reaches the store now
            return
        with suppress(Exception):
            step, ms = cost_step(self.series.history), int(time.time() * 1000)
            rows = [Metric(M.COST_WORKER_SECONDS, cost.worker_s, ms, step)]
            if cost.gpu_s:
                rows.append(Metric(M.COST_GPU_SECONDS, cost.gpu_s, ms, step))
            self.log_rows(rows)


def trained_steps(history: dict[str, list[tuple[int, float]]]) -> int:
    """The newest step whose training loss is in ``history`` (0: none)."""
    return max((s for s, _ in history.get(M.TRAIN_LOSS, [])), default=0)


def cost_step(history: dict[str, list[tuple[int, float]]]) -> int:
    """The step the run's cost is logged at: the last trained one, or past the steps an earlier
    driver of the run already logged its cost at."""
    step = trained_steps(history)
    taken = {s for key in (M.COST_WORKER_SECONDS, M.COST_GPU_SECONDS) for s, _ in history.get(key, [])}
    while step in taken:
        step += 1
    return step
