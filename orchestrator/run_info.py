"""Finding a training run again (``resume``): a small JSON file beside its checkpoints names its
MLflow run and holds its config; a lock beside it says a driver is training the run now.

What ``resume`` may trust (each a refusal with one line and exit status 2, never a fresh start):
the file is written atomically with absolute locations (a resume from another folder reaches the
same tracking store and checkpoints), without credentials (a tracking URI that had some must be
given again); a damaged file, a run that is not in the tracking store, a run with history but no
loadable checkpoint, and a run whose driver is still alive (or already resumed) are refused.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
from typing import Any, Protocol

from orchestrator.config import ConfigError, RootConfig, public_config
from orchestrator.uris import REDACTED, absolute_tracking_uri, has_credentials, mlflow_uri, redact_uri

RUN_INFO = "elastic_run.json"
DRIVER_LOCK = "driver.lock"


class _Run(Protocol):  # what write_run_info reads of a PhaseRunner
    storage_path: str
    train_run_name: str
    tracker: Any


def run_folder(storage_path: str, train_run_name: str) -> str:
    return os.path.join(os.path.abspath(os.path.expanduser(storage_path)), train_run_name)


def write_run_info(runner: _Run, cfg: RootConfig) -> None:
    """Beside the checkpoints, atomically: what ``resume`` needs to find the MLflow run again."""
    folder = run_folder(runner.storage_path, runner.train_run_name)
    os.makedirs(folder, exist_ok=True)
    config = public_config(cfg)
    config["checkpoint"]["storage_path"] = os.path.abspath(os.path.expanduser(cfg.checkpoint.storage_path))
    uri = absolute_tracking_uri(runner.tracker.uri)
    config["tracking"]["uri"] = redact_uri(uri)
    info = {"run_id": runner.tracker.run_id, "tracking_uri": redact_uri(uri), "config": config}
    path = os.path.join(folder, RUN_INFO)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(info, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_run_info(folder: str) -> dict[str, Any]:
    path = os.path.join(folder, RUN_INFO)
    try:
        with open(path) as f:
            info = json.load(f)
        if not isinstance(info, dict) or not {"run_id", "tracking_uri", "config"} <= set(info):
            raise ValueError("keys run_id, tracking_uri, config missing")
        return info
    except (OSError, ValueError) as e:
        raise ConfigError(f"run: {path} is damaged ({type(e).__name__}: {str(e).splitlines()[0][:120]}); "
                          "resume by the MLflow run id with --tracking-uri instead") from None


def _uri_to_use(stored: str, given: str | None) -> str:
    if given:
        return absolute_tracking_uri(given)
    if REDACTED in stored:
        env = os.environ.get("MLFLOW_TRACKING_URI")
        if env and redact_uri(env) == stored:
            return env
        raise ConfigError(f"--tracking-uri: the run's tracking URI {stored} held credentials, which are never "
                          "stored; pass it again with --tracking-uri (or MLFLOW_TRACKING_URI)")
    return stored


def find_run(ref: str, tracking_uri: str | None = None) -> tuple[str, str, dict[str, Any]]:
    """(run_id, tracking_uri, config dict) of a run, from its MLflow run id or its storage directory."""
    folder = os.path.expanduser(ref)
    if os.path.isfile(os.path.join(folder, RUN_INFO)):
        info = read_run_info(folder)
        return info["run_id"], _uri_to_use(info["tracking_uri"], tracking_uri), info["config"]
    from orchestrator.config import DEFAULT_TRACKING_URI

    uri = absolute_tracking_uri(tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI)
    check_store_exists(uri)
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    try:
        run = MlflowClient(mlflow_uri(uri)).get_run(ref)
    except MlflowException:
        raise ConfigError(f"run: {ref!r} is neither an MLflow run id in {redact_uri(uri)} nor a run storage "
                          f"directory holding {RUN_INFO}; pass one of those (or --tracking-uri)") from None
    storage, name = run.data.tags.get("elastic.storage_path"), run.data.tags.get("elastic.train_run_name")
    if not storage or not name or not os.path.isfile(os.path.join(storage, name, RUN_INFO)):
        raise ConfigError(f"run: {ref!r} has no checkpoint storage recorded (tags elastic.storage_path); "
                          "it was not started by this orchestrator or its storage is gone")
    return ref, uri, read_run_info(os.path.join(storage, name))["config"]


def check_store_exists(uri: str) -> None:
    """A local store that does not exist would be created empty by MLflow: refuse instead."""
    path = uri[len("sqlite:///"):] if uri.startswith("sqlite:///") else None
    if path and not os.path.isfile(path):
        raise ConfigError(f"--tracking-uri: {uri} does not exist; pass the store the run was tracked in")


def check_resumable(run_id: str, uri: str, storage_path: str, train_run_name: str) -> None:
    """Refuse a resume that would start over: the run must be in the store, and a run that has
    trained steps must have a loadable checkpoint."""
    check_store_exists(uri)
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    try:
        client = MlflowClient(mlflow_uri(uri))
        run = client.get_run(run_id)
        steps = client.get_metric_history(run_id, "train/loss")
    except MlflowException:
        raise ConfigError(f"run: {run_id} is not in the tracking store {redact_uri(uri)}; pass the store it was "
                          "tracked in with --tracking-uri") from None
    if run.info.status == "FINISHED":
        last = max((m.step for m in steps), default=0)
        raise ConfigError(f"run: {run_id} is FINISHED (it trained to its planned last step {last}); there is "
                          "nothing to resume: train a new run (train.epochs counts from step 0)")
    if not steps:
        return  # nothing trained yet: starting from step 0 loses nothing
    from trainers.loop.checkpoint import CorruptCheckpoint, run_checkpoints, verify_checkpoint

    paths = run_checkpoints(os.path.abspath(storage_path), train_run_name)
    for path in paths:
        try:
            verify_checkpoint(path)
            return
        except CorruptCheckpoint:
            continue
    last = max(m.step for m in steps)
    raise ConfigError(f"run: {run_id} trained {last} steps but has no loadable checkpoint under "
                      f"{run_folder(storage_path, train_run_name)} ({len(paths)} found, none intact); "
                      "resuming would start over: train it anew instead")


class DriverLock:
    """An exclusive lock on the run folder's ``driver.lock``, held for as long as a driver trains
    the run (``train`` or ``resume``): a second ``resume`` of the same run, or one while the first
    driver is alive, is refused.  ``flock`` is released by the kernel when the process dies, so a
    killed driver never leaves a stale lock (on one host; shared filesystems may not honour it)."""

    def __init__(self, folder: str):
        self.folder, self._fd = folder, None

    def acquire(self, run_id: str = "") -> "DriverLock":
        os.makedirs(self.folder, exist_ok=True)
        path = os.path.join(self.folder, DRIVER_LOCK)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise ConfigError(f"run: {run_id or self.folder} is being trained by a live driver ({holder}); "
                              "wait for it to end or stop it, then resume") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}".encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


__all__ = ["DRIVER_LOCK", "DriverLock", "RUN_INFO", "check_resumable", "check_store_exists", "find_run",
           "has_credentials", "read_run_info", "run_folder", "write_run_info"]
