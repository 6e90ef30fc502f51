"""Finding a training run again (``resume``): a small JSON file beside its checkpoints names
its MLflow run and holds its config."""

from __future__ import annotations

import json
import os
from typing import Any, Protocol

from orchestrator.config import RootConfig

RUN_INFO = "elastic_run.json"


class _Run(Protocol):  # what write_run_info reads of a PhaseRunner
    storage_path: str
    train_run_name: str
    tracker: Any


def write_run_info(runner: _Run, cfg: RootConfig) -> None:
    """Beside the checkpoints: what ``resume`` needs to find the MLflow run again."""
    folder = os.path.join(runner.storage_path, runner.train_run_name)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, RUN_INFO), "w") as f:
        json.dump({"run_id": runner.tracker.run_id, "tracking_uri": runner.tracker.uri,
                   "config": cfg.model_dump(mode="json")}, f, indent=1)


def find_run(ref: str, tracking_uri: str | None = None) -> tuple[str, str, dict[str, Any]]:
    """(run_id, tracking_uri, config dict) of a run, from its MLflow run id or its storage directory."""
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
