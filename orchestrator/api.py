"""The Python API: ``from orchestrator import fit`` trains a config from a script or a notebook.

``fit(config, model_fn=..., data_fn=...)`` is ``python -m orchestrator train`` with the factories
given as Python functions.  An importable function (``module.function`` that imports back to the
same object) is recorded as ``"module:qualname"`` in ``model.factory``/``data.factory``, so the run
resumes from the CLI like any other; a lambda, a local function or one defined in ``__main__`` is
sent to the workers by value (Ray pickles it with cloudpickle) and recorded as
``"python:module.qualname"``: ``python -m orchestrator resume RUN`` then says in one line how to
resume it from Python (``fit(resume=RUN, model_fn=..., data_fn=...)``).

Bad input raises :class:`orchestrator.config.schema.ConfigError` (a ``ValueError`` with the CLI's one-line
message) before Ray starts or an MLflow run exists.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from orchestrator.config.prepare import load, prepare
from orchestrator.config.schema import ConfigError
from orchestrator.run.ray_env import quiet_libraries
from trainers.loop.storage import join
from trainers.workload.build import BY_VALUE, by_value_name
from trainers.workload.factory import qualified_name


@dataclass
class FitResult:
    """What :func:`fit` returns: the MLflow run, how it ended, and its final metrics."""

    run_id: str
    status: str  # FINISHED, FAILED or KILLED
    metrics: dict[str, float] = field(default_factory=dict)  # last value of train/loss, val/loss, ...
    steps: int = 0
    wall_s: float = 0.0
    tracking_uri: str = ""
    experiment_id: str = ""
    checkpoint_dir: str = ""
    worker_seconds: float = 0.0  # what the run's worker groups held (orchestrator/record/cost.py)

    @property
    def final(self) -> dict[str, float]:
        """The final metrics (the same as :attr:`metrics`; the name ``RunSummary`` uses)."""
        return self.metrics


def _record(
    section: str, fn: Callable[..., Any], raw: dict[str, Any], functions: dict[str, Callable[..., Any]]
) -> None:
    """Name ``fn`` as the section's factory in ``raw``: by import path, or by value."""

    if not callable(fn):
        raise ConfigError(f"{section}.factory: {section}_fn is a {type(fn).__name__}, not a callable")
    node = raw.setdefault(section, {})
    if not isinstance(node, dict):
        raise ConfigError(f"{section}: must be a mapping of keys")
    node.pop("name", None)  # the function replaces a built-in name
    name = qualified_name(fn)
    if name is None:
        name = by_value_name(fn)
        functions[section] = fn
    node["factory"] = name


def by_value_fields(raw: dict[str, Any]) -> dict[str, str]:
    """``{"model.factory": "python:..."}`` for each factory of a recorded config sent by value."""

    out = {}
    for section in ("data", "model"):
        value = (raw.get(section) or {}).get("factory")
        if isinstance(value, str) and value.startswith(BY_VALUE):
            out[f"{section}.factory"] = value
    return out


def resume_hint(run_id: str, raw: dict[str, Any]) -> str | None:
    """One line telling how to resume a run whose factories were sent by value, or None."""
    fields = by_value_fields(raw)
    if not fields:
        return None
    args = ", ".join(f"{f.split('.')[0]}_fn=<{v[len('python:') :]}>" for f, v in fields.items())
    what = ", ".join(f"{f}={v}" for f, v in fields.items())
    return (
        f"run: {run_id} was started from Python with functions sent by value ({what}); resume it from "
        f"Python: from orchestrator import fit; fit(resume={run_id!r}, {args})"
    )


def fit(
    config: str | dict[str, Any] | None = None,
    *,
    model_fn: Callable[..., Any] | None = None,
    data_fn: Callable[..., Any] | None = None,
    overrides: Iterable[str] = (),
    tracking_uri: str | None = None,
    resume: str | None = None,
    progress: bool = True,
    verbose: bool = False,
) -> FitResult:
    """Train ``config`` (a YAML path or a dict of sections) on Ray, tracked in MLflow; return the result.

    ``model_fn``/``data_fn`` replace ``model.factory``/``data.factory`` (called with ``params`` as
    keyword arguments, like a factory named in the config).  ``overrides`` are ``--set`` items
    (``"batch.size=128"``).  ``resume``: an MLflow run id (or run storage folder) to continue from its
    latest checkpoint, in the same run; its recorded config is used and ``config`` must be None.
    ``verbose``: also MLflow's and Ray's own INFO lines (by default only the bar and its lines).
    """
    t0 = time.time()

    quiet_libraries(verbose)  # a notebook shows the bar and its lines, not MLflow's and Ray's INFO lines
    functions: dict[str, Callable[..., Any]] = {}
    resume_id = None
    if resume is not None:
        if config is not None:
            raise ConfigError("config: give either a config or resume=RUN (which uses the run's own config)")
        from orchestrator.run.run_info import find_run  # only a resume reads a run's folder

        resume_id, uri, raw = find_run(resume, tracking_uri)
        raw.setdefault("tracking", {})["uri"] = uri
        for section, fn in (("model", model_fn), ("data", data_fn)):
            if fn is not None:
                from trainers.workload.factory import qualified_name

                recorded = (raw.get(section) or {}).get("factory") or ""
                if qualified_name(fn) is None or recorded.startswith("python:"):
                    functions[section] = fn
        missing = [f for f in by_value_fields(raw) if f.split(".")[0] not in functions]
        if missing:
            raise ConfigError(resume_hint(resume_id, raw) or f"{missing[0]}: pass the function again")
        if list(overrides):
            raise ConfigError(
                "overrides: a resumed run keeps its recorded config; drop overrides (or start a new "
                "run from the changed config)"
            )
        cfg = prepare(raw, functions=functions or None)  # the same checks as train, environment included
    else:
        raw = load(config)
        for section, fn in (("model", model_fn), ("data", data_fn)):
            if fn is not None:
                _record(section, fn, raw, functions)
        cfg = prepare(raw, overrides, functions=functions or None, tracking_uri=tracking_uri)

    from orchestrator.interrupts import terminate_as_interrupt
    from orchestrator.run.runner import run_training

    with terminate_as_interrupt(sigterm=False):  # Ctrl-C waits for a write to MLflow in progress
        s = run_training(
            cfg, verbose=verbose, progress=progress, t_invoked=t0, resume_run_id=resume_id, functions=functions or None
        )

    return FitResult(
        run_id=s.run_id,
        status=s.status,
        metrics=dict(s.final),
        steps=s.steps,
        wall_s=s.wall_s,
        tracking_uri=s.tracking_uri,
        experiment_id=s.experiment_id,
        checkpoint_dir=join(s.storage_path, s.train_run_name),
        worker_seconds=s.worker_seconds,
    )
