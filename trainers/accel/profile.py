"""A torch-profiler look at a worker's steps, for finding what the orchestrator's loop costs on
an accelerator (``bench/gpu.py --profile``).

Off unless the environment variable ``ELB_PROFILE_DIR`` names a folder: then rank 0 of each
worker group records ``ELB_PROFILE_STEPS`` steps (default 20) after skipping
``ELB_PROFILE_SKIP`` steps of the group (default 30: compilation, cuDNN autotuning) and writes
``profile-phase<N>.txt`` there: the top operators by device time and by CPU time, and the host
synchronisations per step (``aten::_local_scalar_dense``: an ``.item()`` or ``float(tensor)``;
``cudaStreamSynchronize``/``cudaDeviceSynchronize``/``cudaEventSynchronize`` calls), the figures
that say what to take off the hot path.  A local Ray cluster hands the driver's environment on to
its workers, so setting the variable before ``python -m orchestrator train`` is enough there.
"""

from __future__ import annotations

import os
import time

import torch

__all__ = ["SYNC_EVENTS", "StepProfiler", "profiler_from_env", "sync_counts"]

SYNC_EVENTS = ("aten::_local_scalar_dense", "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")


def sync_counts(events, steps: int) -> dict[str, float]:
    """Calls per step of each :data:`SYNC_EVENTS` name among the profiler's averaged ``events``."""
    counts = {name: 0 for name in SYNC_EVENTS}
    for e in events:
        if e.key in counts:
            counts[e.key] += e.count
    return {name: n / max(1, steps) for name, n in counts.items()}


class StepProfiler:
    """Records steps ``skip + 1 .. skip + steps`` of a group (counted by :meth:`step`) with
    ``torch.profiler`` and writes the tables to ``path`` when the last one ends."""

    def __init__(self, path: str, skip: int = 30, steps: int = 20, cuda: bool | None = None) -> None:
        if steps < 1 or skip < 0:
            raise ValueError(f"StepProfiler: steps must be >= 1 and skip >= 0 (got steps={steps}, skip={skip})")
        self.path, self.skip, self.steps = path, skip, steps
        self.cuda = torch.cuda.is_available() if cuda is None else cuda
        self._seen = 0
        self._prof: torch.profiler.profile | None = None
        self._t0 = 0.0
        self.written = False
        if skip == 0:
            self._start()

    def step(self) -> None:
        """Call after each step."""
        if self.written:
            return
        self._seen += 1
        if self._seen == self.skip:
            self._start()
        elif self._seen == self.skip + self.steps:
            self._stop()

    def _start(self) -> None:
        acts = [torch.profiler.ProfilerActivity.CPU]
        if self.cuda:
            acts.append(torch.profiler.ProfilerActivity.CUDA)
        self._prof = torch.profiler.profile(activities=acts)
        self._prof.__enter__()
        self._t0 = time.perf_counter()

    def _stop(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()
        wall = time.perf_counter() - self._t0
        prof, self._prof = self._prof, None
        assert prof is not None
        prof.__exit__(None, None, None)
        events = prof.key_averages()
        device_key = "self_device_time_total" if self.cuda else "self_cpu_time_total"
        lines = [
            f"{self.steps} steps profiled after {self.skip}: {wall / self.steps * 1e3:.2f} ms a step (wall, profiled)",
            "host syncs per step: " + ", ".join(f"{k} {v:.2f}" for k, v in sync_counts(events, self.steps).items()),
            "",
            f"top operators by {'device' if self.cuda else 'CPU'} time (self):",
            events.table(sort_by=device_key, row_limit=25, max_name_column_width=60),
            "",
            "top operators by CPU time (self):",
            events.table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=60),
        ]
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        with open(self.path, "w") as f:
            f.write("\n".join(lines) + "\n")
        self.written = True


def profiler_from_env(rank: int, phase: int, cuda: bool) -> StepProfiler | None:
    """The profiler ``ELB_PROFILE_DIR`` asks for (rank 0 only), or None."""
    folder = os.environ.get("ELB_PROFILE_DIR", "")
    if not folder or rank != 0:
        return None
    skip = int(os.environ.get("ELB_PROFILE_SKIP", "30"))
    steps = int(os.environ.get("ELB_PROFILE_STEPS", "20"))
    return StepProfiler(os.path.join(folder, f"profile-phase{phase}.txt"), skip=skip, steps=steps, cuda=cuda)
