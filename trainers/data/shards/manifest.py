"""The token shards' on-disk format and the checks made before any worker starts (no torch, no numpy).

Format.  A location (a local folder, or an object-store prefix such as ``s3://bucket/corpus``)
holds flat token files and one ``manifest.json``:

- each shard is a flat little-endian array of token ids, ``uint16`` while the vocabulary fits in
  65,536 ids and ``uint32`` beyond, with no header: exactly what nanoGPT's ``prepare.py``
  (``train.bin``) and Megatron-style pipelines (the ``.bin`` beside an ``.idx``) write, and what
  ``numpy.memmap`` reads with no copy and no parser.  A corpus a user already tokenized that way is
  listed in a manifest and read as it is (``tokens prepare`` is one way to make shards, not the
  only one).  A flat array makes a window ``[s, s + T + 1)`` one contiguous byte range (one read,
  a range request on a remote store), and the file's size alone tells its token count, so a
  truncated shard is caught without reading it;
- ``manifest.json`` says how to read them: ``format`` (:data:`FORMAT`), ``version``, ``dtype``,
  ``vocab_size``, ``eos_id`` (the separator written between documents, or null), ``tokenizer`` (a
  description: kind and source), and per shard its ``name`` (relative to the location), ``tokens``,
  ``bytes`` and ``sha256``.  ``tokens prepare`` writes it last, atomically: a folder without it is
  not a corpus yet.

Where the shards are read from: a local folder directly (``numpy.memmap``), an object store through
``pyarrow.fs`` (the filesystems the checkpoint store opens; endpoint, region and credentials come from
the standard environment variables, never from the location, so no message here carries a secret)
into a bounded local cache (``trainers/data/shards/cache.py``).

Splits.  Validation holds out whole shards: the last ``max(1, round(S * data.val_fraction))`` of the
``S`` shards in manifest order, so no validation token is inside a training window.  A window never
crosses two shards (the tokens after a shard's last whole window are not trained on).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

FORMAT = "elastic-tokens"
VERSION = 1
MANIFEST = "manifest.json"
DTYPES: dict[str, int] = {"uint16": 2, "uint32": 4}
"""The token types a shard may hold, and their bytes per token."""
BYTE_VOCAB = 256
"""The byte-level vocabulary (the default of ``tokens prepare`` and of the built-in language models)."""


class ShardError(ValueError):
    """A corpus that cannot be read as the manifest says; its message is one line ``field: problem; fix``."""


@dataclass(frozen=True)
class Shard:
    name: str
    tokens: int
    bytes: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    location: str
    dtype: str
    vocab_size: int
    eos_id: int | None
    tokenizer: dict[str, Any]
    shards: tuple[Shard, ...]

    @property
    def itemsize(self) -> int:
        return DTYPES[self.dtype]

    @property
    def total_tokens(self) -> int:
        return sum(s.tokens for s in self.shards)

    def split(self, val_fraction: float) -> tuple[tuple[Shard, ...], tuple[Shard, ...]]:
        """``(train, val)`` shards: the last ``max(1, round(S * val_fraction))`` are validation's."""
        n = len(self.shards)
        n_val = max(1, int(round(n * val_fraction)))
        return self.shards[: n - n_val], self.shards[n - n_val :]

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": VERSION,
            "dtype": self.dtype,
            "vocab_size": self.vocab_size,
            "eos_id": self.eos_id,
            "tokenizer": self.tokenizer,
            "shards": [{"name": s.name, "tokens": s.tokens, "bytes": s.bytes, "sha256": s.sha256} for s in self.shards],
        }


# --------------------------------------------------------------------------- locations


def is_uri(location: str) -> bool:
    return "://" in location and not location.startswith("file://")


def local_path(location: str) -> str:
    if location.startswith("file://"):
        location = location[len("file://") :]
    return os.path.abspath(os.path.expanduser(location))


def join(location: str, name: str) -> str:
    return f"{location.rstrip('/')}/{name}" if is_uri(location) else os.path.join(local_path(location), name)


_FILESYSTEMS: dict[tuple[Any, ...], Any] = {}


def remote(location: str) -> tuple[Any, str]:
    """The ``pyarrow.fs`` filesystem of a URI and the path on it (one filesystem per bucket and
    environment: opening one resolves its settings)."""
    from pyarrow.fs import FileSystem  # only object-store corpora need pyarrow's filesystems

    scheme, rest = location.split("://", 1)
    bucket, _, key = rest.partition("/")
    env = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith(("AWS_", "GOOGLE_", "GCS_", "AZURE_"))))
    cache_key = (scheme, bucket, env)
    if cache_key not in _FILESYSTEMS:
        fs, root = FileSystem.from_uri(f"{scheme}://{bucket}")
        _FILESYSTEMS[cache_key] = (fs, root.rstrip("/"))
    fs, root = _FILESYSTEMS[cache_key]
    key = key.strip("/")
    return fs, (f"{root}/{key}" if key else root) if root else "/" + key


def _reason(e: BaseException) -> str:
    """The first line of a store's error, cut short (pyarrow's messages name the operation and the
    key, never the credentials)."""
    line = next((s.strip() for s in str(e).splitlines() if s.strip()), type(e).__name__)
    return line if len(line) <= 200 else line[:200].rstrip() + "..."


def read_bytes(location: str) -> bytes:
    """The whole object or file at ``location``."""
    if not is_uri(location):
        with open(local_path(location), "rb") as f:
            return f.read()
    fs, path = remote(location)
    with fs.open_input_stream(path) as f:
        return f.read()


def sizes(location: str) -> dict[str, int]:
    """``{name: bytes}`` of the files directly under ``location`` (one listing on a store)."""
    if not is_uri(location):
        folder = local_path(location)
        return {e.name: e.stat().st_size for e in os.scandir(folder) if e.is_file()} if os.path.isdir(folder) else {}
    from pyarrow.fs import FileSelector, FileType

    fs, path = remote(location)
    infos = fs.get_file_info(FileSelector(path, allow_not_found=True))
    return {i.base_name: int(i.size) for i in infos if i.type == FileType.File}


# --------------------------------------------------------------------------- reading and checking


def parse(location: str, raw: dict[str, Any]) -> Manifest:
    """A manifest's JSON as a :class:`Manifest`, or a :class:`ShardError` naming what is wrong."""
    where = f"data.root: {join(location, MANIFEST)}"
    if raw.get("format") != FORMAT or raw.get("version") != VERSION:
        raise ShardError(
            f"{where} is not a {FORMAT} manifest of version {VERSION} (format {raw.get('format')!r}, "
            f"version {raw.get('version')!r}); prepare the corpus with `python -m orchestrator tokens prepare`"
        )
    dtype = raw.get("dtype")
    if dtype not in DTYPES:
        raise ShardError(f"{where}: dtype {dtype!r} is not one of {', '.join(DTYPES)}; write the shards as one of them")
    vocab = raw.get("vocab_size")
    if not isinstance(vocab, int) or vocab < 1 or vocab > 1 << (8 * DTYPES[dtype]):
        raise ShardError(f"{where}: vocab_size {vocab!r} does not fit dtype {dtype}; fix the manifest")
    try:
        shards = tuple(
            Shard(str(s["name"]), int(s["tokens"]), int(s["bytes"]), str(s["sha256"])) for s in raw["shards"]
        )
    except (KeyError, TypeError, ValueError) as e:
        raise ShardError(f"{where}: a shard entry lacks {_reason(e)}; each needs name, tokens, bytes, sha256") from None
    for s in shards:
        if s.bytes != s.tokens * DTYPES[dtype] or "/" in s.name or s.name in ("", ".", "..", MANIFEST):
            raise ShardError(
                f"{where}: shard {s.name!r} lists {s.tokens} tokens in {s.bytes} bytes, not {DTYPES[dtype]} bytes "
                "per token (or a bad name); fix the manifest"
            )
    if len(shards) < 2:
        raise ShardError(
            f"{where} lists {len(shards)} shard(s); validation holds out whole shards, so prepare at least 2 "
            "(tokens prepare --shard-tokens smaller)"
        )
    eos = raw.get("eos_id")
    tokenizer = dict(raw.get("tokenizer") or {})
    return Manifest(location, dtype, vocab, eos if isinstance(eos, int) else None, tokenizer, shards)


def read_manifest(location: str) -> Manifest:
    """Read and parse the manifest at ``location`` (a folder or a store prefix); one line on failure:
    a missing manifest, an unreachable or refusing store (its reason, no credentials)."""
    path = join(location, MANIFEST)
    try:
        text = read_bytes(path)
    except FileNotFoundError:
        raise ShardError(
            f"data.root: no {MANIFEST} at {path}; prepare the corpus there with "
            "`python -m orchestrator tokens prepare SRC... --out DIR` (it writes the manifest last)"
        ) from None
    except Exception as e:  # pyarrow raises OSError, ArrowInvalid, ValueError for a store it cannot read
        if is_uri(location) and "not found" not in str(e).lower() and "does not exist" not in str(e).lower():
            raise ShardError(
                f"data.root: cannot read {path} ({_reason(e)}); check the endpoint and credentials in "
                "AWS_ENDPOINT_URL / AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (or your store's variables)"
            ) from None
        raise ShardError(
            f"data.root: no {MANIFEST} at {path}; prepare the corpus there with "
            "`python -m orchestrator tokens prepare SRC... --out DIR` (it writes the manifest last)"
        ) from None
    try:
        raw = json.loads(text)
    except ValueError as e:
        raise ShardError(f"data.root: {path} is not JSON ({_reason(e)}); prepare the corpus again") from None
    if not isinstance(raw, dict):
        raise ShardError(f"data.root: {path} is not a JSON object; prepare the corpus again")
    return parse(location, raw)


def check_files(m: Manifest) -> None:
    """Every shard is there with the size the manifest gives (one listing; no shard is read)."""
    found = sizes(m.location)
    for s in m.shards:
        if s.name not in found:
            raise ShardError(
                f"data.root: shard {s.name!r} listed in {MANIFEST} is missing from {m.location}; "
                "copy it there or prepare the corpus again"
            )
        if found[s.name] != s.bytes:
            raise ShardError(
                f"data.root: shard {s.name!r} has {found[s.name]} bytes, the manifest says {s.bytes}; "
                "it is truncated or another file: copy it again or prepare the corpus again"
            )


def windows_in(tokens: int, context: int) -> int:
    """Windows of ``context + 1`` tokens a shard of ``tokens`` holds, at stride ``context``."""
    return 0 if tokens < context + 1 else (tokens - context - 1) // context + 1


def check_context(m: Manifest, context: int) -> None:
    """Every shard holds at least one window of ``context + 1`` tokens (a window never crosses shards)."""
    short = min(m.shards, key=lambda s: s.tokens)
    if short.tokens < context + 1:
        raise ShardError(
            f"data.context: {context} + 1 tokens do not fit in shard {short.name!r} of {short.tokens} tokens "
            f"(a window never crosses two shards); lower data.context to at most {short.tokens - 1} or prepare "
            "larger shards"
        )


def check_corpus(location: str, context: int) -> Manifest:
    """The checks the driver makes before anything starts: manifest, files and sizes, context."""
    m = read_manifest(location)
    check_files(m)
    check_context(m, context)
    return m
