"""A local run's Ray reaches no one else (orchestrator/run/ray_env.py ``ensure_ray``): every process it
starts (GCS, raylet, agents, Ray Train's controller and workers, the run's monitor) listens on
127.0.0.1 only, and the cluster asks for Ray's token.

The one listener that cannot be kept there is torch.distributed's rendezvous store (``TCPStore``),
which Ray Train's process-group setup starts in the rank-0 worker: PyTorch binds it to every
address whatever host it is given.  It is allowed here, one per Ray Train worker, and nothing else.

The run happens in a child process with its own Ray (this is a test of how that Ray starts; the
session's shared Ray is another one), which it stops with ``ray.shutdown()``."""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys

import psutil
import pytest

pytestmark = pytest.mark.integration

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SCRIPT = r"""
import json, os, sys, threading, time
import psutil
from orchestrator.run.ray_env import ensure_ray
from orchestrator.run.runner import run_training
from tests.helpers import make_config
import pathlib, ray

assert ensure_ray(num_cpus=2), "a Ray was already running in this process"
seen, names, done = {}, {}, threading.Event()

def sample():
    me = psutil.Process()
    while not done.is_set():
        for p in me.children(recursive=True):
            try:
                names.setdefault(p.pid, set()).add(p.name())  # ray::IDLE, then ray::RayTrainWorker...
                for c in p.net_connections(kind="inet"):
                    if c.status == psutil.CONN_LISTEN:
                        seen[(p.pid, c.laddr.ip, c.laddr.port)] = p.name()
            except psutil.Error:
                pass
        time.sleep(0.3)

thread = threading.Thread(target=sample, daemon=True)
thread.start()
tmp = pathlib.Path(sys.argv[1])
uri = f"sqlite:///{tmp}/mlflow.db"
cfg = make_config(tmp, uri, scaling={"min_workers": 2, "max_workers": 2, "cpus_per_worker": 0.5})
status = run_training(cfg, progress=False).status
done.set()
thread.join()
gcs = [p for p in psutil.Process().children(recursive=True) if p.name() == "gcs_server"]
out = {"status": status, "node_ip": ray.util.get_node_ip_address(),
       "auth": [p.environ().get("RAY_AUTH_MODE") for p in gcs],
       "pids": [p.pid for p in psutil.Process().children(recursive=True)],
       "listeners": [[pid, name, ip, port] for (pid, ip, port), name in seen.items()],
       "names": {pid: sorted(n) for pid, n in names.items()}}
ray.shutdown()
print("RESULT " + json.dumps(out))
"""


def is_loopback(ip: str) -> bool:
    addr = ipaddress.ip_address(ip)
    mapped = getattr(addr, "ipv4_mapped", None)  # ::ffff:127.0.0.1 on a dual-stack socket
    return (mapped or addr).is_loopback


def test_a_local_runs_ray_listens_on_loopback_only_and_asks_for_a_token(tmp_path):
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER")
    }
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and line, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = json.loads(line[0][len("RESULT ") :])
    for pid in out["pids"]:  # whatever of that Ray outlived its shutdown, by its process id
        try:
            psutil.Process(pid).kill()
        except psutil.Error:
            pass

    assert out["status"] == "FINISHED"
    assert out["node_ip"] == "127.0.0.1"
    assert out["auth"] == ["token"]
    names = {name for _, name, _, _ in out["listeners"]}
    assert {"gcs_server", "raylet"} <= names and any(n.startswith("ray::RayTrainWorker") for n in names), names
    open_to_all = [(pid, name, ip, port) for pid, name, ip, port in out["listeners"] if not is_loopback(ip)]
    by_process: dict[int, list] = {}
    for pid, name, ip, port in open_to_all:
        by_process.setdefault(pid, []).append((name, ip, port))

    def train_worker(pid: int) -> bool:
        return any(n.startswith("ray::RayTrainWorker") for n in out["names"][str(pid)])

    assert all(len(v) == 1 and train_worker(pid) for pid, v in by_process.items()), (open_to_all, out["names"])
    assert len(by_process) <= 1, open_to_all  # rank 0's rendezvous store only
