"""The driver: start (or join) Ray, run training as phases of ``TorchTrainer.fit()``,
stream metrics from the monitor actor to MLflow and a progress bar, and close the run.

Each phase is its own Ray Train run (``elastic-<run>``, ``elastic-<run>-r<resume>p<phase>``)
under one storage path.  Rank 0 writes checkpoints straight into its phase's folder; a
new group (a resize, a restart after a failure, a ``resume``) restores the newest
intact checkpoint across all of the training run's folders (trainers/loop.py).
"""

from __future__ import annotations

import logging
import math
import os
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

from orchestrator.config import RootConfig
from orchestrator.tracking import RunTracker

POLL_S = 0.5


@dataclass
class RunSummary:
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


def quiet_ray_env(verbose: bool) -> None:
    """Set before Ray is imported/started: keep Ray's own log noise off the terminal."""
    os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
    if not verbose:
        os.environ.setdefault("RAY_DEDUP_LOGS", "1")
        os.environ.setdefault("RAY_TRAIN_ENABLE_STATE_TRACKING", "0")
        os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
        os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
        os.environ.setdefault("PYTHONWARNINGS", "ignore::DeprecationWarning,ignore::FutureWarning")


def ensure_ray(verbose: bool = False, num_cpus: int | None = None) -> bool:
    """Join the cluster in ``RAY_ADDRESS`` (e.g. under ``ray job submit``) or start a local one.

    Returns True when this call started Ray (so the caller should shut it down)."""
    quiet_ray_env(verbose)
    import ray

    if ray.is_initialized():
        return False
    level = logging.INFO if verbose else logging.ERROR
    kwargs: dict[str, Any] = dict(logging_level=level, log_to_driver=verbose, configure_logging=True)
    if os.environ.get("RAY_ADDRESS"):
        ray.init(**kwargs)
    else:
        # A local cluster we start ourselves has no node that a cloud provider could preempt:
        # Ray Train's preemption watcher only costs training throughput there (~10% on 2 cores).
        os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")
        # Without a dashboard nothing reads Ray's own metrics: their collection is CPU for nothing.
        os.environ.setdefault("RAY_enable_metrics_collection", "0")
        if not verbose:
            # Ray's log monitor re-lists the session's log folder ten times a second; each fit()
            # adds ~18 files, so its CPU grows run after run (a search on one Ray: 1% of this
            # machine after 6 runs).  Worker logs are not streamed to us here: list every 5 s.
            os.environ.setdefault("RAY_LOG_MONITOR_MANY_FILES_THRESHOLD", "0")
            os.environ.setdefault("LOG_NAME_UPDATE_INTERVAL_S", "5")
        ray.init(num_cpus=num_cpus, include_dashboard=False, **kwargs)
    if not verbose:
        for name in ("ray", "ray.train", "ray.tune", "ray.data"):
            logging.getLogger(name).setLevel(logging.ERROR)
    return True


def estimate_total_steps(cfg: RootConfig) -> int:
    from trainers.data import load_data

    n = load_data(cfg.data, cfg.train.seed).num_train
    per_epoch = math.ceil(n / cfg.batch.size)
    whole = int(cfg.train.epochs)
    frac = cfg.train.epochs - whole
    return whole * per_epoch + math.ceil(frac * n / cfg.batch.size)


class Progress:
    """A tqdm bar on the driver: step, epoch, loss, batch, workers."""

    def __init__(self, total: int, enabled: bool):
        self.bar = None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit="step", dynamic_ncols=True, file=sys.stderr,
                            bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}] {postfix}")
            self.bar.set_description("starting workers")
        self.last: dict[str, float] = {}

    def update(self, records: list[tuple[int, dict[str, float], float]]) -> None:
        if not records:
            return
        for _, m, *_ in records:
            self.last.update(m)
        step = records[-1][0]
        if self.bar is None:
            return
        if step > self.bar.total:
            self.bar.total = step
        self.bar.n = step
        self.bar.set_description("training")
        post = {"epoch": f"{self.last.get('epoch', 0):.2f}", "loss": f"{self.last.get('train/loss', float('nan')):.4f}",
                "B": int(self.last.get("batch/global", 0)), "W": int(self.last.get("workers", 0))}
        if "val/accuracy" in self.last:
            post["val_acc"] = f"{self.last['val/accuracy']:.3f}"
        self.bar.set_postfix(post, refresh=False)
        self.bar.refresh()

    def write(self, line: str) -> None:
        if self.bar is not None:
            self.bar.write(line, file=sys.stderr)
        else:
            print(line, file=sys.stderr)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class _Phase:
    """One ``fit()`` running in a thread."""

    def __init__(self, idx: int, workers: int, trainer: Any):
        self.idx, self.workers = idx, workers
        self.box: dict[str, Any] = {}
        self.t_called, self.ended = 0.0, 0.0

        def fit() -> None:
            self.t_called = time.time()
            try:
                self.box["result"] = trainer.fit()
            except BaseException as e:  # surfaced on the driver thread
                self.box["error"] = e
            self.ended = time.time()

        self.thread = threading.Thread(target=fit, name=f"fit-phase{idx}", daemon=True)


class PhaseRunner:
    """Runs one training run as a sequence of ``fit()`` phases."""

    def __init__(self, cfg: RootConfig, tracker: RunTracker, verbose: bool = False, progress: bool = True,
                 on_records: Callable[[list], None] | None = None):
        self.cfg, self.tracker, self.verbose = cfg, tracker, verbose
        self.progress = Progress(estimate_total_steps(cfg), enabled=progress)
        self.on_records = on_records
        self.poll_s = POLL_S  # how often the monitor is drained (a search lowers it to prune sooner)
        self.train_run_name = f"elastic-{tracker.run_id}"  # all phases and resumes share it
        self.storage_path = os.path.abspath(os.path.expanduser(cfg.checkpoint.storage_path))
        self.events: list[dict[str, Any]] = []
        self.monitor = None
        self.t_start = time.time()
        self.restarts = int(tracker.last_value("restarts", 0))
        self.resumes = 0  # set by run_training for a resumed run: keeps phase run names unique
        self._starts: dict[int, int] = {}  # phase -> times its group started (more than once: restarts)
        self._entered: dict[int, float] = {}  # phase -> when its loop was entered on rank 0
        self._first_step: dict[int, float] = {}  # phase -> when its group made its first step
        self._overlap_wanted: int | None = None  # workers of a new group to start beside the old one
        self.monitor_name, self.namespace = "", None
        self.called_off = 0  # overlapping resizes whose new group never took over
        self._last_idx = -1
        self.warnings: list[str] = []
        self._pending_resize: dict[str, Any] | None = None
        self.resizes: list[dict[str, Any]] = []
        from trainers.resize import build_resize_policy

        self.resize_policy = build_resize_policy()

    # -- one phase ----------------------------------------------------------------------

    def phase_run_name(self, phase: int) -> str:
        """Each phase is its own Ray Train run (two may run at once during an overlapping
        resize); the workers restore the newest checkpoint across all of them."""
        if phase == 0:
            return self.train_run_name
        return f"{self.train_run_name}-r{self.resumes}p{phase}"

    def _resources(self) -> dict[str, float]:
        s = self.cfg.scaling
        resources = {"CPU": s.cpus_per_worker}
        if s.use_gpu:
            resources["GPU"] = s.gpus_per_worker
        return resources

    def _trainer(self, workers: int, phase: int, handover: bool):
        from ray.train import FailureConfig, RunConfig, ScalingConfig
        from ray.train.torch import TorchTrainer

        from trainers.loop import train_loop_per_worker

        s = self.cfg.scaling
        resources = self._resources()
        num_workers: int | tuple[int, int] = workers
        if s.min_workers < workers:
            num_workers = (s.min_workers, workers)
        return TorchTrainer(
            train_loop_per_worker,
            train_loop_config={
                "config": self.cfg.loop_dict(),
                "runtime": {"monitor_name": self.monitor_name, "namespace": self.namespace, "phase": phase,
                            "workers": workers, "handover": handover, "storage": self.storage_path,
                            "run_prefix": self.train_run_name, "run_name": self.phase_run_name(phase)},
            },
            scaling_config=ScalingConfig(num_workers=num_workers, use_gpu=s.use_gpu,
                                         resources_per_worker=resources),
            run_config=RunConfig(
                name=self.phase_run_name(phase),
                storage_path=self.storage_path,
                failure_config=FailureConfig(max_failures=s.max_failures),
            ),
        )

    def _pump(self) -> None:
        import ray

        # The ack (what MLflow holds) rides on the drain: one call to the monitor per poll.
        records, events = ray.get(self.monitor.drain.remote(self.tracker.written_upto))
        if records:
            self.tracker.log_metrics(records)
            self.progress.update(records)
            if self.on_records is not None:
                self.on_records(records)
        for ev in events:
            self.events.append(ev)
            self._on_event(ev)

    def _on_event(self, ev: dict[str, Any]) -> None:
        if ev["kind"] == "first_step":
            self._first_step.setdefault(int(ev.get("phase", 0)), ev["time"])
            self._log_resize()
        elif ev["kind"] == "resize_decision" and ev.get("mode") == "overlap":
            self._overlap_wanted = int(ev["workers"])
        elif ev["kind"] == "batch_change":
            self.progress.write(f"batch: {ev['old']} -> {ev['new']} at step {ev['step']}")
        elif ev["kind"] == "auto_warmup_end":
            self.progress.write(f"auto warmup ended at step {ev['step']}: peak lr {ev['peak_lr']:.4g} ({ev['reason']})")
        elif ev["kind"] == "phase_start":
            phase = int(ev.get("phase", 0))
            self._starts[phase] = self._starts.get(phase, 0) + 1
            if self._starts[phase] > 1:
                # The same phase started again: Ray Train restarted the group after a failure.
                self.restarts += 1
                self.tracker.log_metrics([(int(ev["step"]), {"restarts": float(self.restarts)})], flush=True)
                self.tracker.set_tags({"elastic.restarts": self.restarts})
                self.progress.write(f"worker group restarted from step {ev['step']} with {ev['workers']} "
                                    f"workers (restart {self.restarts})")
            self._entered.setdefault(phase, ev.get("entered", ev["time"]))
            self.tracker.set_tags({"elastic.worker_threads": ev.get("threads", "")})
        elif ev["kind"] == "warning":
            self.warnings.append(ev["message"])
            self.tracker.set_tags({"elastic.warnings": "\n".join(self.warnings)[-5000:]})
            self.progress.write(f"warning: {ev['message']}")

    def _start_phase(self, workers: int, idx: int, handover: bool) -> "_Phase":
        """Start ``fit()`` for one phase in a thread (the driver thread keeps pumping)."""
        ph = _Phase(idx, workers, self._trainer(workers, idx, handover))
        self._last_idx = max(self._last_idx, idx)  # a failed early start keeps its index (and run name)
        ph.thread.start()
        return ph

    def _await_room(self, workers: int, timeout_s: float = 10.0) -> bool:
        """Wait (pumping) until the cluster has room for ``workers`` workers.  Ray frees a
        finished group's resources a moment after its ``fit()`` returns; started before that, an
        elastic group (``min_workers < max_workers``) would start with fewer workers than wanted."""
        import ray

        from orchestrator.monitor import has_room

        deadline = time.time() + timeout_s
        while not has_room(ray.available_resources(), self._resources(), workers):
            if time.time() > deadline:
                return False  # start anyway: Ray starts what fits (or waits for it)
            self._pump()
            time.sleep(0.05)
        return True

    def request_stop(self) -> None:
        if self.monitor is not None:
            self.monitor.request_stop.remote()

    # -- the run ----------------------------------------------------------------------------

    def initial_workers(self) -> int:
        """Enough workers for the initial batch (or for the batch a resumed run had reached)."""
        from trainers.resize import workers_for_batch

        s = self.cfg.scaling
        workers = workers_for_batch(self.cfg.batch.size, self.cfg.batch.max_local_batch, s.min_workers, s.max_workers)
        return max(workers, min(int(self.tracker.last_value("workers", 0)), s.max_workers))

    def _make_monitor(self) -> None:
        import ray

        from orchestrator.monitor import Monitor

        s = self.cfg.scaling
        self.namespace = ray.get_runtime_context().namespace
        self.monitor_name = f"elastic-monitor-{uuid.uuid4().hex[:12]}"
        overlap = self._resources() if s.resize_mode == "overlap" else None
        self.monitor = Monitor.options(name=self.monitor_name, namespace=self.namespace).remote(
            self.resize_policy, self.cfg.batch.max_local_batch, s.min_workers, s.max_workers,
            overlap_resources=overlap)

    def run(self) -> Any:
        """Phases: fit with W workers; when the batch outgrows the group, the next phase with W'.

        With an overlapping resize the next phase starts while the old one still trains,
        and takes over at the old group's last checkpoint (see orchestrator/monitor.py)."""
        import ray

        self._make_monitor()
        cur = self._start_phase(self.initial_workers(), 0, handover=False)
        nxt: _Phase | None = None
        try:
            while True:
                cur.thread.join(self.poll_s)
                self._pump()
                want = self._overlap_wanted
                if want is not None and nxt is None and cur.thread.is_alive():
                    self._overlap_wanted = None
                    nxt = self._start_phase(want, cur.idx + 1, handover=True)
                if (nxt is not None and not nxt.thread.is_alive() and cur.thread.is_alive()
                        and "path" not in ray.get(self.monitor.handover.remote(nxt.idx))):
                    # The new group ended without taking over: it could not start.  (One that took
                    # over may well end first: it trains while the old group's fit() tears down.)
                    err = nxt.box.get("error")
                    self.progress.write(f"warning: the new group of {nxt.workers} workers did not start "
                                        f"({type(err).__name__ if err else 'ended early'}); resizing by restart")
                    self.warnings.append(f"overlapping resize fell back to restart: {err!r}"[:500])
                    self.tracker.set_tags({"elastic.warnings": "\n".join(self.warnings)[-5000:]})
                    ray.get(self.monitor.fall_back_to_restart.remote())
                    nxt = None
                if cur.thread.is_alive():
                    continue
                self._pump()
                done = ray.get(self.monitor.take_handovers.remote())
                if "error" in cur.box or not done:  # the run ended (finished, stopped or failed)
                    if nxt is not None:
                        ray.get(self.monitor.cancel_overlap.remote(nxt.idx))
                        self.called_off += 1
                        self.progress.write(f"resize to {nxt.workers} workers called off: training ended "
                                            "before the new group was ready")
                        self._wait(nxt)
                    if "error" in cur.box:
                        raise cur.box["error"]
                    return cur.box["result"]
                r = done[-1]
                self._record_resize(cur, r)
                if nxt is None:  # break before make: start the next phase once the old one's CPUs are free
                    self._await_room(r["to"])
                    nxt = self._start_phase(r["to"], self._last_idx + 1, handover=False)
                self._pending_resize["fit_called"] = nxt.t_called or time.time()
                self._overlap_wanted = None
                self._log_resize()
                cur, nxt = nxt, None
        finally:
            if nxt is not None and nxt.thread.is_alive():
                ray.get(self.monitor.cancel_overlap.remote(nxt.idx))
            self.progress.close()
            ray.kill(self.monitor)
            self.monitor = None

    def _wait(self, ph: "_Phase") -> None:
        while ph.thread.is_alive():
            ph.thread.join(self.poll_s)
            self._pump()

    def _record_resize(self, old: "_Phase", r: dict[str, Any]) -> None:
        self._pending_resize = {"from": old.workers, "to": r["to"], "mode": r["mode"], "step": int(r["handover_step"]),
                                "time": r["handover_time"], "decided": r["time"], "fit_returned": old.ended,
                                "phase": old.idx + 1}
        how = "the new group took over" if r["mode"] == "overlap" else "restarting the group"
        self.progress.write(f"resize: {old.workers} -> {r['to']} workers at step {r['handover_step']} ({how})")

    def _log_resize(self) -> None:
        """Log a resize once its new group has made its first step.

        ``resize/latency_s`` runs from the old group's last checkpoint to the new group's first
        step: training stood still that long.  Where the time goes: ``resize/overlap_s``, the old
        group trained on while the new one started (overlap only); ``resize/teardown_s``, the old
        group's teardown (restart only: with overlap it is off the critical path);
        ``resize/start_s``, the new ``fit()`` call to its loop's entry on rank 0;
        ``resize/setup_s``, loop entry to the first step (data, model, process group, restore)."""
        r = self._pending_resize
        if r is None or "fit_called" not in r or r["phase"] not in self._first_step:
            return
        self._pending_resize = None
        first = self._first_step[r["phase"]]
        entered = self._entered.get(r["phase"], r["fit_called"])
        overlap = r["mode"] == "overlap"
        parts = {"overlap_s": r["time"] - r["decided"] if overlap else 0.0,
                 "teardown_s": 0.0 if overlap else r["fit_returned"] - r["time"],
                 "start_s": entered - r["fit_called"], "setup_s": first - entered}
        latency = first - r["time"]
        self.tracker.log_metrics([(r["step"], {"resize/from": float(r["from"]), "resize/to": float(r["to"]),
                                               "resize/latency_s": latency,
                                               **{f"resize/{k}": v for k, v in parts.items()}})], flush=True)
        self.resizes.append({**r, "latency_s": latency, **parts})

    def first_step_s(self) -> float | None:
        for ev in self.events:
            if ev["kind"] == "first_step":
                return ev["time"] - self.t_start
        return None


def final_metrics(tracker: RunTracker) -> dict[str, float]:
    out = {}
    for key in ("train/loss", "val/loss", "val/accuracy", "samples_seen", "epoch"):
        pts = tracker.history.get(key)
        if pts:
            out[key] = max(pts)[1]
    return out


RUN_INFO = "elastic_run.json"


def write_run_info(runner: PhaseRunner, cfg: RootConfig) -> None:
    """Beside the checkpoints: what ``resume`` needs to find the MLflow run again."""
    import json

    folder = os.path.join(runner.storage_path, runner.train_run_name)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, RUN_INFO), "w") as f:
        json.dump({"run_id": runner.tracker.run_id, "tracking_uri": runner.tracker.uri,
                   "config": cfg.model_dump(mode="json")}, f, indent=1)


def _open_tracking_store(uri: str) -> None:
    """Import MLflow and, for a database store, create or migrate its schema (a server is not
    called here: one that does not answer would be retried twice as long)."""
    try:
        from mlflow.tracking import MlflowClient

        if uri.split(":", 1)[0].split("+", 1)[0] in ("sqlite", "postgresql", "mysql", "mssql"):
            MlflowClient(uri).search_experiments(max_results=1)
    except Exception:  # noqa: BLE001 - RunTracker reports a bad store with its own error
        pass


def run_training(cfg: RootConfig, verbose: bool = False, progress: bool = True,
                 parent_run_id: str | None = None, tags: dict[str, str] | None = None,
                 on_start: Callable[[PhaseRunner], None] | None = None,
                 on_records: Callable[[list], None] | None = None,
                 t_invoked: float | None = None, resume_run_id: str | None = None) -> RunSummary:
    """Train ``cfg`` on Ray, tracked in MLflow.  The config is already validated.

    With ``resume_run_id``, continue that MLflow run from its latest checkpoint: same run,
    steps continue, nothing already logged is logged again."""
    t0 = t_invoked or time.time()
    # Import MLflow and open its store (a fresh SQLite file takes seconds of schema migrations)
    # while Ray starts; the run itself is created once Ray is up.
    warm = threading.Thread(target=_open_tracking_store, args=(cfg.tracking.resolved_uri(),), daemon=True)
    warm.start()
    started_ray = ensure_ray(verbose)
    warm.join()
    tracker = RunTracker(cfg, run_id=resume_run_id, parent_run_id=parent_run_id, tags=tags)
    runner = PhaseRunner(cfg, tracker, verbose=verbose, progress=progress, on_records=on_records)
    runner.t_start = t0
    tracker.set_tags({"elastic.train_run_name": runner.train_run_name, "elastic.storage_path": runner.storage_path})
    if resume_run_id:
        tracker.set_running()
        before = tracker.client.get_run(tracker.run_id).data.tags.get("elastic.resumes", "0")
        runner.resumes = int(before) + 1
        tracker.set_tags({"elastic.resumes": runner.resumes})
    write_run_info(runner, cfg)
    if on_start:
        on_start(runner)
    status = "FAILED"
    try:
        runner.run()
        status = "FINISHED"
        tracker.release_held()
        tracker.set_tags({"elastic.final_workers": int(tracker.last_value("workers", 0)),
                          "elastic.resizes": len(runner.resizes)})
        tracker.log_plots()
        from trainers.checkpoint import load_newest_checkpoint

        payload = load_newest_checkpoint(runner.storage_path, runner.train_run_name, "cpu",
                                         warn=runner.progress.write)
        if payload is not None:
            tracker.log_model(payload["model"], cfg)
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    finally:
        tracker.end(status)
        if started_ray and not os.environ.get("ELASTIC_KEEP_RAY"):
            import ray

            ray.shutdown()
    steps = max((s for s, _ in tracker.history.get("train/loss", [])), default=0)
    return RunSummary(run_id=tracker.run_id, tracking_uri=tracker.uri, experiment_id=tracker.experiment_id,
                      status=status, steps=steps, wall_s=time.time() - t0, final=final_metrics(tracker),
                      storage_path=runner.storage_path, train_run_name=runner.train_run_name,
                      first_step_s=runner.first_step_s(), resizes=runner.resizes,
                      resizes_called_off=runner.called_off)


def find_run(ref: str, tracking_uri: str | None = None) -> tuple[str, str, dict[str, Any]]:
    """(run_id, tracking_uri, config dict) of a run, from its MLflow run id or its storage directory."""
    import json

    info_path = os.path.join(os.path.expanduser(ref), RUN_INFO)
    if os.path.isfile(info_path):
        with open(info_path) as f:
            info = json.load(f)
        return info["run_id"], tracking_uri or info["tracking_uri"], info["config"]
    from orchestrator.config import DEFAULT_TRACKING_URI, ConfigError

    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI
    import mlflow
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    mlflow.set_tracking_uri(uri)
    try:
        run = MlflowClient(uri).get_run(ref)
    except MlflowException:
        raise ConfigError(f"run: {ref!r} is neither an MLflow run id in {uri} nor a run storage directory "
                          f"holding {RUN_INFO}; pass one of those (or --tracking-uri)") from None
    storage, name = run.data.tags.get("elastic.storage_path"), run.data.tags.get("elastic.train_run_name")
    if not storage or not name or not os.path.isfile(os.path.join(storage, name, RUN_INFO)):
        raise ConfigError(f"run: {ref!r} has no checkpoint storage recorded (tags elastic.storage_path); "
                          "it was not started by this orchestrator or its storage is gone")
    with open(os.path.join(storage, name, RUN_INFO)) as f:
        return ref, uri, json.load(f)["config"]
