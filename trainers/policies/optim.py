"""Optimizer registry, the large-batch optimizers (LARS, LAMB), the MF rule, momentum correction
(the ``optimizer`` section: ``trainers/policies/config.py``).

MF (Tang et al. 2022) is the weight past gradients carry in the current update:
``momentum`` for SGD, Nesterov and LARS, ``beta1`` for Adam-type optimizers and LAMB.
``set_mf``/``set_lr`` change it in place on every param group so that a policy
can move it at any step without rebuilding the optimizer (its state is kept).

MF rules (``optimizer.mf_rule``, registry ``MF_RULES``), ``b`` = B / W the per-worker batch::

    fixed             mu = optimizer.mf
    per_worker_batch  mu(b) = mf ** (b / b_ref)      the EMA scaling rule: a sample keeps the same
                                                     weight in the momentum whatever b is, so a
                                                     smaller b gives a larger mu (Tang et al. 2022;
                                                     docs/architecture.md); b_ref = optimizer.mf_ref_batch
                                                     or, unset, optimizer.base_batch_size

Weight-decay rules (``optimizer.wd_rule``), ``lambda0`` = ``optimizer.weight_decay`` tuned with
``eta0`` = ``optimizer.lr`` at ``B0`` = ``optimizer.base_batch_size``::

    none       lambda = lambda0
    timescale  lambda(B) = lambda0 * (B / B0) * (eta0 / eta(B)),  eta(B) = eta0 * s(B / B0)

``timescale`` keeps AdamW's EMA timescale in epochs, ``tau = B / (eta * lambda * D)`` (D the
training-set size), equal to the tuned one when B and with it the LR change (Wang & Aitchison
2024, "How to set AdamW's weight decay as you scale model and dataset size"; Bergsma et al. 2025,
"Power Lines": the best lambda grows linearly with B at a fixed LR).  ``eta(B)`` is the LR the
scaling rule gives B (the schedule's peak at B), not the warmed-up or decayed LR of the step:
warmup and decay are the schedule's shape, which the timescale is defined across.  So with the
linear rule lambda stays lambda0, with sqrt it grows as sqrt(B / B0), with none as B / B0.
PyTorch's AdamW multiplies its ``weight_decay`` by the LR, as this ``lambda`` assumes.

LARS (You, Gitman, Ginsburg 2017, "Large Batch Training of Convolutional Networks"), per
parameter tensor (layer) w with gradient g, in *velocity form*::

    trust = eta_tc * ||w|| / (||g|| + wd * ||w||)     (1 if ||w|| or the denominator is 0)
    v     = mu * v + lr * trust * (g + wd * w)
    w     = w - v

1-D tensors (biases, norm gains) skip the trust ratio and the weight decay (``exclude_1d``,
as in the common ImageNet/BERT recipes); ``trust_coefficient=None`` turns the trust ratio
off everywhere, leaving velocity-form momentum SGD.

LAMB (You et al. 2019/2020, "Large Batch Optimization for Deep Learning: Training BERT in 76
minutes"), per tensor, t the step count::

    m = b1 * m + (1 - b1) * g          v = b2 * v + (1 - b2) * g^2
    r = m / (1 - b1^t) / (sqrt(v / (1 - b2^t)) + eps) + wd * w
    w = w - lr * (||w|| / ||r||) * r   (ratio 1 if either norm is 0; phi = identity)

with ``exclude_1d`` (default on, as in the reference BERT implementation) dropping the weight
decay and the ratio for 1-D tensors.  torch 2.14's ``torch.optim`` has neither optimizer.

Momentum correction (Goyal et al. 2017, section 2.1): when the LR changes from ``eta_t`` to
``eta_{t+1}`` an optimizer that keeps the LR *inside* its momentum (``v = mu*v + eta*g;
w -= v``) must rescale ``v`` by ``eta_{t+1}/eta_t``, otherwise the old velocity keeps
moving the weights at the old LR's scale for ~1/(1-mu) steps.  Which optimizers need it:

- LARS (velocity form above): **yes**.
- torch SGD / Nesterov (``u = mu*u + g; w -= eta*u``): no, the LR multiplies the update
  when it is applied, so the buffer holds gradients only.
- Adam, AdamW, LAMB: no, their moments ``m``, ``v`` are averages of gradients; the LR is
  applied afterwards.

``needs_momentum_correction`` answers this per optimizer (class attribute
``lr_in_velocity``), and ``apply_momentum_correction`` does nothing for the others, so a
loop may call it on every LR change.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any, ClassVar

import torch

from trainers.policies.config import OptimizerConfig

# --------------------------------------------------------------------------- LARS and LAMB

Params = Iterable[torch.Tensor] | Iterable[dict[str, Any]]


def _adapt(p: torch.Tensor, exclude_1d: bool) -> bool:
    """Whether tensor ``p`` gets the layer-wise ratio and the weight decay."""
    return not (exclude_1d and p.ndim <= 1)


def _safe_ratio(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    """``num / den``, or 1 where either is 0 (kept on the device: no host sync)."""
    ok = (num > 0) & (den > 0)
    return torch.where(ok, num / torch.where(ok, den, torch.ones_like(den)), torch.ones_like(num))


class LARS(torch.optim.Optimizer):
    """Layer-wise Adaptive Rate Scaling in velocity form (see the module docstring)."""

    lr_in_velocity: ClassVar[bool] = True

    def __init__(
        self,
        params: Params,
        lr: float,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
        trust_coefficient: float | None = 0.001,
        exclude_1d: bool = True,
    ):
        if lr < 0:
            raise ValueError(f"LARS: lr must be >= 0 (got {lr})")
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"LARS: momentum must be in [0, 1) (got {momentum})")
        if weight_decay < 0:
            raise ValueError(f"LARS: weight_decay must be >= 0 (got {weight_decay})")
        if trust_coefficient is not None and trust_coefficient <= 0:
            raise ValueError(f"LARS: trust_coefficient must be > 0 or None (got {trust_coefficient})")
        super().__init__(
            params,
            dict(
                lr=lr,
                momentum=momentum,
                weight_decay=weight_decay,
                trust_coefficient=trust_coefficient,
                exclude_1d=exclude_1d,
            ),
        )

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, mu, wd, tc = group["lr"], group["momentum"], group["weight_decay"], group["trust_coefficient"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                if _adapt(p, group["exclude_1d"]):
                    d = g.add(p, alpha=wd) if wd else g
                    if tc is not None:
                        w_norm = torch.linalg.vector_norm(p)
                        trust = _safe_ratio(tc * w_norm, torch.linalg.vector_norm(g) + wd * w_norm)
                        d = d * (trust * lr)
                    else:
                        d = d * lr
                else:
                    d = g * lr
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                v = state["momentum_buffer"]
                v.mul_(mu).add_(d)
                p.sub_(v)
        return loss


class LAMB(torch.optim.Optimizer):
    """Layer-wise Adaptive Moments for Batch training (see the module docstring)."""

    lr_in_velocity: ClassVar[bool] = False

    def __init__(
        self,
        params: Params,
        lr: float,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.0,
        exclude_1d: bool = True,
    ):
        if lr < 0:
            raise ValueError(f"LAMB: lr must be >= 0 (got {lr})")
        if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise ValueError(f"LAMB: betas must be in [0, 1) (got {betas})")
        if eps <= 0:
            raise ValueError(f"LAMB: eps must be > 0 (got {eps})")
        if weight_decay < 0:
            raise ValueError(f"LAMB: weight_decay must be >= 0 (got {weight_decay})")
        super().__init__(
            params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, exclude_1d=exclude_1d)
        )

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, (b1, b2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                t = state["step"]
                m, v = state["exp_avg"], state["exp_avg_sq"]
                m.mul_(b1).add_(g, alpha=1.0 - b1)
                v.mul_(b2).addcmul_(g, g, value=1.0 - b2)
                r = (m / (1.0 - b1**t)) / ((v / (1.0 - b2**t)).sqrt_().add_(eps))
                if _adapt(p, group["exclude_1d"]):
                    if wd:
                        r.add_(p, alpha=wd)
                    ratio = _safe_ratio(torch.linalg.vector_norm(p), torch.linalg.vector_norm(r))
                    p.sub_(r * (ratio * lr))
                else:
                    p.sub_(r, alpha=lr)
        return loss


# --------------------------------------------------------------------------- registry


def _sgd(params: Params, cfg: OptimizerConfig) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.mf, weight_decay=cfg.weight_decay)


def _nesterov(params: Params, cfg: OptimizerConfig) -> torch.optim.Optimizer:
    # PyTorch refuses nesterov with zero momentum; MF=0 is plain SGD either way.
    return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.mf, nesterov=cfg.mf > 0, weight_decay=cfg.weight_decay)


def _adam(params: Params, cfg: OptimizerConfig) -> torch.optim.Optimizer:
    return torch.optim.Adam(params, lr=cfg.lr, betas=(cfg.mf, cfg.beta2), eps=cfg.eps, weight_decay=cfg.weight_decay)


def _adamw(params: Params, cfg: OptimizerConfig) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=cfg.lr, betas=(cfg.mf, cfg.beta2), eps=cfg.eps, weight_decay=cfg.weight_decay)


def _lars(params: Params, cfg: OptimizerConfig) -> torch.optim.Optimizer:
    return LARS(
        params, lr=cfg.lr, momentum=cfg.mf, weight_decay=cfg.weight_decay, trust_coefficient=cfg.trust_coefficient
    )


def _lamb(params: Params, cfg: OptimizerConfig) -> torch.optim.Optimizer:
    return LAMB(params, lr=cfg.lr, betas=(cfg.mf, cfg.beta2), eps=cfg.eps, weight_decay=cfg.weight_decay)


OPTIMIZERS: dict[str, Callable[..., torch.optim.Optimizer]] = {
    "sgd": _sgd,
    "nesterov": _nesterov,
    "adam": _adam,
    "adamw": _adamw,
    "lars": _lars,
    "lamb": _lamb,
}


def build_optimizer(model: torch.nn.Module, cfg: OptimizerConfig) -> torch.optim.Optimizer:
    return OPTIMIZERS[cfg.name](model.parameters(), cfg)


def set_lr(opt: torch.optim.Optimizer, lr: float) -> None:
    for g in opt.param_groups:
        g["lr"] = lr


def set_weight_decay(opt: torch.optim.Optimizer, weight_decay: float) -> None:
    for g in opt.param_groups:
        if "weight_decay" in g:
            g["weight_decay"] = weight_decay


def set_mf(opt: torch.optim.Optimizer, mf: float) -> None:
    for g in opt.param_groups:
        if "betas" in g:
            g["betas"] = (mf, g["betas"][1])
        elif "momentum" in g:
            g["momentum"] = mf


# --------------------------------------------------------------------------- MF rule


def _mf_fixed(cfg: OptimizerConfig, per_worker_batch: float) -> float:
    return cfg.mf


def _mf_per_worker_batch(cfg: OptimizerConfig, per_worker_batch: float) -> float:
    b_ref = cfg.mf_ref_batch or cfg.base_batch_size
    return cfg.mf ** (per_worker_batch / b_ref)


MF_RULES: dict[str, Callable[[OptimizerConfig, float], float]] = {
    "fixed": _mf_fixed,
    "per_worker_batch": _mf_per_worker_batch,
}


def mf_for(cfg: OptimizerConfig, per_worker_batch: float) -> float:
    """The MF for per-worker batch ``b = B / W`` under ``cfg.mf_rule`` (see the module docstring)."""
    if not per_worker_batch > 0 or not math.isfinite(per_worker_batch):
        raise ValueError(f"per_worker_batch: must be a finite number > 0 (got {per_worker_batch})")
    return MF_RULES[cfg.mf_rule](cfg, per_worker_batch)


# --------------------------------------------------------------------------- weight-decay rule


def adamw_timescale(batch_size: float, lr: float, weight_decay: float, dataset_size: float) -> float:
    """AdamW's EMA timescale in epochs, ``tau = B / (eta * lambda * D)`` (Wang & Aitchison 2024):
    ``1 / (eta * lambda)`` optimizer steps, of which an epoch has ``D / B``."""
    if min(batch_size, lr, weight_decay, dataset_size) <= 0:
        raise ValueError(
            f"adamw_timescale: needs B, lr, weight_decay and D > 0 (got {batch_size}, {lr}, "
            f"{weight_decay}, {dataset_size})"
        )
    return batch_size / (lr * weight_decay * dataset_size)


def timescale_weight_decay(weight_decay: float, base_batch: float, batch_size: float, lr_scale: float) -> float:
    """The weight decay that keeps ``tau = B / (eta * lambda * D)`` at its tuned value:
    ``lambda0 * (B / B0) / (eta(B) / eta0)``, with ``lr_scale = eta(B) / eta0`` the scaling rule's
    factor at ``B`` (see the module docstring)."""
    if base_batch <= 0 or batch_size <= 0 or not lr_scale > 0:
        raise ValueError(
            f"timescale_weight_decay: needs B0, B and lr_scale > 0 (got {base_batch}, {batch_size}, {lr_scale})"
        )
    return weight_decay * (batch_size / base_batch) / lr_scale


def weight_decay_for(cfg: OptimizerConfig, batch_size: float, lr_scale: float) -> float:
    """The weight decay at global batch B under ``cfg.wd_rule``; ``lr_scale`` = eta(B) / eta0."""
    if cfg.wd_rule == "timescale":
        return timescale_weight_decay(cfg.weight_decay, cfg.base_batch_size, batch_size, lr_scale)
    return cfg.weight_decay


# --------------------------------------------------------------------------- momentum correction


def needs_momentum_correction(opt: torch.optim.Optimizer) -> bool:
    """True when ``opt`` keeps the LR inside its velocity (LARS); False for SGD, Adam(W), LAMB."""
    return bool(getattr(opt, "lr_in_velocity", False))


@torch.no_grad()
def apply_momentum_correction(opt: torch.optim.Optimizer, old_lr: float, new_lr: float) -> bool:
    """Scale the velocity by ``new_lr / old_lr`` (Goyal et al.) before stepping at ``new_lr``.

    Does nothing (returns False) for optimizers that do not need it, when the LR did not
    change, or when ``old_lr`` is 0 (no velocity at a scale to carry over).
    """
    if not needs_momentum_correction(opt) or old_lr <= 0 or new_lr == old_lr:
        return False
    ratio = new_lr / old_lr
    for group in opt.param_groups:
        for p in group["params"]:
            buf = opt.state.get(p, {}).get("momentum_buffer")
            if buf is not None:
                buf.mul_(ratio)
    return True
