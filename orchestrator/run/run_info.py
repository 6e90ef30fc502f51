"""Finding a training run again (``resume``): a small JSON file beside its checkpoints names its
MLflow run and holds its config; a lock beside it says a driver is training the run now.

Both live where the checkpoints do, a local folder or an object store (trainers/loop/storage.py).

What ``resume`` may trust (each a refusal with one line and exit status 2, never a fresh start):
the file is written atomically with absolute locations (a resume from another folder reaches the
same tracking store and checkpoints), without credentials (a tracking URI that had some must be
given again); a damaged file, a run that is not in the tracking store, a run with history but no
loadable checkpoint, and a run whose driver is still alive (or already resumed) are refused.
"""

from __future__ import annotations

import copy
import fcntl
import json
import logging
import os
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from orchestrator.config.schema import DEFAULT_TRACKING_URI, ConfigError
from orchestrator.config.uris import REDACTED, absolute_tracking_uri, has_credentials, mlflow_uri, redact_uri
from trainers.errors import one_line
from trainers.link import tags as T
from trainers.loop.checkpoint import CorruptCheckpoint, run_checkpoints, verify_checkpoint
from trainers.loop.storage import is_uri, join, pid_alive, reach_problem, resolve, store_for

logger = logging.getLogger(__name__)

RUN_INFO = "elastic_run.json"
DRIVER_LOCK = "driver.lock"


def run_folder(storage_path: str, train_run_name: str) -> str:
    """The run's (first phase's) folder: an absolute local path, or a URI under the bucket prefix."""
    return join(resolve(storage_path), train_run_name)


def write_run_info(folder: str, run_id: str, tracking_uri: str, public: dict[str, Any]) -> None:
    """Beside the checkpoints, in the run's ``folder`` (:func:`run_folder`), atomically: what
    ``resume`` needs to find MLflow run ``run_id`` in ``tracking_uri`` again, and the run's
    ``public`` config (``record.params.public_config``) with its storage path resolved."""
    config = copy.deepcopy(public)
    config["checkpoint"]["storage_path"] = resolve(config["checkpoint"]["storage_path"])
    uri = absolute_tracking_uri(tracking_uri)
    config["tracking"]["uri"] = redact_uri(uri)
    info = {"run_id": run_id, "tracking_uri": redact_uri(uri), "config": config}
    path = join(folder, RUN_INFO)
    store_for(path).write_bytes(path, json.dumps(info, indent=1).encode())


def read_run_info(folder: str) -> dict[str, Any]:
    path = join(folder, RUN_INFO)
    try:
        data = store_for(path).read_bytes(path)
    except OSError as e:
        if is_uri(path):  # the store did not answer: nothing says the file is damaged
            raise ConfigError(
                f"run: cannot read {path} ({one_line(e, 160)}); check the object store's credentials and "
                "endpoint in the environment"
            ) from None
        raise ConfigError(
            f"run: {path} is damaged ({one_line(e, 160)}); resume by the MLflow run id with --tracking-uri instead"
        ) from None
    try:
        info = json.loads(data)
        if not isinstance(info, dict) or not {"run_id", "tracking_uri", "config"} <= set(info):
            raise ValueError("keys run_id, tracking_uri, config missing")
        return info
    except ValueError as e:
        raise ConfigError(
            f"run: {path} is damaged ({one_line(e, 160)}); resume by the MLflow run id with --tracking-uri instead"
        ) from None


def _holds_run_info(folder: str) -> bool:
    """Whether ``folder`` (a local path or a URI) holds a run's ``elastic_run.json``; an object
    store that cannot be reached is a one-line ``ConfigError``."""
    if not is_uri(folder):
        return os.path.isfile(os.path.join(folder, RUN_INFO))
    why = reach_problem(folder)
    if why is not None:
        raise ConfigError(f"run: {why}")
    try:
        return store_for(folder).kind(join(folder, RUN_INFO)) == "file"
    except OSError as e:
        raise ConfigError(f"run: cannot read {folder} ({one_line(e, 160)})") from None


def _uri_to_use(stored: str, given: str | None) -> str:
    if given:
        return absolute_tracking_uri(given)
    if REDACTED in stored:
        env = os.environ.get("MLFLOW_TRACKING_URI")
        if env and redact_uri(env) == stored:
            return env
        raise ConfigError(
            f"--tracking-uri: the run's tracking URI {stored} held credentials, which are never "
            "stored; pass it again with --tracking-uri (or MLFLOW_TRACKING_URI)"
        )
    return stored


def find_run(ref: str, tracking_uri: str | None = None) -> tuple[str, str, dict[str, Any]]:
    """(run_id, tracking_uri, config dict) of a run, from its MLflow run id or its storage directory."""
    folder = resolve(ref) if is_uri(ref) else os.path.expanduser(ref)
    if _holds_run_info(folder):
        info = read_run_info(folder)
        return info["run_id"], _uri_to_use(info["tracking_uri"], tracking_uri), info["config"]
    if is_uri(folder):
        raise ConfigError(
            f"run: {folder} holds no {RUN_INFO}; pass the run's folder (<storage>/elastic-<run id>) "
            "or its MLflow run id"
        )

    uri = absolute_tracking_uri(tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI)
    check_store_exists(uri)

    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    try:
        run = MlflowClient(mlflow_uri(uri)).get_run(ref)
    except MlflowException:
        raise ConfigError(
            f"run: {ref!r} is neither an MLflow run id in {redact_uri(uri)} nor a run storage "
            f"directory holding {RUN_INFO}; pass one of those (or --tracking-uri)"
        ) from None
    storage, name = run.data.tags.get(T.STORAGE_PATH), run.data.tags.get(T.TRAIN_RUN_NAME)
    if not storage or not name or not _holds_run_info(join(storage, name)):
        raise ConfigError(
            f"run: {ref!r} has no checkpoint storage recorded (tags {T.STORAGE_PATH}); "
            "it was not started by this orchestrator or its storage is gone"
        )
    return ref, uri, read_run_info(join(storage, name))["config"]


def check_store_exists(uri: str) -> None:
    """A local store that does not exist would be created empty by MLflow: refuse instead."""
    path = uri[len("sqlite:///") :] if uri.startswith("sqlite:///") else None
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
        raise ConfigError(
            f"run: {run_id} is not in the tracking store {redact_uri(uri)}; pass the store it was "
            "tracked in with --tracking-uri"
        ) from None
    if run.info.status == "FINISHED":
        last = max((m.step for m in steps), default=0)
        raise ConfigError(
            f"run: {run_id} is FINISHED (it trained to its planned last step {last}); there is "
            "nothing to resume: train a new run (train.epochs counts from step 0)"
        )
    if not steps:
        return  # nothing trained yet: starting from step 0 loses nothing

    try:
        paths = run_checkpoints(resolve(storage_path), train_run_name)
    except OSError as e:
        raise ConfigError(
            f"checkpoint.storage_path: cannot list {run_folder(storage_path, train_run_name)} "
            f"({one_line(e, 160)}); check the object store's credentials and endpoint"
        ) from None
    for path in paths:
        try:
            verify_checkpoint(path)
            return
        except CorruptCheckpoint:
            continue
    last = max(m.step for m in steps)
    raise ConfigError(
        f"run: {run_id} trained {last} steps but has no loadable checkpoint under "
        f"{run_folder(storage_path, train_run_name)} ({len(paths)} found, none intact); "
        "resuming would start over: train it anew instead"
    )


LEASE_S = 30.0  # an object-store lock not renewed for this long is a dead driver's
RENEW_S = 10.0  # how often a live driver renews it
CLOCK_SKEW_S = 120.0  # what another host's clock may be off by (a lease older than this plus LEASE_S is stale)


class DriverLock:
    """One driver per run at a time: held for as long as a driver trains the run (``train`` or
    ``resume``); a second ``resume`` of the same run, or one while the first driver is alive, is
    refused.

    In a local folder: an exclusive ``flock`` on ``driver.lock``, released by the kernel when the
    process dies, so a killed driver never leaves a stale lock (on one host; shared filesystems
    may not honour it).  On an object store there is no flock: a :class:`DriverLease` object
    ``driver.lock`` in the run's folder instead.  A lock file on the driver's own disk would only
    stop a second driver on the same machine, and the point of a bucket is that the run can be
    resumed from any machine; two drivers of one run would write over each other's checkpoints."""

    def __init__(self, folder: str):
        self.folder, self._fd = folder, None
        self._lease: DriverLease | None = None

    def acquire(self, run_id: str = "") -> DriverLock:
        if is_uri(self.folder):
            self._lease = DriverLease(join(self.folder, DRIVER_LOCK)).acquire(run_id)
            return self
        os.makedirs(self.folder, exist_ok=True)
        path = os.path.join(self.folder, DRIVER_LOCK)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise ConfigError(
                f"run: {run_id or self.folder} is being trained by a live driver ({holder}); "
                "wait for it to end or stop it, then resume"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}".encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._lease is not None:
            self._lease.release()
            self._lease = None
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class DriverLease:
    """The driver lock on an object store: an object naming its holder (host, pid, a token),
    rewritten every ``renew_s`` seconds by a thread of the driver that holds it.

    Whether the holder is alive: on this host its pid says so at once (a killed driver's lease is
    taken over by the next ``resume`` right away, as a local flock would be); a holder on another
    host is alive while it renews, so a lease renewed within ``lease_s`` (plus the clocks'
    skew) is watched for up to ``lease_s`` and taken over only if nothing renews it.  Two drivers
    that start in the same instant can both write; each reads the lease back and the one whose
    token is not there gives up (an object store offers no compare-and-swap through pyarrow)."""

    lease_s, renew_s, skew_s = LEASE_S, RENEW_S, CLOCK_SKEW_S

    def __init__(self, path: str, warn: Callable[[str], None] = _stderr) -> None:
        self.path, self.warn, self.store = path, warn, store_for(path)
        self.token = uuid.uuid4().hex
        self._beat = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _read(self) -> tuple[bytes | None, dict[str, Any]]:
        """The lease's raw bytes (None: there is none) and its fields ({} when unreadable)."""
        if self.store.kind(self.path) != "file":
            return None, {}
        try:
            raw = self.store.read_bytes(self.path)
        except FileNotFoundError:  # released between the two requests
            return None, {}
        try:
            fields = json.loads(raw)
        except ValueError:
            fields = {}
        return raw, fields if isinstance(fields, dict) else {}

    def _write(self) -> None:
        host = socket.gethostname()
        self.store.write_bytes(
            self.path,
            json.dumps(
                {
                    "holder": f"pid {os.getpid()} on {host}",
                    "host": host,
                    "pid": os.getpid(),
                    "token": self.token,
                    "renewed_at": time.time(),
                    "beat": self._beat,
                }
            ).encode(),
        )

    def _gone(self, raw: bytes, fields: dict[str, Any]) -> bool:
        """Whether the driver that wrote this lease is dead (see the class)."""
        age = time.time() - float(fields.get("renewed_at", 0) or 0)
        if fields.get("host") == socket.gethostname():
            return not pid_alive(int(fields.get("pid", 0) or 0)) or age > self.lease_s
        if age > self.lease_s + self.skew_s:
            return True
        self.warn(
            f"{self.path} names a driver on another host ({fields.get('holder', 'unreadable')}); "
            f"waiting up to {self.lease_s:.0f} s to see whether it renews its lease"
        )
        deadline = time.monotonic() + self.lease_s
        while time.monotonic() < deadline:
            time.sleep(min(1.0, self.renew_s / 4))
            now, _ = self._read()
            if now != raw:
                return now is None  # renewed: alive; removed: released
        return True

    def acquire(self, run_id: str = "") -> DriverLease:
        what = run_id or os.path.dirname(self.path)
        raw, fields = self._read()
        if raw is not None and not self._gone(raw, fields):
            raise ConfigError(
                f"run: {what} is being trained by a live driver ({fields.get('holder', 'another process')}); "
                "wait for it to end or stop it, then resume"
            )
        self._write()
        _, back = self._read()
        if back.get("token") != self.token:
            raise ConfigError(
                f"run: {what} was taken by another driver a moment ago "
                f"({back.get('holder', 'another process')}); wait for it to end or stop it, then resume"
            )
        self._thread = threading.Thread(target=self._renew, name="driver-lease", daemon=True)
        self._thread.start()
        return self

    def _renew(self) -> None:
        while not self._stop.wait(self.renew_s):
            try:
                _, fields = self._read()
                if fields.get("token") != self.token:
                    logger.warning(
                        "the driver lease %s was taken over by %s; another driver trains this run",
                        self.path,
                        fields.get("holder", "another process"),
                    )
                    return
                self._beat += 1
                self._write()
            except Exception as e:  # a store that does not answer now may answer at the next beat
                logger.warning("could not renew the driver lease %s (%s)", self.path, one_line(e, 160))

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.renew_s)
            self._thread = None
        try:
            _, fields = self._read()
            if fields.get("token") == self.token:
                self.store.remove(self.path)
        except OSError as e:  # it expires on its own
            logger.warning("could not remove the driver lease %s (%s)", self.path, one_line(e, 160))


__all__ = [
    "DRIVER_LOCK",
    "DriverLease",
    "DriverLock",
    "RUN_INFO",
    "check_resumable",
    "check_store_exists",
    "find_run",
    "has_credentials",
    "read_run_info",
    "run_folder",
    "write_run_info",
]
