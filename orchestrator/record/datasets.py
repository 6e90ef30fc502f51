"""What a run trained and validated on, as MLflow dataset inputs (the run page's "Datasets used").

Each of the two splits is one MLflow ``Dataset`` (name, digest, source) logged with
``log_inputs`` in its context, ``training`` or ``validation``: a built-in set by its catalog name
(trainers/catalog.py) and the config fields that shape it, a user's factory by its import path and a
digest of its parameters, a text corpus by a digest of its files.  Two runs on different data
differ in a digest.  No credential reaches a logged source: a URI loses its user, password and
query (:func:`clean_source`).

A dataset that knows its own files (a token shard manifest) describes itself with
:func:`dataset_input` ``(name, source URI, digest, context)``."""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from mlflow.entities import Dataset, DatasetInput, InputTag

from trainers import catalog
from trainers.data.text import default_corpus

CONTEXT_TAG = "mlflow.data.context"  # MLflow's tag for the role of a dataset in a run
TRAINING, VALIDATION = "training", "validation"
DIGEST_CHARS = 16  # MLflow stores at most 36
IDENTITY = ("val_fraction", "val_split", "size", "shape", "num_classes", "seed", "context", "root", "path")
"""The ``data`` fields that can change which samples a split holds (the loader's settings cannot)."""


def clean_source(uri: str) -> str:
    """``uri`` without its user, password, query and fragment (``s3://key:secret@b/p?X-Amz-Signature=…``
    -> ``s3://b/p``); a local path as it is."""
    if "://" not in uri:
        return uri
    parts = urlsplit(uri)
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def _source_type(uri: str) -> str:
    return urlsplit(uri).scheme if "://" in uri else "local"


def digest_of(*parts: Any) -> str:
    """A short digest of JSON-able ``parts`` (keys sorted; what JSON cannot hold, by its ``repr``)."""
    text = json.dumps(parts, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:DIGEST_CHARS]


def files_digest(paths: list[str]) -> str:
    """A short digest of the files' contents, in order."""
    h = hashlib.sha256()
    for p in paths:
        with open(p, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        h.update(b"\0")
    return h.hexdigest()[:DIGEST_CHARS]


def dataset_input(
    name: str, source_uri: str, digest: str, context: str, source_type: str | None = None
) -> DatasetInput:
    """One dataset input of a run: ``name`` and ``digest`` as MLflow shows them, ``source_uri``
    where the data is (cleaned of credentials), ``context``: :data:`TRAINING` or :data:`VALIDATION`.
    ``source_type``: MLflow's (``local``, ``s3``, ``code``...; default: the URI's scheme)."""
    source = clean_source(source_uri)
    kind = source_type or _source_type(source)
    dataset = Dataset(name=name, digest=digest[:36], source_type=kind, source=json.dumps({"uri": source}))
    return DatasetInput(dataset, tags=[InputTag(CONTEXT_TAG, context)])


def _corpus(data: Any) -> tuple[str, list[str]]:
    """A text set's source and files: ``data.path``, or the default standard-library corpus."""
    if data.path:
        path = os.path.abspath(os.path.expanduser(data.path))
        return path, [path]
    files = [str(p) for p in default_corpus()]
    return os.path.dirname(files[0]), files


def describe_data(data: Any) -> list[DatasetInput]:
    """The training and validation inputs of a ``data`` section (trainers/data/config.py)."""
    identity = {k: getattr(data, k, None) for k in IDENTITY}
    if data.factory is not None:  # the user's factory: its import path, its parameters' digest
        name, source, kind = data.factory, data.factory, "code"
        content = digest_of(data.params)
    else:
        entry = catalog.BUILTIN_DATASETS[data.name]
        name, kind = entry.name, None
        where = data.root if entry.needs_root else getattr(data, "path", None)
        if entry is catalog.TEXT:  # a text corpus: its files' contents
            source, files = _corpus(data)
            content = files_digest(files)
        elif where:  # files of its own (a folder, a manifest's URI): where they are
            source = where if "://" in where else os.path.abspath(os.path.expanduser(where))
            content = digest_of(clean_source(source))
        else:  # built from the catalog entry and the config alone
            source, kind, content = f"catalog:{name}", "code", digest_of(name)
    return [
        dataset_input(name, source, digest_of(content, identity, context), context, kind)
        for context in (TRAINING, VALIDATION)
    ]


def log_datasets(client: Any, run_id: str, inputs: list[DatasetInput], tries: int = 3) -> bool:
    """Log ``inputs`` on the run; False where the store would not take them (the run goes on).

    Runs of one experiment started at once (a search's parallel trials) may both create the same
    dataset: the store refuses the second (its unique key), whose next try finds it and links it."""
    for attempt in range(tries):
        try:
            client.log_inputs(run_id, datasets=inputs)
            return True
        except Exception:  # the dataset created meanwhile by another run, or the store away
            if attempt == tries - 1:
                return False
    return False
