"""The built-in language-model data: byte-level tokens of a local text, cut into fixed-context windows.

Tokens are the bytes of the text (vocabulary 256, no tokenizer to ship or train).  The bytes are
written once to a ``uint8`` file read back as a ``numpy.memmap``, so a corpus larger than memory
costs only page cache, and every loader process shares the same pages.  Beside the cache a small
JSON file records, per source file, its size, ``mtime_ns`` and sha256; the cache is reused while
the sources are unchanged and rebuilt otherwise.  Both files are written atomically (a temporary
file in the same folder, then ``os.replace``), so concurrent workers on one machine never read a
half-written cache.

Sample ``i`` of a split ``[lo, hi)`` is the window starting at ``s = lo + i * stride``:
``input = tokens[s : s + T]``, ``target = tokens[s + 1 : s + T + 1]`` (next-byte prediction).
Train and validation are contiguous ranges of the token stream (the first ``1 - val_fraction``
and the rest), not random windows, so no validation byte is ever inside a training window.

The default corpus is Python source that ships with CPython itself (a fixed list of standard
library modules present in every CPython 3.10+, concatenated in that order), so it works offline
on any machine; its content, and so the numbers, depends on the Python version.
See docs/architecture.md ("workloads").
"""

from __future__ import annotations

import hashlib
import json
import os
import sysconfig
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from trainers import catalog

VOCAB_SIZE = 256

# Large, long-lived pure-Python modules of the standard library (none deprecated for removal).
DEFAULT_CORPUS_MODULES: tuple[str, ...] = (
    "argparse",
    "ast",
    "inspect",
    "typing",
    "pydoc",
    "difflib",
    "tarfile",
    "subprocess",
    "threading",
    "dataclasses",
    "functools",
    "collections/__init__",
    "enum",
    "pathlib",
    "shutil",
    "textwrap",
    "statistics",
    "fractions",
    "_pydecimal",
    "configparser",
    "logging/__init__",
    "unittest/case",
    "email/message",
    "json/decoder",
    "json/encoder",
    "string",
    "random",
    "heapq",
    "bisect",
    "pickle",
    "datetime",
    "calendar",
    "zipfile",
    "locale",
    "gettext",
    "tempfile",
    "csv",
    "imaplib",
    "ftplib",
    "http/client",
    "urllib/parse",
    "socket",
    "selectors",
    "traceback",
    "pprint",
    "copy",
    "weakref",
    "contextlib",
    "abc",
    "codecs",
    "base64",
    "platform",
    "glob",
    "fnmatch",
    "optparse",
    "cmd",
    "shlex",
    "doctest",
    "pdb",
    "bdb",
    "trace",
    "timeit",
    "tokenize",
    "keyword",
)


def default_corpus() -> list[Path]:
    """The default corpus: the files of :data:`DEFAULT_CORPUS_MODULES` in this Python's stdlib, in order.

    A module a distribution left out is skipped; ``FileNotFoundError`` if none is found.
    """
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = [stdlib / f"{name}.py" for name in DEFAULT_CORPUS_MODULES]
    found = [f for f in files if f.is_file()]
    if not found:
        raise FileNotFoundError(f"data.path: no standard-library sources under {stdlib}; set data.path to a text file")
    return found


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _describe(sources: Sequence[Path]) -> list[dict]:
    out = []
    for p in sources:
        st = p.stat()
        out.append({"path": str(p), "size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": _sha256(p)})
    return out


def default_cache_dir() -> Path:
    """``$ELASTIC_CACHE_DIR/text`` or ``~/.cache/elastic-large-batch/text``."""
    base = os.environ.get("ELASTIC_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "elastic-large-batch")
    return Path(base) / catalog.TEXT.name


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _cache_is_current(cache: Path, meta: Path, sources: Sequence[Path]) -> bool:
    """Reuse iff the recorded sources match: same paths and sizes, and same mtime or else same sha256."""
    try:
        recorded = json.loads(meta.read_text())["sources"]
        n_bytes = cache.stat().st_size
    except (OSError, ValueError, KeyError):
        return False
    if [r["path"] for r in recorded] != [str(p) for p in sources]:
        return False
    total = 0
    for r, p in zip(recorded, sources):
        st = p.stat()
        if st.st_size != r["size"]:
            return False
        if st.st_mtime_ns != r["mtime_ns"] and _sha256(p) != r["sha256"]:
            return False
        total += r["size"]
    return n_bytes == total + max(0, len(sources) - 1)  # the files joined by one newline each


def token_cache(sources: Path | str | Sequence[Path | str] | None = None, cache_dir: Path | str | None = None) -> Path:
    """The ``uint8`` byte cache of ``sources`` (default: :func:`default_corpus`), built once and reused.

    The files are joined with one ``b"\\n"`` between them.  The cache is named by a hash of the
    source paths; ``<name>.json`` beside it records each source's path, size, ``mtime_ns`` and
    sha256.  It is rebuilt when a source's size changes, or its mtime changes and its sha256 with
    it (a ``touch`` alone does not rebuild).
    """
    if sources is None:
        paths = default_corpus()
    elif isinstance(sources, (str, Path)):
        paths = [Path(sources)]
    else:
        paths = [Path(s) for s in sources]
    paths = [p.expanduser().resolve() for p in paths]
    for p in paths:
        if not p.is_file():
            raise FileNotFoundError(f"data.path: no text file at {str(p)!r}")
    folder = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    key = hashlib.sha256("\0".join(str(p) for p in paths).encode()).hexdigest()[:16]
    cache, meta = folder / f"bytes-{key}.u8", folder / f"bytes-{key}.json"
    if _cache_is_current(cache, meta, paths):
        return cache
    data = b"\n".join(p.read_bytes() for p in paths)
    described = _describe(paths)
    _atomic_write(cache, data)
    _atomic_write(meta, json.dumps({"sources": described, "bytes": len(data)}, indent=1).encode())
    return cache


def load_tokens(cache: Path | str) -> np.memmap:
    """The cache as a read-only ``uint8`` memmap."""
    return np.memmap(cache, dtype=np.uint8, mode="r")


class ByteWindows(torch.utils.data.Dataset):
    """Map-style next-byte windows over ``tokens[lo:hi]``: sample ``i`` starts at ``lo + i * stride``.

    ``__getitem__(i) -> (x, y)`` with ``x = tokens[s:s+T]`` and ``y = tokens[s+1:s+T+1]`` as int64
    tensors of shape ``[T]``; ``__getitems__(indices)`` returns the batch ``(X, Y)`` of shape
    ``[b, T]`` in one gather (what :func:`trainers.data.sampler.collate` passes through).  The windows
    never read past ``hi``: there are ``(hi - lo - T - 1) // stride + 1`` of them.
    """

    def __init__(
        self, tokens: np.ndarray | Path | str, lo: int, hi: int, context: int, stride: int | None = None
    ) -> None:
        if context < 1:
            raise ValueError(f"data.context: must be >= 1, got {context}")
        # A cache path is opened lazily and not pickled: loader processes map the same file.
        self.path = (
            None
            if isinstance(tokens, np.ndarray) and not isinstance(tokens, np.memmap)
            else (Path(tokens.filename) if isinstance(tokens, np.memmap) else Path(tokens))
        )
        self._tokens = tokens if isinstance(tokens, np.ndarray) else None
        self.lo, self.hi, self.context = int(lo), int(hi), int(context)
        self.stride = int(stride or context)
        if self.stride < 1:
            raise ValueError(f"data.stride: must be >= 1, got {self.stride}")
        span = self.hi - self.lo - self.context - 1
        if span < 0:
            raise ValueError(
                f"data.context: a split of {self.hi - self.lo} bytes holds no window of "
                f"{self.context} + 1 bytes; lower data.context or give a longer text (data.path)"
            )
        self.n = span // self.stride + 1
        self._offsets = np.arange(self.context + 1)

    @property
    def tokens(self) -> np.ndarray:
        if self._tokens is None:
            assert self.path is not None
            self._tokens = load_tokens(self.path)
        return self._tokens

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        if self.path is not None:
            state["_tokens"] = None  # re-mapped in the receiving process, not copied
        return state

    def __len__(self) -> int:
        return self.n

    def _start(self, i: int) -> int:
        if not -self.n <= i < self.n:
            raise IndexError(f"window {i} out of range for {self.n} windows")
        return self.lo + (i % self.n) * self.stride

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        s = self._start(int(i))
        w = torch.from_numpy(np.asarray(self.tokens[s : s + self.context + 1], dtype=np.int64))
        return w[:-1], w[1:]

    def __getitems__(self, indices: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        starts = np.fromiter((self._start(int(i)) for i in indices), dtype=np.int64, count=len(indices))
        w = torch.from_numpy(np.asarray(self.tokens[starts[:, None] + self._offsets], dtype=np.int64))
        return w[:, :-1], w[:, 1:]


def load_text(
    path: Path | str | Sequence[Path | str] | None = None,
    *,
    context: int = 128,
    val_fraction: float = 0.1,
    stride: int | None = None,
    cache_dir: Path | str | None = None,
) -> tuple[ByteWindows, ByteWindows]:
    """``(train, val)`` byte windows of a text (default: the stdlib corpus), split by contiguous ranges.

    Train covers bytes ``[0, v)`` and validation ``[v, N)`` with ``v = round(N * (1 - val_fraction))``;
    each split is cut into windows of ``context`` with ``stride`` (default ``context``: no overlap).
    """
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"data.val_fraction: must be in (0, 1), got {val_fraction}")
    tokens = load_tokens(token_cache(path, cache_dir))
    n = int(tokens.shape[0])
    v = int(round(n * (1.0 - val_fraction)))
    return ByteWindows(tokens, 0, v, context, stride), ByteWindows(tokens, v, n, context, stride)
