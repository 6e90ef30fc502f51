"""The input pipeline on the device: in-memory data held on the accelerator and normalised (and
augmented) per batch, and a host->device prefetcher for map-style data.

The in-memory set is moved to the accelerator once and indexed there; augmentation works on the raw
pixels, before normalising."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import torch

from trainers.data.augment import Augment

__all__ = ["DeviceData", "InputPipeline", "Prefetcher", "input_pipeline", "normalize_pixels", "on_device"]


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

    def __init__(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        device: torch.device | str,
        mean: Sequence[float] | torch.Tensor | None = None,
        std: Sequence[float] | torch.Tensor | None = None,
        channels_last: bool = False,
    ):
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

    def batch(
        self, ids: np.ndarray | Sequence[int] | torch.Tensor, augment: Any = None, epoch: int = 0
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(inputs, labels)`` of ``ids`` on the device; ``augment(x, ids, epoch)`` (an
        :class:`trainers.data.augment.Augment`) is applied to the raw rows before normalisation."""
        idx = self.index(ids)
        x, y = self.x.index_select(0, idx), self.y.index_select(0, idx)
        if augment is not None:
            x = augment(x, idx, epoch)
        return self.normalize(x), y


def normalize_pixels(
    x: torch.Tensor, mean: torch.Tensor | None, std: torch.Tensor | None, channels_last: bool = False
) -> torch.Tensor:
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
    augment the raw rows (:class:`trainers.data.augment.Augment`, training only), turn uint8 pixels into
    normalised float32 (:func:`normalize_pixels`), and lay 4-D batches out ``channels_last``.

    The same steps as :meth:`DeviceData.batch`, for batches indexed by the loop's own data path
    (on the host, or on the device with ``data.device: accelerator``: :func:`on_device`)."""

    def __init__(
        self,
        device: torch.device | str,
        *,
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
        channels: int = 1,
        channels_last: bool = False,
        augment: Any = None,
    ):
        self.device = torch.device(device)
        self.mean = _stats(mean, channels, self.device)
        self.std = _stats(std, channels, self.device)
        self.channels_last, self.augment = channels_last, augment

    @classmethod
    def build(
        cls,
        *,
        device: torch.device | str,
        mean: Sequence[float] | None,
        std: Sequence[float] | None,
        channels: int,
        channels_last: bool,
        augment: Any,
    ) -> InputPipeline | None:
        """None when there is nothing to do (float inputs, no augmentation, NCHW): the loop then
        feeds its batches to the model as they are."""
        if mean is None and std is None and not channels_last and not augment:
            return None
        return cls(device, mean=mean, std=std, channels=channels, channels_last=channels_last, augment=augment or None)

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

    t = work.tensors
    if t is not None and cfg.data.device == "accelerator":
        work.tensors = t = on_device(t, device)
    channels = int(t.train_x.shape[1]) if t is not None and t.train_x.dim() >= 2 else 1
    return InputPipeline.build(
        device=device,
        mean=t.mean if t is not None else None,
        std=t.std if t is not None else None,
        channels=channels,
        channels_last=cfg.model.channels_last,
        augment=Augment.from_config(cfg.data, cfg.train.seed),
    )


def on_device(data: Any, device: torch.device | str) -> Any:
    """A :class:`trainers.data.datasets.InMemoryData` with its four tensors moved to ``device`` once
    (``data.device: accelerator``): uint8 pixels stay uint8 (normalised per batch), the rest as it is."""

    dev = torch.device(device)
    return dataclasses.replace(
        data,
        train_x=data.train_x.to(dev),
        train_y=data.train_y.to(dev),
        val_x=data.val_x.to(dev),
        val_y=data.val_y.to(dev),
    )


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
