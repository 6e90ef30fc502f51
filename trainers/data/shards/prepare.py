"""Text files -> token shards and their manifest (``python -m orchestrator tokens prepare``).

Tokenizers (Hugging Face ``tokenizers``, offline):

- default: the bytes of the text (vocabulary 256, the ``text`` set's tokens), files joined by one
  ``b"\\n"`` as the ``text`` set joins them, no EOS id (every byte value is text);
- ``tokenizer_file``: a local ``tokenizer.json`` (``Tokenizer.from_file``);
- ``train_bpe``: a byte-level BPE of that vocabulary trained on the sources here, saved as
  ``tokenizer.json`` beside the shards.

With a tokenizer, each file is a document and its ids are followed by the EOS id (``<|endoftext|>``,
``</s>`` or ``<eos>`` when the vocabulary has one).  Shards hold ``shard_tokens`` tokens each; a
last shard shorter than half of that is merged into the one before it.  ``uint16`` when the
vocabulary fits, else ``uint32``.

Idempotent: the manifest records what it was made from (each source's path, size and mtime, the
tokenizer, the shard size); a second run with the same inputs finds it and writes nothing.  A run
with other inputs removes the old manifest first, writes each shard atomically (a temporary file,
then ``os.replace``), and writes the manifest last, atomically: a folder whose manifest is there
is complete.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from trainers.data.shards.manifest import DTYPES, FORMAT, MANIFEST, VERSION, Manifest, Shard

EOS_NAMES = ("<|endoftext|>", "</s>", "<eos>")


def _atomic_write(path: str, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=os.path.basename(path) + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would keep the corpus from other users and upload tools
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def source_files(sources: Sequence[str]) -> list[str]:
    """The files named, a folder's files (recursively, sorted); ``FileNotFoundError`` for a missing one."""
    out: list[str] = []
    for src in sources:
        p = os.path.abspath(os.path.expanduser(src))
        if os.path.isdir(p):
            out += sorted(os.path.join(d, f) for d, _, fs in os.walk(p) for f in fs)
        elif os.path.isfile(p):
            out.append(p)
        else:
            raise FileNotFoundError(f"SRC: no file or folder at {src!r}; give text files or folders of them")
    if not out:
        raise FileNotFoundError("SRC: the folders given hold no files; give text files")
    return out


class Encoder:
    """One of the three tokenizers, as ``encode(text bytes) -> ids`` plus what the manifest records."""

    def __init__(self, files: Sequence[str], out: str, tokenizer_file: str | None, train_bpe: int | None):
        self.tok: Any = None
        if tokenizer_file and train_bpe:
            raise ValueError("--tokenizer and --train-bpe: give one of them")
        if tokenizer_file:
            from tokenizers import Tokenizer

            if not os.path.isfile(tokenizer_file):
                raise FileNotFoundError(f"--tokenizer: no tokenizer.json at {tokenizer_file!r}")
            self.tok = Tokenizer.from_file(tokenizer_file)
            self.description = {"kind": "file", "source": os.path.abspath(tokenizer_file)}
        elif train_bpe:
            self.tok = train_byte_bpe(files, train_bpe)
            self.tok.save(os.path.join(out, "tokenizer.json"))
            self.description = {"kind": "byte_bpe", "trained_on": "the sources", "file": "tokenizer.json"}
        else:
            self.description = {"kind": "bytes", "note": "token = byte value; files joined by one newline"}
        self.vocab_size = 256 if self.tok is None else int(self.tok.get_vocab_size())
        self.eos_id = None
        if self.tok is not None:
            found = (self.tok.token_to_id(n) for n in EOS_NAMES)
            self.eos_id = next((i for i in found if i is not None), None)
        self.dtype = "uint16" if self.vocab_size <= 1 << 16 else "uint32"

    def documents(self, files: Sequence[str], advance: Callable[[int], None]) -> Iterator[np.ndarray]:
        """Each file's ids (with its separator), in order."""
        for i, path in enumerate(files):
            with open(path, "rb") as f:
                data = f.read()
            if self.tok is None:
                ids = np.frombuffer((b"\n" if i else b"") + data, dtype=np.uint8)
            else:
                ids = np.asarray(self.tok.encode(data.decode("utf-8", errors="replace")).ids, dtype=np.int64)
                if self.eos_id is not None:
                    ids = np.append(ids, self.eos_id)
            advance(len(data))
            yield ids


def train_byte_bpe(files: Sequence[str], vocab_size: int) -> Any:
    """A byte-level BPE (GPT-2's scheme) of ``vocab_size`` trained on ``files``, with ``<|endoftext|>``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if vocab_size < 257:
        raise ValueError(f"--train-bpe: a vocabulary of {vocab_size} is below the 256 bytes plus EOS; give >= 257")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train(list(files), trainer)
    return tok


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def prepare(
    sources: Sequence[str],
    out: str,
    *,
    tokenizer_file: str | None = None,
    train_bpe: int | None = None,
    shard_tokens: int = 1 << 20,
    progress: bool = True,
) -> tuple[Manifest, bool]:
    """Write the shards of ``sources`` and their manifest under ``out``; ``(manifest, written)``
    (``written`` False: the manifest there was made from the same inputs, nothing was done)."""
    from tqdm import tqdm

    from trainers.data.shards.manifest import parse

    if shard_tokens < 2:
        raise ValueError(f"--shard-tokens: must be >= 2, got {shard_tokens}")
    files = source_files(sources)
    out = os.path.abspath(os.path.expanduser(out))
    os.makedirs(out, exist_ok=True)
    manifest_path = os.path.join(out, MANIFEST)
    # the recipe without training a BPE first: a trained tokenizer is known by its vocabulary and the sources
    kind = {"kind": "file"} if tokenizer_file else ({"kind": "byte_bpe", "vocab": train_bpe} if train_bpe else {})
    probe = {
        "files": [[p, os.path.getsize(p), os.stat(p).st_mtime_ns] for p in files],
        "tokenizer": kind | {"sha256": _file_sha(tokenizer_file)},
        "shard_tokens": shard_tokens,
    }
    if os.path.isfile(manifest_path):
        with open(manifest_path) as f:
            old = json.load(f)
        if old.get("recipe") == probe and all(
            os.path.isfile(os.path.join(out, s["name"])) and os.path.getsize(os.path.join(out, s["name"])) == s["bytes"]
            for s in old.get("shards", [])
        ):
            return parse(out, old), False
        os.unlink(manifest_path)  # other inputs: the folder is not a corpus until the new manifest is written
    encoder = Encoder(files, out, tokenizer_file, train_bpe)
    dtype = np.dtype(encoder.dtype).newbyteorder("<")
    shards: list[Shard] = []
    buf: list[np.ndarray] = []
    held = 0

    def write(ids: np.ndarray) -> None:
        data = ids.astype(dtype).tobytes()
        name = f"shard-{len(shards):05d}.bin"
        _atomic_write(os.path.join(out, name), data)
        shards.append(Shard(name, len(ids), len(data), _sha256(data)))

    total = sum(os.path.getsize(p) for p in files)
    with tqdm(total=total, unit="B", unit_scale=True, desc="tokenizing", disable=not progress) as bar:
        for ids in encoder.documents(files, bar.update):
            buf.append(ids)
            held += len(ids)
            while held >= shard_tokens:
                flat = np.concatenate(buf)
                write(flat[:shard_tokens])
                buf, held = [flat[shard_tokens:]], len(flat) - shard_tokens
    tail = np.concatenate(buf) if buf else np.zeros(0, dtype=np.int64)
    if len(tail) and shards and len(tail) < shard_tokens // 2:  # merge a short tail into the last shard
        last = shards.pop()
        prev = np.fromfile(os.path.join(out, last.name), dtype=dtype).astype(np.int64)
        tail = np.concatenate([prev, tail])
    if len(tail):
        write(tail)
    for stale in sorted(os.listdir(out)):  # shards of an earlier, longer preparation
        if stale.startswith("shard-") and stale.endswith(".bin") and stale not in {s.name for s in shards}:
            os.unlink(os.path.join(out, stale))
    if len(shards) < 2:
        raise ValueError(
            f"--shard-tokens: the corpus's {sum(s.tokens for s in shards)} tokens make {len(shards)} shard(s) of "
            f"{shard_tokens}; validation holds out whole shards, so lower --shard-tokens to make at least 2"
        )
    m = Manifest(out, encoder.dtype, encoder.vocab_size, encoder.eos_id, encoder.description, tuple(shards))
    record = m.to_json() | {"recipe": probe}
    assert record["format"] == FORMAT and record["version"] == VERSION and record["dtype"] in DTYPES
    _atomic_write(manifest_path, (json.dumps(record, indent=1) + "\n").encode())
    return m, True


def _file_sha(path: str | None) -> str | None:
    if not path or not os.path.isfile(path):
        return None
    with open(path, "rb") as f:
        return _sha256(f.read())
