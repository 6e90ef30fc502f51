"""Decisions every rank must act on at the same step, broadcast from rank 0 as named records.

A record is a frozen dataclass of ``int``/``bool``/``IntEnum`` fields.  :func:`agree` encodes
its fields, in declaration order, into one int64 tensor, broadcasts it from rank 0 (one
collective, like the packed integer it replaces) and decodes it on every rank; the other
ranks pass any instance of the same type (its values are overwritten).  See
``docs/architecture.md`` (the driver <-> worker link).
"""

from __future__ import annotations

import enum
import typing
from dataclasses import dataclass, fields
from typing import TypeVar

import torch
import torch.distributed as dist

R = TypeVar("R")


class Action(enum.IntEnum):
    """What the whole group does after a push: go on, stop (at a checkpoint), or hand over to a
    new group started beside this one."""

    GO = 0
    STOP = 1
    HAND_OVER = 2


@dataclass(frozen=True)
class WorkersNeeded:
    """The driver's answer to a batch change: ``workers`` the batch needs (0: keep this group);
    ``overlap``: a new group starts beside this one, which trains on until it is ready; ``batch``:
    the global batch goodput chose (0: keep B)."""

    workers: int = 0
    overlap: bool = False
    batch: int = 0


@dataclass(frozen=True)
class PushDecision:
    """Rank 0's decision at a push, and the steps until the next push (rank 0's clock sets the
    pace for every rank, see :func:`trainers.loop.meter.push_interval`); ``to``: with a hand
    over, the workers of the group that takes over."""

    action: Action = Action.GO
    next_push_in: int = 1
    to: int = 0


def encode(record: object) -> torch.Tensor:
    """The record's fields, in declaration order, as one int64 tensor."""
    return torch.tensor([int(getattr(record, f.name)) for f in fields(record)], dtype=torch.int64)


def decode(cls: type[R], values: list[int]) -> R:
    """The inverse of :func:`encode`: each field's declared type applied to its integer."""
    hints = typing.get_type_hints(cls)
    return cls(**{f.name: hints[f.name](v) for f, v in zip(fields(cls), values)})


def agree(record: R, world: int, device: torch.device | str = "cpu") -> R:
    """Rank 0's ``record``, on every rank of the default process group (``world`` 1: as is)."""
    if world == 1:
        return record
    t = encode(record).to(device)
    dist.broadcast(t, src=0)
    return decode(type(record), t.tolist())
