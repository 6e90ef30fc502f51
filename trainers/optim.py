"""Optimizer registry and the momentum-like factor (MF).

MF (Tang et al. 2022) is the weight past gradients carry in the current update:
``momentum`` for SGD and Nesterov, ``beta1`` for Adam-type optimizers.
``set_mf``/``set_lr`` change it in place on every param group so that a policy
can move it at any step without rebuilding the optimizer (its state is kept).
"""

from __future__ import annotations

from typing import Callable, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

OptimizerName = Literal["sgd", "nesterov", "adam", "adamw"]


class OptimizerConfig(BaseModel):
    """The ``optimizer`` section."""

    model_config = ConfigDict(extra="forbid")

    name: OptimizerName = "sgd"
    lr: float = Field(default=0.1, gt=0.0, description="learning rate tuned at base_batch_size")
    base_batch_size: int = Field(default=64, gt=0, description="the batch at which lr was tuned (B0)")
    mf: float = Field(default=0.9, ge=0.0, lt=1.0, description="momentum (sgd/nesterov) or beta1 (adam/adamw)")
    weight_decay: float = Field(default=0.0, ge=0.0)
    beta2: float = Field(default=0.999, gt=0.0, lt=1.0)
    eps: float = Field(default=1e-8, gt=0.0)


def _sgd(params, cfg: OptimizerConfig) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.mf, weight_decay=cfg.weight_decay)


def _nesterov(params, cfg: OptimizerConfig) -> torch.optim.Optimizer:
    # PyTorch refuses nesterov with zero momentum; MF=0 is plain SGD either way.
    return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.mf, nesterov=cfg.mf > 0,
                           weight_decay=cfg.weight_decay)


def _adam(params, cfg: OptimizerConfig) -> torch.optim.Optimizer:
    return torch.optim.Adam(params, lr=cfg.lr, betas=(cfg.mf, cfg.beta2), eps=cfg.eps,
                            weight_decay=cfg.weight_decay)


def _adamw(params, cfg: OptimizerConfig) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=cfg.lr, betas=(cfg.mf, cfg.beta2), eps=cfg.eps,
                             weight_decay=cfg.weight_decay)


OPTIMIZERS: dict[str, Callable[..., torch.optim.Optimizer]] = {
    "sgd": _sgd,
    "nesterov": _nesterov,
    "adam": _adam,
    "adamw": _adamw,
}


def build_optimizer(model: torch.nn.Module, cfg: OptimizerConfig) -> torch.optim.Optimizer:
    return OPTIMIZERS[cfg.name](model.parameters(), cfg)


def set_lr(opt: torch.optim.Optimizer, lr: float) -> None:
    for g in opt.param_groups:
        g["lr"] = lr


def set_mf(opt: torch.optim.Optimizer, mf: float) -> None:
    for g in opt.param_groups:
        if "betas" in g:
            g["betas"] = (mf, g["betas"][1])
        elif "momentum" in g:
            g["momentum"] = mf
