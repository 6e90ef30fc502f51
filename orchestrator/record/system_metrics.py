"""The driver's own machine in its MLflow run, sampled by MLflow's system-metrics monitor; the other nodes.

CPU, memory, disk, network (GPU with ``pynvml``) as ``system/<metric>``.  Every other node the run's
workers are on as ``system/<host>-<node id>/<metric>`` (orchestrator/record/node_metrics.py).  Each
node once: the workers' rank 0 reports its process's view of its node (``system/worker-<host>/<metric>``,
over the link: trainers/link/system.py) only where the driver samples neither (:meth:`DriverSystemMetrics.sampled`:
a search's trial, which samples its own machine only, with rank 0 on another node)."""

from __future__ import annotations

import logging
from typing import Any

import ray
from mlflow.tracking import MlflowClient

from orchestrator.record.node_metrics import NodeSystemMetrics

SYSTEM_EVERY_S = 5.0  # seconds between the driver's system-metrics samples (MLflow's monitor)


class DriverSystemMetrics:
    """Run MLflow's system-metrics monitor for one run on the driver, anew after a tracking outage."""

    def __init__(self, run_id: str, mlflow_uri: str, nodes: bool = True) -> None:
        self.run_id, self.mlflow_uri = run_id, mlflow_uri
        self._monitor: Any = None
        self.sample_nodes = nodes  # the cluster's other nodes too (False: this machine only)
        self.nodes: NodeSystemMetrics | None = None

    def start(self, resume: bool = False) -> bool:
        """Sample every :data:`SYSTEM_EVERY_S` seconds (``resume``: go on at the run's next step);
        False where MLflow's monitor cannot run.  It needs ``psutil``, which Ray ships (importing Ray
        puts it on the path) when it is not installed."""
        try:
            from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor
        except ImportError:
            return False
        # Its thread logs a warning and ends at a call to the store that fails: the run's writer
        # says what an outage means itself and a new monitor starts once the store answers (revive).
        logging.getLogger("mlflow.system_metrics.system_metrics_monitor").setLevel(logging.ERROR)
        self._monitor = SystemMetricsMonitor(
            self.run_id, sampling_interval=SYSTEM_EVERY_S, resume_logging=resume, tracking_uri=self.mlflow_uri
        )
        self._monitor.start()
        self.start_nodes()
        return True

    def start_nodes(self) -> bool:
        """Sample every node of the Ray cluster this driver joined, but its own (False: no Ray here)."""
        if not self.sample_nodes or not ray.is_initialized() or self.nodes is not None:
            return False
        client = MlflowClient(self.mlflow_uri)  # its own: written from the sampler's thread
        started = client.get_run(self.run_id).info.start_time / 1000.0
        self.nodes = NodeSystemMetrics(
            lambda rows: client.log_batch(self.run_id, metrics=rows),
            ray.get_runtime_context().get_node_id(),
            started,
        )
        self.nodes.start()
        return True

    def sampled(self) -> dict[str, Any]:
        """What this driver samples itself, for the workers (``Runtime.driver_node``,
        ``Runtime.nodes_sampled``): rank 0 sends its node's figures only where neither covers it,
        so no node is logged twice under two names."""
        own = self._monitor is not None and ray.is_initialized()
        return {
            "driver_node": ray.get_runtime_context().get_node_id() if own else "",
            "nodes_sampled": self.nodes is not None,
        }

    def follow(self, nodes: Any) -> None:
        """The run's newest worker group is on ``nodes``: the nodes sampled (the driver's aside)."""
        if self.nodes is not None and nodes:
            self.nodes.follow(nodes)

    def stop(self, lost: bool = False) -> None:
        """End the monitor; ``lost``: the store stays away, its last rows cannot be written (stopped
        without MLflow's flush and its error line)."""
        if self.nodes is not None:
            self.nodes.stop(last=not lost)
            self.nodes = None
        if self._monitor is not None:
            if lost:
                self._monitor._shutdown_event.set()
            else:
                self._monitor.finish()
            self._monitor = None

    def revive(self) -> None:
        """MLflow's monitor thread ends at the first call to the store that fails (with a warning
        it logs itself): after an outage a new one goes on where it stopped."""
        thread = getattr(self._monitor, "_process", None)
        if self._monitor is not None and thread is not None and not thread.is_alive():
            self._monitor = None
            self.start(resume=True)
