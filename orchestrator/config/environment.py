"""The filesystem and the tracking store a run will write to, checked before Ray starts (reads only).

:func:`check_environment` (``orchestrator/config/prepare.py`` runs it last, for every command that
trains): the checkpoint folder (or the object store's bucket) and the tracking store's folder must
be creatable and writable, and the experiment must not be a deleted one.  Nothing is created here.
"""

from __future__ import annotations

import glob
import os
import sqlite3
from typing import TYPE_CHECKING

import yaml

from orchestrator.config.schema import ConfigError
from trainers.loop.storage import is_uri, reach_problem, resolve

if TYPE_CHECKING:
    from orchestrator.config.schema import RootConfig


def _nearest_existing(path: str) -> str:
    cur = path
    while not os.path.exists(cur):
        parent = os.path.dirname(cur)
        if parent == cur:
            break
        cur = parent
    return cur


def folder_problem(path: str, create: bool = True) -> str | None:
    """Why the folder ``path`` cannot be used for writing (``None`` if it can), touching nothing.

    ``create``: the folder may be missing and made later (its nearest existing ancestor must then be
    a writable folder); otherwise it must exist.
    """
    if not path.strip():
        return "is empty"
    full = os.path.abspath(os.path.expanduser(path))
    if os.path.exists(full):
        if not os.path.isdir(full):
            return f"{full!r} is a file, not a folder"
        base = full
    else:
        if not create:
            return f"folder {full!r} does not exist"
        base = _nearest_existing(full)
        if not os.path.isdir(base):
            return f"{full!r} is under the file {base!r}"
    if not os.access(base, os.W_OK | os.X_OK):
        return f"cannot write in {base!r}"
    return None


def local_store(uri: str) -> tuple[str, str] | None:
    """``(kind, path)`` of a local tracking store: ``("sqlite", file)`` or ``("file", folder)``;
    ``None`` for a tracking server or a database server."""
    if uri.startswith("sqlite:///"):
        return "sqlite", uri[len("sqlite:///") :]
    if uri.startswith("sqlite://"):
        return None  # in-memory
    if uri.startswith("file://"):
        return "file", uri[len("file://") :]
    if "://" in uri or uri.startswith("databricks"):
        return None
    return "file", uri


def store_problem(uri: str) -> str | None:
    """Why MLflow cannot write the local tracking store ``uri`` (``None`` if it can)."""
    store = local_store(uri)
    if store is None:
        return None
    kind, path = store
    if kind == "file":
        why = folder_problem(path)
        return None if why is None else f"{uri}: {why}"
    full = os.path.abspath(os.path.expanduser(path))
    if os.path.isdir(full):
        return f"{uri}: {full!r} is a folder, not a database file"
    if os.path.exists(full):
        return None if os.access(full, os.R_OK | os.W_OK) else f"{uri}: cannot write {full!r}"
    why = folder_problem(os.path.dirname(full), create=False)
    return None if why is None else f"{uri}: {why}"


def deleted_experiment(uri: str, name: str) -> bool:
    """Whether the local tracking store ``uri`` holds a deleted experiment called ``name``.

    Read only when the store already exists (an sqlite file opened read-only, or a file store's
    ``.trash``); nothing is created.  A store this cannot read counts as not holding one.
    """
    store = local_store(uri)
    if store is None:
        return False
    kind, path = store
    full = os.path.abspath(os.path.expanduser(path))
    if kind == "sqlite":
        if not os.path.isfile(full):
            return False
        try:
            con = sqlite3.connect(f"file:{full}?mode=ro", uri=True)
            try:
                row = con.execute("SELECT lifecycle_stage FROM experiments WHERE name = ?", (name,)).fetchone()
            finally:
                con.close()
        except sqlite3.Error:
            return False
        return row is not None and row[0] == "deleted"

    for meta in glob.glob(os.path.join(full, ".trash", "*", "meta.yaml")):
        try:
            with open(meta) as f:
                if (yaml.safe_load(f) or {}).get("name") == name:
                    return True
        except (OSError, yaml.YAMLError, AttributeError):
            continue
    return False


def check_checkpoint_storage(path: str) -> None:
    """``checkpoint.storage_path`` can hold checkpoints, reading only: a local folder that can be
    created and written, or an object store whose bucket exists and answers to the credentials in
    the environment (one request for the bucket, one listing of the prefix: a missing bucket, bad
    credentials or an unreachable endpoint is one line here, before Ray starts)."""
    if is_uri(resolve(path)):
        why = reach_problem(path)
        if why is not None:
            raise ConfigError(f"checkpoint.storage_path: {why}")
        return
    why = folder_problem(path)
    if why is not None:
        raise ConfigError(
            f"checkpoint.storage_path: {why}; give a folder you can write (on a cluster: a shared "
            f"mount or a bucket URI such as s3://bucket/runs), e.g. ray_runs"
        )


def check_environment(cfg: RootConfig) -> None:
    """Filesystem and tracking-store checks (reads only): run before Ray starts."""
    check_checkpoint_storage(cfg.checkpoint.storage_path)
    uri = cfg.tracking.resolved_uri()
    why = store_problem(uri)
    if why is not None:
        raise ConfigError(
            f"tracking.uri: {why}; create the folder or point tracking.uri (--tracking-uri) at a writable place"
        )
    name = cfg.tracking.experiment
    if deleted_experiment(uri, name):
        raise ConfigError(
            f"tracking.experiment: {name!r} was deleted in {uri} and MLflow will not log to it; "
            f"choose another name or restore it (mlflow experiments restore)"
        )
