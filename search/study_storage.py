"""Where a study lives: an Optuna storage, named by a journal file path or an RDB URL.

By default a local journal file (``optuna.journal``: Optuna's ``JournalFileBackend``, safe for
several processes on one host); any RDB URL (``sqlite:///x.db``, ``postgresql://...``) for a
cluster.  Only the search driver opens it: trials run in Ray actors that never see it (see
``docs/architecture.md``, the search layer).  Every failure to open is a ``ConfigError`` naming
``--storage`` (exit status 2 in the CLI).
"""

from __future__ import annotations

import os
import sqlite3
from typing import TYPE_CHECKING

import optuna
from optuna.storages.journal import JournalFileBackend, JournalStorage

from orchestrator.config.schema import ConfigError
from orchestrator.interrupts import deferring
from trainers.errors import one_line

if TYPE_CHECKING:
    from optuna.storages import BaseStorage

DEFAULT_STORAGE = "optuna.journal"


def is_rdb_url(storage: str) -> bool:
    """``True`` for a database URL (``scheme://...``), ``False`` for a journal file path."""
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


NOT_OPTUNA_SCHEMES = ("http", "https", "file", "databricks", "mlflow-artifacts", "runs", "models", "s3", "gs", "wasbs")
"""URL schemes of MLflow stores, tracking servers and object stores: never an Optuna storage."""


def _is_mlflow_sqlite(path: str) -> bool:
    """Whether the existing sqlite file ``path`` is an MLflow tracking database (read-only look)."""

    try:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        finally:
            con.close()
    except sqlite3.Error:
        return False
    return {"experiments", "runs", "metrics"} <= tables


def check_storage(storage: str) -> None:
    """Refuse a storage string of the wrong kind before anything starts, creating nothing:
    an MLflow URI or database, an http(s) URL, a folder, a journal file under a missing folder.
    ``ConfigError`` names ``--storage`` and what to pass instead."""
    example = f"pass a journal file path (e.g. {DEFAULT_STORAGE}) or a database URL (sqlite:///optuna.db)"
    if not storage.strip():
        raise ConfigError(f"--storage: empty; {example}")
    if is_rdb_url(storage):
        scheme = storage.split("://", 1)[0].lower()
        shown = describe_storage(storage)
        if scheme.split("+")[0] in NOT_OPTUNA_SCHEMES:
            what = "a server URL" if scheme.startswith("http") else "not a database URL"
            raise ConfigError(
                f"--storage: {shown!r} is {what} (an MLflow tracking URI goes to --tracking-uri); {example}"
            )
        try:
            from sqlalchemy.engine import make_url

            url = make_url(storage)
        except Exception:
            raise ConfigError(f"--storage: {shown!r} is not a database URL; {example}") from None
        if url.get_backend_name() == "sqlite" and url.database:
            db = os.path.abspath(os.path.expanduser(url.database))
            if os.path.isdir(db):
                raise ConfigError(f"--storage: {db!r} is a folder; {example}")
            if os.path.isfile(db) and _is_mlflow_sqlite(db):
                raise ConfigError(
                    f"--storage: {db!r} is an MLflow tracking database (pass it as --tracking-uri); "
                    f"give Optuna a file of its own, e.g. sqlite:///optuna.db or {DEFAULT_STORAGE}"
                )
            if not os.path.isdir(os.path.dirname(db)):
                raise ConfigError(
                    f"--storage: folder {os.path.dirname(db)!r} does not exist; create it or pass another database file"
                )
        return
    path = os.path.abspath(os.path.expanduser(storage))
    if os.path.isdir(path):
        raise ConfigError(f"--storage: {path!r} is a folder; pass a journal file path (e.g. {DEFAULT_STORAGE})")
    folder = os.path.dirname(path)
    if not os.path.isdir(folder):
        raise ConfigError(f"--storage: folder {folder!r} does not exist; create it or pass another journal file")
    if os.path.isfile(path) and _is_mlflow_sqlite(path):
        raise ConfigError(
            f"--storage: {path!r} is an MLflow tracking database; give Optuna a file of its own, e.g. {DEFAULT_STORAGE}"
        )


def open_storage(storage: str, heartbeat_s: int | None = None) -> BaseStorage:
    """An Optuna storage: a journal file (a path) or an RDB (a URL).  ``ConfigError`` if it cannot open.

    ``heartbeat_s`` (the search driver's): an RDB storage gets Optuna's heartbeat with that interval,
    a grace period of ``liveness.GRACE_BEATS`` intervals and a ``StaleCollector`` (``search.liveness``);
    a journal file needs nothing (the driver beats in trial attributes).  A stop (Ctrl-C, SIGTERM)
    waits for the end of each call (``orchestrator.interrupts.deferring``): a journal's lock file or
    an RDB's transaction is never left half-held."""

    if is_rdb_url(storage):
        kw = {}
        if heartbeat_s is not None:
            from search.liveness import GRACE_BEATS, StaleCollector

            kw = dict(
                heartbeat_interval=int(heartbeat_s),
                grace_period=int(GRACE_BEATS * heartbeat_s),
                heartbeat_stale_trial_callback=StaleCollector(),
            )
        try:
            return deferring(optuna.storages.RDBStorage(storage, **kw))
        except Exception as e:
            raise ConfigError(
                f"--storage: cannot open {describe_storage(storage)!r} ({one_line(e)}); check the URL"
            ) from None
    path = os.path.abspath(os.path.expanduser(storage))
    folder = os.path.dirname(path)
    if not os.path.isdir(folder):
        raise ConfigError(f"--storage: folder {folder!r} does not exist; create it or pass another journal file")
    if os.path.isdir(path):
        raise ConfigError(f"--storage: {path!r} is a folder; pass a journal file path (e.g. {DEFAULT_STORAGE})")

    try:
        return deferring(JournalStorage(JournalFileBackend(path)))
    except Exception as e:
        raise ConfigError(f"--storage: cannot use journal file {path!r} ({e})") from None


def study_names(storage: BaseStorage) -> list[str]:
    """The names of the studies the storage holds, in creation order."""

    return [s.study_name for s in optuna.get_all_study_summaries(storage, include_best_trial=False)]
