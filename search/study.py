"""The search driver: an Optuna study (ask/tell) whose trials are orchestrator runs on Ray.

* Storage: by default a local journal file (``optuna.journal``: Optuna's ``JournalFileBackend``,
  safe for several processes on one host); any RDB URL (``sqlite:///x.db``, ``postgresql://...``)
  for a cluster.  Only this driver touches it: trials run in Ray actors that never see it.
* Parallel trials: each trial runs in its own ``TrialActor`` (``search.trial``); at most
  ``parallel`` at once, and only as many as the cluster's resources fit (a trial holds its
  ``max_workers`` times the per-worker CPUs/GPUs).
* Pruning: the driver polls each running trial for the objective's values at their global steps,
  ``trial.report``s them and asks ``trial.should_prune()``; on prune it tells the actor to stop
  (every worker stops at the same step), waits for the run to close, and tells the study PRUNED.
* A trial whose sampled config is invalid, or whose run raises, is told FAIL with its message
  (user attribute ``error``; tag ``search.error`` on its MLflow run); the study goes on.
"""

from __future__ import annotations

import math
import os
import sys
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

from orchestrator.config import ConfigError, RootConfig, to_yaml, validate
from search.registry import AlgorithmSpec
from search.space import SearchSpace, SpaceError
from search.tracking import PARENT_RUN_ATTR, StudyTracker, best_trials, trial_values

DEFAULT_STORAGE = "optuna.journal"
DEFAULT_TRIALS = 10
POLL_S = 0.1
EPS = 1e-9


# --------------------------------------------------------------------------- storage


def is_rdb_url(storage: str) -> bool:
    return "://" in storage


def describe_storage(storage: str) -> str:
    """How the storage is shown and tagged: a journal file's absolute path, an RDB URL without password."""
    if not is_rdb_url(storage):
        return os.path.abspath(os.path.expanduser(storage))
    try:
        from sqlalchemy.engine import make_url

        return make_url(storage).render_as_string(hide_password=True)
    except Exception:
        return storage.split("@")[-1] if "@" in storage else storage


def open_storage(storage: str) -> Any:
    """An Optuna storage: a journal file (a path) or an RDB (a URL).  ``ConfigError`` if it cannot open."""
    import optuna

    if is_rdb_url(storage):
        try:
            return optuna.storages.RDBStorage(storage)
        except Exception as e:
            raise ConfigError(f"--storage: cannot open {describe_storage(storage)!r} ({type(e).__name__}: "
                              f"{str(e).splitlines()[0] if str(e) else ''}); check the URL") from None
    path = os.path.abspath(os.path.expanduser(storage))
    folder = os.path.dirname(path)
    if not os.path.isdir(folder):
        raise ConfigError(f"--storage: folder {folder!r} does not exist; create it or pass another journal file")
    if os.path.isdir(path):
        raise ConfigError(f"--storage: {path!r} is a folder; pass a journal file path (e.g. {DEFAULT_STORAGE})")
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    try:
        return JournalStorage(JournalFileBackend(path))
    except Exception as e:
        raise ConfigError(f"--storage: cannot use journal file {path!r} ({e})") from None


def study_names(storage: Any) -> list[str]:
    import optuna

    return [s.study_name for s in optuna.get_all_study_summaries(storage, include_best_trial=False)]


def create_or_load_study(space: SearchSpace, name: str, storage: Any) -> Any:
    """Create the study, or load it when it exists (its objectives must match the space's)."""
    import optuna

    existing = study_names(storage)
    if name in existing:
        study = optuna.load_study(study_name=name, storage=storage, pruner=space.build_pruner())
        # A seeded sampler built again would draw the same points as the first invocation did:
        # continue its sequence from a seed offset by the trials already in the study.
        done = len(study.get_trials(deepcopy=False))
        seed = space.sampler.options.get("seed")
        spec = space.sampler
        if isinstance(seed, int) and done:
            spec = AlgorithmSpec(spec.kind, spec.name, {**spec.options, "seed": seed + done})
        study.sampler = spec.build(space.grid() if spec.entry.needs_grid else None)
        have = [d.name.lower() for d in study.directions]
        if have != space.directions:
            raise SpaceError(f"objective: study {name!r} already exists and optimizes {', '.join(have)}; "
                             f"the space asks {', '.join(space.directions)}; use another --study-name")
        stored = study.user_attrs.get("objectives")
        wanted = [o.metric for o in space.objectives]
        if stored and stored != wanted:
            raise SpaceError(f"objective.metric: study {name!r} already exists and optimizes {', '.join(stored)}; "
                             f"the space asks {', '.join(wanted)}; use another --study-name")
        return study
    study = optuna.create_study(study_name=name, storage=storage, sampler=space.build_sampler(),
                                pruner=space.build_pruner(), directions=space.directions, load_if_exists=True)
    study.set_user_attr("objectives", [o.metric for o in space.objectives])
    return study


def load_existing_study(name: str, storage_url: str) -> Any:
    """A stored study for ``show``; ``ConfigError`` naming the studies there if it is missing."""
    import optuna

    storage = open_storage(storage_url)
    names = study_names(storage)
    if name not in names:
        there = f"studies there: {', '.join(names)}" if names else "it holds no study"
        raise ConfigError(f"study: no study {name!r} in {describe_storage(storage_url)}; {there}")
    return optuna.load_study(study_name=name, storage=storage)


def trial_raw_config(study: Any, trial: Any) -> dict[str, Any]:
    """The training config a trial ran, as written: the study's base config plus the trial's values
    (validated; ``ConfigError`` if not)."""
    import copy

    from search.space import set_path

    base = study.user_attrs.get("base_config")
    if base is None:
        raise ConfigError(f"study: {study.study_name!r} was not created by python -m search (no base config "
                          f"stored); cannot rebuild a training config")
    raw = copy.deepcopy(base)
    for path, v in trial_values(trial).items():
        set_path(raw, path, v)
    validate(copy.deepcopy(raw))
    return raw


def best_config_yaml(study: Any, trial: Any | None = None, full: bool = False) -> str | None:
    """The best (or given) trial's config as a ready-to-train YAML, with a header saying where it
    comes from: the base config as written plus the trial's values, or with ``full`` every field."""
    import yaml

    best = [trial] if trial is not None else best_trials(study)
    if not best:
        return None
    t = best[0]
    raw = trial_raw_config(study, t)
    body = to_yaml(validate(raw)) if full else yaml.safe_dump(raw, sort_keys=False)
    values = ", ".join(f"{v:.6g}" for v in (t.values or []))
    head = (f"# study {study.study_name}, trial {t.number} ({t.state.name}"
            + (f", value {values}" if values else "") + ")\n"
            + "# train it: python -m orchestrator train THIS_FILE.yaml\n")
    return head + body


# --------------------------------------------------------------------------- runtime settings


def absolute_tracking_uri(uri: str) -> str:
    """Trials run in other processes (other folders, other nodes): pin relative local stores to absolute paths."""
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        rest = uri[len("sqlite:///"):]
        if rest and rest != ":memory:":
            return "sqlite:///" + os.path.abspath(rest)
    if uri.startswith("file:") and not uri.startswith("file:/"):
        return "file:" + os.path.abspath(uri[len("file:"):])
    if "://" not in uri and not uri.startswith(("file:", "databricks", "sqlite:")):
        return os.path.abspath(uri)
    return uri


def config_key(cfg: RootConfig) -> str:
    """What makes two trials the same run: the whole config but where results go (tracking,
    checkpoint storage)."""
    import hashlib
    import json

    d = cfg.model_dump(mode="json", exclude={"tracking": True, "checkpoint": {"storage_path"}})
    return hashlib.sha1(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]


def trial_needs(cfg: RootConfig) -> dict[str, float]:
    """What a trial holds at its largest: max_workers times each worker's CPUs (and GPUs)."""
    s = cfg.scaling
    need = {"CPU": s.max_workers * s.cpus_per_worker}
    if s.use_gpu:
        need["GPU"] = s.max_workers * s.gpus_per_worker
    return need


class Capacity:
    """The cluster's CPUs/GPUs and what running trials hold."""

    def __init__(self, total: dict[str, float]):
        self.total = {k: float(v) for k, v in total.items() if k in ("CPU", "GPU")}
        self.used: dict[str, float] = {k: 0.0 for k in self.total}

    def never_fits(self, need: dict[str, float]) -> str | None:
        for k, v in need.items():
            if v > self.total.get(k, 0.0) + EPS:
                return f"needs {v:g} {k} but the cluster has {self.total.get(k, 0.0):g}"
        return None

    def fits(self, need: dict[str, float]) -> bool:
        return all(self.used.get(k, 0.0) + v <= self.total.get(k, 0.0) + EPS for k, v in need.items())

    def take(self, need: dict[str, float]) -> None:
        for k, v in need.items():
            self.used[k] = self.used.get(k, 0.0) + v

    def give(self, need: dict[str, float]) -> None:
        for k, v in need.items():
            self.used[k] = max(0.0, self.used.get(k, 0.0) - v)


# --------------------------------------------------------------------------- the driver


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


@dataclass
class TrialRecord:
    """A trial finished by this invocation."""

    number: int
    state: str
    values: list[float] | None
    params: dict[str, Any]
    steps: int = 0
    samples: int = 0
    wall_s: float = 0.0
    worker_seconds: float = 0.0
    error: str | None = None
    run_id: str | None = None
    pruned_at: int | None = None
    duplicate_of: int | None = None


@dataclass
class SearchSummary:
    study_name: str
    storage: str
    parent_run_id: str
    tracking_uri: str
    experiment_id: str
    records: list[TrialRecord]
    trials_in_study: int
    best: list[Any]
    wall_s: float
    objectives: list[str] = field(default_factory=list)

    def count(self, state: str) -> int:
        return sum(r.state == state for r in self.records)

    @property
    def total_steps(self) -> int:
        return sum(r.steps for r in self.records)


@dataclass
class _Pending:
    trial: Any
    values: dict[str, Any]
    cfg: RootConfig
    need: dict[str, float]
    key: str
    twin: int | None = None  # a running trial with the same config: wait for it, then reuse its value


@dataclass
class _Running:
    trial: Any
    values: dict[str, Any]
    cfg: RootConfig
    need: dict[str, float]
    key: str
    actor: Any
    ref: Any
    t0: float
    run_id: str | None = None
    last_step: int = -1
    last_value: float | None = None
    pruned_at: int | None = None


class _ActorPool:
    """Trial actors, reused across trials (each trial still gets a fresh orchestrator run)."""

    def __init__(self) -> None:
        self.idle: list[Any] = []
        self.busy: list[Any] = []

    def get(self) -> Any:
        from search.trial import TrialActor

        actor = self.idle.pop() if self.idle else TrialActor.remote()
        self.busy.append(actor)
        return actor

    def put(self, actor: Any, healthy: bool = True) -> None:
        import ray

        if actor in self.busy:
            self.busy.remove(actor)
        if healthy:
            self.idle.append(actor)
        else:
            ray.kill(actor, no_restart=True)

    def close(self) -> None:
        import ray

        for a in self.idle + self.busy:
            try:
                ray.kill(a, no_restart=True)
            except Exception:
                pass
        self.idle, self.busy = [], []


class _Bar:
    """The driver's progress bar: trials done/total, best value, running, pruned, failed."""

    def __init__(self, total: int, enabled: bool):
        self.bar = None
        self._last: tuple = ()
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc="trials", unit="trial", dynamic_ncols=True, file=sys.stderr,
                            bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}] {postfix}")

    def show(self, done: int, best: str, running: int, pruned: int, failed: int) -> None:
        """Redraw only when something changed (the driver polls several times a second)."""
        state = (done, best, running, pruned, failed)
        if self.bar is None or state == self._last:
            return
        self._last = state
        self.bar.n = done
        self.bar.set_postfix({"best": best, "running": running, "pruned": pruned, "failed": failed}, refresh=False)
        self.bar.refresh()

    def write(self, line: str) -> None:
        if self.bar is not None:
            self.bar.write(line, file=sys.stderr)
        else:
            print(line, file=sys.stderr)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _fmt_values(values: dict[str, Any]) -> str:
    def one(v: Any) -> str:
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    return " ".join(f"{k}={one(v)}" for k, v in values.items())


def grid_remaining(study: Any, space: SearchSpace) -> int | None:
    """Grid points this study has not started yet (``None`` unless the sampler is the grid)."""
    if not space.sampler.entry.needs_grid:
        return None
    grid = space.grid() or {}
    seen = {t.system_attrs["grid_id"] for t in study.get_trials(deepcopy=False)
            if "grid_id" in t.system_attrs and set(t.system_attrs.get("search_space", {})) == set(grid)}
    return max(0, (space.grid_size() or 0) - len(seen))


class SearchDriver:
    """Runs ``options.trials`` trials of ``space`` in ``study``, ``options.parallel`` at a time, on Ray."""

    def __init__(self, space: SearchSpace, study: Any, options: SearchOptions, storage_desc: str):
        self.space, self.study, self.opts, self.storage_desc = space, study, options, storage_desc
        self.records: list[TrialRecord] = []
        self.running: dict[int, _Running] = {}
        self.pool = _ActorPool()
        base_cfg = validate(space.base)
        self.tracking_uri = absolute_tracking_uri(options.tracking_uri or base_cfg.tracking.resolved_uri())
        self.experiment = base_cfg.tracking.experiment
        self.storage_path = os.path.abspath(os.path.expanduser(base_cfg.checkpoint.storage_path))
        self.metrics = [o.metric for o in space.objectives if o.per_step]
        self.tracker: StudyTracker | None = None
        self.capacity: Capacity | None = None
        self.bar: _Bar | None = None

    # -- one trial ------------------------------------------------------------------------

    def _runtime(self, raw: dict[str, Any], number: int) -> dict[str, Any]:
        raw.setdefault("tracking", {}).update(uri=self.tracking_uri, experiment=self.experiment,
                                              run_name=f"{self.study.study_name}-trial-{number}")
        raw.setdefault("checkpoint", {})["storage_path"] = self.storage_path
        return raw

    def _ask(self) -> _Pending | None:
        """A new trial with its config, or ``None`` if it failed on the spot (told FAIL)."""
        trial = self.study.ask()
        values: dict[str, Any] = {}
        try:
            values = self.space.sample(trial)
            trial.set_user_attr("config_values", values)
            cfg = validate(self._runtime(self.space.raw_config(values), trial.number))
            cfg.check_resources()
            need = trial_needs(cfg)
            why = self.capacity.never_fits(need) if self.capacity else None
            if why:
                raise ConfigError(f"scaling: this trial {why}; lower scaling.max_workers or cpus_per_worker")
        except (ConfigError, ValueError, TypeError) as e:
            self._fail_early(trial, values, f"invalid config: {e}")
            return None
        key = config_key(cfg)
        trial.set_user_attr("config_key", key)
        twin = None
        if self.space.skip_duplicates:
            same = self._duplicate_of(key)
            if same is not None:
                self._reuse(trial, values, same)
                return None
            twin = next((n for n, r in self.running.items() if r.key == key), None)
        return _Pending(trial, values, cfg, need, key, twin)

    def _duplicate_of(self, key: str) -> Any | None:
        """A COMPLETE trial of the study that trained exactly this config (its run would repeat)."""
        import optuna

        for t in self.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
            if t.user_attrs.get("config_key") == key and "duplicate_of" not in t.user_attrs:
                return t
        return None

    def _reuse(self, trial: Any, values: dict[str, Any], same: Any) -> None:
        """Tell a duplicate trial the value of the trial it repeats; it trains nothing (0 steps)."""
        trial.set_user_attr("duplicate_of", same.number)
        trial.set_user_attr("steps", 0)
        run_id = None
        if self.tracker is not None:
            run_id = self.tracker.duplicate_child(trial.number, values, same, [o.metric for o in self.space.objectives],
                                                  run_name=f"{self.study.study_name}-trial-{trial.number}")
            trial.set_user_attr("mlflow_run_id", run_id)
        self.study.tell(trial, list(same.values) if self.space.multi_objective else same.value)
        self._record(TrialRecord(trial.number, "COMPLETE", list(same.values), values, run_id=run_id,
                                 duplicate_of=same.number))

    def _fail_early(self, trial: Any, values: dict[str, Any], error: str) -> None:
        import optuna

        trial.set_user_attr("error", error)
        run_id = None
        if self.tracker is not None:
            run_id = self.tracker.failed_child(trial.number, values, error,
                                               run_name=f"{self.study.study_name}-trial-{trial.number}")
            trial.set_user_attr("mlflow_run_id", run_id)
        self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
        self._record(TrialRecord(trial.number, "FAIL", None, values, error=error, run_id=run_id))

    def _launch(self, p: _Pending) -> None:
        actor = self.pool.get()
        tags = self.tracker.child_tags(p.trial.number, p.values) if self.tracker else {}
        parent = self.tracker.run_id if self.tracker else None
        ref = actor.run.remote(p.trial.number, p.cfg.model_dump(mode="json"), parent, tags, self.metrics,
                               self.space.keep_checkpoints)
        self.capacity.take(p.need)
        self.running[p.trial.number] = _Running(p.trial, p.values, p.cfg, p.need, p.key, actor, ref, time.time())

    def _poll(self) -> None:
        """Report new objective values; stop the trials the pruner gives up on."""
        import ray

        refs = {n: r.actor.poll.remote(n) for n, r in self.running.items()}
        for n, ref in refs.items():
            r = self.running[n]
            try:
                info = ray.get(ref, timeout=30)
            except Exception:
                continue  # the actor died: its run ref reports it
            r.run_id = info["run_id"] or r.run_id
            if self.space.multi_objective or not self.metrics or self.metrics[0] != self.space.objectives[0].metric:
                continue
            for step, key, value in info["values"]:
                if step <= r.last_step:
                    continue
                r.trial.report(float(value), int(step))
                r.last_step, r.last_value = step, float(value)
            if self.space.prunes and r.pruned_at is None and r.last_step >= 0 and r.trial.should_prune():
                r.pruned_at = r.last_step
                r.actor.stop.remote(n)

    def _finish(self, r: _Running) -> None:
        """The trial's run returned (or its actor died): tell the study and close the MLflow run."""
        import optuna
        import ray

        from search.trial import TrialResult

        healthy = True
        try:
            res = TrialResult(**ray.get(r.ref))
        except Exception as e:  # the actor process died
            from search.trial import short_error

            healthy = False
            res = TrialResult(run_id=r.run_id, status="FAILED", stopped=r.pruned_at is not None, steps=0,
                              wall_s=time.time() - r.t0, worker_seconds=0.0,
                              error=f"trial actor died: {short_error(e)}")
        self.pool.put(r.actor, healthy)
        self.capacity.give(r.need)
        run_id = res.run_id or r.run_id
        values: list[float] | None = None
        error = res.error
        if error is not None:
            state = "FAIL"
        elif r.pruned_at is not None:
            state = "PRUNED"
        else:
            figures = [res.figure(o.metric) for o in self.space.objectives]
            missing = [o.metric for o, v in zip(self.space.objectives, figures) if v is None]
            bad = [o.metric for o, v in zip(self.space.objectives, figures) if v is not None and not math.isfinite(v)]
            if missing:
                state, error = "FAIL", (f"objective {missing[0]} was never reported by the run; "
                                        f"check train.eval_every / the metric name")
            elif bad:
                state, error = "FAIL", f"objective {bad[0]} is not finite (the run diverged)"
            elif res.status != "FINISHED":
                state, error = "FAIL", f"the run ended {res.status}"
            else:
                state, values = "COMPLETE", [float(v) for v in figures]  # type: ignore[arg-type]
        t = r.trial
        for key, v in (("mlflow_run_id", run_id), ("steps", res.steps), ("samples", res.samples),
                       ("wall_s", round(res.wall_s, 3)),
                       ("worker_seconds", round(res.worker_seconds, 3)), ("error", error),
                       ("pruned_at_step", r.pruned_at)):
            if v is not None:
                t.set_user_attr(key, v)
        if state == "COMPLETE":
            self.study.tell(t, values if self.space.multi_objective else values[0])  # type: ignore[index]
        else:
            self.study.tell(t, state=getattr(optuna.trial.TrialState, state))
        if state == "PRUNED" and r.last_value is not None and math.isfinite(r.last_value):
            values = [r.last_value]  # Optuna keeps the last intermediate value as a pruned trial's value
        if run_id and self.tracker is not None:
            try:
                self.tracker.finish_child(run_id, state, values, error, res.error_detail)
            except Exception as e:  # MLflow trouble must not stop the study
                self._write(f"warning: trial {t.number}: cannot update MLflow run {run_id} ({e})")
        self._record(TrialRecord(t.number, state, values, r.values, steps=res.steps, samples=res.samples,
                                 wall_s=res.wall_s,
                                 worker_seconds=res.worker_seconds, error=error, run_id=run_id,
                                 pruned_at=r.pruned_at))

    # -- bookkeeping ---------------------------------------------------------------------------

    def _write(self, line: str) -> None:
        if self.bar is not None:
            self.bar.write(line)
        else:
            print(line, file=sys.stderr)

    def _best_text(self) -> str:
        best = best_trials(self.study)
        if not best:
            return "-"
        if self.space.multi_objective:
            return f"{len(best)} on the front"
        return f"{best[0].value:.4g} (#{best[0].number})"

    def _record(self, rec: TrialRecord) -> None:
        self.records.append(rec)
        names = [o.metric for o in self.space.objectives]
        if rec.state == "COMPLETE" and rec.values:
            what = " ".join(f"{m}={v:.4g}" for m, v in zip(names, rec.values))
        elif rec.state == "PRUNED":
            what = f"pruned at step {rec.pruned_at}" + (f" ({names[0]}={rec.values[0]:.4g})" if rec.values else "")
        else:
            what = f"error: {rec.error}"
        extra = f"  {rec.steps} steps, {rec.wall_s:.0f} s" if rec.steps or rec.wall_s else ""
        if rec.duplicate_of is not None:
            extra = f"  same config as trial {rec.duplicate_of}: its value, not run again"
        self._write(f"trial {rec.number} {rec.state}  {what}{extra}  [{_fmt_values(rec.params)}]")
        self._refresh()

    def _refresh(self) -> None:
        if self.bar is not None:
            self.bar.show(len(self.records), self._best_text(), len(self.running),
                          sum(r.state == "PRUNED" for r in self.records), sum(r.state == "FAIL" for r in self.records))

    # -- the loop -------------------------------------------------------------------------------

    def run(self) -> SearchSummary:
        import ray

        from orchestrator.runner import ensure_ray

        t0 = time.time()
        n_trials = self.opts.trials
        remaining_grid = grid_remaining(self.study, self.space)
        if remaining_grid is not None:
            n_trials = remaining_grid if n_trials is None else min(n_trials, remaining_grid)
            if remaining_grid == 0:
                self._write(f"the grid is done: all {self.space.grid_size()} points of study "
                            f"{self.study.study_name!r} have been tried")
        n_trials = DEFAULT_TRIALS if n_trials is None else n_trials
        started_ray = ensure_ray(self.opts.verbose)
        status = "FAILED"
        try:
            self.capacity = Capacity(ray.cluster_resources())
            self.tracker = StudyTracker(self.tracking_uri, self.experiment, self.study.study_name,
                                        self.storage_desc, self.space,
                                        existing_run_id=self.study.user_attrs.get(PARENT_RUN_ATTR))
            self.study.set_user_attr(PARENT_RUN_ATTR, self.tracker.run_id)
            self.study.set_user_attr("tracking_uri", self.tracking_uri)
            self.study.set_user_attr("base_config", self.space.base)
            self.study.set_user_attr("space", self.space.summary())
            self.bar = _Bar(n_trials, self.opts.progress)
            self._refresh()
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
            if self.bar is not None:
                self.bar.close()
            self.pool.close()
            if self.tracker is not None:
                self._close_parent(status, time.time() - t0)
            if started_ray and not os.environ.get("ELASTIC_KEEP_RAY"):
                ray.shutdown()
        return SearchSummary(self.study.study_name, self.storage_desc, self.tracker.run_id, self.tracking_uri,
                             self.tracker.experiment_id, self.records, len(self.study.trials),
                             best_trials(self.study), time.time() - t0,
                             [o.metric for o in self.space.objectives])

    def _loop(self, n_trials: int, t0: float) -> None:
        import ray

        to_ask = n_trials
        pending: _Pending | None = None
        parallel = max(1, self.opts.parallel)
        while True:
            timed_out = self.opts.timeout_s is not None and time.time() - t0 >= self.opts.timeout_s
            # Fill free slots: ask for trials (failed-on-the-spot ones count), launch what fits.
            while pending is None and to_ask > 0 and not timed_out and len(self.running) < parallel:
                to_ask -= 1
                pending = self._ask()
            if pending is not None and pending.twin is not None and pending.twin not in self.running:
                same = self._duplicate_of(pending.key)
                if same is not None:
                    self._reuse(pending.trial, pending.values, same)
                    pending = None
                    continue
                pending.twin = None  # the twin was pruned or failed: run this one
            if (pending is not None and pending.twin is None and len(self.running) < parallel
                    and self.capacity.fits(pending.need)):
                self._launch(pending)
                pending = None
                self._refresh()
                continue
            if not self.running:
                if pending is None and (to_ask == 0 or timed_out):
                    break
                if pending is not None:  # nothing running, yet it does not fit: cannot happen (never_fits)
                    raise RuntimeError("a trial does not fit an idle cluster")
            refs = [r.ref for r in self.running.values()]
            done, _ = ray.wait(refs, num_returns=len(refs), timeout=POLL_S)
            self._poll()
            for n in [n for n, r in self.running.items() if r.ref in done]:
                self._finish(self.running.pop(n))
            self._refresh()
        if timed_out and to_ask > 0:
            self._write(f"--timeout reached: {to_ask} trial(s) not started")

    def _abort(self, why: str) -> None:
        """Fail the trials still running (the driver is going away)."""
        import optuna

        for n, r in list(self.running.items()):
            try:
                r.trial.set_user_attr("error", why)
                self.study.tell(r.trial, state=optuna.trial.TrialState.FAIL)
                if r.run_id and self.tracker is not None:
                    self.tracker.finish_child(r.run_id, "FAIL", None, why)
            except Exception:
                pass
            self.records.append(TrialRecord(n, "FAIL", None, r.values, error=why, run_id=r.run_id))
        self.running.clear()

    def _close_parent(self, status: str, wall_s: float) -> None:
        try:
            best_yaml = best_config_yaml(self.study)
        except ConfigError:
            best_yaml = None
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self.tracker.finish(self.study, status, wall_s, best_yaml)
        except Exception as e:
            self._write(f"warning: cannot finish the MLflow parent run ({type(e).__name__}: {e})")


def run_search(space: SearchSpace, options: SearchOptions) -> SearchSummary:
    """Create or continue the study and run ``options.trials`` more trials.  The space is checked."""
    import optuna

    if not options.verbose:
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    storage = open_storage(options.storage)
    study = create_or_load_study(space, options.study_name, storage)
    return SearchDriver(space, study, options, describe_storage(options.storage)).run()
