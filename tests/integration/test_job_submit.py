"""`ray job submit` against a local head started with `ray start --head` on 127.0.0.1:
the quickstart runs as a job, SUCCEEDED, and lands in the MLflow store the command names."""

import os
import re
import shutil
import socket
import subprocess
import sys
import time

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_quickstart_via_ray_job_submit(tmp_path):
    import tempfile

    temp_dir = tempfile.mkdtemp(prefix="rayjob-", dir="/tmp")  # unix socket paths must stay short
    bindir = os.path.dirname(sys.executable)
    ray_bin = os.path.join(bindir, "ray")
    env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}", RAY_AUTH_MODE="token")
    env.pop("RAY_ADDRESS", None)
    gcs, dash = _free_port(), _free_port()
    start = subprocess.run([ray_bin, "start", "--head", "--node-ip-address=127.0.0.1", f"--port={gcs}",
                            "--dashboard-host=127.0.0.1", f"--dashboard-port={dash}", "--num-cpus=2",
                            "--disable-usage-stats", f"--temp-dir={temp_dir}",
                            # own ports for the agents, so another Ray on this machine (the test
                            # session's) cannot hold them and leave this head without a job agent
                            f"--dashboard-agent-listen-port={_free_port()}",
                            f"--dashboard-agent-grpc-port={_free_port()}",
                            f"--metrics-export-port={_free_port()}",
                            f"--runtime-env-agent-port={_free_port()}"],
                           env=env, capture_output=True, text=True, timeout=180)
    assert start.returncode == 0, start.stdout + start.stderr
    try:
        uri = f"sqlite:///{tmp_path}/mlflow.db"
        for _ in range(20):  # the head's job agent may need a few seconds after `ray start` returns
            out = _submit(ray_bin, dash, uri, tmp_path, env)
            if "No available agent to submit job" not in out.stdout + out.stderr:
                break
            time.sleep(3)
        log = out.stdout + out.stderr
        assert out.returncode == 0, log
        assert re.search(r"Job 'raysubmit_\w+' succeeded", log), log
        run_id = re.search(r"MLflow run id\s+(\w+)", log).group(1)
        from mlflow.tracking import MlflowClient

        run = MlflowClient(uri).get_run(run_id)
        assert run.info.status == "FINISHED"
        assert run.data.metrics["val/accuracy"] > 0.8 and run.data.metrics["workers"] == 2
    finally:
        _stop_head(temp_dir, gcs)
        shutil.rmtree(temp_dir, ignore_errors=True)


def _submit(ray_bin, dash, uri, tmp_path, env):
    return subprocess.run(
            [ray_bin, "job", "submit", "--address", f"http://127.0.0.1:{dash}", "--working-dir", ROOT, "--",
             "python", "-m", "orchestrator", "train", "configs/quickstart.yaml", "--no-progress",
             "--set", "train.epochs=2", "--set", f"tracking.uri={uri}",
             # a fixed batch of 64 on 2 workers from the start (the demo's growing batch is not the point here)
             "--set", "batch.policy=fixed", "--set", "batch.max_size=null", "--set", "batch.size=64",
             "--set", "batch.max_local_batch=32", "--set", "optimizer.mf_rule=fixed",
             "--set", f"checkpoint.storage_path={tmp_path}/ray_runs"],
            env=env, capture_output=True, text=True, timeout=600)


def _stop_head(temp_dir: str, gcs_port: int) -> None:
    """Stop only this head's processes (`ray stop` would stop every Ray on the machine,
    including the test session's own)."""
    import signal
    import time

    def ours() -> list[int]:
        pids, parent = [], {}
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read().decode(errors="replace")
                with open(f"/proc/{pid}/environ", "rb") as f:
                    envb = f.read().decode(errors="replace")
                with open(f"/proc/{pid}/stat") as f:
                    parent[int(pid)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            if temp_dir in cmd or temp_dir in envb or f":{gcs_port}" in cmd:
                pids.append(int(pid))
        found = set(pids)
        grew = True
        while grew:  # and everything those started
            new = {p for p, pp in parent.items() if pp in found} - found
            grew = bool(new)
            found |= new
        return sorted(found)

    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in ours():
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        time.sleep(3)
