"""Checkpoints by registered components: the format, discovery, pruning, fallback and the manager.

The pattern is torchtitan's ``components/checkpoint.py``: a :class:`CheckpointManager` is given
``states``, a mapping of names to objects with ``state_dict()`` / ``load_state_dict()`` (the
model unwrapped from DDP, the optimizer, :class:`~trainers.policies.plan.TrainState`, the policies, the
noise estimator, an :class:`RNGState`, the reporter's unconfirmed records), and saves, prunes and
restores them all; the loop never lists keys.  A component that a run does not have (no noise
estimator) is simply not registered.  How checkpoints fit in a run: ``docs/architecture.md``.

**Format.**  A checkpoint is a directory ``checkpoint_step<8 digits>[_resize]`` holding

* ``state.pt``: ``{name: component.state_dict()}``, tensors and builtins only, so it loads
  with ``torch.load(weights_only=True)`` and nothing but tensors and builtins is unpickled;
* ``manifest.json``: ``{"format": 2, "sha256": ..., "bytes": ...}`` of ``state.pt``.

It is written into a temporary sibling ``.<name>.tmp-<host>-<pid>``; the state file, the
manifest and that directory are fsynced, the directory is renamed into place and its parent is
fsynced, so a reader never sees a half-written checkpoint and a renamed one survives a power
loss.  A checkpoint that is missing a file, fails its size or sha256 check, has an unreadable
manifest or state, or carries a format this version does not know is :class:`CorruptCheckpoint`,
and the reader falls back to the next older one.

Format 1 (before components were registered) kept the policies under ``train["extra"]`` and the
reporter's records under ``pending_metrics``; :func:`upgrade_format1` maps it onto the names
below, so old checkpoints restore into the new components.

**Discovery.**  All phases of one training run (``<prefix>``, ``<prefix>-…`` folders under the
storage path, one Ray Train run each) share its checkpoints; the newest one by step wins.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import posixpath
import re
import shutil
import socket
from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

import torch
from pydantic import ConfigDict, Field, field_validator
from trainers.section import Section

logger = logging.getLogger(__name__)

STATE_FILE = "state.pt"
MANIFEST_FILE = "manifest.json"
FORMAT_VERSION = 2  # {name: state_dict} of registered components
READABLE_FORMATS = (1, 2)  # 1: the hand-gathered layout, upgraded on read (upgrade_format1)

_STEP = re.compile(r"checkpoint_step(\d+)")
_TMP = re.compile(r"^\..+\.tmp-(?:(?P<host>.+)-)?(?P<pid>\d+)$")  # host absent: written before hosts were named


class CorruptCheckpoint(RuntimeError):
    """The checkpoint directory is missing files, fails its checksum, cannot be read, or has an
    unknown format: the caller falls back to an older one."""


class CheckpointConfig(Section):
    """The ``checkpoint`` section."""

    model_config = ConfigDict(extra="forbid")

    every_steps: int = Field(default=0, ge=0, description="0 = only at epoch ends")
    keep: int = Field(default=2, description="newest checkpoints of the run kept (at least 2: the "
                                             "newest and one to fall back to)")
    storage_path: str = Field(default="ray_runs", description="checkpoint folder (on a cluster: a shared filesystem mount)")

    @field_validator("keep")
    @classmethod
    def _a_fallback(cls, v: int) -> int:
        # With keep = 1 the write of a checkpoint deletes the only older one, so a newest one that
        # turns out corrupt leaves nothing to resume from.  Keeping one more on disk is simpler and
        # cheaper to reason about than setting the last good one aside.
        if v < 2:
            raise ValueError(f"checkpoint.keep: {v} leaves no older checkpoint to fall back to when the newest "
                             "is corrupt; set it to at least 2")
        return v

    @field_validator("storage_path")
    @classmethod
    def _a_directory(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("checkpoint.storage_path: empty; give a folder, e.g. ray_runs (on a cluster: a shared "
                             "filesystem mount)")
        if "://" in v:
            raise ValueError(f"URIs are not supported (got {v!r}); give a directory path (on a cluster: "
                             "a shared filesystem such as NFS mounted at the same path on every node)")
        return v


# --------------------------------------------------------------------------- components


@runtime_checkable
class Stateful(Protocol):
    """What a checkpoint component offers (``torch.nn.Module`` and ``torch.optim.Optimizer`` do).

    ``state_dict()`` returns tensors and builtins only (``weights_only=True`` loads them);
    ``load_state_dict(state)`` restores in place what ``state_dict()`` returned."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> Any: ...


class StateAdapter:
    """A component from two callables, for state that lives in attributes of another object
    (the global batch size beside its policy)."""

    def __init__(self, save: Callable[[], dict[str, Any]], load: Callable[[dict[str, Any]], None]) -> None:
        self._save, self._load = save, load

    def state_dict(self) -> dict[str, Any]:
        return self._save()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._load(state)


class RNGState:
    """The torch CPU generator and, on a GPU, the device's generator: ``{"torch", ["cuda"]}``."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def state_dict(self) -> dict[str, torch.Tensor]:
        out = {"torch": torch.get_rng_state()}
        if self.device.type == "cuda":
            out["cuda"] = torch.cuda.get_rng_state(self.device)
        return out

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        # generator states are CPU byte tensors, whatever map_location the checkpoint was loaded with
        torch.set_rng_state(state["torch"].cpu())
        if self.device.type == "cuda" and "cuda" in state:
            torch.cuda.set_rng_state(state["cuda"].cpu(), self.device)


class PendingRecords:
    """The reporter's records the driver has not confirmed it logged, ``{"records": [[step,
    metrics, time], ...]}``: restored, they are sent again (the driver drops what it has)."""

    def __init__(self, channel: Any) -> None:
        self.channel = channel  # anything with pending() -> list and replay(list)

    def state_dict(self) -> dict[str, Any]:
        return {"records": self.channel.pending()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.channel.replay(state["records"])


# --------------------------------------------------------------------------- the format


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _fsync_path(path: str) -> None:
    """fsync a file or a directory by path (a directory's fsync makes its renames durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as e:  # a filesystem that cannot fsync directories
        if e.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)


def tmp_name(name: str) -> str:
    """The temporary sibling a checkpoint is written into: ``.<name>.tmp-<host>-<pid>``."""
    return f".{name}.tmp-{socket.gethostname()}-{os.getpid()}"


def write_checkpoint(directory: str, payload: dict[str, Any]) -> str:
    """Write ``payload`` atomically and durably as checkpoint ``directory`` (which must not exist
    yet): temporary sibling, fsync of state, manifest and directory, rename, fsync of the parent."""
    parent = os.path.dirname(os.path.abspath(directory)) or "."
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, tmp_name(os.path.basename(directory)))
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    state_path = os.path.join(tmp, STATE_FILE)
    torch.save(payload, state_path)
    _fsync_path(state_path)
    manifest = {"format": FORMAT_VERSION, "sha256": _sha256(state_path), "bytes": os.path.getsize(state_path)}
    with open(os.path.join(tmp, MANIFEST_FILE), "w") as f:
        json.dump(manifest, f)
        f.flush()
        os.fsync(f.fileno())
    _fsync_path(tmp)
    os.replace(tmp, directory)
    _fsync_path(parent)
    return directory


def verify_checkpoint(directory: str) -> int:
    """Raise ``CorruptCheckpoint`` unless ``directory`` holds a complete, intact checkpoint of a
    format this version reads; return that format."""
    state_path = os.path.join(directory, STATE_FILE)
    manifest_path = os.path.join(directory, MANIFEST_FILE)
    if not (os.path.isfile(state_path) and os.path.isfile(manifest_path)):
        raise CorruptCheckpoint(f"{directory}: missing {STATE_FILE} or {MANIFEST_FILE}")
    try:
        with open(manifest_path) as f:
            manifest = json.load(f)
    except (OSError, ValueError) as e:
        raise CorruptCheckpoint(f"{directory}: unreadable manifest ({e})") from e
    if not isinstance(manifest, dict):
        raise CorruptCheckpoint(f"{directory}: unreadable manifest (not a JSON object)")
    fmt = manifest.get("format")
    if fmt not in READABLE_FORMATS:
        raise CorruptCheckpoint(f"{directory}: unknown checkpoint format {fmt!r} (this version reads "
                                f"{', '.join(map(str, READABLE_FORMATS))}; written by a newer one?)")
    try:
        size = os.path.getsize(state_path)
        if size != manifest.get("bytes"):
            raise CorruptCheckpoint(f"{directory}: {STATE_FILE} has {size} bytes, manifest says {manifest.get('bytes')}")
        if _sha256(state_path) != manifest.get("sha256"):
            raise CorruptCheckpoint(f"{directory}: {STATE_FILE} fails its sha256 check")
    except OSError as e:
        raise CorruptCheckpoint(f"{directory}: cannot read {STATE_FILE} ({e})") from e
    return int(fmt)


def upgrade_format1(payload: dict[str, Any]) -> dict[str, Any]:
    """Format 1 -> 2.  Format 1 was ``{"model", "optimizer", "rng", "pending_metrics", "train":
    {step, epoch, cursor, samples_seen, restarts, finished, "extra": {"batch": {"size", "policy"},
    "gns", "auto_warmup"}}}``; format 2 names each component: ``model``, ``optimizer``, ``rng``,
    ``train`` (without ``extra`` and the unused ``restarts``), ``batch``, ``noise``,
    ``auto_warmup``, ``reporter``."""
    out = {k: payload[k] for k in ("model", "optimizer", "rng") if k in payload}
    train = dict(payload.get("train", {}))
    extra = train.pop("extra", None) or {}
    train.pop("restarts", None)
    out["train"] = train
    for old, new in (("batch", "batch"), ("gns", "noise"), ("auto_warmup", "auto_warmup")):
        if old in extra:
            out[new] = extra[old]
    out["reporter"] = {"records": payload.get("pending_metrics", [])}
    return out


def read_checkpoint(directory: str, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Verify and load a checkpoint without unpickling anything but tensors and builtins; the
    payload comes in the current layout (``{name: state}``) whatever format it was written in."""
    fmt = verify_checkpoint(directory)
    try:
        payload = torch.load(os.path.join(directory, STATE_FILE), map_location=map_location, weights_only=True)
    except Exception as e:  # a file that passes the checksum but still fails to load
        raise CorruptCheckpoint(f"{directory}: cannot load {STATE_FILE} ({e})") from e
    if not isinstance(payload, dict):
        raise CorruptCheckpoint(f"{directory}: {STATE_FILE} holds a {type(payload).__name__}, not a mapping")
    return upgrade_format1(payload) if fmt == 1 else payload


# --------------------------------------------------------------------------- discovery


def checkpoint_name(step: int, resize: bool = False) -> str:
    """``checkpoint_step00000045`` (``_resize``: the last checkpoint of a group that hands over)."""
    return f"checkpoint_step{step:08d}" + ("_resize" if resize else "")


def checkpoint_step(path: str) -> int | None:
    """The step in a checkpoint directory's name (``checkpoint_step00000045[_resize]``)."""
    m = _STEP.match(posixpath.basename(path.rstrip("/")))
    return int(m.group(1)) if m else None


def _run_folders(storage: str, run_prefix: str) -> list[str]:
    """The local folders of a training run's phases: ``<prefix>`` and ``<prefix>-…``."""
    try:
        entries = list(os.scandir(storage))
    except OSError:
        return []
    return [e.path for e in entries
            if e.is_dir() and (e.name == run_prefix or e.name.startswith(run_prefix + "-"))]


def run_checkpoints(storage: str, run_prefix: str) -> list[str]:
    """Every checkpoint of one training run, newest first: all phases' Ray Train run folders
    (``<prefix>``, ``<prefix>-…``) under ``storage``."""
    from pyarrow.fs import FileSelector, FileSystem, FileType

    fs, root = FileSystem.from_uri(storage) if "://" in storage else (None, storage)
    if fs is None:
        from pyarrow.fs import LocalFileSystem

        fs = LocalFileSystem()
    found = []
    for run in fs.get_file_info(FileSelector(root, allow_not_found=True)):
        name = posixpath.basename(run.path)
        if run.type != FileType.Directory or not (name == run_prefix or name.startswith(run_prefix + "-")):
            continue
        for c in fs.get_file_info(FileSelector(run.path)):
            step = checkpoint_step(c.path)
            if c.type == FileType.Directory and step is not None:
                found.append((step, c.path))
    found.sort(reverse=True)
    return [p if fs.type_name == "local" else f"{storage.split('://')[0]}://{p}" for _, p in found]


def prune_checkpoints(storage: str, run_prefix: str, keep: int, skip: frozenset[str] | set[str] = frozenset()) -> None:
    """Delete all but the ``keep`` newest checkpoints of a training run (every phase's folder:
    an overlapping resize leaves the old phase's last ones behind).  ``skip``: checkpoints known
    to be corrupt; they neither count towards ``keep`` nor are deleted here (the run writes
    over each when it passes its step again)."""
    known = {os.path.normpath(p) for p in skip}
    intact = [p for p in run_checkpoints(storage, run_prefix) if os.path.normpath(p) not in known]
    for path in intact[keep:]:
        shutil.rmtree(path, ignore_errors=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def remove_stale_tmp(storage: str, run_prefix: str) -> list[str]:
    """Delete the temporary folders (``.<name>.tmp-<host>-<pid>``) that writers on this host left
    in the training run's folders when they died mid-write; a live writer's, or another host's
    (its pid means nothing here), are left alone.  Returns what was deleted."""
    if "://" in storage:
        return []
    host, removed = socket.gethostname(), []
    for folder in _run_folders(storage, run_prefix):
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for e in entries:
            m = _TMP.match(e.name)
            if m is None or not e.is_dir() or m.group("host") not in (None, host):
                continue
            if not _pid_alive(int(m.group("pid"))):
                shutil.rmtree(e.path, ignore_errors=True)
                removed.append(e.path)
    return removed


def _as_local(path: str):
    """A checkpoint's local directory: the path itself, or a download for a URI (Ray's)."""
    if "://" not in path:
        return contextlib.nullcontext(path)
    from ray.train import Checkpoint

    return Checkpoint(path=path).as_directory()


def load_newest_checkpoint(storage: str, run_prefix: str, map_location: str | torch.device = "cpu",
                           warn: Callable[[str], None] = print, expect: str | None = None,
                           corrupt: set[str] | None = None) -> dict[str, Any] | None:
    """The newest intact checkpoint of this training run (``{name: state}``); a corrupt one is
    skipped with a warning (and added to ``corrupt`` when given).  None when there is none;
    ``CorruptCheckpoint`` when there are some but none is intact.

    ``expect``: a checkpoint known to exist (the handover), listed even if storage is slow to show it."""
    paths = run_checkpoints(storage, run_prefix)
    if expect and expect.rstrip("/") not in paths:
        paths.insert(0, expect.rstrip("/"))
        paths.sort(key=lambda p: checkpoint_step(p) or 0, reverse=True)
    for i, path in enumerate(paths):
        try:
            with _as_local(path) as d:
                payload = read_checkpoint(d, map_location=map_location)
            if i > 0:
                warn(f"resumed from older checkpoint {path}")
            return payload
        except CorruptCheckpoint as e:
            warn(f"skipping corrupt checkpoint: {e}")
            if corrupt is not None:
                corrupt.add(os.path.normpath(path))
    if paths:
        raise CorruptCheckpoint(f"no intact checkpoint to resume from among {paths}")
    return None


# --------------------------------------------------------------------------- the manager


class CheckpointManager:
    """Saves, prunes and restores the registered ``states`` of one worker (torchtitan's pattern).

    ``storage``/``run_prefix``: where the training run's phase folders are (``""``: no
    checkpoints); ``run_name``: this phase's folder, where :meth:`save` writes; ``keep``: how many
    of the run's newest intact checkpoints survive a save; ``writer``: whether this process writes
    (rank 0; the others only restore).  ``warn`` gets each fallback warning.

    A writer deletes stale temporary folders of dead writers on this host when it starts."""

    def __init__(self, states: Mapping[str, Stateful], *, storage: str, run_prefix: str, run_name: str,
                 keep: int = 2, writer: bool = True, warn: Callable[[str], None] = print,
                 map_location: str | torch.device = "cpu") -> None:
        for name, obj in states.items():
            if not isinstance(obj, Stateful):
                raise TypeError(f"checkpoint component {name!r} ({type(obj).__name__}) lacks "
                                "state_dict()/load_state_dict()")
        self.states = dict(states)
        self.storage, self.run_prefix, self.run_name = storage, run_prefix, run_name
        self.keep, self.writer, self.warn, self.map_location = keep, writer, warn, map_location
        self.corrupt: set[str] = set()  # checkpoints found corrupt by load(): not counted by prune()
        if self.writing:
            for path in remove_stale_tmp(storage, run_prefix):
                logger.info("removed the partial checkpoint %s of a writer that died", path)

    @property
    def writing(self) -> bool:
        """Whether :meth:`save` writes anything here."""
        return self.writer and bool(self.storage)

    def checkpoints(self) -> list[str]:
        """The training run's checkpoints, newest first (every phase's folder)."""
        return run_checkpoints(self.storage, self.run_prefix) if self.storage else []

    def load_path(self, path: str) -> None:
        """Restore the checkpoint at ``path`` into the components (``CorruptCheckpoint`` if it is not intact)."""
        with _as_local(path) as d:
            self.load_state_dict(read_checkpoint(d, map_location=self.map_location))

    def state_dict(self) -> dict[str, Any]:
        """``{name: component.state_dict()}``: what :meth:`save` writes."""
        return {name: obj.state_dict() for name, obj in self.states.items()}

    def load_state_dict(self, payload: Mapping[str, Any]) -> None:
        """Restore each registered component, in registration order, from its entry; a component
        the checkpoint does not hold (its run had no noise estimator) keeps its fresh state."""
        for name, obj in self.states.items():
            if name in payload:
                obj.load_state_dict(payload[name])

    def save(self, step: int, resize: bool = False) -> str:
        """Write the components as checkpoint ``step`` into this phase's folder, then prune the
        run to ``keep``.  Returns the path (the bare name where this process writes nothing)."""
        name = checkpoint_name(step, resize)
        if not self.writing:
            return name
        path = os.path.join(self.storage, self.run_name, name)
        if os.path.exists(path):  # a corrupt one this group skipped on restore and has now passed again
            shutil.rmtree(path)
        write_checkpoint(path, self.state_dict())
        self.corrupt.discard(os.path.normpath(path))
        self.prune()
        return path

    def prune(self) -> None:
        """Keep the ``keep`` newest intact checkpoints of the run (see :func:`prune_checkpoints`)."""
        if self.writing:
            prune_checkpoints(self.storage, self.run_prefix, self.keep, skip=self.corrupt)

    def load(self, expect: str | None = None) -> bool:
        """Restore the newest intact checkpoint of the run into the components, falling back past
        corrupt ones with a warning; False when the run has none.  ``expect``: see
        :func:`load_newest_checkpoint`."""
        if not self.storage:
            return False
        payload = load_newest_checkpoint(self.storage, self.run_prefix, self.map_location, warn=self.warn,
                                         expect=expect, corrupt=self.corrupt)
        if payload is None:
            return False
        self.load_state_dict(payload)
        return True
