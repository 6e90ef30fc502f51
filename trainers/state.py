"""Checkpoint state: what a run needs to continue exactly where it stopped.

A checkpoint directory holds ``state.pt`` (tensors and plain values only, so it
loads with ``torch.load(weights_only=True)``: nothing is unpickled but tensors and
builtins) and ``manifest.json`` with its sha256 and size.  It is written into a
temporary sibling directory and renamed into place, so a reader never sees a half
written checkpoint; a truncated or corrupt one fails the checksum and is reported
as such (``CorruptCheckpoint``) so the caller can fall back to an older one.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

STATE_FILE = "state.pt"
MANIFEST_FILE = "manifest.json"
FORMAT_VERSION = 1


class CorruptCheckpoint(RuntimeError):
    """The checkpoint directory is missing files or fails its checksum."""


@dataclass
class TrainState:
    """Counters that survive phases and restarts.  ``step`` is the global optimizer step."""

    step: int = 0
    epoch: int = 0
    cursor: int = 0  # samples of ``epoch``'s permutation already consumed
    samples_seen: int = 0
    restarts: int = 0
    finished: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TrainState":
        return cls(**d)


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_checkpoint(directory: str, payload: dict[str, Any]) -> str:
    """Write ``payload`` atomically as checkpoint ``directory`` (which must not exist yet)."""
    parent = os.path.dirname(os.path.abspath(directory)) or "."
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f".{os.path.basename(directory)}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    state_path = os.path.join(tmp, STATE_FILE)
    torch.save(payload, state_path)
    manifest = {"format": FORMAT_VERSION, "sha256": _sha256(state_path), "bytes": os.path.getsize(state_path)}
    with open(os.path.join(tmp, MANIFEST_FILE), "w") as f:
        json.dump(manifest, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, directory)
    return directory


def verify_checkpoint(directory: str) -> None:
    """Raise ``CorruptCheckpoint`` unless ``directory`` holds a complete, intact checkpoint."""
    state_path = os.path.join(directory, STATE_FILE)
    manifest_path = os.path.join(directory, MANIFEST_FILE)
    if not (os.path.isfile(state_path) and os.path.isfile(manifest_path)):
        raise CorruptCheckpoint(f"{directory}: missing {STATE_FILE} or {MANIFEST_FILE}")
    try:
        with open(manifest_path) as f:
            manifest = json.load(f)
    except (OSError, ValueError) as e:
        raise CorruptCheckpoint(f"{directory}: unreadable manifest ({e})") from e
    size = os.path.getsize(state_path)
    if size != manifest.get("bytes"):
        raise CorruptCheckpoint(f"{directory}: {STATE_FILE} has {size} bytes, manifest says {manifest.get('bytes')}")
    if _sha256(state_path) != manifest.get("sha256"):
        raise CorruptCheckpoint(f"{directory}: {STATE_FILE} fails its sha256 check")


def read_checkpoint(directory: str, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Verify and load a checkpoint without unpickling anything but tensors and builtins."""
    verify_checkpoint(directory)
    try:
        return torch.load(os.path.join(directory, STATE_FILE), map_location=map_location, weights_only=True)
    except Exception as e:  # a file that passes the checksum but still fails to load
        raise CorruptCheckpoint(f"{directory}: cannot load {STATE_FILE} ({e})") from e
