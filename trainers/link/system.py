"""System metrics of the workers' node, sent by rank 0 with its step records (trainers/link/channel.py).

The driver's MLflow run gets its own machine's figures from MLflow's system-metrics monitor
(orchestrator/record/run_tracker.py); the training runs on the worker nodes, so rank 0 samples its node the
same way and names the figures as MLflow does for a node (``system/<node_id>/<metric>``, with
``node_id`` ``worker-<host>``): CPU utilization, memory used (MB and percent) and, on a GPU, its
memory used and utilization.  ``psutil`` comes with Ray (``ray/thirdparty_files``) when it is not
installed; without it only the GPU figures are sent.
"""

from __future__ import annotations

import socket
import time
from typing import Any

EVERY_S = 5.0  # seconds between samples (MLflow's own monitor samples every 10 s by default)


class SystemSampler:
    """Samples the node at most every ``every_s`` seconds (:meth:`due`, :meth:`sample`)."""

    def __init__(self, every_s: float = EVERY_S, node_id: str | None = None) -> None:
        self.every_s = every_s
        self.prefix = f"system/{node_id or 'worker-' + socket.gethostname()}/"
        self._last = -float("inf")  # the first push carries a sample (a short phase gets one too)
        try:
            import psutil
            import ray  # noqa: F401 - puts Ray's psutil on the path

            self._psutil: Any = psutil
            psutil.cpu_percent()  # the first call only starts the measurement window
        except ImportError:
            self._psutil = None

    def due(self) -> bool:
        return time.monotonic() - self._last >= self.every_s

    def sample(self) -> dict[str, float]:
        """The node's figures now (CPU utilization over the time since the last sample)."""
        self._last = time.monotonic()
        out: dict[str, float] = {}
        if self._psutil is not None:
            mem = self._psutil.virtual_memory()
            out["cpu_utilization_percentage"] = float(self._psutil.cpu_percent())
            out["system_memory_usage_megabytes"] = mem.used / 1e6
            out["system_memory_usage_percentage"] = 100.0 * mem.used / mem.total
        out.update(_gpu())
        return {self.prefix + k: v for k, v in out.items()}


def _gpu() -> dict[str, float]:
    """Rank 0's own GPU (only one this process already uses: no new CUDA context)."""
    import torch

    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return {}
    i = torch.cuda.current_device()
    out: dict[str, float] = {}
    try:
        free, total = torch.cuda.mem_get_info(i)
        out[f"gpu_{i}_memory_usage_megabytes"] = (total - free) / 1e6
        out[f"gpu_{i}_memory_usage_percentage"] = 100.0 * (total - free) / total
        out[f"gpu_{i}_utilization_percentage"] = float(torch.cuda.utilization(i))  # needs pynvml
    except Exception:  # a figure this node cannot read is left out
        pass
    return out
