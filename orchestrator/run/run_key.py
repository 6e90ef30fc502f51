"""A training run's idempotency key: a restarted entrypoint goes on with its own run.

A job system that restarts the driver (a KubeRay RayJob's ``backoffLimit``, a ``ray job submit``
retried by its submitter) starts ``python -m orchestrator train CONFIG`` again.  With a key
(``--run-key KEY``, ``tracking.run_key``, or by default the Ray job's submission id, which the job
supervisor gives its entrypoint in ``RAY_JOB_CONFIG_JSON_ENV_VAR``'s ``metadata``), the MLflow run is
tagged ``elastic.run_key``, and a ``train`` whose key names a run already in the experiment:

- a FINISHED one: says so and exits 0 (nothing to train again);
- any other (killed, failed, stopped, RUNNING): resumes it from its newest checkpoint, as
  ``resume RUN_ID`` does; the run's driver lock (orchestrator/run/run_info.py) refuses, with one
  line and exit status 2, a second driver while the first is alive.

:func:`decide` is the choice on the runs found; :func:`find_keyed` asks MLflow for them.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from orchestrator.config.schema import ConfigError
from trainers.link import tags as T

JOB_CONFIG_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"  # set by Ray's job supervisor for a submitted entrypoint
_SUBMISSION_ID = "job_submission_id"  # its metadata's key for the job's submission id
_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@-]{0,199}")


def submission_id(environ: Mapping[str, str] = os.environ) -> str | None:
    """The submission id of the Ray job this process is the entrypoint of (None: not one)."""
    raw = environ.get(JOB_CONFIG_ENV)
    if not raw:
        return None
    try:
        metadata = json.loads(raw).get("metadata") or {}
    except (ValueError, AttributeError):
        return None
    found = metadata.get(_SUBMISSION_ID) if isinstance(metadata, dict) else None
    return str(found) if found else None


def run_key(flag: str | None, configured: str | None, environ: Mapping[str, str] = os.environ) -> str | None:
    """The run's key: ``--run-key``, else ``tracking.run_key``, else the Ray job's submission id
    (None: no key, every ``train`` is a new run).  A key MLflow's search cannot match exactly is
    refused with one line."""
    where = "--run-key" if flag is not None else "tracking.run_key"
    key = flag if flag is not None else configured
    if key is None:
        return submission_id(environ)
    if not _KEY.fullmatch(key):
        raise ConfigError(
            f"{where}: {key[:60]!r} is not a usable key; use 1 to 200 letters, digits and . _ : / @ - "
            "(starting with a letter or digit), e.g. the RayJob's name"
        )
    return key


@dataclass(frozen=True)
class KeyedStart:
    """What a keyed ``train`` does: ``new`` run, ``resume`` ``run_id``, or nothing (``finished``)."""

    action: Literal["new", "resume", "finished"]
    run_id: str | None = None


def decide(runs: Sequence[tuple[str, str, int]]) -> KeyedStart:
    """The choice on the runs tagged with the key, each ``(run_id, status, start_time_ms)``: none,
    a new run; the newest FINISHED, nothing; else the newest goes on."""
    if not runs:
        return KeyedStart("new")
    run_id, status, _ = max(runs, key=lambda r: r[2])
    return KeyedStart("finished" if status == "FINISHED" else "resume", run_id)


def find_keyed(client: Any, experiment: str, key: str) -> list[tuple[str, str, int]]:
    """The runs of ``experiment`` tagged with ``key``, through an ``MlflowClient`` (none when the
    experiment does not exist yet)."""
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return []
    runs = client.search_runs([exp.experiment_id], filter_string=f"tags.`{T.RUN_KEY}` = '{key}'", max_results=50)
    return [(r.info.run_id, r.info.status, int(r.info.start_time or 0)) for r in runs]
