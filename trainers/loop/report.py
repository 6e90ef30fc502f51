"""What a worker group tells the driver and asks it, as the loop uses it.

The step's metrics, pushes at their pace with the window's throughput, events, the workers a new batch needs, and the
handover of an overlapping resize.  Rank 0 talks (``trainers/link/channel.py``); every rank
agrees on the answers.  See ``docs/architecture.md`` (the driver <-> worker link)."""

from __future__ import annotations

import contextlib
from typing import Any

import ray
import torch

from trainers.link import metrics as M
from trainers.link.agreement import Action, PushDecision, WorkersNeeded
from trainers.link.channel import Channel
from trainers.link.messages import Event, FirstStep, WorkerWarning
from trainers.link.runtime import Runtime
from trainers.loop.group import Group
from trainers.loop.meter import ThroughputMeter


def _node_id() -> str:
    """The Ray node this worker runs on ("" outside Ray)."""
    return ray.get_runtime_context().get_node_id() if ray.is_initialized() else ""


class Reporter:
    """The group's side of the link: ``channel`` (rank 0's; a no-op elsewhere), the throughput
    ``meter``, and the step of the next push."""

    def __init__(
        self, runtime: Runtime, group: Group, log_every: int, push_every_s: float, tokens_per_sample: int | None = None
    ) -> None:
        self.runtime, self.group = runtime, group
        self.channel = Channel(
            runtime.monitor_name,
            runtime.namespace,
            enabled=group.rank == 0,
            judged=runtime.judged_metrics,
            system=group.rank == 0 and runtime.sends_system_metrics(_node_id()),
        )
        self.log_every, self.push_every_s = log_every, push_every_s
        self.tokens = tokens_per_sample  # T of a language model: tokens ride beside samples
        self.meter = ThroughputMeter(log_every, push_every_s)
        self.next_push = log_every  # the step of the next push
        self.stepped = False  # this group made its first step
        self.samples_per_s: float | None = None  # the last push window's throughput (resize economics)

    def start(self, step: int) -> None:
        """The group starts training at ``step``: a new throughput window, the first push due
        ``log_every`` steps on."""
        self.meter = ThroughputMeter(self.log_every, self.push_every_s)
        self.next_push, self.stepped = step + self.log_every, False

    # -- events ---------------------------------------------------------------------------------------

    def emit(self, event: Event) -> None:
        self.channel.emit(event)

    def warn(self, message: str) -> None:
        print(f"[elastic] warning: {message}", flush=True)
        self.channel.emit(WorkerWarning(message=message))

    def stepped_at(self, step: int) -> None:
        """A step was made: the group's first one tells the driver the group is running."""
        if not self.stepped:
            self.channel.emit(FirstStep(step=step, phase=self.runtime.phase))
            self.stepped = True

    def flush(self, wait: bool = False) -> bool:
        return self.channel.flush(wait=wait)

    # -- throughput ---------------------------------------------------------------------------------

    def aside(self) -> contextlib.AbstractContextManager[None]:
        """Time in the block (validation, a checkpoint) does not count as training."""
        return self.meter.aside()

    def count(self, samples: int) -> None:
        self.meter.count(samples)

    # -- pushes ------------------------------------------------------------------------------------------

    def due(self, step: int) -> bool:
        """A push is due at ``step`` by the pace of the pushes."""
        return step >= self.next_push

    def push(self, step: int, metrics: dict[str, float], flush: bool) -> PushDecision:
        """Log the step's metrics.  At a push (``flush``) add the window's throughput, send, and
        agree with every rank on rank 0's decision (stop, hand over to the group the driver
        resizes to: one started beside this one, or one the driver starts once this one ended,
        or go on) and on the steps to the next push."""
        if not flush:
            self.channel.log(step, metrics)
            return PushDecision(Action.GO, 0)
        reading = self.meter.read()
        self.samples_per_s = reading.samples_per_s
        metrics[M.THROUGHPUT] = reading.samples_per_s
        device = self.group.device
        if device.type == "cuda":  # the GPU memory this process's tensors peaked at so far
            metrics[M.MEMORY_PEAK] = float(torch.cuda.max_memory_allocated(device))
        if self.tokens is not None:
            metrics[M.THROUGHPUT_TOKENS] = reading.samples_per_s * self.tokens
        self.channel.log(step, metrics)
        stop = self.channel.flush()
        handover = self.channel.handover
        action = Action.STOP if stop else Action.HAND_OVER if handover else Action.GO
        decision = self.group.agree(
            PushDecision(action, reading.push_interval, self.channel.handover_to if handover else 0)
        )
        self.next_push = step + decision.next_push_in
        return decision

    # -- questions to the driver ------------------------------------------------------------------------

    def ask_workers(
        self, step: int, batch_size: int, remaining_samples: float, inputs: Any = None, ask: bool = True
    ) -> WorkersNeeded:
        """The workers global batch ``batch_size`` needs (0 = keep this group), whether a new group
        starts beside this one and (goodput) the batch to take: rank 0 asks the driver, with
        goodput's measurements ``inputs`` (:class:`~trainers.policies.goodput.GoodputInputs`), unless
        ``ask`` is false on rank 0 (nothing to ask yet); every rank agrees."""
        mine = WorkersNeeded()
        if self.group.rank == 0 and ask:
            answer = self.channel.ask_resize(
                step, batch_size, self.runtime.workers, remaining_samples, self.samples_per_s, inputs
            )
            mine = WorkersNeeded(answer.workers, answer.overlap, answer.batch)
        return self.group.agree(mine)

    def await_handover(self) -> str | None:
        """A group started early: rank 0 waits for the old group's last checkpoint, every rank
        gets its path (None: the resize was called off)."""
        path = self.channel.await_handover(self.runtime.phase) if self.group.rank == 0 else None
        return self.group.agree_object(path)

    def handed_over(self, step: int, path: str) -> None:
        """This group wrote its last checkpoint, at ``path``, for the group that takes over."""
        if self.group.rank == 0:
            self.channel.handed_over(self.runtime.phase, step, path)
