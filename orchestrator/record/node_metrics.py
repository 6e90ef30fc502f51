"""System metrics of every node the run's workers are on (the driver's aside), each under its MLflow node id.

MLflow names a node's figures ``system/<node_id>/<metric>`` (its ``node_id`` for system metrics);
here each node's id is its host name and the start of its Ray node id (``gpu-7-1a2b3c``: nodes that
share a host stay apart).  The nodes are those of the run's newest worker group (each group's start
says where its ranks are: :meth:`NodeSystemMetrics.follow`), so a node the run leaves is let go
(an autoscaler may remove it) and another job's nodes are not logged.  A small actor on each node
(no CPU asked, pinned to its node) samples it with MLflow's own monitors: CPU, memory, disk, network
and, with ``nvidia-ml-py``, each GPU's utilization and memory.  The driver asks every actor every
:data:`NODE_EVERY_S` seconds and writes the figures to the run (its own MLflow client, from its own
thread); a node that is lost (drained, failed) is dropped.  The driver's machine:
orchestrator/record/system_metrics.py."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from typing import Any

import ray
from mlflow.entities import Metric
from mlflow.system_metrics.metrics.cpu_monitor import CPUMonitor
from mlflow.system_metrics.metrics.disk_monitor import DiskMonitor
from mlflow.system_metrics.metrics.gpu_monitor import GPUMonitor
from mlflow.system_metrics.metrics.network_monitor import NetworkMonitor
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

NODE_EVERY_S = 5.0  # seconds between samples of each node
REFRESH_EVERY = 6  # samples between two looks at the cluster's nodes (new nodes get a sampler)
ASK_TIMEOUT_S = 10.0  # a node whose sampler does not answer in this long is skipped this round


class NodeSampler:
    """The figures of the node it runs on, as MLflow's system-metrics monitor takes them."""

    def __init__(self) -> None:
        self.monitors: list[Any] = [CPUMonitor(), DiskMonitor(), NetworkMonitor()]
        try:
            self.monitors.append(GPUMonitor())  # NVIDIA GPUs through nvidia-ml-py
        except Exception:  # no GPU, or no nvidia-ml-py: the other figures
            pass
        self.sample()  # CPU utilization is measured from one sample to the next

    def sample(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for monitor in self.monitors:
            monitor.collect_metrics()
            out.update(monitor.aggregate_metrics())
            monitor.clear_metrics()
        return {k: float(v) for k, v in out.items()}


def node_label(hostname: str, node_id: str) -> str:
    """``<host>-<first 6 of the Ray node id>``, in the characters MLflow allows in a metric key."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", f"{hostname}-{node_id[:6]}")


def alive_nodes() -> dict[str, str]:
    """The cluster's live nodes: ``{node id: host name}``."""
    return {n["NodeID"]: n.get("NodeManagerHostname") or n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]}


def spawn_sampler(node_id: str) -> Any:
    """A :class:`NodeSampler` actor pinned to ``node_id``, asking for no CPU."""
    actor = ray.remote(num_cpus=0, max_restarts=0)(NodeSampler)
    return actor.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)).remote()


def ask(samplers: dict[str, Any]) -> dict[str, dict[str, float] | None]:
    """Each sampler's figures (None: its node is gone or it did not answer in time)."""
    refs = {node: actor.sample.remote() for node, actor in samplers.items()}
    ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=ASK_TIMEOUT_S)
    out: dict[str, dict[str, float] | None] = {}
    for node, ref in refs.items():
        try:
            out[node] = ray.get(ref) if ref in ready else None
        except Exception:  # the actor died with its node
            out[node] = None
    return out


def end(samplers: dict[str, Any]) -> None:
    for actor in samplers.values():
        try:
            ray.kill(actor)
        except Exception:  # gone with its node
            pass


class NodeSystemMetrics:
    """Sample every node but ``driver_node`` and write ``system/<node>/<metric>`` to the run.

    ``write(rows)``: MLflow ``Metric`` rows to the run; ``started_s``: the run's start (wall time):
    a node's step is the index of the :data:`NODE_EVERY_S` window since then (a resumed run's
    driver goes on after its earlier drivers).  ``nodes``/``spawn``/``ask``/``end``: Ray by default."""

    def __init__(
        self,
        write: Callable[[list[Any]], None],
        driver_node: str,
        started_s: float,
        nodes: Callable[[], dict[str, str]] = alive_nodes,
        spawn: Callable[[str], Any] = spawn_sampler,
        asker: Callable[[dict[str, Any]], dict[str, dict[str, float] | None]] = ask,
        ender: Callable[[dict[str, Any]], None] = end,
    ) -> None:
        self.write, self.driver_node, self.started_s = write, driver_node, started_s
        self.nodes, self.spawn, self.asker, self.ender = nodes, spawn, asker, ender
        self.samplers: dict[str, Any] = {}
        self.labels: dict[str, str] = {}
        self.wanted: frozenset[str] = frozenset()  # the nodes of the run's newest group
        self._moved = False  # the group's nodes changed since the last look
        self.last_step: dict[str, int] = {}
        self.rounds = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def follow(self, nodes: Any) -> None:
        """The run's newest worker group is on ``nodes`` (Ray node ids, one per rank): sample those."""
        self.wanted, self._moved = frozenset(nodes), True

    def refresh(self) -> None:
        """A sampler on each live node of the group that has none (the driver's excepted); the others ended."""
        self._moved = False
        live = {n: h for n, h in self.nodes().items() if n in self.wanted and n != self.driver_node}
        left = {n: a for n, a in self.samplers.items() if n not in live}
        for node in left:
            self.samplers.pop(node)
        if left:
            self.ender(left)
        for node, host in live.items():
            if node not in self.samplers:
                self.samplers[node] = self.spawn(node)
                self.labels[node] = node_label(host, node)

    def tick(self, now: float | None = None) -> int:
        """One round: look at the nodes when due, ask every sampler, write what came back; the rows written."""
        if self._moved or self.rounds % REFRESH_EVERY == 0:
            self.refresh()
        self.rounds += 1
        if not self.samplers:
            return 0
        now = time.time() if now is None else now
        window = max(0, int((now - self.started_s) // NODE_EVERY_S))
        rows = []
        for node, figures in self.asker(self.samplers).items():
            if figures is None:  # gone with its node, or stuck: a new one at the next look if the node lives
                self.ender({node: self.samplers.pop(node)})
                continue
            step = max(window, self.last_step.get(node, -1) + 1)
            self.last_step[node] = step
            prefix, ms = f"system/{self.labels[node]}/", int(now * 1000)
            rows += [Metric(prefix + k, v, ms, step) for k, v in sorted(figures.items())]
        if rows:
            self.write(rows)
        return len(rows)

    def _loop(self) -> None:
        while not self._stop.wait(NODE_EVERY_S):
            try:
                self.tick()
            except Exception:  # a store or a cluster that does not answer: the next round tries again
                pass

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="node-system-metrics", daemon=True)
        self._thread.start()

    def stop(self, last: bool = True) -> None:
        """End the thread; with ``last``, one more round first (a short run gets a sample of each node)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=ASK_TIMEOUT_S + 5)
            self._thread = None
        try:
            if last:
                self.tick()
        except Exception:  # the store or the cluster is away: nothing more to write
            pass
        finally:
            self.ender(self.samplers)
            self.samplers = {}
