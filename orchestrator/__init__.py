"""The driver: config, CLI, phases on Ray, MLflow tracking; ``fit`` is the Python API (orchestrator/api.py)."""

from __future__ import annotations

from typing import Any

__all__ = ["FitResult", "fit"]


def __getattr__(name: str) -> Any:  # lazy: importing orchestrator.config.schema stays light
    if name in __all__:
        from orchestrator import api

        return getattr(api, name)
    raise AttributeError(f"module 'orchestrator' has no attribute {name!r}")
