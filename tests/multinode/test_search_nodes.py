"""A search on several nodes: ``python -m search run --trials 2 --parallel 2`` on a real cluster of
three 1-CPU worker nodes (and a head without CPUs: the driver's node, where the trial actors, their
Ray Train controllers and their runs' monitors live) runs its two trials' groups on two different
nodes.  One of those nodes lost without notice mid-study does not lose its trial: Ray Train restarts
the trial's group on the node left free, from the trial's own newest checkpoint (not from step 0),
and the study completes with both trials COMPLETE in its Optuna storage, each step logged once.
The driver says so in one line, and prints no stack trace."""

from __future__ import annotations

import glob
import os
import re
import subprocess
import sys
import time

import optuna
import pytest
from mlflow.tracking import MlflowClient

from search.study_storage import open_storage
from tests.helpers import metric_series, migrated_store
from tests.multinode.runs import ROOT, alive_actor_nodes, free_cpus, lift_brake, worker_nodes
from tests.search_helpers import base_config, write_space

pytestmark = [pytest.mark.multinode, pytest.mark.timeout(600)]

STEPS = 45  # one epoch of digits' 1438 training samples at B = 32


def _space(tmp) -> str:
    """Two grid points; each trial one 1-CPU worker (a node each), a checkpoint every 5 steps, every
    step slowed by the brake file until the test has seen the lost node's trial restart."""
    brake = os.path.join(tmp, "brake")
    open(brake, "w").close()
    base = base_config(
        tmp,
        scaling={"min_workers": 1, "max_workers": 1, "cpus_per_worker": 1, "max_failures": 3},
        train={"epochs": 1, "seed": 0, "log_every": 5, "eval_every": 20},
        checkpoint={"every_steps": 5},
    )
    base["model"] = {"factory": "tests.byo_workloads:slow_mlp", "params": {"sleep_s": 0.3, "brake": brake}}
    return write_space(
        tmp,
        "nodes",
        base=base,
        objective={"metric": "val/accuracy", "direction": "maximize"},
        sampler={"name": "grid", "seed": 0},
        pruner="none",
        params={"optimizer.lr": {"choices": [0.05, 0.1]}},
    )


def _newest_checkpoints(tmp) -> dict[str, int]:
    """Each trial's run id -> the step of its newest checkpoint so far."""
    out: dict[str, int] = {}
    for path in glob.glob(f"{tmp}/ray_runs/elastic-*/checkpoint_step*"):
        m = re.search(r"/elastic-([0-9a-f]+)[^/]*/checkpoint_step(\d+)", path)
        if m:
            out[m.group(1)] = max(out.get(m.group(1), 0), int(m.group(2)))
    return out


def _wait(p: subprocess.Popen, said, what: str, ready, timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while not ready():
        assert p.poll() is None, f"the search ended before {what}:\n{said()}"
        assert time.time() < deadline, f"{what}: not in {timeout:.0f} s\n{said()}"
        time.sleep(0.5)


def test_a_node_lost_mid_study_does_not_lose_its_trial(cluster, tmp_path):
    worker_nodes(cluster, 3, cpus=1)
    deadline = time.time() + 120  # a test before may still be releasing its workers' CPUs
    while free_cpus(cluster) < 3:
        assert time.time() < deadline, "the three worker nodes' CPUs are not free after 120 s"
        time.sleep(1)
    uri, storage = migrated_store(f"sqlite:///{tmp_path}/mlflow.db"), str(tmp_path / "optuna.journal")
    env = dict(os.environ, RAY_ADDRESS=cluster.address, PYTHONPATH=ROOT)
    env.pop("ELASTIC_KEEP_RAY", None)
    log = tmp_path / "out.txt"
    p = subprocess.Popen(
        [sys.executable, "-m", "search", "run", _space(tmp_path), "--storage", storage, "--tracking-uri", uri]
        + ["--trials", "2", "--parallel", "2", "--no-progress"],
        cwd=tmp_path,
        env=env,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        text=True,
    )

    def said() -> str:
        return log.read_text()

    try:
        _wait(p, said, "both trials' first checkpoints", lambda: len(_newest_checkpoints(tmp_path)) == 2)
        head = cluster.head_node.node_id
        assert alive_actor_nodes(cluster, "TrialActor") == {head}, "the trial actors live on the driver's node"
        groups = alive_actor_nodes(cluster, "RayTrainWorker")
        assert len(groups) == 2 and head not in groups, f"the two trials' groups on two worker nodes: {groups}"
        victim = next(n for n in cluster.worker_nodes if n.node_id in groups)
        before = _newest_checkpoints(tmp_path)
        cluster.remove_node(victim, allow_graceful=False)  # its raylet and every process under it
        _wait(p, said, "the lost node's trial restarted", lambda: "its group restarted" in said(), timeout=180)
    finally:
        lift_brake(tmp_path)  # the rest of the study trains at full speed
    p.wait(300)
    text = said()
    assert p.returncode == 0, text

    study = optuna.load_study(study_name="nodes", storage=open_storage(storage))
    assert [t.state.name for t in study.trials] == ["COMPLETE", "COMPLETE"], [
        (t.state.name, t.user_attrs.get("error")) for t in study.trials
    ]
    client = MlflowClient(uri)
    restarted = []
    for t in study.trials:
        rid = t.user_attrs["mlflow_run_id"]
        run = client.get_run(rid)
        assert run.info.status == "FINISHED" and run.data.tags["search.state"] == "COMPLETE", (t.number, run.info)
        assert [s for s, _ in metric_series(uri, rid, "train/loss")] == list(range(1, STEPS + 1)), "each step once"
        assert t.user_attrs["steps"] == STEPS
        if "elastic.restarts" in run.data.tags:
            restarted.append((t.number, rid, run.data.tags["elastic.restarts"]))
    assert len(restarted) == 1, f"only the lost node's trial restarted: {restarted}"
    number, rid, count = restarted[0]
    assert count == "1"
    # the restart's record is at the step its group restored: the trial's newest checkpoint, never 0
    [(step, _)] = metric_series(uri, rid, "restarts")
    assert step >= before[rid] > 0, (step, before)

    assert "Traceback" not in text, text
    lines = [line for line in text.splitlines() if "its group restarted" in line]
    assert len(lines) == 1 and re.fullmatch(
        rf"trial {number}: its group restarted after a worker failed \(.+\); "
        rf"it goes on from its checkpoint at step {step} with 1 worker \(restart 1\)",
        lines[0],
    ), text
    print(lines[0])
