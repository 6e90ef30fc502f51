"""Mixed precision: ``train.precision: fp32 | bf16 | fp16`` as one small component.

Only the *compute* of forward and loss runs in low precision (``torch.autocast``); the
parameters, their gradients, the optimizer state, the loss sum and the noise-scale
statistics stay fp32/fp64, so the global-batch math (loss normalised by the global ``B``)
and ``B_simple`` do not change with the precision (Micikevicius et al. 2018, "Mixed
Precision Training": fp32 master weights, fp16 compute, loss scaling).

- ``fp32``: nothing changes; :meth:`Precision.autocast` is a null context.
- ``bf16``: autocast to bfloat16 on the device type (CUDA, and CPU too, which is how it is
  tested here).  bf16 has fp32's exponent range, so no loss scaling is needed.
- ``fp16``: autocast to float16 **on CUDA only** and a :class:`LossScaler` (PyTorch's
  ``torch.amp.GradScaler``): the loss is multiplied by a scale ``S`` before backward so small
  gradients do not underflow; before the optimizer steps the gradients are divided by ``S``;
  a step whose gradients hold an inf/NaN is skipped and ``S`` is halved (and doubled after
  ``growth_interval`` clean steps).  A skipped step trained nothing: the loop does not count
  its samples and logs ``amp/skipped_steps`` (:attr:`Precision.skipped_steps`).

How the loop uses it, per optimizer step (the order matters)::

    prec.begin_step()
    for each micro-batch:
        with prec.autocast():
            out = model(x)
            per_sample = F.cross_entropy(out, y, reduction="none")
        loss = per_sample.float().sum()           # the sum is fp32 whatever the precision
        prec.backward(loss * world / B)            # scaled by S under fp16
        noise.after_micro_batch(...)               # reads S * g: multiply its scale by prec.grad_factor()
    prec.unscale(opt)                              # from here on .grad holds the true gradient
    noise.finish(...); clipping; anything that reads gradient norms
    skipped = prec.step(opt)                       # opt.step() unless inf/NaN; updates S
    opt.zero_grad(set_to_none=True)
    if skipped: do not update the noise estimator, do not count the samples

Anything that reads gradients *before* :meth:`Precision.unscale` (a DDP communication hook,
the per-micro-batch norms) sees ``S * g`` and must multiply by :meth:`Precision.grad_factor`
(``1/S``; squared norms by its square).  :meth:`Precision.unscale` is idempotent within a
step, so a helper may call it again safely.
"""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager
from typing import Any

import torch

from trainers.accel.config import PrecisionConfig, check_precision
from trainers.link import metrics as M

__all__ = ["PRECISIONS", "LossScaler", "Precision"]

#: name (``trainers.accel.config.PRECISION_NAMES``) -> the autocast dtype (None: no autocast)
PRECISIONS: dict[str, torch.dtype | None] = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


class LossScaler:
    """Dynamic loss scaling around ``torch.amp.GradScaler``, with the skip made visible.

    ``GradScaler.step`` silently skips the optimizer step when the unscaled gradients hold an
    inf/NaN, and ``update`` then multiplies the scale by ``backoff_factor`` (< 1).  A clean step
    never lowers the scale, so "the scale went down" is exactly "this step was skipped".
    Works on any device type (the CPU refusal of fp16 is :func:`check_precision`'s job), which is
    what lets its tests run here.
    """

    def __init__(self, device_type: str, init_scale: float = 2.0**16, growth_interval: int = 2000):
        self.scaler = torch.amp.GradScaler(device_type, init_scale=init_scale, growth_interval=growth_interval)
        self._unscaled = False

    def begin_step(self) -> None:
        self._unscaled = False

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return self.scaler.scale(loss)

    def unscale(self, optimizer: torch.optim.Optimizer) -> None:
        """Divide the gradients by the scale in place (once per step)."""
        if not self._unscaled:
            self.scaler.unscale_(optimizer)
            self._unscaled = True

    def get_scale(self) -> float:
        """The current scale ``S`` (a host sync)."""
        return float(self.scaler.get_scale())

    def step(self, optimizer: torch.optim.Optimizer) -> bool:
        """Unscale if not done, step unless inf/NaN, update the scale; True if the step was skipped."""
        self.unscale(optimizer)
        before = self.get_scale()
        self.scaler.step(optimizer)
        self.scaler.update()
        self._unscaled = False
        return self.get_scale() < before

    def state_dict(self) -> dict[str, Any]:
        return self.scaler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state:
            self.scaler.load_state_dict(state)


class Precision:
    """``train.precision`` on one worker: the autocast context, backward, step, and their state.

    ``state_dict()`` is ``{"skipped_steps": int, "scaler": {...}}`` (the scaler part empty
    unless fp16): builtins only, so ``torch.load(weights_only=True)`` reads it.  Loading a
    checkpoint written under another precision keeps the skip count and ignores a scaler
    state this precision has no use for.
    """

    def __init__(
        self, name: str, device: torch.device | str, *, init_scale: float = 2.0**16, growth_interval: int = 2000
    ):
        self.device = torch.device(device)
        check_precision(name, self.device.type)
        self.name = name
        self.dtype = PRECISIONS[name]
        self.scaler = LossScaler(self.device.type, init_scale, growth_interval) if name == "fp16" else None
        self.skipped_steps = 0

    @classmethod
    def from_config(cls, cfg: PrecisionConfig, device: torch.device | str) -> Precision:
        return cls(
            cfg.precision, device, init_scale=cfg.loss_scale_init, growth_interval=cfg.loss_scale_growth_interval
        )

    @property
    def enabled(self) -> bool:
        return self.dtype is not None

    def autocast(self) -> AbstractContextManager[Any]:
        """Autocast for forward and loss (training and evaluation); a null context for fp32."""
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.dtype)

    def begin_step(self) -> None:
        """Before the first backward of an optimizer step."""
        if self.scaler is not None:
            self.scaler.begin_step()

    def backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()``, with the loss multiplied by the scale ``S`` under fp16."""
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def grad_factor(self) -> float:
        """What turns a gradient read before :meth:`unscale` into the true one: ``1/S`` (1 unless fp16)."""
        return 1.0 if self.scaler is None else 1.0 / self.scaler.get_scale()

    def unscale(self, optimizer: torch.optim.Optimizer) -> None:
        """Make ``.grad`` hold the true gradients (fp16: divide by ``S``; otherwise nothing).  Call it
        after the last backward and before anything reads gradient norms (noise probe, clipping)."""
        if self.scaler is not None:
            self.scaler.unscale(optimizer)

    def step(self, optimizer: torch.optim.Optimizer) -> bool:
        """Step the optimizer; True if the step was skipped (fp16 with inf/NaN gradients)."""
        if self.scaler is None:
            optimizer.step()
            return False
        skipped = self.scaler.step(optimizer)
        self.skipped_steps += int(skipped)
        return skipped

    def metrics(self) -> dict[str, float]:
        """``amp/skipped_steps`` (and ``amp/loss_scale``) under fp16; nothing otherwise."""
        if self.scaler is None:
            return {}
        return {M.AMP_SKIPPED_STEPS: float(self.skipped_steps), M.AMP_LOSS_SCALE: self.scaler.get_scale()}

    def state_dict(self) -> dict[str, Any]:
        return {"skipped_steps": self.skipped_steps, "scaler": self.scaler.state_dict() if self.scaler else {}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.skipped_steps = int(state.get("skipped_steps", 0))
        if self.scaler is not None:
            self.scaler.load_state_dict(state.get("scaler") or {})
