"""One trial on Ray: an actor that drives a whole orchestrator run and relays it to the search driver.

The actor calls ``orchestrator.run.runner.run_training`` (phases, resizes, MLflow child run and all).
While it runs, the driver polls ``poll()`` for the objective's intermediate values (from the
records rank 0 pushes to the run's monitor) and answers with ``verdict()`` (go on, or stop) on the
values up to a step: the actor hands it to the run's ``PhaseRunner``, the monitor answers rank 0's
pushes with it, and rank 0, which waits for it at its next evaluation when the objective is an
evaluation metric (``search.pruning``), broadcasts a stop: every worker writes a final checkpoint
and stops at the same step.  Only the driver touches Optuna's storage, so the actor never needs to
reach it.

The actor takes no CPU of its own (the run's workers hold the trial's resources) and is threaded:
``run`` occupies one thread while ``poll`` and ``stop`` are answered on others.  It is reused for
the next trial once ``run`` returns.

A worker of the trial's group that fails (its node lost) does not end the trial: Ray Train restarts
the group from the trial's newest checkpoint (``scaling.max_failures``), and ``poll`` hands the
driver a note of each restart (:class:`RestartNotes`), which it shows as one line.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
import traceback
from dataclasses import asdict, dataclass, field
from typing import Any

import ray

from orchestrator.config.schema import validate
from orchestrator.record.events import GroupFailed, GroupRestarted
from orchestrator.run.outcome import Stopped
from orchestrator.run.runner import run_training
from trainers.errors import one_line
from trainers.link import metrics as M
from trainers.loop.storage import join, store_for

# How often the trial's run drains its monitor: the objective's values reach the pruner, and a
# stop reaches the workers, within about this (the orchestrator's default is 0.5 s).
RUNNER_POLL_S = 0.1


@dataclass
class TrialResult:
    """What ``TrialActor.run`` returns: the run's outcome and its figures."""

    run_id: str | None
    status: str  # the MLflow run's end status (FINISHED, FAILED) or "ERROR"
    stopped: bool  # the run stopped before its planned end, as the driver asked (pruned)
    steps: int  # optimizer steps the run took
    wall_s: float
    worker_seconds: float  # workers x seconds held, integrated over the run
    samples: int = 0  # training samples the run consumed
    last: dict[str, float] = field(default_factory=dict)  # last value of each watched metric
    error: str | None = None  # one line
    error_detail: str | None = None  # the traceback / Ray's full message

    def figure(self, metric: str) -> float | None:
        """An objective's value: a run figure or the metric's last reported value."""
        if metric == "steps":
            return float(self.steps)
        if metric == "samples":
            return float(self.samples)
        if metric == "wall_s":
            return self.wall_s
        if metric == "worker_seconds":
            return self.worker_seconds
        return self.last.get(metric)


class RestartNotes:
    """The restarts of a trial's group, for its driver: each ``GroupRestarted`` (the step the new
    group restored, its workers, the run's restart count) with the failure Ray Train's controller
    reported before it (``GroupFailed``: a worker that died with its node, one that raised)."""

    def __init__(self) -> None:
        self.cause: str | None = None
        self.notes: list[dict[str, Any]] = []

    def record_event(self, event: Any) -> None:
        match event:
            case GroupFailed(message=message):
                self.cause = message
            case GroupRestarted(step=step, workers=workers, restarts=n):
                self.notes.append({"step": step, "workers": workers, "restarts": n, "cause": self.cause})
                self.cause = None

    def take(self) -> list[dict[str, Any]]:
        """The notes since the last call."""
        notes, self.notes = self.notes, []
        return notes


def short_error(e: BaseException) -> str:
    """One line for a trial's failure: the exception, and for Ray's wrapped errors the root cause."""
    text = str(e).strip()
    root = ""
    for line in reversed(text.splitlines()):
        s = line.strip()
        if (
            s
            and ":" in s
            and s.split(":", 1)[0].replace(".", "").isidentifier()
            and s.split(":", 1)[0].endswith(("Error", "Exception", "Interrupt"))
        ):
            root = s
            break
    msg = one_line(e, None)
    if root and root not in msg:
        msg += f" (cause: {root})"
    return msg[:1000]


@ray.remote(num_cpus=0, max_concurrency=4)
class TrialActor:
    """Runs one training run at a time; answers ``poll``/``stop`` while it runs."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reset([])

    def _reset(self, metrics: list[str]) -> None:
        self._metrics = metrics
        self._values: list[tuple[int, str, float]] = []
        self._last: dict[str, float] = {}
        self._step = 0
        self._samples = 0
        self._tokens: int | None = None
        self._runner: Any = None
        self._run_id: str | None = None
        self._stop = False
        self._judged = -1  # the driver's verdicts cover the values up to this step
        self._judged_metrics: list[str] = []
        self._token: int | None = None
        self._workers = 0.0
        self._t_mark = time.time()
        self._worker_s = 0.0
        self._restarts = RestartNotes()

    # -- called by the driver ------------------------------------------------------------

    def run(
        self,
        token: int,
        config: dict[str, Any],
        parent_run_id: str | None,
        tags: dict[str, str],
        metrics: list[str],
        keep_checkpoints: bool = False,
        judged: list[str] | None = None,
    ) -> dict[str, Any]:
        """Train ``config`` (a resolved, validated config as JSON) as a child run of ``parent_run_id``;
        watch ``metrics`` (their values at each step go to ``poll``); the run waits for the
        driver's verdict on ``judged`` metrics at its next value of them.  ``token`` (the trial
        number) ties later ``verdict`` calls to this run: a late one for an earlier trial is ignored."""

        with self._lock:
            self._reset(list(metrics))
            self._judged_metrics = list(judged or [])
            self._token = token
        cfg = validate(config)
        t0 = time.time()
        result = TrialResult(run_id=None, status="ERROR", stopped=False, steps=0, wall_s=0.0, worker_seconds=0.0)
        folder = None
        try:
            summary = run_training(
                cfg,
                progress=False,
                parent_run_id=parent_run_id,
                tags=tags,
                on_start=self._on_start,
                on_records=self._on_records,
                on_event=self._on_event,
                poll_s=RUNNER_POLL_S,
                judged=self._judged_metrics,
            )
            result.status, result.steps = summary.status, summary.steps
            # pruned only if the run stopped before its planned end: one that finished first is not
            result.stopped = self._stop and isinstance(summary.outcome, Stopped)
            result.error = summary.error  # a diverged run is a FAIL with its reason
            folder = (summary.storage_path, summary.train_run_name)
        except BaseException as e:  # a failed trial is a result, not a crash of the search
            result.error = short_error(e)
            result.error_detail = "".join(traceback.format_exception(e))[-20000:]
            result.status = "FAILED"
        with self._lock:
            self._integrate(time.time())
            result.run_id = self._run_id
            result.steps = result.steps or self._step
            result.last, result.worker_seconds = dict(self._last), self._worker_s
            result.samples = self._samples
            self._runner = None
        result.wall_s = time.time() - t0
        if folder and not keep_checkpoints and result.error is None:
            with contextlib.suppress(OSError):  # a store that does not answer now: the folder stays
                store_for(folder[0]).remove(join(*folder))
        return asdict(result)

    def poll(self, token: int) -> dict[str, Any]:
        """New ``(step, metric, value, samples seen, tokens seen or None)`` of run ``token`` since the
        last poll (the work done by that step: pruning compares trials at equal work), its MLflow
        run id, its latest step and its group's restarts since the last poll (``RestartNotes``)."""
        with self._lock:
            if token != self._token:
                return {"values": [], "run_id": None, "step": 0, "restarts": []}
            values, self._values = self._values, []
            return {"values": values, "run_id": self._run_id, "step": self._step, "restarts": self._restarts.take()}

    def verdict(self, token: int, step: int, stop: bool) -> None:
        """The driver judged run ``token``'s values up to ``step``: ``stop`` it (pruned; every worker
        stops at the same step, at the latest at its next evaluation), or let it go on."""
        with self._lock:
            if token != self._token:
                return
            self._stop = self._stop or stop
            self._judged = max(self._judged, int(step))
            runner, stop, step = self._runner, self._stop, self._judged
        if runner is not None:
            try:
                runner.verdict(step, stop)
            except Exception:  # the run is ending: nothing left to stop
                pass

    # -- callbacks from run_training (on the actor's run thread) -----------------------------

    def _on_start(self, runner: Any) -> None:
        with self._lock:
            self._runner = runner
            self._run_id = runner.tracker.run_id
            self._workers = float(runner.initial_workers())
            self._t_mark = time.time()

    def _on_event(self, event: Any) -> None:
        with self._lock:
            self._restarts.record_event(event)

    def _integrate(self, now: float) -> None:
        self._worker_s += self._workers * max(0.0, now - self._t_mark)
        self._t_mark = now

    def _on_records(self, records: list[tuple[int, dict[str, float], float]]) -> None:
        with self._lock:
            self._integrate(time.time())
            for step, m, *_ in records:
                self._step = max(self._step, int(step))
                if M.WORKERS in m:
                    self._workers = float(m[M.WORKERS])
                if M.SAMPLES_SEEN in m:
                    self._samples = max(self._samples, int(m[M.SAMPLES_SEEN]))
                if M.TOKENS_SEEN in m:
                    self._tokens = max(self._tokens or 0, int(m[M.TOKENS_SEEN]))
                for key in self._metrics:
                    if key in m:
                        v = float(m[key])
                        self._last[key] = v
                        self._values.append(
                            (int(step), key, v if math.isfinite(v) else float("nan"), self._samples, self._tokens)
                        )
            stop, runner, step = self._stop, self._runner, self._judged
        if stop and runner is not None:
            runner.verdict(step, True)  # a stop asked before the monitor was there
