"""The ``model`` section (``ModelConfig``): a built-in model or a factory, its loss and its knobs.

No torch here: the driver validates a config without importing it.  The builders of the built-in
models are in ``trainers/workload/models.py`` and ``trainers/workload/lm_models.py``, a factory's
loading in ``trainers/workload/factory.py``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from trainers import catalog
from trainers.accel.config import LayoutConfig

__all__ = ["ModelConfig", "Norm"]

Norm = Literal["batch", "group", "none"]


class ModelConfig(LayoutConfig):
    """The ``model`` section (``channels_last``: trainers/accel/device.py)."""

    name: Literal[catalog.MODEL_NAMES] | None = Field(
        default=None, description="a built-in model (default cnn when no factory is given)"
    )
    factory: str | None = Field(
        default=None, description="'package.module:function' returning a torch.nn.Module; exclusive with name"
    )
    params: dict[str, Any] = Field(
        default_factory=dict, description="keyword arguments of the factory (and of gpt/lstm)"
    )
    loss: str | None = Field(
        default=None,
        description="cross_entropy | token_cross_entropy | "
        "'package.module:function' (one loss per sample); default: token_cross_entropy "
        "for gpt/lstm, else cross_entropy",
    )
    norm: Norm = Field(default="batch", description="batch (per-worker BatchNorm), group (GroupNorm) or none")
    hidden: int = Field(default=128, gt=0, description="mlp hidden width / cnn channels")
    sync_bn: bool = Field(default=False, description="BatchNorm statistics over all workers (SyncBatchNorm, GPU only)")
    zero_init_residual: bool = Field(
        default=False, description="resnet: each residual block's last BatchNorm starts at zero (Goyal et al.)"
    )

    @model_validator(mode="after")
    def _default_name(self) -> ModelConfig:
        # name and factory both given: orchestrator/config/rules.py
        if self.name is None and self.factory is None:
            self.name = catalog.DEFAULT_MODEL
        return self

    @property
    def builtin(self) -> catalog.BuiltinModel | None:
        """The built-in model ``name`` names (None: a factory's model)."""
        return None if self.name is None else catalog.BUILTIN_MODELS[self.name]

    @property
    def language_model(self) -> bool:
        return self.builtin is not None and self.builtin.language_model

    def loss_name(self) -> str:
        """The loss this section names (its default depends on the model)."""
        return self.loss or ("token_cross_entropy" if self.language_model else "cross_entropy")
