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
    "CompileConfig", "DataDeviceConfig", "DeviceData", "LayoutConfig", "Prefetcher", "check_channels_last",
    "check_data_device", "check_fast_path",
    "clean_state_dict", "compile_model", "load_clean_state_dict", "strip_prefixes", "to_channels_last",
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


def check_fast_path(*, precision: str, data_device: str, channels_last: bool, input_shape: Sequence[int],
                    use_gpu: bool) -> None:
    """Every check of issue #20's options in one call for the driver (before Ray starts): the first
    problem as a ``ValueError`` whose one-line message starts with the field."""
    from trainers.precision import check_precision

    check_precision(precision, "cuda" if use_gpu else "cpu")
    check_data_device(data_device, use_gpu)
    check_channels_last(channels_last, input_shape)


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
        out = x.float()
        if self.raw_uint8:
            out = out / 255.0
        if self.mean is not None:
            out = out - self.mean
        if self.std is not None:
            out = out / self.std
        if self.channels_last:
            out = out.contiguous(memory_format=torch.channels_last)
        return out

    def batch(self, ids: np.ndarray | Sequence[int] | torch.Tensor, augment: Any = None,
              epoch: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """``(inputs, labels)`` of ``ids`` on the device; ``augment(x, ids, epoch)`` (an
        :class:`trainers.augment.Augment`) is applied to the raw rows before normalisation."""
        idx = self.index(ids)
        x, y = self.x.index_select(0, idx), self.y.index_select(0, idx)
        if augment is not None:
            x = augment(x, idx, epoch)
        return self.normalize(x), y


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

