"""The one way a config becomes a run's config: load, merge overrides, validate the schema,
check the workload (and, for a command that trains, the environment), each error one line."""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable, Mapping
from typing import Any

from orchestrator.config import RootConfig, apply_overrides, drop_replaced_choice, read_yaml, validate
from orchestrator.preflight import check_config


def load_config(path: str | dict[str, Any] | None, overrides: list[str] | None = None, *,
                functions: Mapping[str, Callable[..., Any]] | None = None) -> RootConfig:
    """Read (a YAML path, or a dict of sections), override, validate, check data and probe the
    workload: every error is a one-line ConfigError before anything starts.  A probe's warning
    (a BatchNorm model) is printed once to stderr."""
    raw = read_yaml(path) if isinstance(path, str) else copy.deepcopy(path or {})
    raw = drop_replaced_choice(raw, overrides or [])
    cfg = validate(apply_overrides(raw, overrides or []))
    check_config(cfg)
    cfg.check_resources()
    warning = cfg.check_workload(functions)
    if warning:
        print(f"warning: {warning}", file=sys.stderr)
    return cfg
