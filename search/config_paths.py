"""Paths into the run config's tree: the field a dotted path names, its kind, and reading or setting
it in a plain config dict (what a search space's parameters and a trial's overrides address)."""

from __future__ import annotations

import copy
import difflib
import types
from inspect import isclass
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from orchestrator.config.schema import RootConfig


def _is_section(annotation: Any) -> bool:
    return isclass(annotation) and issubclass(annotation, BaseModel)


def config_field(path: str, allow_section: bool = False) -> FieldInfo | None:
    """The pydantic field of ``RootConfig`` at dotted ``path``; ``ValueError`` names what is wrong.

    Returns ``None`` for a section when ``allow_section``."""
    parts = path.split(".")
    model: type[BaseModel] = RootConfig
    for i, part in enumerate(parts):
        fields = model.model_fields
        where = ".".join(parts[:i]) or "the config"
        if part not in fields:
            close = difflib.get_close_matches(part, list(fields), n=1)
            guess = f"did you mean {'.'.join([*parts[:i], close[0]])}? " if close else ""
            raise ValueError(f"unknown config field; {guess}{where} has: {', '.join(fields)}")
        info = fields[part]
        last = i == len(parts) - 1
        if not last:
            if not _is_section(info.annotation):
                raise ValueError(f"{'.'.join(parts[: i + 1])} is a value, not a section")
            model = info.annotation
        elif _is_section(info.annotation):
            if allow_section:
                return None
            raise ValueError(f"is a section; name one of its fields: {', '.join(info.annotation.model_fields)}")
        else:
            return info
    return None  # pragma: no cover  (empty path)


def field_kind(annotation: Any) -> tuple[str, tuple[Any, ...]]:
    """``("int" | "float" | "choice", literal values)`` for a field's type annotation."""
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        return field_kind(args[0]) if len(args) == 1 else ("choice", ())
    if origin is Literal:
        return "choice", get_args(annotation)
    if annotation is int:
        return "int", ()
    if annotation is float:
        return "float", ()
    return "choice", ()


def get_path(config: dict[str, Any], path: str) -> Any:
    node: Any = config
    for part in path.split("."):
        node = node[part]
    return node


def set_path(config: dict[str, Any], path: str, value: Any) -> None:
    parts = path.split(".")
    node = config
    for part in parts[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = node[part] = {}
        node = child
    node[parts[-1]] = copy.deepcopy(value)
