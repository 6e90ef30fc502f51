"""The accelerator's config fields (``model.channels_last``, ``data.device``, ``train.compile``,
``train.precision``) as base classes of their sections, and a precision's check against a device.

No torch here: the driver validates a config without importing it.  What these fields do:
``trainers/accel/device.py`` (layout, placement, compile) and ``trainers/accel/precision.py``.
"""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import Field

from trainers.section import Section

__all__ = [
    "PRECISION_NAMES",
    "CompileConfig",
    "DataDevice",
    "DataDeviceConfig",
    "LayoutConfig",
    "PrecisionConfig",
    "PrecisionName",
    "check_precision",
]

DataDevice = Literal["host", "accelerator"]
PrecisionName = Literal["fp32", "bf16", "fp16"]
PRECISION_NAMES: tuple[str, ...] = get_args(PrecisionName)


class LayoutConfig(Section):
    """The layout fields of the ``model`` section (``ModelConfig`` takes them as a base class)."""

    channels_last: bool = Field(default=False, description="NHWC memory format (4-D image models only)")


class DataDeviceConfig(Section):
    """The placement field of the ``data`` section (``DataConfig`` takes it as a base class)."""

    device: DataDevice = Field(
        default="host", description="accelerator: keep the in-memory dataset on the GPU (needs scaling.use_gpu)"
    )


class CompileConfig(Section):
    """The compile field of the ``train`` section."""

    compile: bool = Field(default=False, description="torch.compile the model (dynamic shapes)")
    compile_backend: Literal["inductor", "aot_eager", "eager"] = Field(
        default="inductor",
        description="train.compile: torch.compile's backend (inductor: generated kernels; "
        "aot_eager/eager: graph capture only, to debug or test)",
    )


class PrecisionConfig(Section):
    """The precision fields of the ``train`` section (``TrainConfig`` takes them as a base class)."""

    precision: PrecisionName = Field(
        default="fp32",
        description="fp32; bf16 (autocast, CPU or GPU); fp16 (autocast with a gradient scaler, GPU only)",
    )
    loss_scale_init: float = Field(default=2.0**16, gt=0, description="fp16: the first loss scale")
    loss_scale_growth_interval: int = Field(
        default=2000, gt=0, description="fp16: clean steps before the loss scale doubles"
    )


def check_precision(precision: str, device_type: str) -> None:
    """Raise ``ValueError`` naming ``train.precision`` if ``precision`` cannot run on ``device_type``.

    The driver calls it with ``"cuda" if scaling.use_gpu else "cpu"`` before Ray starts."""
    if precision not in PRECISION_NAMES:
        raise ValueError(f"train.precision: unknown {precision!r}; expected one of {', '.join(PRECISION_NAMES)}")
    if precision == "fp16" and device_type != "cuda":
        raise ValueError(
            "train.precision: fp16 needs a CUDA GPU (autocast to float16 with a gradient scaler); "
            "use bf16 on CPU, or set scaling.use_gpu: true"
        )
