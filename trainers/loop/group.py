"""Where this worker sits in its group (rank, world size, device) and how the ranks agree on rank 0's
values; see ``docs/architecture.md`` (the driver <-> worker link)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from trainers.link import agreement

R = TypeVar("R")


@dataclass(frozen=True)
class Group:
    """This worker's ``rank`` of ``world`` and its ``device``."""

    rank: int
    world: int
    device: torch.device

    @classmethod
    def current(cls, rank: int | None = None, world: int | None = None, device: torch.device | None = None) -> Group:
        """From Ray Train's context unless given (the gloo tests give all three)."""
        if rank is None or world is None:
            import ray.train

            ctx = ray.train.get_context()
            rank, world = ctx.get_world_rank(), ctx.get_world_size()
        if device is None:
            import ray.train.torch

            device = ray.train.torch.get_device()
        return cls(rank, world, device)

    def agree(self, record: R) -> R:
        """Rank 0's ``record`` (a named decision, ``trainers/link/agreement.py``) on every rank, so
        that all act on the same one at the same step."""
        return agreement.agree(record, self.world, self.device)

    def agree_int(self, value: int) -> int:
        """Rank 0's ``value`` on every rank (one broadcast; none at W = 1)."""
        if self.world == 1:
            return value
        t = torch.tensor([value], dtype=torch.int64, device=self.device)
        dist.broadcast(t, src=0)
        return int(t.item())

    def agree_object(self, obj: Any) -> Any:
        """Rank 0's picklable ``obj`` on every rank (for rare answers such as a checkpoint path)."""
        if self.world == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0, device=self.device)
        return box[0]

    def gather_object(self, obj: Any) -> list[Any]:
        """Every rank's picklable ``obj``, by rank, on every rank (rare: once per group start)."""
        if self.world == 1:
            return [obj]
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def start_time(self) -> float:
        """Rank 0's clock now, on every rank: tells a restarted group's records from an earlier
        attempt's."""
        t = torch.tensor([time.time()], dtype=torch.float64)
        if self.world > 1:
            dist.broadcast(t, src=0)
        return float(t.item())


def node_id() -> str:
    """The Ray node this worker runs on ("" outside Ray)."""
    try:
        import ray

        return ray.get_runtime_context().get_node_id() if ray.is_initialized() else ""
    except Exception:  # outside a Ray worker (tests): no node to name
        return ""
