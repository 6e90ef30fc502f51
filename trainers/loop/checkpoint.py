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

The storage is a local folder or an object store (``s3://``, ``gs://``: trainers/loop/storage.py).
On a local disk a checkpoint is written into a temporary sibling ``.<name>.tmp-<host>-<pid>``;
the state file, the manifest and that directory are fsynced, the directory is renamed into place
and its parent is fsynced, so a reader never sees a half-written checkpoint and a renamed one
survives a power loss.  An object store has no rename: the state is uploaded where it belongs
and the manifest last, so a checkpoint is complete once its manifest is there (and its sha256
matches).  One without a manifest there is a writer's that died mid-upload (or one still
uploading): readers do not list it, and the run's writer deletes it when it next prunes.

A checkpoint that is missing a file, fails its size or sha256 check, has an unreadable
manifest or state, or carries a format this version does not know is :class:`CorruptCheckpoint`,
and the reader falls back to the next older one; the run's writer moves a damaged one into
``quarantine/`` in its phase's folder, where neither pruning nor the next restore sees it.

Format 1 (before components were registered) kept the policies under ``train["extra"]`` and the
reporter's records under ``pending_metrics``; :func:`upgrade_format1` maps it onto the names
below, so old checkpoints restore into the new components.

**Discovery.**  All phases of one training run (``<prefix>``, ``<prefix>-…`` folders under the
storage path, one Ray Train run each) share its checkpoints; the newest one by step wins.
"""

from __future__ import annotations

import copy
import hashlib
import io
import json
import logging
import os
import posixpath
import re
import socket
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol, runtime_checkable

import torch

from trainers.loop.storage import (
    LOCAL,
    StorageFull,
    discard_partial,
    is_uri,
    join,
    no_room,
    pid_alive,
    resolve,
    store_for,
)

logger = logging.getLogger(__name__)

STATE_FILE = "state.pt"
QUARANTINE = "quarantine"  # the folder, in a phase's folder, that damaged checkpoints are moved into
MANIFEST_FILE = "manifest.json"
FORMAT_VERSION = 2  # {name: state_dict} of registered components
READABLE_FORMATS = (1, 2)  # 1: the hand-gathered layout, upgraded on read (upgrade_format1)

_STEP = re.compile(r"checkpoint_step(\d+)")
_TMP = re.compile(r"^\..+\.tmp-(?:(?P<host>.+)-)?(?P<pid>\d+)$")  # host optional: older checkpoints name the pid alone


class CorruptCheckpoint(RuntimeError):
    """The checkpoint directory is missing files, fails its checksum, cannot be read, or has an
    unknown format: the caller falls back to an older one.  ``damaged``: its content is wrong (a
    file missing or failing its check), as opposed to storage that did not answer a read, which
    may answer the next time; only a damaged one is quarantined (:func:`quarantine_checkpoint`)."""

    def __init__(self, message: str, damaged: bool = True) -> None:
        super().__init__(message)
        self.damaged = damaged


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


class _Hashing:
    """A write-only stream that passes bytes on and keeps their sha256 and count (the manifest's),
    so the state is hashed as it is written, not read back (an upload cannot be)."""

    def __init__(self, out: Any) -> None:
        self.out, self.sha, self.bytes = out, hashlib.sha256(), 0

    def write(self, data: Any) -> int:
        n = memoryview(data).nbytes
        self.sha.update(data)
        self.bytes += n
        self.out.write(data)
        return n

    def flush(self) -> None:
        pass


def write_checkpoint(directory: str, payload: dict[str, Any]) -> str:
    """Write ``payload`` as checkpoint ``directory`` (which must not exist yet), the manifest
    last: on a local disk atomically and durably (temporary sibling, fsync, rename, fsync of the
    parent), on an object store complete once the manifest is there."""
    store = store_for(directory)
    with store.stage(directory) as staged:
        with store.open_write(join(staged, STATE_FILE)) as f:
            state = _Hashing(f)
            torch.save(payload, state)
        manifest = {"format": FORMAT_VERSION, "sha256": state.sha.hexdigest(), "bytes": state.bytes}
        with store.open_write(join(staged, MANIFEST_FILE)) as f:
            f.write(json.dumps(manifest).encode())
    return directory


def _manifest(directory: str) -> tuple[int, dict[str, Any]]:
    """The checkpoint's format and manifest, or ``CorruptCheckpoint``."""
    store = store_for(directory)
    state_path, manifest_path = join(directory, STATE_FILE), join(directory, MANIFEST_FILE)
    try:
        present = store.kind(state_path) == "file" and store.kind(manifest_path) == "file"
    except OSError as e:
        raise CorruptCheckpoint(f"{directory}: cannot read it ({e})", damaged=False) from e
    if not present:
        raise CorruptCheckpoint(f"{directory}: missing {STATE_FILE} or {MANIFEST_FILE}")
    try:
        manifest = json.loads(store.read_bytes(manifest_path))
    except OSError as e:
        raise CorruptCheckpoint(f"{directory}: unreadable manifest ({e})", damaged=False) from e
    except ValueError as e:
        raise CorruptCheckpoint(f"{directory}: unreadable manifest ({e})") from e
    if not isinstance(manifest, dict):
        raise CorruptCheckpoint(f"{directory}: unreadable manifest (not a JSON object)")
    fmt = manifest.get("format")
    if fmt not in READABLE_FORMATS:
        raise CorruptCheckpoint(
            f"{directory}: unknown checkpoint format {fmt!r} (this version reads "
            f"{', '.join(map(str, READABLE_FORMATS))}; written by a newer one?)"
        )
    return int(fmt), manifest


def _check_size(directory: str, manifest: dict[str, Any], size: int) -> None:
    if size != manifest.get("bytes"):
        raise CorruptCheckpoint(f"{directory}: {STATE_FILE} has {size} bytes, manifest says {manifest.get('bytes')}")


def _check_sha(directory: str, manifest: dict[str, Any], sha: str) -> None:
    if sha != manifest.get("sha256"):
        raise CorruptCheckpoint(f"{directory}: {STATE_FILE} fails its sha256 check")


def verify_checkpoint(directory: str) -> int:
    """Raise ``CorruptCheckpoint`` unless ``directory`` holds a complete, intact checkpoint of a
    format this version reads; return that format.  The state is streamed, never held whole."""
    fmt, manifest = _manifest(directory)
    store, state_path = store_for(directory), join(directory, STATE_FILE)
    try:
        _check_size(directory, manifest, store.size(state_path))
        sha = hashlib.sha256()
        with store.open_read(state_path) as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                sha.update(chunk)
    except OSError as e:
        raise CorruptCheckpoint(f"{directory}: cannot read {STATE_FILE} ({e})", damaged=False) from e
    _check_sha(directory, manifest, sha.hexdigest())
    return fmt


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
    fmt, manifest = _manifest(directory)
    try:  # read once, checked in memory, loaded from there: nothing of an object store lands on disk
        data = store_for(directory).read_bytes(join(directory, STATE_FILE))
    except OSError as e:
        raise CorruptCheckpoint(f"{directory}: cannot read {STATE_FILE} ({e})", damaged=False) from e
    _check_size(directory, manifest, len(data))
    _check_sha(directory, manifest, hashlib.sha256(data).hexdigest())
    try:
        payload = torch.load(io.BytesIO(data), map_location=map_location, weights_only=True)
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


def _same(path: str) -> str:
    """One spelling per checkpoint location (sets of known corrupt ones compare these)."""
    return resolve(path)


def run_folders(storage: str, run_prefix: str) -> list[str]:
    """The folders of a training run's phases under ``storage``: ``<prefix>`` and ``<prefix>-…``."""
    root = resolve(storage)
    return [
        join(root, name)
        for name, kind in store_for(root).children(root)
        if kind == "dir" and (name == run_prefix or name.startswith(run_prefix + "-"))
    ]


def _scan(storage: str, run_prefix: str) -> tuple[list[tuple[int, str]], list[str]]:
    """``([(step, checkpoint)], [incomplete checkpoint])`` of a training run.  On a local disk
    every ``checkpoint_step…`` folder counts (a rename made it whole; damage shows on reading);
    on an object store only one whose manifest is there: the rest are incomplete uploads."""
    store = store_for(storage)
    found, incomplete = [], []
    for folder in run_folders(storage, run_prefix):
        if store.renames:
            found += [
                (step, join(folder, name))
                for name, kind in store.children(folder)
                if kind == "dir" and (step := checkpoint_step(name)) is not None
            ]
            continue
        names, complete = set(), set()
        for rel in store.files_under(folder):  # one listing of the folder, every key below it
            top, _, rest = rel.partition("/")
            if rest and checkpoint_step(top) is not None:
                names.add(top)
                if rest == MANIFEST_FILE:
                    complete.add(top)
        found += [(checkpoint_step(name) or 0, join(folder, name)) for name in complete]
        incomplete += [join(folder, name) for name in sorted(names - complete)]
    found.sort(reverse=True)
    return found, incomplete


def run_checkpoints(storage: str, run_prefix: str) -> list[str]:
    """Every checkpoint of one training run, newest first: all phases' Ray Train run folders
    (``<prefix>``, ``<prefix>-…``) under ``storage`` (a folder or an object-store URI)."""
    return [path for _, path in _scan(storage, run_prefix)[0]]


def incomplete_checkpoints(storage: str, run_prefix: str) -> list[str]:
    """The training run's checkpoints on an object store whose manifest is missing: uploads
    that died (or are still going on).  Always empty on a local disk, where a checkpoint
    appears whole by a rename (a dead writer's temporary folder: :func:`remove_stale_tmp`)."""
    return _scan(storage, run_prefix)[1]


def prune_checkpoints(storage: str, run_prefix: str, keep: int, skip: frozenset[str] | set[str] = frozenset()) -> None:
    """Delete all but the ``keep`` newest checkpoints of a training run (every phase's folder:
    an overlapping resize leaves the old phase's last ones behind).  ``skip``: checkpoints known
    to be corrupt; they neither count towards ``keep`` nor are deleted here (the run writes
    over each when it passes its step again).

    On an object store this also deletes the run's incomplete checkpoints: the run's one writer
    calls this right after its own save, when no other writer of the run is alive (a group starts
    only after the one before it ended or handed over), so a checkpoint without a manifest then
    is a dead writer's.  A writer that starts does not delete them: the group it replaces may
    still be finishing an upload."""
    found, incomplete = _scan(storage, run_prefix)
    store = store_for(storage)
    known = {_same(p) for p in skip}
    intact = [p for _, p in found if _same(p) not in known]
    for path in intact[keep:] + incomplete:
        store.remove(path)


def remove_stale_tmp(storage: str, run_prefix: str) -> list[str]:
    """Delete the temporary folders (``.<name>.tmp-<host>-<pid>``) that writers on this host left
    in the training run's local folders when they died mid-write; a live writer's, or another
    host's (its pid means nothing here), are left alone.  Returns what was deleted.  An object
    store has no temporary folders (its incomplete checkpoints: :func:`prune_checkpoints`)."""
    if is_uri(resolve(storage)):
        return []
    host, removed = socket.gethostname(), []
    for folder in run_folders(storage, run_prefix):
        for name, kind in LOCAL.children(folder):
            m = _TMP.match(name)
            if m is None or kind != "dir" or m.group("host") not in (None, host):
                continue
            if not pid_alive(int(m.group("pid"))):
                LOCAL.remove(os.path.join(folder, name))
                removed.append(os.path.join(folder, name))
    return removed


def quarantine_checkpoint(path: str) -> str:
    """Move a damaged checkpoint aside, into ``quarantine/`` in its phase's folder (a name with a
    number added when one of that name is there already): no listing of the run's checkpoints
    sees it again, so pruning does not count it and the next restore does not try it, and it is
    kept for a person to look at.  Returns where it is now."""
    store = store_for(path)
    folder = join(
        posixpath.dirname(path.rstrip("/")) if is_uri(path) else os.path.dirname(path.rstrip(os.sep)), QUARANTINE
    )
    name = posixpath.basename(path.rstrip("/")) if is_uri(path) else os.path.basename(path.rstrip(os.sep))
    target, n = join(folder, name), 1
    while store.kind(target) is not None:
        n += 1
        target = join(folder, f"{name}-{n}")
    store.move(path, target)
    return target


def load_newest_checkpoint(
    storage: str,
    run_prefix: str,
    map_location: str | torch.device = "cpu",
    warn: Callable[[str], None] = print,
    expect: str | None = None,
    corrupt: set[str] | None = None,
    quarantined: Callable[[str, str, str], None] | None = None,
) -> dict[str, Any] | None:
    """The newest intact checkpoint of this training run (``{name: state}``); a corrupt one is
    skipped with a warning (and added to ``corrupt`` when given).  None when there is none;
    ``CorruptCheckpoint`` when there are some but none is intact.

    ``expect``: a checkpoint known to exist (the handover), listed even if storage is slow to show it.
    ``quarantined``: given by the run's writer only; a damaged checkpoint is then moved aside
    (:func:`quarantine_checkpoint`) and ``quarantined(path, why, where_now)`` is called."""
    paths = run_checkpoints(storage, run_prefix)
    if expect and expect.rstrip("/") not in paths:
        paths.insert(0, expect.rstrip("/"))
        paths.sort(key=lambda p: checkpoint_step(p) or 0, reverse=True)
    for i, path in enumerate(paths):
        try:
            payload = read_checkpoint(path, map_location=map_location)
            if i > 0:
                warn(f"resumed from older checkpoint {path}")
            return payload
        except CorruptCheckpoint as e:
            moved = None
            if quarantined is not None and e.damaged:
                try:
                    moved = quarantine_checkpoint(path)
                except OSError as move_error:  # left where it is: skipped, not counted by pruning
                    logger.warning("could not move the corrupt checkpoint %s aside (%s)", path, move_error)
            if moved is None:
                warn(f"skipping corrupt checkpoint: {e}")
                if corrupt is not None:
                    corrupt.add(_same(path))
                continue
            warn(f"skipping corrupt checkpoint: {e}; moved to {moved}")
            quarantined(path, str(e), moved)
    if paths:
        raise CorruptCheckpoint(f"no intact checkpoint to resume from among {paths}")
    return None


def host_copy(state: Any) -> Any:
    """A copy of ``state`` that the loop's next steps cannot change: every tensor copied to host
    memory, containers rebuilt, other values deep-copied (what a checkpoint written beside the
    loop pickles while the parameters and buffers it came from are updated in place)."""
    if isinstance(state, torch.Tensor):
        return state.detach().to("cpu", copy=True)
    if isinstance(state, dict):
        return {k: host_copy(v) for k, v in state.items()}
    if isinstance(state, list):
        return [host_copy(v) for v in state]
    if isinstance(state, tuple) and not hasattr(state, "_fields"):
        return tuple(host_copy(v) for v in state)
    return copy.deepcopy(state)


# --------------------------------------------------------------------------- the manager


def _ignore(*_: Any) -> None:
    pass


class CheckpointManager:
    """Saves, prunes and restores the registered ``states`` of one worker (torchtitan's pattern).

    ``storage``/``run_prefix``: where the training run's phase folders are (``""``: no
    checkpoints); ``run_name``: this phase's folder, where :meth:`save` writes; ``keep``: how many
    of the run's newest intact checkpoints survive a save; ``writer``: whether this process writes
    (rank 0; the others only restore).  ``warn`` gets each fallback warning.

    A writer deletes stale temporary folders of dead writers on this host when it starts, and moves
    a damaged checkpoint it meets on restore aside (:func:`quarantine_checkpoint`), telling
    ``quarantined(path, why, where_now)``."""

    def __init__(
        self,
        states: Mapping[str, Stateful],
        *,
        storage: str,
        run_prefix: str,
        run_name: str,
        keep: int = 2,
        writer: bool = True,
        warn: Callable[[str], None] = print,
        map_location: str | torch.device = "cpu",
        quarantined: Callable[[str, str, str], None] | None = None,
    ) -> None:
        for name, obj in states.items():
            if not isinstance(obj, Stateful):
                raise TypeError(
                    f"checkpoint component {name!r} ({type(obj).__name__}) lacks state_dict()/load_state_dict()"
                )
        self.states = dict(states)
        self.storage, self.run_prefix, self.run_name = storage, run_prefix, run_name
        self.keep, self.writer, self.warn, self.map_location = keep, writer, warn, map_location
        self.quarantined = quarantined  # told of each damaged checkpoint the writer moved aside
        self.corrupt: set[str] = set()  # checkpoints found corrupt by load(): not counted by prune()
        self._thread: ThreadPoolExecutor | None = None  # writes checkpoints beside the loop (save_beside)
        self._pending: tuple[int, Future[str]] | None = None
        self._written: list[tuple[int, str]] = []  # (step, path) written beside the loop, not yet taken
        if self.writing:
            for path in remove_stale_tmp(storage, run_prefix):
                logger.info("removed the partial checkpoint %s of a writer that died", path)

    @property
    def writing(self) -> bool:
        """Whether :meth:`save` writes anything here."""
        return self.writer and bool(self.storage)

    def checkpoints(self) -> list[str]:
        """The training run's checkpoints, newest first (every phase's folder)."""
        self.settle()
        return run_checkpoints(self.storage, self.run_prefix) if self.storage else []

    def load_path(self, path: str) -> None:
        """Restore the checkpoint at ``path`` into the components (``CorruptCheckpoint`` if it is not intact)."""
        self.settle()
        self.load_state_dict(read_checkpoint(path, map_location=self.map_location))

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
        run to ``keep``.  Returns the path (the bare name where this process writes nothing).
        A disk that is full, over its quota or read-only raises :class:`StorageFull` with nothing
        of the write left behind.  A write still going on beside the loop ends first."""
        name = checkpoint_name(step, resize)
        if not self.writing:
            return name
        self.settle()
        return self._write(step, resize, self.state_dict())

    def save_beside(self, step: int) -> None:
        """Checkpoint ``step`` written beside the loop: the components' state is copied to host
        memory now (the loop then goes on changing it), and a thread writes and prunes while the
        next steps train.  :meth:`take_written` hands over what has been written; :meth:`settle`
        waits for it (every other method of the manager does so first) and raises its error."""
        if not self.writing:
            return
        self.settle()
        payload = host_copy(self.state_dict())
        if self._thread is None:
            self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint-writer")
        self._pending = (step, self._thread.submit(self._write, step, False, payload))

    def settle(self) -> None:
        """Wait for the write beside the loop, if one is going on; its error (``StorageFull``, ...)
        is raised here, in the loop's thread."""
        if self._pending is None:
            return
        step, future = self._pending
        self._pending = None
        self._written.append((step, future.result()))

    def take_written(self) -> list[tuple[int, str]]:
        """``(step, path)`` of each checkpoint written beside the loop since the last call (a write
        that failed stays pending: :meth:`settle` raises it at the loop's next checkpoint)."""
        if self._pending is not None and self._pending[1].done() and self._pending[1].exception() is None:
            self.settle()
        taken, self._written = self._written, []
        return taken

    def close(self) -> None:
        """Let a write beside the loop finish (the process is ending); its error is logged, not raised."""
        try:
            self.settle()
        except Exception as e:  # noqa: BLE001 - closing after another error: that one is what the run reports
            logger.warning("the checkpoint written beside the loop failed: %s", e)
        if self._thread is not None:
            self._thread.shutdown(wait=True)
            self._thread = None

    def _write(self, step: int, resize: bool, payload: dict[str, Any]) -> str:
        path = join(self.storage, self.run_name, checkpoint_name(step, resize))
        store = store_for(path)
        if store.kind(path) is not None:  # a corrupt one this group skipped on restore and has now passed again
            store.remove(path)
        try:
            write_checkpoint(path, payload)
        except Exception as e:
            full = no_room(e)  # a full (or read-only) disk: no retry can cure it (StorageFull)
            if full is None:
                raise
            discard_partial(path)
            raise StorageFull.from_error(path, full) from e
        self.corrupt.discard(_same(path))
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
        self.settle()
        payload = load_newest_checkpoint(
            self.storage,
            self.run_prefix,
            self.map_location,
            warn=self.warn,
            expect=expect,
            corrupt=self.corrupt,
            quarantined=(self.quarantined or _ignore) if self.writing else None,
        )
        if payload is None:
            return False
        self.load_state_dict(payload)
        return True
