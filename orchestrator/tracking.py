"""MLflow run life: create the run, log what applies to it (params, config, source, metrics, system
metrics, plots, timeline, the final model), and close it with a status.

The params that apply: orchestrator/params.py; each (metric, step) is logged once; the source is the
git commit; the timeline: orchestrator/timeline.py; the final model is an MLflow PyTorch model with a
signature, optionally registered."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from typing import Any

import yaml

from orchestrator.config import RootConfig, public_config
from orchestrator.note import changes as resize_steps  # resize/to changes at each resize (its stretch's end repeats it)
from orchestrator.ui import experiment_id
from orchestrator.uris import mlflow_uri, redact_text
from trainers.link import metrics as M

MAX_BATCH = 900  # MLflow's log_batch takes at most 1000 metrics per call
# Metrics whose per-step series is piecewise linear (constant for long stretches, or growing by
# the same amount every step): logged only where the series bends (see RunTracker.log_metrics),
# with the tolerance a dropped point may miss the line by, relative to its value.
PIECEWISE = {M.LR: 0.0, M.WEIGHT_DECAY: 0.0, M.MF: 0.0, M.BATCH_GLOBAL: 0.0, M.BATCH_SAMPLES: 0.0, M.BATCH_LOCAL: 0.0, M.BATCH_ACCUM_STEPS: 0.0,
             M.WORKERS: 0.0, M.SAMPLES_SEEN: 0.0, M.EPOCH: 1e-12}
PIECEWISE.update({M.COMBINE_SYNCS: 0.0, M.COMBINE_BYTES_SENT: 0.0, M.COMBINE_BYTES_SAVED: 0.0})  # change at syncs
# Of those, the step functions (a value kept for a stretch, then a jump): a jump's first point is
# logged at once, not held, so every step up to what the driver acks can be read back exactly after
# the driver dies (a resumed run's timeline: orchestrator/history.py).
STEPWISE = frozenset({M.BATCH_GLOBAL, M.WORKERS, M.BATCH_SAMPLES})
HOLD_S = 5.0  # a held point is logged at least this often, so the MLflow UI stays current
# Rows are written in batches about this often: a MLflow (SQLite) call costs the driver ~4 ms of CPU
# plus ~0.1 ms a row, and at hundreds of steps a second that CPU is taken from the training workers.
FLUSH_S = 2.0
SYSTEM_EVERY_S = 5.0  # seconds between the driver's system-metrics samples (MLflow's monitor)
# While the tracking store does not answer, the buffered rows are tried again this often (each try
# is one bounded request: HTTP_LIMITS); training goes on meanwhile (tracking.outage_timeout_s).
RETRY_S = 5.0
# Bounds on each request to a tracking server, unless the environment sets them: MLflow's own
# defaults (7 retries with backoff, 120 s timeout) hold one call for about 4 minutes, and the
# driver, which also relays resizes and the progress bar, must not stand still that long; the
# tracker retries on its own (RETRY_S) for as long as tracking.outage_timeout_s allows.
HTTP_LIMITS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
               "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}
MODEL_NAME = "final_model"  # the MLflow Model's name (the run's artifact "model/" holds the raw state dict)
EXAMPLE_ROWS = 4  # validation samples in the logged model's input example
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
    tags = {"mlflow.source.git.commit": commit, "mlflow.source.name": script, "mlflow.source.type": "LOCAL",
            "elastic.git.dirty": str(bool(_git("status", "--porcelain", "--untracked-files=no"))).lower()}
    remote = _git("remote", "get-url", "origin")
    if remote:
        from orchestrator.uris import redact_uri

        tags["mlflow.source.git.repoURL"] = redact_uri(remote)
    return tags


def bound_http_requests(uri: str) -> None:
    """:data:`HTTP_LIMITS` for a tracking server (``http(s)://``), each only where the environment
    does not set it already."""
    if uri.split(":", 1)[0].lower() in ("http", "https"):
        for key, value in HTTP_LIMITS.items():
            os.environ.setdefault(key, value)


def unavailable(e: BaseException) -> bool:
    """Whether ``e`` says the tracking store did not answer (refused or dropped connection, a
    timeout, retries used up on 5xx/429 answers), as opposed to refusing the request itself (a
    bad value, a missing run), which waiting does not cure.  MLflow wraps the HTTP library's error
    in an ``MlflowException`` whose context keeps it."""
    import requests
    import urllib3.exceptions

    gone = (requests.exceptions.ConnectionError, requests.exceptions.Timeout, requests.exceptions.RetryError,
            urllib3.exceptions.HTTPError, ConnectionError, TimeoutError)
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, gone):
            return True
        cur = cur.__cause__ or cur.__context__
    return False


class TrackingLost(Exception):
    """The tracking store did not answer for ``tracking.outage_timeout_s``: the run stops at a
    checkpoint (its unconfirmed records ride in it) and ends with :meth:`RunTracker.lost_message`."""


class Outage:
    """The tracking store stopped answering at ``since`` (monotonic; ``wall``: the clock time),
    with ``error``; the next write is tried at ``next_try``."""

    def __init__(self, error: str) -> None:
        self.since, self.wall, self.error = time.monotonic(), time.time(), error
        self.next_try = self.since + RETRY_S


def _short_error(e: BaseException) -> str:
    """The innermost cause's type and first line, credentials masked (MLflow quotes the URL)."""
    inner = e
    while inner.__cause__ or inner.__context__:
        inner = inner.__cause__ or inner.__context__
    line = (str(inner).strip().splitlines() or [""])[0][:160]
    return redact_text(f"{type(inner).__name__}: {line}" if line else type(inner).__name__)


class _Segment:
    """The open segment of one piecewise metric: its last logged point, the first and the last
    point since then that were held back because they lie on one line with it."""

    __slots__ = ("anchor", "first", "held")

    def __init__(self, anchor: tuple[int, float] | None = None):
        self.anchor = anchor
        self.first: tuple[int, float] | None = None
        self.held: tuple[int, float] | None = None

    def on_line(self, step: int, value: float, tol: float) -> bool:
        (sa, va), (s1, v1) = self.anchor, self.first
        if tol == 0.0:  # exact for constants and integer-valued series (no division)
            return (value - va) * (s1 - sa) == (v1 - va) * (step - sa)
        return abs(va + (v1 - va) * (step - sa) / (s1 - sa) - value) <= tol * max(1.0, abs(value))

    def add(self, step: int, value: float, tol: float, stepwise: bool = False) -> list[tuple[int, float]]:
        """The points to log now for the next point of the series (a step seen before is ignored);
        ``stepwise``: a jump's first point is logged now too (see :data:`STEPWISE`)."""
        last = self.held or self.anchor
        if last is not None and step <= last[0]:
            return []
        if self.anchor is None:
            self.anchor = (step, value)
            return [self.anchor]
        if self.first is None or self.on_line(step, value, tol):
            jump = stepwise and self.first is None and value != self.anchor[1]
            self.first = self.first or (step, value)
            self.held = (step, value)
            return [self.held] if jump else []
        out = [self.held]
        if stepwise and value != self.held[1]:
            out.append((step, value))
        self.anchor, self.first, self.held = self.held, (step, value), (step, value)
        return out

    def release(self) -> list[tuple[int, float]]:
        """Log the held point now (end of a run, or the UI should catch up); the segment restarts there."""
        if self.held is None:
            return []
        out = [self.held]
        self.anchor, self.first, self.held = self.held, None, None
        return out


class RunTracker:
    def __init__(self, cfg: RootConfig, run_id: str | None = None, parent_run_id: str | None = None,
                 tags: dict[str, str] | None = None):
        import mlflow
        from mlflow.tracking import MlflowClient

        self.uri = cfg.tracking.resolved_uri()  # as given (its credentials, redacted, tell resume to ask again)
        self._mlflow_uri = mlflow_uri(self.uri)  # what MLflow sees: never a password (it prints its URI)
        mlflow.set_tracking_uri(self._mlflow_uri)
        self.client = MlflowClient(self._mlflow_uri)
        self.history: dict[str, list[tuple[int, float]]] = defaultdict(list)
        self._logged: set[tuple[str, int]] = set()
        self._segments: dict[str, _Segment] = {}  # piecewise metric -> its open segment
        self._released = self._flushed = time.monotonic()
        self._buffer: list[Any] = []  # MLflow Metric rows not yet written
        self._buffered_upto = -1  # the newest step of the records logged so far
        self._when: dict[int, float] = {}  # step -> when it ran, for the steps a row may still be made of
        self.written_upto = -1  # every record up to this step is written to MLflow (what the driver acks)
        self._system: Any = None  # MLflow's system-metrics monitor (start_system_metrics)
        # The store not answering: rows and tags wait here for tracking.outage_timeout_s (see flush).
        self.outage_timeout_s = cfg.tracking.outage_timeout_s
        self.outage: Outage | None = None
        self.lost = False  # the store stayed away past the timeout: nothing more is tried
        self._deferred_tags: dict[str, str] = {}
        self._unwritten: dict[int, int] = {}  # step -> metric values of the records not written yet
        self.warn: Any = lambda line: print(line, file=sys.stderr, flush=True)
        bound_http_requests(self._mlflow_uri)
        if run_id is None:
            # artifacts beside the store; MLflow's UI opens it in the model-training view
            exp_id = experiment_id(self.client, self.uri, cfg.tracking.experiment)
            all_tags = {**source_tags(), **(tags or {})}
            if parent_run_id:
                all_tags["mlflow.parentRunId"] = parent_run_id
            run = self.client.create_run(exp_id, run_name=cfg.tracking.run_name, tags=all_tags)
            self.run_id = run.info.run_id
            self.experiment_id = exp_id
            self.log_config(cfg)
        else:
            run = self.client.get_run(run_id)
            self.run_id, self.experiment_id = run_id, run.info.experiment_id
            self._load_history()

    # -- config ------------------------------------------------------------------------

    def log_config(self, cfg: RootConfig) -> None:
        from mlflow.entities import Param

        from orchestrator.params import applicable_params

        resolved = public_config(cfg)  # credentials in the tracking URI are never logged
        # the params a reviewer compares: only the fields this run reads; config.yaml has them all
        params = [Param(k, str(v)[:6000]) for k, v in sorted(applicable_params(cfg).items())]
        for i in range(0, len(params), 90):
            self.client.log_batch(self.run_id, params=params[i:i + 90])
        self.log_text(yaml.safe_dump(resolved, sort_keys=False), "config.yaml")

    def log_text(self, text: str, name: str) -> None:
        self.client.log_text(self.run_id, text, name)

    # -- metrics -----------------------------------------------------------------------

    def _load_history(self) -> None:
        """For a resumed run: what is already logged, so nothing is logged twice."""
        run = self.client.get_run(self.run_id)
        for key in run.data.metrics:
            for m in self.client.get_metric_history(self.run_id, key):
                self._logged.add((key, m.step))
                self.history[key].append((m.step, m.value))
        for key in set(PIECEWISE) & set(self.history):
            self.history[key].sort()
            self._segments[key] = _Segment(self.history[key][-1])

    @property
    def newest_step(self) -> int:
        """The newest step of the records this tracker was given (written or not)."""
        return self._buffered_upto

    def last_step(self) -> int:
        return max((s for _, s in self._logged), default=0)

    def log_metrics(self, records: list[tuple], flush: bool = False) -> None:
        """Log per-step records.  A :data:`PIECEWISE` metric is logged only where its per-step
        series bends, i.e. the points where a constant stretch or a constant slope begins and
        ends, plus its newest point every :data:`HOLD_S` and at the end (:meth:`release_held`):
        the lines MLflow draws between them pass through every step's value.  Every other metric
        is logged at every step.  A record is ``(step, metrics, time)``: a row's MLflow timestamp is
        when its step ran (without a time, when it is logged).  Rows are written about every
        :data:`FLUSH_S` (or now, with ``flush``); :attr:`written_upto` says up to which step every
        record is written."""
        points: list[tuple[str, int, float]] = []
        for step, metrics, *when in records:
            if step > self.written_upto:
                self._unwritten[step] = max(self._unwritten.get(step, 0), len(metrics))
            self._buffered_upto = max(self._buffered_upto, step)
            if when:
                self._when[step] = when[0]
            for key, value in metrics.items():
                value = float(value)
                if (key, step) in self._logged:
                    continue
                tol = PIECEWISE.get(key)
                if tol is None:
                    points.append((key, step, value))
                else:
                    seg = self._segments.get(key) or self._segments.setdefault(key, _Segment())
                    points += [(key, *p) for p in seg.add(step, value, tol, key in STEPWISE)]
        self._add(points)
        now = time.monotonic()
        if now - self._released >= HOLD_S:
            self.release_held()
        elif flush or now - self._flushed >= FLUSH_S:
            self.flush()

    def release_held(self) -> None:
        """Log every piecewise metric's newest point and write every row (the UI catches up; at
        the end of a run)."""
        self._released = time.monotonic()
        self._add([(key, *p) for key, seg in self._segments.items() for p in seg.release()])
        self.flush()

    def _add(self, points: list[tuple[str, int, float]]) -> None:
        from mlflow.entities import Metric

        now = time.time()
        for key, step, value in points:
            if (key, step) in self._logged:
                continue
            self._logged.add((key, step))
            self.history[key].append((step, value))
            self._buffer.append(Metric(key, value, int(1000 * self._when.get(step, now)), step))
        # keep the times of the steps a held point may still be logged at (each segment's newest)
        oldest = min([seg.held[0] for seg in self._segments.values() if seg.held] + [self._buffered_upto])
        if self._when and min(self._when) < oldest:
            self._when = {s: t for s, t in self._when.items() if s >= oldest}

    def flush(self, force: bool = False) -> None:
        """Write the buffered rows (and tags held back by an outage).

        A store that does not answer (:func:`unavailable`) raises nothing here: the rows stay
        buffered, :attr:`written_upto` stays where it was (so rank 0 keeps the records in its
        checkpoints), and the write is tried again every :data:`RETRY_S` (``force``: now) until
        the store answers (nothing is lost) or :meth:`outage_expired` ends the run."""
        now = time.monotonic()
        self._flushed = now
        if self.lost or (self.outage is not None and not force and now < self.outage.next_try):
            return
        try:
            while self._buffer:
                chunk = self._buffer[:MAX_BATCH]
                self.client.log_batch(self.run_id, metrics=chunk)
                del self._buffer[:len(chunk)]
            while self._deferred_tags:
                key = next(iter(self._deferred_tags))
                self.client.set_tag(self.run_id, key, self._deferred_tags[key])
                del self._deferred_tags[key]
        except Exception as e:
            if not unavailable(e):
                raise
            self._away(e)
            return
        if self.outage is not None:
            self._back()
        self.written_upto = self._buffered_upto
        self._unwritten.clear()

    def _away(self, e: BaseException) -> None:
        if self.outage is None:
            self.outage = Outage(_short_error(e))
            self.warn(f"warning: the tracking server {redact_text(self.uri)} does not answer ({self.outage.error}); "
                      f"training goes on and its records are kept for up to {self.outage_timeout_s:g} s")
        else:
            self.outage.next_try = time.monotonic() + RETRY_S

    def _back(self) -> None:
        away = time.monotonic() - self.outage.since
        self.outage = None
        self.warn(f"the tracking server answers again after {away:.0f} s: every record kept meanwhile is logged")
        self._revive_system_metrics()

    def outage_expired(self) -> TrackingLost | None:
        """Try the store again when due; once it has not answered for ``tracking.outage_timeout_s``
        the tracker gives up (:attr:`lost`: no more calls to it) and returns the error to stop the
        run with (None while the store answers or the wait goes on)."""
        if self.outage is None or self.lost:
            return None
        if time.monotonic() >= self.outage.next_try:
            self.flush(force=True)
            if self.outage is None:
                return None
        if time.monotonic() - self.outage.since < self.outage_timeout_s:
            return None
        self.lost = True
        return TrackingLost(f"the tracking server {redact_text(self.uri)} did not answer for "
                            f"{self.outage_timeout_s:g} s ({self.outage.error})")

    def await_store(self) -> TrackingLost | None:
        """At the end of training: wait, trying every :data:`RETRY_S`, until the store answers
        what is buffered or ``tracking.outage_timeout_s`` has passed since it stopped answering."""
        self.release_held()
        while self.outage is not None and not self.lost:
            lost = self.outage_expired()
            if lost is not None:
                return lost
            if self.outage is not None:
                time.sleep(max(0.0, min(RETRY_S, self.outage.next_try - time.monotonic())))
        return None

    def unrecorded(self) -> tuple[int, int, int | None]:
        """What the store does not hold: (step records, metric values, the first such step)."""
        return len(self._unwritten), sum(self._unwritten.values()), min(self._unwritten, default=None)

    def lost_message(self, lost: TrackingLost, stopped_at: int, checkpoints: str, resume: str) -> str:
        """One line for a run whose tracking store stayed away: what was not recorded, where the
        checkpoints are and the command that records it all once the store is back."""
        records, values, first = self.unrecorded()
        since = time.strftime("%H:%M:%S", time.localtime(self.outage.wall)) if self.outage else "?"
        what = (f"{records} step records ({values} metric values) from step {first} on were not recorded "
                f"(the checkpoints carry them; the steps after the newest one are trained again)"
                if records else "every step record was recorded")
        return (f"{lost} since {since}; training reached step {stopped_at}; {what}; checkpoints: "
                f"{checkpoints}; the run shows RUNNING until it is resumed; once the server answers again: {resume}")

    def set_tags(self, tags: dict[str, Any]) -> None:
        """Tags (failures, notes: free text that may quote a URI) with any credential redacted.
        While the store does not answer they wait with the rows (:meth:`flush`)."""
        clean = {k: redact_text(str(v)) for k, v in tags.items()}
        if self.outage is not None or self.lost:
            self._deferred_tags.update(clean)
            return
        items = list(clean.items())
        for i, (k, v) in enumerate(items):
            try:
                self.client.set_tag(self.run_id, k, v)
            except Exception as e:
                if not unavailable(e):
                    raise
                self._deferred_tags.update(items[i:])  # this one and the rest wait
                self._away(e)
                return

    def log_rows(self, rows: list[Any]) -> None:
        """MLflow ``Metric`` rows as they are (two at one step stay two), written now or, while the
        store does not answer, with the buffered rows."""
        self._buffer.extend(rows)
        self.flush()

    # -- artifacts -----------------------------------------------------------------------

    def log_plots(self) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        panels = [(M.TRAIN_LOSS, M.VAL_LOSS), (M.VAL_ACCURACY,), (M.LR,), (M.MF,), (M.BATCH_GLOBAL,), (M.WORKERS,)]
        panels = [p for p in panels if any(self.history.get(k) for k in p)]
        if not panels:
            return
        fig, axes = plt.subplots(len(panels), 1, figsize=(8, 2.2 * len(panels)), sharex=True, squeeze=False)
        for ax, keys in zip(axes[:, 0], panels):
            for k in keys:
                pts = sorted(self.history.get(k, []))
                if pts:
                    ax.plot([s for s, _ in pts], [v for _, v in pts], label=k,
                            drawstyle="steps-post" if k in (M.WORKERS, M.BATCH_GLOBAL) else "default",
                            marker="o" if k.startswith("val/") else None, markersize=3)
            for step, _ in resize_steps(self.history.get(M.RESIZE_TO, [])):  # where the worker group was resized
                ax.axvline(step, color="gray", linestyle="--", linewidth=0.8)
            ax.set_ylabel(keys[0])
            ax.grid(alpha=0.3)
            if len(keys) > 1:
                ax.legend(loc="upper right")
        axes[-1, 0].set_xlabel("optimizer step")
        fig.tight_layout()
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "training_curves.png")
            fig.savefig(path, dpi=100)
            self.client.log_artifact(self.run_id, path, "plots")
        plt.close(fig)

    def log_timeline(self, timeline: Any) -> None:
        """The run's stretches of constant B and W and its resizes (orchestrator/timeline.py): the
        table artifact ``timeline.json`` (MLflow's table view) and the chart ``plots/timeline.png``."""
        from orchestrator.timeline import plot

        table = timeline.table()
        if not table:
            return
        self.client.log_table(self.run_id, data=table, artifact_file="timeline.json")
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "timeline.png")
            if plot(timeline, path):
                self.client.log_artifact(self.run_id, path, "plots")

    def log_model(self, model_state: dict[str, Any], cfg: RootConfig, functions: dict[str, Any] | None = None,
                  register: str | None = None, warn: Any = print) -> tuple[str | None, str | None]:
        """The final weights as the artifact ``model/model.pt`` (a state dict, with ``config.yaml``),
        and as an MLflow PyTorch model (:meth:`log_pytorch_model`).  Returns that model's URI and,
        with ``register``, the registered ``name/version`` (None where logging it failed: warned)."""
        import torch

        with tempfile.TemporaryDirectory() as d:
            torch.save(model_state, os.path.join(d, "model.pt"))
            with open(os.path.join(d, "config.yaml"), "w") as f:
                f.write(yaml.safe_dump(public_config(cfg), sort_keys=False))
            self.client.log_artifacts(self.run_id, d, "model")
        try:
            return self.log_pytorch_model(model_state, cfg, functions, register)
        except Exception as e:  # noqa: BLE001 - the run trained; its weights are logged above
            why = redact_text(str(e))[:300]
            message = f"the MLflow model was not logged ({type(e).__name__}: {why}); model/model.pt holds the weights"
            warn(f"warning: {message}")
            self.set_tags({"elastic.model_error": message})
            return None, None

    def log_pytorch_model(self, model_state: dict[str, Any], cfg: RootConfig, functions: dict[str, Any] | None,
                          register: str | None) -> tuple[str, str | None]:
        """The model rebuilt on the driver with the final weights, logged with ``mlflow.pytorch`` as
        :data:`MODEL_NAME` (under the run's Logged models), its signature inferred from the first
        validation samples (also its input example).  Saved with ``torch.export`` (MLflow's default:
        loads without this project's code); a model that cannot be exported is pickled instead.
        With ``register``, registered under that name."""
        import importlib.metadata

        import mlflow.pytorch
        import numpy as np
        import torch
        from mlflow.models import infer_signature

        from trainers.workload.build import build_workload

        torch.manual_seed(cfg.train.seed)
        work = build_workload(cfg, functions)
        model = work.model.cpu()
        model.load_state_dict(model_state)
        model.eval()
        if work.tensors is not None:
            x = work.tensors.val_x[:EXAMPLE_ROWS]
        else:
            x = torch.stack([torch.as_tensor(work.val[i][0]) for i in range(min(EXAMPLE_ROWS, len(work.val)))])
        with torch.no_grad():
            y = model(x)
        example = x.numpy()
        signature = infer_signature(example, y.numpy() if isinstance(y, torch.Tensor) else np.asarray(y))
        common = dict(name=MODEL_NAME, run_id=self.run_id, signature=signature, input_example=example,
                      pip_requirements=[f"torch=={importlib.metadata.version('torch')}"],
                      validate_serving_input=False)  # the example was just run through the model

        def new_model() -> str:
            # created here so that it belongs to the run's experiment (log_model alone would put it in
            # the active experiment of this process, the Default one)
            return self.client.create_logged_model(self.experiment_id, name=MODEL_NAME, source_run_id=self.run_id,
                                                   model_type="pytorch").model_id

        try:
            info = mlflow.pytorch.log_model(model, model_id=new_model(), **common)
        except Exception:  # noqa: BLE001 - torch.export could not trace it (data-dependent control flow)
            info = mlflow.pytorch.log_model(model, model_id=new_model(), serialization_format="pickle", **common)
        version = None
        if register:
            mv = mlflow.register_model(info.model_uri, register)
            version = f"{mv.name}/{mv.version}"
            self.set_tags({"elastic.registered_model": version})
        return info.model_uri, version

    # -- system metrics --------------------------------------------------------------------------

    def start_system_metrics(self, resume: bool = False) -> bool:
        """MLflow's system-metrics monitor on the driver (CPU, memory, disk, network; GPU with
        ``pynvml``): ``system/<metric>`` every :data:`SYSTEM_EVERY_S` seconds.  The workers' rank 0
        reports its node as ``system/worker-<host>/<metric>`` (trainers/link/system.py).  It needs
        ``psutil``, which Ray ships (importing Ray puts it on the path) when it is not installed."""
        try:
            import ray  # noqa: F401 - see the docstring
            from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor
        except ImportError:
            return False
        # Its thread logs a warning and ends at a call to the store that fails: the tracker says
        # what an outage means itself and starts a new monitor once the store answers again.
        logging.getLogger("mlflow.system_metrics.system_metrics_monitor").setLevel(logging.ERROR)
        self._system = SystemMetricsMonitor(self.run_id, sampling_interval=SYSTEM_EVERY_S, resume_logging=resume,
                                            tracking_uri=self._mlflow_uri)
        self._system.start()
        return True

    def stop_system_metrics(self) -> None:
        if self._system is not None:
            if self.lost:  # its last rows cannot be written: stop it without MLflow's flush (and error line)
                self._system._shutdown_event.set()
            else:
                self._system.finish()
            self._system = None

    def _revive_system_metrics(self) -> None:
        """MLflow's monitor thread ends at the first call to the store that fails (with a warning
        it logs itself): after an outage a new one goes on where it stopped."""
        thread = getattr(self._system, "_process", None)
        if self._system is not None and thread is not None and not thread.is_alive():
            self._system = None
            self.start_system_metrics(resume=True)

    def last_value(self, key: str, default: float = 0.0) -> float:
        pts = self.history.get(key)
        return max(pts)[1] if pts else default

    def set_running(self) -> None:
        self.client.update_run(self.run_id, status="RUNNING")

    def clear_failure(self) -> None:
        """A run that reached its planned end no longer carries an earlier driver's failure."""
        if "elastic.failure" in self.client.get_run(self.run_id).data.tags:
            self.client.delete_tag(self.run_id, "elastic.failure")

    def end(self, status: str = "FINISHED") -> None:
        """Close the run with ``status``; a run whose store stayed away (:attr:`lost`) is left as it
        is (RUNNING), for ``resume`` to go on with."""
        self.stop_system_metrics()
        if self.lost:
            return
        self.release_held()
        try:
            self.client.set_terminated(self.run_id, status=status)
        except Exception as e:
            if not unavailable(e):
                raise
            self.warn(f"warning: the tracking server {redact_text(self.uri)} did not answer; the run was not "
                      f"closed {status} there ({_short_error(e)})")
