"""Model registry: name -> constructor(info, cfg) -> nn.Module (the ``model`` section:
``trainers/workload/config.py``).

``norm`` picks the normalization layer where a model has one: ``batch`` (per-worker
BatchNorm, statistics over each micro-batch; Goyal et al.), ``group`` or ``none``.
With ``group``/``none`` the math does not depend on how the batch is cut, which
is what exactness tests across world sizes need.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from trainers import catalog
from trainers.data.config import DatasetInfo
from trainers.workload.config import ModelConfig, Norm


def norm_layer(kind: Norm, channels: int) -> nn.Module:
    if kind == "batch":
        return nn.BatchNorm2d(channels)
    if kind == "group":
        return nn.GroupNorm(min(32, channels), channels)
    return nn.Identity()


def _mlp(info: DatasetInfo, cfg: ModelConfig) -> nn.Module:
    d_in = math.prod(info.shape)
    layers: list[nn.Module] = [nn.Flatten(), nn.Linear(d_in, cfg.hidden)]
    if cfg.norm == "batch":
        layers.append(nn.BatchNorm1d(cfg.hidden))
    elif cfg.norm == "group":
        layers.append(nn.GroupNorm(min(32, cfg.hidden), cfg.hidden))
    layers += [nn.ReLU(), nn.Linear(cfg.hidden, cfg.hidden), nn.ReLU(), nn.Linear(cfg.hidden, info.num_classes)]
    return nn.Sequential(*layers)


class SmallCNN(nn.Module):
    """Two 3x3 conv blocks, global average pooling, a linear head: fast on CPU."""

    def __init__(self, info: DatasetInfo, cfg: ModelConfig):
        super().__init__()
        c_in = info.shape[0]
        c = max(8, cfg.hidden // 4)
        self.features = nn.Sequential(
            nn.Conv2d(c_in, c, 3, padding=1, bias=cfg.norm == "none"),
            norm_layer(cfg.norm, c),
            nn.ReLU(),
            nn.Conv2d(c, 2 * c, 3, padding=1, bias=cfg.norm == "none"),
            norm_layer(cfg.norm, 2 * c),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(2),
            nn.Flatten(),
        )
        self.head = nn.Linear(8 * c, info.num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def _resnet(depth: int) -> Callable[[DatasetInfo, ModelConfig], nn.Module]:
    def build(info: DatasetInfo, cfg: ModelConfig) -> nn.Module:
        from torchvision.models import resnet18, resnet50

        norm = {
            "batch": nn.BatchNorm2d,
            "group": lambda c: nn.GroupNorm(min(32, c), c),
            "none": lambda c: nn.Identity(),
        }[cfg.norm]
        ctor = resnet18 if depth == 18 else resnet50
        m = ctor(
            weights=None,
            num_classes=info.num_classes,
            norm_layer=norm,
            zero_init_residual=cfg.zero_init_residual and cfg.norm == "batch",
        )
        # 32x32 inputs: a 3x3 stem with stride 1 and no max-pool keeps the spatial size.
        m.conv1 = nn.Conv2d(info.shape[0], 64, 3, stride=1, padding=1, bias=False)
        m.maxpool = nn.Identity()
        return m

    return build


MODELS: dict[str, Callable[[DatasetInfo, ModelConfig], nn.Module]] = {
    catalog.MLP.name: _mlp,
    catalog.CNN.name: SmallCNN,
    catalog.RESNET18.name: _resnet(18),
    catalog.RESNET50.name: _resnet(50),
}
"""The builders of the built-in models that are not language models (those: ``lm_models.LM_MODELS``)."""


def build_model(info: DatasetInfo, cfg: ModelConfig) -> nn.Module:
    model = MODELS[cfg.name](info, cfg)
    if cfg.sync_bn and cfg.norm == "batch":
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    return model
