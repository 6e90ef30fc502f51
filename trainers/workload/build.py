"""A run's workload from its config: the model, the per-sample loss, the datasets, and the batches
of the global data order that this rank trains on (docs/architecture.md, "workloads").

A workload is named either by built-in names (``data.name``: ``digits``, ``synthetic``, ``cifar10``,
``text``; ``model.name``: ``mlp``, ``cnn``, ``resnet18``, ``resnet50``, ``gpt``, ``lstm``) or by the
user's factories (``data.factory`` / ``model.factory``, ``"package.module:function"`` called with
``params``; :mod:`trainers.workload.factory`).  Both come out as the same :class:`Workload`.

Two ways to serve a global batch, with the same ids for every (seed, epoch, cursor, B, W,
max_local_batch) (:func:`trainers.data.sampler.rank_micro_batches`):

* :class:`TensorBatches`: the built-in in-memory sets, indexed as tensors (fast: no collation);
* :class:`LoaderBatches`: every map-style dataset (a factory's, ``text``), through a
  ``torch.utils.data.DataLoader`` fed by :class:`trainers.data.sampler.RankLoader`.

The loss is per sample (shape ``[b]``) and the loop sums it: ``loss_sum / B`` is the global
batch's mean and the noise-scale estimator gets its per-micro-batch sums.  Language models (the
loss ``token_cross_entropy``) count the batch in sequences of ``T`` tokens; ``tokens_per_sample``
is ``T`` so that the loop can log tokens beside samples.

Functions sent by value (``fit(model_fn=lambda ...)``) travel in the workers' payload as
``functions = {"model": fn, "data": fn}``; the config then records ``factory: "python:<name>"``
(:data:`BY_VALUE`), which only such a payload can resolve.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from trainers import catalog
from trainers.data.datasets import DataConfig, InMemoryData, dataset_info, load_data
from trainers.data.order import epoch_permutation, global_batch
from trainers.data.sampler import LoaderConfig, RankLoader, fetch, rank_micro_batches
from trainers.workload.batchnorm import guard_single_samples
from trainers.workload.factory import (
    FactoryError,
    LossFn,
    ProbeReport,
    build_datasets,
    cross_entropy,
    resolve_loss,
    token_cross_entropy,
)
from trainers.workload.factory import (
    build_model as build_factory_model,
)
from trainers.workload.models import ModelConfig
from trainers.workload.models import build_model as build_named_model

BY_VALUE = "python:"  # prefix of a factory sent by value from Python (not importable by name)
Functions = Mapping[str, Callable[..., Any]]


def by_value_name(fn: Callable[..., Any]) -> str:
    """What the config records for a function sent by value: ``python:module.qualname``."""
    return f"{BY_VALUE}{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def _spec(section: str, factory: str, functions: Functions | None) -> str | Callable[..., Any]:
    """A factory string, or the function sent by value that a ``python:`` string stands for."""
    if factory.startswith(BY_VALUE):
        fn = (functions or {}).get(section)
        if fn is None:
            raise FactoryError(
                f"{section}.factory: {factory!r} was sent by value from Python and is not "
                f"importable; pass the function again ({section}_fn=... of fit())"
            )
        return fn
    return factory


# --------------------------------------------------------------------------- factories of the config


class _TensorPairs(torch.utils.data.Dataset):
    """``(x[i], y[i])`` of two tensors, with a batched ``__getitems__`` (the probe's view of built-in data)."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return int(self.y.shape[0])

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]

    def __getitems__(self, indices: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.as_tensor(list(indices), dtype=torch.long)
        return self.x[idx], self.y[idx]


def data_factory(
    data: DataConfig, seed: int, functions: Functions | None = None
) -> tuple[str | Callable[..., Any], dict[str, Any]]:
    """``(factory, params)`` that builds ``(train, val)`` for the ``data`` section.

    ``text`` is :func:`trainers.data.text.load_text` of ``data.path`` (default: the stdlib corpus)
    with ``data.context`` and ``data.val_fraction``; the in-memory sets are wrapped as map-style
    pairs (what :func:`trainers.workload.factory.probe` reads; the loop indexes their tensors directly).
    """
    if data.factory is not None:
        return _spec("data", data.factory, functions), dict(data.params)
    if data.name == catalog.TEXT.name:
        from trainers.data.text import load_text

        return load_text, {"path": data.path, "context": data.context, "val_fraction": data.val_fraction}
    if data.name == catalog.TOKENS.name:
        from trainers.data.shards.dataset import load_tokens

        return load_tokens, {
            "root": data.root,
            "context": data.context,
            "val_fraction": data.val_fraction,
            "block": data.shard_block,
            "cache_bytes": data.cache_bytes,
        }

    def in_memory() -> tuple[_TensorPairs, _TensorPairs]:
        d = load_data(data, seed)
        return _TensorPairs(d.train_x, d.train_y), _TensorPairs(d.val_x, d.val_y)

    return in_memory, {}


def model_factory(
    model: ModelConfig, data: DataConfig, functions: Functions | None = None
) -> tuple[str | Callable[..., Any], dict[str, Any]]:
    """``(factory, params)`` that builds the model of the ``model`` section.

    ``gpt``/``lstm`` are :mod:`trainers.workload.lm_models`' factories with ``model.params`` (a GPT's
    ``context`` defaults to ``data.context``); the image models need a built-in in-memory set
    (their input shape and classes come from it).
    """
    if model.factory is not None:
        return _spec("model", model.factory, functions), dict(model.params)
    if model.language_model:
        from trainers.workload.lm_models import LM_MODELS

        params = dict(model.params)
        if model.builtin is not None and model.builtin.uses_context:
            params.setdefault("context", data.context)
        return LM_MODELS[str(model.name)], params
    if not data.in_memory:
        image_sets = ", ".join(catalog.dataset_names(lambda d: d.in_memory))
        language_models = "/".join(catalog.model_names(lambda m: m.language_model))
        token_sets = "/".join(catalog.dataset_names(lambda d: d.inputs == "tokens"))
        raise FactoryError(
            f"model.name: {model.name!r} needs a built-in image dataset ({image_sets}); with "
            f"data.{'factory' if data.factory else 'name'} give model.factory "
            f"(or {language_models} for {token_sets})"
        )
    info = dataset_info(data)
    return (lambda: build_named_model(info, model)), {}


def largest_batch(batch: Any) -> int:
    """The largest global batch the batch policy can reach (what the training set must hold)."""
    sizes = [batch.size, batch.max_size or 0, *(s for _, s in (batch.schedule or []))]
    return int(max(sizes))


def probe_config(cfg: Any, functions: Functions | None = None) -> ProbeReport | None:
    """Run :func:`trainers.workload.factory.probe_report` on the config's workload (driver, before Ray starts).

    Only workloads that are not entirely built-in image ones are probed (those are tested code; the
    driver checks their shapes on PyTorch's ``meta`` device): ``None`` for those.  Returns what the
    probe saw (its BatchNorm warning, the training set's size, the layers that cannot train on one
    sample); raises :class:`FactoryError`.
    """
    data, model = cfg.data, cfg.model
    if data.in_memory and model.factory is None and not model.loss:
        return None
    from trainers.workload.factory import probe_report, resolve

    data_fn, data_params = data_factory(data, cfg.train.seed, functions)
    resolve(data_fn, "data.factory")  # the data's import errors first
    model_fn, model_params = model_factory(model, data, functions)

    check_size = not data.in_memory
    return probe_report(
        model_fn,
        data_fn,
        model.loss_name(),
        model_params=model_params,
        data_params=data_params,
        global_batch=largest_batch(cfg.batch) if check_size else None,
        model_field="model.factory" if model.factory else "model.name",
        data_field="data.factory" if data.factory else "data.name",
    )


# --------------------------------------------------------------------------- the workload


@dataclass
class Workload:
    """What one worker trains: the model, the per-sample loss and the data.

    Exactly one of ``tensors`` (a built-in in-memory set) and ``train``/``val`` (map-style
    datasets) is set.  ``tokens_per_sample`` is ``T`` for a language model (else ``None``).
    """

    model: nn.Module
    loss_fn: LossFn
    tensors: InMemoryData | None = None
    train: Any = None
    val: Any = None
    tokens_per_sample: int | None = None

    @property
    def num_train(self) -> int:
        return self.tensors.num_train if self.tensors is not None else len(self.train)


def build_workload(
    cfg: Any, functions: Functions | None = None, raw_pixels: bool = False, single_sample_guard: bool = False
) -> Workload:
    """Datasets, then model (in that order after the caller's ``torch.manual_seed``), then loss.
    ``single_sample_guard`` (the worker loop): the model's BatchNorm layers take an epoch's
    single-sample tail with their running statistics
    (:func:`trainers.workload.batchnorm.guard_single_samples`); a model built to be logged or
    exported is left as its factory made it.

    ``raw_pixels``: CIFAR-10's inputs stay uint8 with their mean/std (``load_data(raw=True)``) for a
    caller that normalises each batch (the worker loop's :class:`trainers.data.pipeline.InputPipeline`)."""
    data, model = cfg.data, cfg.model
    loss_fn = resolve_loss(model.loss_name())
    if data.in_memory:
        tensors = load_data(data, cfg.train.seed, raw=raw_pixels)
        built = (
            build_named_model(tensors.info, model)
            if model.factory is None
            else build_factory_model(*model_factory(model, data, functions))
        )
        return Workload(guard_single_samples(built) if single_sample_guard else built, loss_fn, tensors=tensors)
    data_fn, data_params = data_factory(data, cfg.train.seed, functions)
    train, val = build_datasets(data_fn, data_params, "data.factory" if data.factory else "data.name")
    built = build_factory_model(
        *model_factory(model, data, functions), field="model.factory" if model.factory else "model.name"
    )
    tokens = None
    if loss_fn is token_cross_entropy:
        _, y = train[0]
        tokens = int(torch.as_tensor(y).numel())
    return Workload(
        guard_single_samples(built) if single_sample_guard else built,
        loss_fn,
        train=train,
        val=val,
        tokens_per_sample=tokens,
    )


def train_size(cfg: Any, functions: Functions | None = None) -> int:
    """Training samples per epoch, without building the model (driver: plan, progress bar)."""
    if cfg.data.in_memory:
        return load_data(cfg.data, cfg.train.seed).num_train
    data_fn, data_params = data_factory(cfg.data, cfg.train.seed, functions)
    train, _ = build_datasets(data_fn, data_params, "data.factory" if cfg.data.factory else "data.name")
    return len(train)


# --------------------------------------------------------------------------- losses and metrics


def summed_loss(loss_fn: LossFn, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The sum over the micro-batch of the per-sample losses (``reduction='sum'`` for the built-in CE),
    in fp32 whatever the precision of ``out`` (bf16/fp16 autocast: the per-sample loss is taken to
    fp32 before summing, so the loss sum and the global-batch math do not change)."""
    if loss_fn is cross_entropy:
        return F.cross_entropy(out.float(), y, reduction="sum")
    return loss_fn(out, y).float().sum()


def correct(out: Any, y: Any) -> torch.Tensor | None:
    """Accuracy's numerator: classes ``[b, C]`` vs ``[b]`` -> hits; tokens ``[b, T, V]`` vs ``[b, T]`` ->
    the sum over sequences of each one's token accuracy; ``None`` for other outputs (no accuracy)."""
    if not isinstance(out, torch.Tensor) or not isinstance(y, torch.Tensor) or y.is_floating_point():
        return None
    if out.dim() == 2 and y.dim() == 1 and out.shape[0] == y.shape[0]:
        return (out.argmax(1) == y).sum().double()
    if out.dim() == 3 and y.dim() == 2 and out.shape[:2] == y.shape:
        return (out.argmax(-1) == y).double().mean(dim=1).sum()
    return None


def to_device(obj: Any, device: torch.device) -> Any:
    """Tensors (also inside tuples, lists and dicts) moved to ``device``."""
    if isinstance(obj, torch.Tensor):
        return obj.to(device, non_blocking=True)
    if isinstance(obj, (tuple, list)):
        return type(obj)(to_device(o, device) for o in obj)
    if isinstance(obj, dict):
        return {k: to_device(v, device) for k, v in obj.items()}
    return obj


def batch_len(obj: Any) -> int:
    """Samples in a collated input (its leading dimension; the first tensor's in a container)."""
    if isinstance(obj, torch.Tensor):
        return int(obj.shape[0])
    if isinstance(obj, (tuple, list)) and obj:
        return batch_len(obj[0])
    if isinstance(obj, dict) and obj:
        return batch_len(next(iter(obj.values())))
    return 0


# --------------------------------------------------------------------------- batches of the global order


@dataclass
class StepBatch:
    """One step's data on this rank: the global batch ``ids`` and this rank's loaded micro-batches."""

    ids: np.ndarray
    micro_ids: list[np.ndarray]
    micro: list[Any] = field(default_factory=list)  # collated (inputs, targets) per micro-batch

    @property
    def mine_len(self) -> int:
        return int(sum(len(m) for m in self.micro_ids))

    @property
    def mine(self) -> np.ndarray:
        return np.concatenate(self.micro_ids) if self.micro_ids else self.ids[:0]


def _take(t: Any, ids: np.ndarray) -> Any:
    """``t[ids]`` along the first dimension.  For a tensor, ``index_select`` with an index tensor: a
    numpy index goes through PyTorch's generic indexing, ~7x slower (60 vs 9 us for 64 rows here,
    ~2% of a small model's step)."""
    if not isinstance(t, torch.Tensor):
        return t[ids]
    index = torch.from_numpy(np.ascontiguousarray(ids, dtype=np.int64))
    return t.index_select(0, index if t.device.type == "cpu" else index.to(t.device))


class TensorBatches:
    """The built-in in-memory sets: micro-batches by indexing the training tensors."""

    def __init__(
        self, data: InMemoryData, *, seed: int, rank: int, world: int, max_local_batch: int, split_single: bool
    ) -> None:
        self.data, self.seed, self.rank, self.world = data, seed, rank, world
        self.max_local_batch, self.split_single = max_local_batch, split_single
        self._perm: tuple[int, np.ndarray] | None = None

    def permutation(self, epoch: int) -> np.ndarray:
        if self._perm is None or self._perm[0] != epoch:
            self._perm = (epoch, epoch_permutation(self.seed, epoch, self.data.num_train))
        return self._perm[1]

    def batch(self, ids: np.ndarray) -> StepBatch:
        micro_ids = rank_micro_batches(ids, self.rank, self.world, self.max_local_batch, self.split_single)
        return StepBatch(
            ids, micro_ids, [(_take(self.data.train_x, m), _take(self.data.train_y, m)) for m in micro_ids]
        )

    def next(self, epoch: int, cursor: int, batch_size: int) -> StepBatch:
        return self.batch(global_batch(self.permutation(epoch), cursor, batch_size))

    def one_input(self, ids: np.ndarray) -> Any:
        return self.data.train_x[ids[:1]]

    def val_batches(self, chunk: int) -> Iterator[tuple[Any, Any]]:
        x_all, y_all = self.data.val_x[self.rank :: self.world], self.data.val_y[self.rank :: self.world]
        for s in range(0, len(y_all), chunk):
            yield x_all[s : s + chunk], y_all[s : s + chunk]

    def close(self) -> None:
        pass


class LoaderBatches:
    """Map-style datasets through :class:`trainers.data.sampler.RankLoader` (a ``DataLoader`` in our order)."""

    def __init__(
        self,
        train: Any,
        val: Any,
        *,
        seed: int,
        rank: int,
        world: int,
        max_local_batch: int,
        split_single: bool,
        config: LoaderConfig | None = None,
    ) -> None:
        self.val, self.rank, self.world = val, rank, world
        self.max_local_batch, self.split_single = max_local_batch, split_single
        self.loader = RankLoader(
            train,
            seed=seed,
            rank=rank,
            world=world,
            max_local_batch=max_local_batch,
            config=config,
            split_single=split_single,
        )

    def batch(self, ids: np.ndarray) -> StepBatch:
        """Load a given global batch in this process (tests, benchmarks)."""
        micro_ids = rank_micro_batches(ids, self.rank, self.world, self.max_local_batch, self.split_single)
        return StepBatch(ids, micro_ids, [self.loader.fetch(m) for m in micro_ids])

    def next(self, epoch: int, cursor: int, batch_size: int) -> StepBatch:
        if (self.loader.epoch, self.loader.cursor) != (epoch, cursor):
            self.loader.seek(epoch, cursor)  # a resume (or anything that moved the position)
        gb = self.loader.next_global_batch(batch_size)
        return StepBatch(gb.ids, gb.micro_ids, gb.micro)

    def one_input(self, ids: np.ndarray) -> Any:
        return self.loader.fetch(ids[:1])[0]

    def val_batches(self, chunk: int) -> Iterator[tuple[Any, Any]]:
        n = len(self.val)
        mine = list(range(self.rank, n, self.world))
        for s in range(0, len(mine), chunk):
            yield fetch(self.val, mine[s : s + chunk])

    def close(self) -> None:
        self.loader.close()


def make_batches(
    work: Workload,
    *,
    seed: int,
    rank: int,
    world: int,
    max_local_batch: int,
    split_single: bool,
    loader: LoaderConfig | None = None,
) -> TensorBatches | LoaderBatches:
    if work.tensors is not None:
        return TensorBatches(
            work.tensors, seed=seed, rank=rank, world=world, max_local_batch=max_local_batch, split_single=split_single
        )
    return LoaderBatches(
        work.train,
        work.val,
        seed=seed,
        rank=rank,
        world=world,
        max_local_batch=max_local_batch,
        split_single=split_single,
        config=loader,
    )


def perplexity(val_loss: float) -> float:
    """``exp(val/loss)`` (per-token perplexity when the loss is a per-sequence mean of token losses)."""
    return math.exp(min(val_loss, 700.0))
