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

The config fields (``LayoutConfig``, ``DataDeviceConfig``, ``CompileConfig``) are in
``trainers/accel/config.py``, which the driver imports without torch.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DataParallel, DistributedDataParallel

__all__ = [
    "clean_state_dict",
    "compile_model",
    "load_clean_state_dict",
    "strip_prefixes",
    "to_channels_last",
    "unwrap_model",
]

_PREFIXES = ("_orig_mod.", "module.")


# --------------------------------------------------------------------------- model


def to_channels_last(model: nn.Module) -> nn.Module:
    """Convert ``model``'s 4-D parameters and buffers to ``torch.channels_last`` in place; returns it.

    Refuses (``ValueError`` naming ``model.channels_last``) a model with no 2-D convolution:
    its weights are not 4-D, so the format would change nothing but the inputs' strides."""
    if not any(isinstance(m, nn.Conv2d) for m in model.modules()):
        raise ValueError(
            f"model.channels_last: {type(model).__name__} has no Conv2d layer (not a 4-D image "
            "model); set model.channels_last: false"
        )
    return model.to(memory_format=torch.channels_last)


def compile_model(model: nn.Module, dynamic: bool = True, **kwargs: Any) -> nn.Module:
    """``torch.compile(model, dynamic=dynamic, **kwargs)``; keys of its state dict gain ``_orig_mod.``,
    so checkpoint through :func:`clean_state_dict`."""
    return torch.compile(model, dynamic=dynamic, **kwargs)  # type: ignore[return-value]


def unwrap_model(model: nn.Module) -> nn.Module:
    """The plain model inside any nesting of ``torch.compile`` and DDP/DataParallel wrappers."""
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
                out = {k[len(prefix) :]: v for k, v in out.items()}
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
