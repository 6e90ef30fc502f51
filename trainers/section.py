"""The base of every config section: unknown keys, non-finite floats and values of the wrong
kind are refused in one place, so no section has to repeat it field by field.

Pydantic's lax mode turns ``true`` into 1 for an ``int``, ``1`` into ``True`` for a ``bool`` and
accepts ``.inf``/``.nan`` for a ``float``; a YAML typo then trains silently with a value the user
never meant.  :class:`Section` refuses those:

- ``allow_inf_nan=False``: ``.inf``, ``-.inf``, ``.nan`` anywhere a float is accepted (also inside
  lists and tuples);
- a boolean where a number is expected, a number or string where a boolean is expected, and a
  string where an integer is expected (``"1e3"``: PyYAML reads exponents without a dot as
  strings).  Numeric strings stay accepted for floats, because YAML 1.1 reads ``lr: 1e-3`` as
  the string ``"1e-3"``.

The error names the field through pydantic's location and says what to write instead.
"""

from __future__ import annotations

import types
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator


def _options(annotation: Any) -> tuple[Any, ...]:
    """The members of a union (``X | None`` included), else the annotation itself."""
    if get_origin(annotation) in (Union, types.UnionType):
        return tuple(a for a in get_args(annotation) if a is not type(None))
    return (annotation,)


def kind_problem(annotation: Any, value: Any) -> str | None:
    """Why ``value`` is of the wrong kind for ``annotation`` (``None`` when it is not).

    Only the confusions pydantic's lax mode lets through are reported here; anything else is left
    to pydantic's own type check.
    """
    if value is None:
        return None
    options = _options(annotation)
    if len(options) > 1:
        # a union: fine if any member takes the value
        problems = [kind_problem(a, value) for a in options]
        return None if any(p is None for p in problems) else problems[0]
    ann = options[0]
    origin = get_origin(ann)
    if origin in (list, tuple) and isinstance(value, (list, tuple)):
        args = get_args(ann)
        if origin is tuple and args and args[-1] is not Ellipsis:
            pairs = list(zip(args, value))
        else:
            pairs = [(args[0] if args else Any, v) for v in value]
        for i, (a, v) in enumerate(pairs):
            p = kind_problem(a, v)
            if p is not None:
                return f"item {i}: {p}"
        return None
    if ann is bool:
        if not isinstance(value, bool):
            return f"expects true or false, got {value!r}; write true or false (no quotes)"
    elif ann is int:
        if isinstance(value, bool):
            return f"expects an integer, got the boolean {str(value).lower()}; write a number such as 64"
        if isinstance(value, str):
            return (
                f"expects an integer, got the string {value!r}; write plain digits without quotes "
                f"or exponent, e.g. 1000"
            )
    elif ann is float:
        if isinstance(value, bool):
            return f"expects a number, got the boolean {str(value).lower()}; write a number such as 0.1"
    elif origin is Literal and isinstance(value, bool):
        return (
            f"expects one of {', '.join(repr(a) for a in get_args(ann))}, got the boolean {str(value).lower()}; "
            f"write one of those names"
        )
    return None


class Section(BaseModel):
    """Base class of the config sections (``data``, ``model``, ... and the driver's own)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _right_kind(cls, value: Any, info: ValidationInfo) -> Any:
        field = cls.model_fields.get(info.field_name or "")
        if field is not None:
            problem = kind_problem(field.annotation, value)
            if problem is not None:
                raise ValueError(problem)
        return value
