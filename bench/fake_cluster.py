"""A real autoscaling Ray cluster on this machine (bench/autoscale.py, tests/multinode/test_autoscaling_cluster.py).

Ray's fake multi-node provider (``ray/autoscaler/_private/fake_multi_node/node_provider.py``): a head
started with ``RAY_FAKE_CLUSTER=1 ray start --head --autoscaling-config=FILE`` runs Ray's autoscaler
(its ``monitor.py``), which launches worker nodes for what the cluster is asked for (pending tasks,
placement groups, ``ray.autoscaler.sdk.request_resources``) and terminates nodes idle for
``idle_timeout_minutes``; each node it launches is a raylet (and its processes) under the monitor.

``ray.cluster_utils.AutoscalingCluster`` wraps the same, but its ``start()`` and ``shutdown()`` run
``ray stop --force`` (every Ray on the machine) and it reads an ``example.yaml`` the wheel does not
ship: here the whole config is written out, and the head and every node it launched are stopped by
their processes (found by the cluster's own temp folder and port), never ``ray stop``.

    head = FakeAutoscalingCluster(max_nodes=2).start()
    env = head.driver_env()          # RAY_ADDRESS of the head (and the token auth it asks for)
    ...
    head.node_events()               # (time, "launched" | "terminated", nodes), from the autoscaler's log
    head.worker_nodes()              # (worker nodes that ever joined, alive now), from Ray's GCS
    head.stop()
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEAD_TYPE = "ray.head.default"
WORKER_TYPE = "cpu_worker"
OBJECT_STORE_BYTES = 100 * 1024 * 1024  # a node's object store (Ray's default is 30% of this machine's RAM a node)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def autoscaling_config(
    gcs_port: int, max_nodes: int, cpus_per_node: float = 1, idle_timeout_minutes: float = 0.1
) -> dict[str, Any]:
    """The whole autoscaling config of a fake cluster: a head without CPUs and up to ``max_nodes``
    worker nodes of ``cpus_per_node`` CPUs, launched on demand, removed after ``idle_timeout_minutes``
    idle.  (The keys every autoscaling config carries are here, empty: the fake provider runs no
    setup commands.)"""
    return {
        "cluster_name": f"fake-{gcs_port}",
        "max_workers": max_nodes,
        "upscaling_speed": 1.0,
        "idle_timeout_minutes": idle_timeout_minutes,
        "provider": {
            "type": "fake_multinode",
            "gcs_address": f"127.0.0.1:{gcs_port}",  # else the nodes join port 6379
            "use_node_id_as_ip": True,
            "disable_node_updaters": True,
            "disable_launch_config_check": True,
            "launch_multiple": True,  # n nodes for "launch n" (by default the fake provider makes one a call)
        },
        "head_node_type": HEAD_TYPE,
        "available_node_types": {
            HEAD_TYPE: {"resources": {"CPU": 0}, "node_config": {}, "max_workers": 0},
            WORKER_TYPE: {
                "resources": {"CPU": cpus_per_node, "object_store_memory": OBJECT_STORE_BYTES},
                "node_config": {},
                "min_workers": 0,
                "max_workers": max_nodes,
            },
        },
        "auth": {"ssh_user": "ray"},
        "docker": {},
        "file_mounts": {},
        "cluster_synced_files": [],
        "file_mounts_sync_continuously": False,
        "rsync_exclude": [],
        "rsync_filter": [],
        "initialization_commands": [],
        "setup_commands": [],
        "head_setup_commands": [],
        "worker_setup_commands": [],
        "head_start_ray_commands": [],
        "worker_start_ray_commands": [],
    }


# monitor.log, as each is decided: "StandardAutoscaler: Queue 1 new nodes for launch" (the launcher logs
# "Launching 1 nodes, type ..." once the node is up) and "StandardAutoscaler: Terminating the node with id ID and
# ip IP. (idle)"; its summaries ("Adding ...", "Removing ...") come later still
_LAUNCHED = re.compile(r"StandardAutoscaler: Queue (\d+) new nodes for launch")
_TERMINATED = re.compile(r"Terminating the node with id \S+ and ip \S+\. \((\w+)\)")
# each line starts with its local time: "2026-11-27 05:59:49,512\tINFO ..."
_STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3})")


class FakeAutoscalingCluster:
    """A fake autoscaling head on 127.0.0.1 with its own port and temp folder (token auth on, as
    ``ray start --head`` has it); :meth:`stop` ends its processes and its nodes' only."""

    def __init__(self, max_nodes: int = 2, cpus_per_node: float = 1, idle_timeout_minutes: float = 0.1) -> None:
        self.max_nodes, self.cpus_per_node, self.idle_timeout_minutes = max_nodes, cpus_per_node, idle_timeout_minutes
        self.temp_dir = tempfile.mkdtemp(prefix="rayfake-", dir="/tmp")  # unix socket paths must stay short
        self.port = free_port()
        self.config_path = os.path.join(self.temp_dir, "autoscaling.yaml")

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def driver_env(self, **extra: str) -> dict[str, str]:
        """The environment of a driver (or any Ray client) that joins this cluster."""
        env = dict(os.environ, RAY_ADDRESS=self.address, RAY_AUTH_MODE="token", **extra)
        env.pop("ELASTIC_KEEP_RAY", None)
        return env

    def start(self, timeout_s: float = 180) -> FakeAutoscalingCluster:
        with open(self.config_path, "w") as f:
            yaml.safe_dump(
                autoscaling_config(self.port, self.max_nodes, self.cpus_per_node, self.idle_timeout_minutes), f
            )
        bindir = os.path.dirname(sys.executable)
        # the project on the path of every process of the cluster (the run's monitor actor, its workers),
        # as on a real cluster where it is installed on every node
        path = os.pathsep.join([ROOT, *filter(None, [os.environ.get("PYTHONPATH")])])
        env = dict(
            os.environ,
            PYTHONPATH=path,
            PATH=f"{bindir}:{os.environ['PATH']}",
            RAY_FAKE_CLUSTER="1",
            AUTOSCALER_UPDATE_INTERVAL_S="1",
            RAY_AUTH_MODE="token",
        )
        env.pop("RAY_ADDRESS", None)
        cmd = [
            os.path.join(bindir, "ray"),
            "start",
            "--head",
            "--node-ip-address=127.0.0.1",
            f"--port={self.port}",
            "--num-cpus=0",
            f"--autoscaling-config={self.config_path}",
            "--include-dashboard=false",
            "--disable-usage-stats",
            f"--temp-dir={self.temp_dir}",
            f"--object-store-memory={OBJECT_STORE_BYTES}",
            # own ports for the head's agents: another Ray on this machine cannot hold them
            f"--dashboard-agent-listen-port={free_port()}",
            f"--dashboard-agent-grpc-port={free_port()}",
            f"--metrics-export-port={free_port()}",
            f"--runtime-env-agent-port={free_port()}",
        ]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
        if out.returncode != 0:
            self.stop()
            raise RuntimeError(f"ray start --head failed ({out.returncode}): {out.stdout}{out.stderr}")
        return self

    # -- what the autoscaler did ---------------------------------------------------------------

    def monitor_log(self) -> str:
        """The autoscaler's log so far (``monitor.log`` of the head's session)."""
        path = os.path.join(self.temp_dir, "session_latest", "logs", "monitor.log")
        try:
            with open(path, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def launched(self) -> int:
        """Worker nodes the autoscaler has launched so far."""
        return sum(int(n) for n in _LAUNCHED.findall(self.monitor_log()))

    def terminated(self) -> int:
        """Worker nodes the autoscaler has terminated so far."""
        return len(_TERMINATED.findall(self.monitor_log()))

    def node_events(self) -> list[tuple[float, str, int]]:
        """``(time, "launched" | "terminated", nodes)`` in the order the autoscaler logged them (``time``:
        seconds since the epoch, as ``time.time()``)."""
        out = []
        for line in self.monitor_log().splitlines():
            stamp = _STAMP.match(line)
            if stamp is None:
                continue
            for kind, pattern in (("launched", _LAUNCHED), ("terminated", _TERMINATED)):
                found = pattern.search(line)
                if found:
                    when = time.mktime(time.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S")) + int(stamp.group(2)) / 1000
                    out.append((when, kind, int(found.group(1)) if kind == "launched" else 1))
        return out

    def worker_nodes(self, wait_gone_s: float = 0.0) -> tuple[int, int]:
        """``(ever, alive)``: the worker nodes that ever joined the cluster (Ray's GCS keeps the dead ones)
        and those alive; with ``wait_gone_s``, once none is alive or after that long.  Asked from a
        process of its own (a test process may hold another Ray)."""
        code = (
            "import sys, time, ray; ray.init(log_to_driver=False); end = time.time() + float(sys.argv[1])\n"
            "while True:\n"
            "    workers = [n for n in ray.nodes() if n['NodeID'] != ray.get_runtime_context().get_node_id()"
            " and not n['Resources'].get('node:__internal_head__')]\n"
            "    alive = sum(1 for n in workers if n['Alive'])\n"
            "    if not alive or time.time() >= end: break\n"
            "    time.sleep(1)\n"
            "print('NODES', len({n['NodeID'] for n in workers}), alive)"
        )
        out = subprocess.run(
            [sys.executable, "-c", code, str(wait_gone_s)],
            env=self.driver_env(),
            capture_output=True,
            text=True,
            timeout=wait_gone_s + 120,
        )
        if out.returncode != 0:
            raise RuntimeError(out.stderr[-2000:])
        # the line it printed (the autoscaler's events may reach this driver's output too)
        ever, alive = next(ln.split()[1:3] for ln in out.stdout.splitlines() if ln.startswith("NODES "))
        return int(ever), int(alive)

    def wait_idle_removed(self, timeout_s: float = 180) -> bool:
        """Wait until no worker node is alive (the idle ones removed); whether none is."""
        return self.worker_nodes(wait_gone_s=timeout_s)[1] == 0

    # -- stop --------------------------------------------------------------------------------------

    def _pids(self) -> list[int]:
        """This cluster's processes: those naming its temp folder or port, and everything they started
        (the nodes the autoscaler launched are processes of its monitor)."""
        port = re.compile(rf"(?<!\d):{self.port}(?!\d)")
        found, parent = set(), {}
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read().decode(errors="replace")
                with open(f"/proc/{pid}/stat") as f:
                    parent[int(pid)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            if self.temp_dir in cmd or port.search(cmd):
                found.add(int(pid))
        grew = True
        while grew:
            new = {p for p, pp in parent.items() if pp in found} - found
            grew = bool(new)
            found |= new
        found.discard(os.getpid())
        return sorted(found)

    def stop(self, grace_s: float = 3.0) -> None:
        """SIGTERM to the cluster's processes, SIGKILL to those still there after ``grace_s``."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            pids = self._pids()
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except OSError:
                    pass
            end = time.time() + grace_s
            while pids and time.time() < end:
                time.sleep(0.2)
                pids = self._pids()
        shutil.rmtree(self.temp_dir, ignore_errors=True)
