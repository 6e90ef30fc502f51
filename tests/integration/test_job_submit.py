"""`ray job submit` against a local head started with `ray start --head` on 127.0.0.1 (token
auth, as the README says): the quickstart from the repository root, and the example user project
(examples/user_project) as the job's working directory, each run as a job, SUCCEEDED, and land
FINISHED in the MLflow store the command names; a job stopped and submitted again with its run key
finishes its own run."""

import glob
import json
import os
import re
import shutil
import subprocess
import sys
import time

import pytest

from tests.helpers import free_port, migrated_store

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


@pytest.fixture(scope="module")
def ray_head():
    """A local head (`ray start --head`, token auth, its own ports and temp dir); stopped afterwards.
    Yields (the `ray` executable, the dashboard port, the environment to submit with)."""
    import tempfile

    temp_dir = tempfile.mkdtemp(prefix="rayjob-", dir="/tmp")  # unix socket paths must stay short
    bindir = os.path.dirname(sys.executable)
    ray_bin = os.path.join(bindir, "ray")
    env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}", RAY_AUTH_MODE="token")
    env.pop("RAY_ADDRESS", None)
    gcs, dash = free_port(), free_port()
    start = subprocess.run(
        [
            ray_bin,
            "start",
            "--head",
            "--node-ip-address=127.0.0.1",
            f"--port={gcs}",
            "--dashboard-host=127.0.0.1",
            f"--dashboard-port={dash}",
            "--num-cpus=2",
            "--disable-usage-stats",
            f"--temp-dir={temp_dir}",
            # own ports for the agents, so another Ray on this machine (the test
            # session's) cannot hold them and leave this head without a job agent
            f"--dashboard-agent-listen-port={free_port()}",
            f"--dashboard-agent-grpc-port={free_port()}",
            f"--metrics-export-port={free_port()}",
            f"--runtime-env-agent-port={free_port()}",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert start.returncode == 0, start.stdout + start.stderr
    try:
        yield ray_bin, dash, env
    finally:
        _stop_head(temp_dir, gcs)
        shutil.rmtree(temp_dir, ignore_errors=True)


def _submit(ray_bin, dash, env, working_dir, entrypoint, runtime_env=None, extra=()):
    """`ray job submit` of ``entrypoint`` (``extra``: more of its options); retried while the head's
    job agent is not up yet."""
    extra = [*extra, *(["--runtime-env-json", json.dumps(runtime_env)] if runtime_env else [])]
    cmd = [
        ray_bin,
        "job",
        "submit",
        "--address",
        f"http://127.0.0.1:{dash}",
        "--working-dir",
        working_dir,
        *extra,
        "--",
        *entrypoint,
    ]
    for _ in range(20):  # the head's job agent may need a few seconds after `ray start` returns
        out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        if "No available agent to submit job" not in out.stdout + out.stderr:
            break
        time.sleep(3)
    return out


def _finished_run(out, uri):
    log = out.stdout + out.stderr
    assert out.returncode == 0, log
    assert re.search(r"Job 'raysubmit_\w+' succeeded", log), log
    run_id = re.search(r"MLflow run id\s+(\w+)", log).group(1)
    from mlflow.tracking import MlflowClient

    run = MlflowClient(uri).get_run(run_id)
    assert run.info.status == "FINISHED"
    return run


def test_quickstart_via_ray_job_submit(ray_head, tmp_path):
    ray_bin, dash, env = ray_head
    uri = migrated_store(f"sqlite:///{tmp_path}/mlflow.db")
    out = _submit(
        ray_bin,
        dash,
        env,
        ROOT,
        [
            "python",
            "-m",
            "orchestrator",
            "train",
            "configs/quickstart.yaml",
            "--no-progress",
            "--set",
            "train.epochs=2",
            "--set",
            f"tracking.uri={uri}",
            # a fixed batch of 64 on 2 workers from the start (the demo's growing batch is not the point here)
            "--set",
            "batch.policy=fixed",
            "--set",
            "batch.max_size=null",
            "--set",
            "batch.size=64",
            "--set",
            "batch.max_local_batch=32",
            "--set",
            "optimizer.mf_rule=fixed",
            "--set",
            f"checkpoint.storage_path={tmp_path}/ray_runs",
        ],
    )
    run = _finished_run(out, uri)
    assert run.data.metrics["val/accuracy"] > 0.8 and run.data.metrics["workers"] == 2


def test_example_project_via_ray_job_submit(ray_head, tmp_path):
    """examples/user_project as the job's working directory, its package on the path by the
    runtime environment (the README's third way); the project itself is installed on the node
    (here: on PYTHONPATH, which the head passes to its jobs)."""
    ray_bin, dash, env = ray_head
    uri = migrated_store(f"sqlite:///{tmp_path}/mlflow.db")
    pythonpath = os.pathsep.join(["src", ROOT])  # README: "src" (the project is pip-installed there)
    out = _submit(
        ray_bin,
        dash,
        env,
        os.path.join("examples", "user_project"),
        [
            "python",
            "-m",
            "orchestrator",
            "train",
            "config.yaml",
            "--no-progress",
            "--set",
            "train.epochs=2",
            "--set",
            "data.params.n_train=2048",
            "--set",
            "data.params.n_val=512",
            "--set",
            "scaling.cpus_per_worker=0.5",
            "--set",
            "batch.size=128",
            "--set",
            "batch.max_local_batch=64",
            "--set",
            "optimizer.lr=0.05",  # 32 steps, lr 0.1
            "--set",
            f"tracking.uri={uri}",
            "--set",
            f"checkpoint.storage_path={tmp_path}/ray_runs",
        ],
        runtime_env={"env_vars": {"PYTHONPATH": pythonpath}},
    )
    run = _finished_run(out, uri)
    assert run.data.params["data.factory"] == "my_workload.data:rings"
    assert run.data.metrics["val/accuracy"] > 0.6 and run.data.metrics["workers"] == 2  # 3 rings: chance 1/3
    assert run.data.metrics["train/loss"] < 1.0


def _stop_head(temp_dir: str, gcs_port: int) -> None:
    """Stop only this head's processes (`ray stop` would stop every Ray on the machine,
    including the test session's own)."""
    import signal
    import time

    port = re.compile(rf"(?<!\d):{gcs_port}(?!\d)")  # never another process's :{gcs_port}1

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
            if temp_dir in cmd or temp_dir in envb or port.search(cmd):
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
        deadline = time.time() + 3  # the processes' own time to end, not waited out once they are gone
        while ours() and time.time() < deadline:
            time.sleep(0.2)


def test_a_stopped_job_submitted_again_with_its_run_key_finishes_its_own_run(ray_head, tmp_path):
    """``ray job submit ... train --run-key K``, stopped by ``ray job stop`` after a checkpoint (the
    driver's SIGTERM, a SIGKILL 3 s later), then submitted again with the same key:
    the same MLflow run resumes, FINISHES, every step trained, no (metric, step) logged twice."""
    import yaml
    from mlflow.tracking import MlflowClient

    ray_bin, dash, env = ray_head
    uri = migrated_store(f"sqlite:///{tmp_path}/mlflow.db")
    brake = tmp_path / "brake"  # every step >= 30 ms while it exists: the stop lands mid-run on any machine
    brake.touch()
    epochs, steps = 4, 4 * 29  # ceil(1438 / 50) steps an epoch
    cfg = {
        "data": {"name": "digits", "val_fraction": 0.2},
        "model": {"factory": "tests.byo_workloads:slow_mlp", "params": {"sleep_s": 0.03, "brake": str(brake)}},
        "optimizer": {"name": "sgd", "lr": 0.05, "base_batch_size": 50},
        "batch": {"size": 50},
        "scaling": {"min_workers": 1, "max_workers": 1, "cpus_per_worker": 0.5},
        "train": {"epochs": epochs, "log_every": 5},
        "checkpoint": {"every_steps": 5, "storage_path": f"{tmp_path}/ray_runs"},
        "tracking": {"uri": uri, "experiment": "keyed-job"},
    }
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    train = ["python", "-m", "orchestrator", "train", str(tmp_path / "cfg.yaml"), "--no-progress", "--run-key", "job-7"]
    job = "keyed-first"
    out = _submit(ray_bin, dash, env, ROOT, train, extra=["--no-wait", "--submission-id", job])
    assert out.returncode == 0, out.stdout + out.stderr
    deadline = time.time() + 240
    while not glob.glob(f"{tmp_path}/ray_runs/elastic-*/checkpoint_step*"):
        assert time.time() < deadline, "no checkpoint in 240 s"
        time.sleep(0.5)
    stop = subprocess.run(
        [ray_bin, "job", "stop", "--address", f"http://127.0.0.1:{dash}", job],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert stop.returncode == 0, stop.stdout + stop.stderr
    client = MlflowClient(uri)
    (first,) = client.search_runs([client.get_experiment_by_name("keyed-job").experiment_id])
    # KILLED when the driver closed it within the stop's grace (3 s before Ray's SIGKILL), else RUNNING
    assert client.get_run(first.info.run_id).info.status in ("KILLED", "RUNNING")
    done = {int(p.rsplit("checkpoint_step", 1)[1][:8]) for p in glob.glob(f"{tmp_path}/ray_runs/*/checkpoint_step*")}
    assert max(done) < steps, "the job finished before it was stopped"

    brake.unlink()
    again = _submit(ray_bin, dash, env, ROOT, train)
    log = again.stdout + again.stderr
    assert again.returncode == 0 and f"run key job-7: resuming run {first.info.run_id}" in log, log
    run = client.get_run(first.info.run_id)
    assert run.info.status == "FINISHED" and run.data.tags["elastic.resumes"] == "1"
    assert len(client.search_runs([run.info.experiment_id])) == 1, "the same run, no new one"
    for key in run.data.metrics:
        logged = [m.step for m in client.get_metric_history(run.info.run_id, key)]
        assert len(logged) == len(set(logged)), f"{key} logged twice at a step"
    losses = [m.step for m in client.get_metric_history(run.info.run_id, "train/loss")]
    assert sorted(losses) == list(range(1, steps + 1)), "every step trained, each once"
