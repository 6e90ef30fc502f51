"""The accelerator fast path around the model and the data: channels_last, data kept on the
device, ``torch.compile`` with clean checkpoint keys, and a host->device prefetcher.

- **channels_last** (``model.channels_last``): NHWC memory format for 4-D image models; with
  bf16/fp16 convolutions on tensor cores it avoids layout transposes (PyTorch's "Channels Last
  Memory Format" tutorial).  The inputs must be in the same format: :class:`DeviceData` does it.
- **data on the device** (``data.device: accelerator``): an in-memory training set is copied to
  the GPU once (kept as uint8 when it came as uint8: 4x smaller than float32) and every
  micro-batch is indexed there, then converted to float and normalised,
  ``x = (x_raw / 255 - mean) / std`` for uint8 (``(x_raw - mean) / std`` otherwise).  No host
  copy per step at all.
- **compile** (``train.compile``): ``torch.compile(model, dynamic=True)`` (dynamic shapes: the
  slices of a global batch are uneven).  The compiled wrapper prefixes state-dict keys with
  ``_orig_mod.`` (and DDP with ``module.``); :func:`clean_state_dict` gives the keys of the
  plain model and :func:`load_clean_state_dict` loads either form.
- **prefetch** (map-style data on the host): :class:`Prefetcher` pins each batch and copies it
  with ``non_blocking`` on a side CUDA stream one batch ahead, so the copy of batch ``i+1``
  overlaps the step on batch ``i``.

Order when building a worker's model: ``build_model`` -> :func:`to_channels_last` -> ``.to(device)``
-> DDP (and its communication hook) -> :func:`compile_model`.  Compiling the DDP-wrapped model is
what PyTorch recommends (its DDPOptimizer splits graphs at bucket boundaries so the all-reduce
still overlaps backward), and the hook registered on DDP keeps working.
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator, Literal, Sequence

import numpy as np
import torch
from pydantic import ConfigDict, Field
from torch import nn
from trainers.section import Section

__all__ = [
    "CompileConfig", "DataDeviceConfig", "DeviceData", "InputPipeline", "LayoutConfig", "NON_IMAGE_MODELS",
    "Prefetcher", "check_channels_last", "normalize_pixels", "on_device",
    "check_data_device", "check_fast_path",
    "clean_state_dict", "compile_model", "input_pipeline", "load_clean_state_dict", "strip_prefixes", "to_channels_last",
    "unwrap_model",
]

DataDevice = Literal["host", "accelerator"]
_PREFIXES = ("_orig_mod.", "module.")


class LayoutConfig(Section):
    """The layout fields of the ``model`` section (``ModelConfig`` takes them as a base class)."""

    model_config = ConfigDict(extra="forbid")

    channels_last: bool = Field(default=False, description="NHWC memory format (4-D image models only)")


class DataDeviceConfig(Section):
    """The placement field of the ``data`` section (``DataConfig`` takes it as a base class)."""

    model_config = ConfigDict(extra="forbid")

    device: DataDevice = Field(default="host", description="accelerator: keep the in-memory dataset on the GPU "
                               "(needs scaling.use_gpu)")


class CompileConfig(Section):
    """The compile field of the ``train`` section."""

    model_config = ConfigDict(extra="forbid")

    compile: bool = Field(default=False, description="torch.compile the model (dynamic shapes)")
    compile_backend: Literal["inductor", "aot_eager", "eager"] = Field(
        default="inductor", description="train.compile: torch.compile's backend (inductor: generated kernels; "
                                        "aot_eager/eager: graph capture only, to debug or test)")


# --------------------------------------------------------------------------- checks (driver, before Ray)


def check_data_device(device: str, use_gpu: bool) -> None:
    """``data.device: accelerator`` needs GPUs."""
    if device == "accelerator" and not use_gpu:
        raise ValueError("data.device: accelerator keeps the dataset on the GPU and needs scaling.use_gpu: true; "
                         "set data.device: host to train on CPUs")


def check_channels_last(enabled: bool, input_shape: Sequence[int]) -> None:
    """``model.channels_last`` needs image inputs ``[C, H, W]`` (a 4-D batch)."""
    if enabled and len(input_shape) != 3:
        raise ValueError(f"model.channels_last: needs 4-D image batches (inputs shaped [C, H, W]); this "
                         f"dataset's inputs are shaped {list(input_shape)}; set model.channels_last: false")


#: built-in models without a Conv2d layer (``model.channels_last`` would change nothing)
NON_IMAGE_MODELS = ("mlp", "gpt", "lstm")


def check_fast_path(*, precision: str, data_device: str, channels_last: bool, input_shape: Sequence[int] | None,
                    use_gpu: bool, model_name: str | None = None, augment: Sequence[str] = ()) -> None:
    """Every check of issue #20's options in one call for the driver (before Ray starts): the first
    problem as a ``ValueError`` whose one-line message starts with the field.

    ``input_shape``: one sample's input shape where the driver knows it (built-in data), else
    ``None``; ``model_name``: a built-in model's name (``None`` for a factory's, which the worker's
    :func:`to_channels_last` checks once built)."""
    from trainers.precision import check_precision

    check_precision(precision, "cuda" if use_gpu else "cpu")
    check_data_device(data_device, use_gpu)
    if channels_last and model_name in NON_IMAGE_MODELS:
        raise ValueError(f"model.channels_last: {model_name} has no Conv2d layer (not a 4-D image model); set "
                         "model.channels_last: false, or use cnn/resnet18/resnet50")
    if input_shape is not None:
        check_channels_last(channels_last, input_shape)
        if augment and len(input_shape) != 3:
            raise ValueError(f"data.augment: {', '.join(augment)} need image inputs shaped [C, H, W]; this "
                             f"dataset's inputs are shaped {list(input_shape)}; remove data.augment")


# --------------------------------------------------------------------------- model


def to_channels_last(model: nn.Module) -> nn.Module:
    """Convert ``model``'s 4-D parameters and buffers to ``torch.channels_last`` in place; returns it.

    Refuses (``ValueError`` naming ``model.channels_last``) a model with no 2-D convolution:
    its weights are not 4-D, so the format would change nothing but the inputs' strides."""
    if not any(isinstance(m, nn.Conv2d) for m in model.modules()):
        raise ValueError(f"model.channels_last: {type(model).__name__} has no Conv2d layer (not a 4-D image "
                         "model); set model.channels_last: false")
    return model.to(memory_format=torch.channels_last)


def compile_model(model: nn.Module, dynamic: bool = True, **kwargs: Any) -> nn.Module:
    """``torch.compile(model, dynamic=dynamic, **kwargs)``; keys of its state dict gain ``_orig_mod.``,
    so checkpoint through :func:`clean_state_dict`."""
    return torch.compile(model, dynamic=dynamic, **kwargs)  # type: ignore[return-value]


def unwrap_model(model: nn.Module) -> nn.Module:
    """The plain model inside any nesting of ``torch.compile`` and DDP/DataParallel wrappers."""
    from torch.nn.parallel import DataParallel, DistributedDataParallel

    while True:
        if isinstance(model, torch._dynamo.eval_frame.OptimizedModule):
            model = model._orig_mod
        elif isinstance(model, (DistributedDataParallel, DataParallel)):
            model = model.module
        else:
            return model


def strip_prefixes(state: dict[str, Any]) -> dict[str, Any]:
    """Drop leading ``_orig_mod.`` / ``module.`` from the keys, a prefix at a time and only while
    *every* key has it (a model whose own first submodule is called ``module`` keeps its keys
    unless all of them start so and the dict came from a wrapper)."""
    out = dict(state)
    while out:
        for prefix in _PREFIXES:
            if all(k.startswith(prefix) for k in out):
                out = {k[len(prefix):]: v for k, v in out.items()}
                break
        else:
            return out
    return out


def clean_state_dict(model: nn.Module | dict[str, Any]) -> dict[str, Any]:
    """The state dict with the plain model's keys, whatever wraps it (or a wrapped model's dict)."""
    if isinstance(model, nn.Module):
        return unwrap_model(model).state_dict()
    return strip_prefixes(model)


def load_clean_state_dict(model: nn.Module, state: dict[str, Any], strict: bool = True) -> Any:
    """Load a state dict with or without wrapper prefixes into ``model`` (wrapped or not)."""
    return unwrap_model(model).load_state_dict(strip_prefixes(state), strict=strict)


# --------------------------------------------------------------------------- data


def _stats(values: Sequence[float] | torch.Tensor | None, channels: int, device: torch.device) -> torch.Tensor | None:
    if values is None:
        return None
    t = torch.as_tensor(values, dtype=torch.float32, device=device).reshape(-1)
    if t.numel() not in (1, channels):
        raise ValueError(f"mean/std: need 1 or {channels} values (one per channel), got {t.numel()}")
    return t.reshape(1, -1, *([1] * 2)) if t.numel() == channels else t.reshape(())


class DeviceData:
    """An in-memory dataset held on ``device`` once and indexed there.

    ``x`` is stored as it comes: uint8 stays uint8 (raw pixels; :meth:`batch` divides by 255),
    anything else becomes float32.  :meth:`batch` returns ``(x, y)`` of the given ids, float32,
    normalised per batch by ``(x - mean) / std`` when ``mean``/``std`` are given (per channel,
    shape ``[C]``, or one value), optionally augmented *before* normalisation (on raw pixels, as
    torchvision's ``RandomCrop(padding=4)`` before ``Normalize``: the crop's padding is black),
    and in ``channels_last`` format when asked for 4-D inputs.
    """

    def __init__(self, x: torch.Tensor, y: torch.Tensor, device: torch.device | str,
                 mean: Sequence[float] | torch.Tensor | None = None, std: Sequence[float] | torch.Tensor | None = None,
                 channels_last: bool = False):
        self.device = torch.device(device)
        if x.shape[0] != y.shape[0]:
            raise ValueError(f"x and y differ in length: {x.shape[0]} vs {y.shape[0]}")
        self.raw_uint8 = x.dtype == torch.uint8
        self.x = x.to(self.device) if self.raw_uint8 else x.to(self.device, torch.float32)
        self.y = y.to(self.device)
        channels = int(x.shape[1]) if x.dim() >= 2 else 1
        self.mean = _stats(mean, channels, self.device)
        self.std = _stats(std, channels, self.device)
        if self.std is not None and bool((self.std == 0).any()):
            raise ValueError("std: must be non-zero")
        self.channels_last = channels_last and x.dim() == 4

    def __len__(self) -> int:
        return int(self.y.shape[0])

    def index(self, ids: np.ndarray | Sequence[int] | torch.Tensor) -> torch.Tensor:
        """The ids as an int64 tensor on the device (one small host->device copy)."""
        if isinstance(ids, torch.Tensor):
            return ids.to(self.device, torch.long)
        return torch.as_tensor(np.asarray(ids, dtype=np.int64), device=self.device)

    def raw(self, ids: np.ndarray | Sequence[int] | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The stored rows of ``ids`` as they are (uint8 or float32), and their labels."""
        idx = self.index(ids)
        return self.x.index_select(0, idx), self.y.index_select(0, idx)

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        """Raw rows -> the model's float32 inputs: ``/255`` for uint8, then ``(x - mean) / std``."""
        return normalize_pixels(x, self.mean, self.std, self.channels_last)

    def batch(self, ids: np.ndarray | Sequence[int] | torch.Tensor, augment: Any = None,
              epoch: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """``(inputs, labels)`` of ``ids`` on the device; ``augment(x, ids, epoch)`` (an
        :class:`trainers.augment.Augment`) is applied to the raw rows before normalisation."""
        idx = self.index(ids)
        x, y = self.x.index_select(0, idx), self.y.index_select(0, idx)
        if augment is not None:
            x = augment(x, idx, epoch)
        return self.normalize(x), y


def normalize_pixels(x: torch.Tensor, mean: torch.Tensor | None, std: torch.Tensor | None,
                     channels_last: bool = False) -> torch.Tensor:
    """Raw rows -> float32 model inputs: ``/255`` for uint8, then ``(x - mean) / std`` where given,
    then ``channels_last`` for a 4-D batch when asked."""
    out = x.float()
    if x.dtype == torch.uint8:
        out = out / 255.0
    if mean is not None:
        out = out - mean
    if std is not None:
        out = out / std
    if channels_last and out.dim() == 4:
        out = out.contiguous(memory_format=torch.channels_last)
    return out


class InputPipeline:
    """What the worker loop does to a micro-batch's inputs once they are on the device, in order:
    augment the raw rows (:class:`trainers.augment.Augment`, training only), turn uint8 pixels into
    normalised float32 (:func:`normalize_pixels`), and lay 4-D batches out ``channels_last``.

    The same steps as :meth:`DeviceData.batch`, for batches indexed by the loop's own data path
    (on the host, or on the device with ``data.device: accelerator``: :func:`on_device`)."""

    def __init__(self, device: torch.device | str, *, mean: Sequence[float] | None = None,
                 std: Sequence[float] | None = None, channels: int = 1, channels_last: bool = False,
                 augment: Any = None):
        self.device = torch.device(device)
        self.mean = _stats(mean, channels, self.device)
        self.std = _stats(std, channels, self.device)
        self.channels_last, self.augment = channels_last, augment

    @classmethod
    def build(cls, *, device: torch.device | str, mean: Sequence[float] | None, std: Sequence[float] | None,
              channels: int, channels_last: bool, augment: Any) -> "InputPipeline | None":
        """None when there is nothing to do (float inputs, no augmentation, NCHW): the loop then
        feeds its batches to the model as they are, as before these options existed."""
        if mean is None and std is None and not channels_last and not augment:
            return None
        return cls(device, mean=mean, std=std, channels=channels, channels_last=channels_last,
                   augment=augment or None)

    def __call__(self, x: Any, ids: Any = None, epoch: int = 0) -> Any:
        """``ids`` (the rows of the training set) and ``epoch`` seed the augmentation; ``ids=None``
        (validation, the empty slice's dummy input) does not augment.  Non-tensor inputs pass through."""
        if not isinstance(x, torch.Tensor):
            return x
        if self.augment is not None and ids is not None:
            x = self.augment(x, ids, epoch)
        if x.dtype == torch.uint8 or self.mean is not None or self.std is not None:
            return normalize_pixels(x, self.mean, self.std, self.channels_last)
        if self.channels_last and x.dim() == 4:
            return x.contiguous(memory_format=torch.channels_last)
        return x


def input_pipeline(cfg: Any, work: Any, device: torch.device | str) -> InputPipeline | None:
    """The worker loop's :class:`InputPipeline` for a ``LoopConfig`` and its ``Workload``; with
    ``data.device: accelerator`` an in-memory set is moved to ``device`` here, once
    (``work.tensors`` is replaced).  None when there is nothing to do."""
    from trainers.augment import Augment

    t = work.tensors
    if t is not None and cfg.data.device == "accelerator":
        work.tensors = t = on_device(t, device)
    channels = int(t.train_x.shape[1]) if t is not None and t.train_x.dim() >= 2 else 1
    return InputPipeline.build(device=device, mean=t.mean if t is not None else None,
                               std=t.std if t is not None else None, channels=channels,
                               channels_last=cfg.model.channels_last,
                               augment=Augment.from_config(cfg.data, cfg.train.seed))


def on_device(data: Any, device: torch.device | str) -> Any:
    """A :class:`trainers.data.InMemoryData` with its four tensors moved to ``device`` once
    (``data.device: accelerator``): uint8 pixels stay uint8 (normalised per batch), the rest as it is."""
    import dataclasses

    dev = torch.device(device)
    return dataclasses.replace(data, train_x=data.train_x.to(dev), train_y=data.train_y.to(dev),
                               val_x=data.val_x.to(dev), val_y=data.val_y.to(dev))


class Prefetcher:
    """Iterate host batches ``(x, y)`` with each one's host->device copy started a batch ahead.

    On CUDA each batch is pinned and copied with ``non_blocking=True`` on a side stream; before a
    batch is handed out the current stream waits for its copy and the tensors are marked as used
    by the current stream (``record_stream``) so the caching allocator does not reuse them early.
    Elsewhere it is a plain ``.to(device)`` per batch.
    """

    def __init__(self, batches: Iterable[Sequence[torch.Tensor]], device: torch.device | str):
        self.batches = batches
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.stream = torch.cuda.Stream(self.device) if self.cuda else None

    def _copy(self, batch: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        if not self.cuda:
            return tuple(t.to(self.device) for t in batch)
        with torch.cuda.stream(self.stream):
            return tuple((t if t.is_pinned() else t.pin_memory()).to(self.device, non_blocking=True) for t in batch)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
        it = iter(self.batches)
        try:
            nxt = self._copy(next(it))
        except StopIteration:
            return
        while True:
            cur = nxt
            if self.cuda:
                torch.cuda.current_stream(self.device).wait_stream(self.stream)
                for t in cur:
                    t.record_stream(torch.cuda.current_stream(self.device))
            try:
                nxt = self._copy(next(it))  # the next copy runs while the caller steps on ``cur``
            except StopIteration:
                yield cur
                return
            yield cur

