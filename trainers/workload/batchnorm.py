"""Batch-statistics layers and micro-batches of one sample: which layers of a model cannot train on
a single sample, and the fallback that lets an epoch's short tail pass through them.

PyTorch's BatchNorm refuses to train on an input holding one value per channel (a single sample
of a ``BatchNorm1d``, or a single 1x1 feature map of a ``BatchNorm2d``): the batch variance does
not exist.  A run meets such an input only at the edges of the data order: an epoch's short last
global batch split over W workers, or a worker's stand-in sample when its slice is empty.  The
driver refuses configs in which every step would meet one (``orchestrator/config/workload_checks.py``
``check_single_samples``); for the rare tail, :func:`guard_single_samples` makes such a layer use
its running statistics for that one forward (what it does at evaluation), instead of ending a run
that is hours in.  The sample still trains every other layer, and the layer's running statistics
skip it (one sample per epoch at most).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["guard_single_samples", "one_value_per_channel", "single_sample_layers"]

_GUARDED = "_elastic_single_sample_guard"


def one_value_per_channel(x: Any) -> bool:
    """Whether a batch-statistics layer in training mode would refuse ``x`` (PyTorch's
    ``_verify_batch_size``: batch size times the spatial sizes is 1)."""
    return isinstance(x, torch.Tensor) and x.dim() >= 2 and x.shape[0] * math.prod(x.shape[2:]) == 1


def _acts_alone(module: nn.Module) -> bool:
    """A SyncBatchNorm in a group of several processes reduces its statistics over all ranks (one
    sample on one rank is fine there), and switching it on one rank alone would desynchronise the
    collective: only plain BatchNorm, or a SyncBatchNorm with nobody to sync with, is guarded."""
    if not isinstance(module, nn.SyncBatchNorm):
        return True
    if not (dist.is_available() and dist.is_initialized()):
        return True
    return dist.get_world_size(module.process_group) == 1


def _pre(module: nn.Module, args: tuple[Any, ...]) -> None:
    if module.training and args and one_value_per_channel(args[0]) and _acts_alone(module):
        module.train(False)
        setattr(module, _GUARDED + "_on", True)


def _post(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
    if getattr(module, _GUARDED + "_on", False):
        setattr(module, _GUARDED + "_on", False)
        module.train(True)


def _holds_one_sample(args: tuple[Any, ...]) -> bool:
    """Whether a model's input may hold a single sample: a tensor whose first (batch) dimension is
    1, or an input that is not one tensor (a tuple, a dict: checked layer by layer)."""
    x = args[0] if len(args) == 1 else None
    return not isinstance(x, torch.Tensor) or x.dim() == 0 or x.shape[0] == 1


class _Guard:
    """The hooks of :func:`guard_single_samples`.  A layer can see one value per channel only in a
    forward of one sample (the built-in models, and the models a factory returns, keep the batch as
    their input's first dimension), so the model itself carries one cheap check and the per-layer
    hooks exist only during such a forward: the training step of every other batch runs without
    them (a hook on a layer takes PyTorch's slower call path, ~25 us a step on a small CNN)."""

    def __init__(self, model: nn.Module, layers: list[nn.Module]) -> None:
        self.model, self.layers = model, layers
        self.handles: list[Any] = []

    def arm(self, model: nn.Module, args: tuple[Any, ...]) -> None:
        if not (model.training and _holds_one_sample(args)):
            return
        for m in self.layers:
            if m is model:  # the model is the layer itself: its hooks would start with the next call
                _pre(m, args)
            else:
                self.handles += [m.register_forward_pre_hook(_pre), m.register_forward_hook(_post)]

    def disarm(self, model: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        for h in self.handles:
            h.remove()
        self.handles.clear()
        _post(model, args, output)


def guard_single_samples(model: nn.Module) -> nn.Module:
    """Let every batch-statistics layer of ``model`` that tracks running statistics take an input of
    one value per channel in training mode, with its running statistics for that forward (see the
    module docstring).  Idempotent; returns ``model``."""
    if getattr(model, _GUARDED, False):
        return model
    layers = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats]
    if layers:
        guard = _Guard(model, layers)
        model.register_forward_pre_hook(guard.arm)
        model.register_forward_hook(guard.disarm)
    setattr(model, _GUARDED, True)
    return model


def single_sample_layers(model: nn.Module, one_input: Any) -> list[str]:
    """Names of the batch-statistics layers of ``model`` that would see one value per channel when it
    trains on the single sample ``one_input`` (a batch of one).  The forward runs without gradients,
    on whatever device ``one_input`` is on (PyTorch's ``meta`` device checks shapes only); the
    model's training flags and running statistics are left as they were."""
    found: list[str] = []
    names = {m: n for n, m in model.named_modules()}
    flags = {m: m.training for m in model.modules()}

    def look(module: nn.Module, args: tuple[Any, ...]) -> None:
        if args and one_value_per_channel(args[0]) and _acts_alone(module):
            found.append(names.get(module, type(module).__name__) or type(module).__name__)
            module.train(False)  # let the forward go on to the next layer

    layers = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if not layers:
        return []
    saved = {
        m: (
            m.running_mean.clone() if m.running_mean is not None else None,
            m.running_var.clone() if m.running_var is not None else None,
            m.num_batches_tracked.clone() if m.num_batches_tracked is not None else None,
        )
        for m in layers
    }
    handles = [m.register_forward_pre_hook(look, prepend=True) for m in layers]
    try:
        model.train()
        with torch.no_grad():
            model(one_input)
    except Exception:  # a layer without running statistics cannot go on; other failures are not ours
        if not found:
            return []
    finally:
        for h in handles:
            h.remove()
        for m, flag in flags.items():
            m.training = flag
        for m, (mean, var, count) in saved.items():
            if mean is not None:
                m.running_mean.copy_(mean)
            if var is not None:
                m.running_var.copy_(var)
            if count is not None:
                m.num_batches_tracked.copy_(count)
    return found
