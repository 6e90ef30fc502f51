"""Nodes that leave and come back, on a real 4-node Ray cluster (a head without CPUs for the driver,
three 1-CPU worker nodes) running a W=3 (min 2) run: a lost node shrinks the group, the run goes on
from its newest checkpoint; a node that comes back grows it again at a checkpoint; a driver killed
outright is resumed from checkpoints in a bucket.  Each run ends FINISHED with the losses of an uninterrupted run
(up to float reduction order), no step logged twice,
and the run's monitor on the driver's node all along."""

from __future__ import annotations

import glob
import json
import os
import re
import time
import uuid

import numpy as np
import pytest
import yaml

from tests.helpers import metric_series
from tests.multinode.runs import (
    STEPS,
    alive_actor_nodes,
    busy_nodes,
    checkpointed,
    config,
    drain,
    driver,
    finish,
    free_cpus,
    lift_brake,
    logged_workers,
    refresh_train_view,
    resume,
    run_id,
    wait_for,
    worker_nodes,
    worker_stretches,
    workers_logged,
)

pytestmark = [pytest.mark.multinode, pytest.mark.timeout(900)]


def _three_nodes(cluster) -> list:
    """The cluster's worker nodes: three live 1-CPU nodes (a test before may have lost one, or shaped
    the tier's cluster otherwise)."""
    worker_nodes(cluster, 3, cpus=1)
    deadline = time.time() + 120  # and free: a run before may still be releasing its workers' CPUs
    while (free := free_cpus(cluster)) < 3:
        assert time.time() < deadline, f"only {free} CPUs free on the three worker nodes after 120 s"
        time.sleep(1)
    refresh_train_view(cluster)  # a node added just now counts when the run starts (W=3 from its first step)
    return sorted(cluster.worker_nodes, key=lambda n: n.node_id)


@pytest.fixture(scope="module")
def reference(cluster, tmp_path_factory) -> tuple[str, str]:
    """The uninterrupted run (MLflow URI, run id), on the same cluster."""
    _three_nodes(cluster)
    tmp = tmp_path_factory.mktemp("ref")
    rc, text = finish(driver(cluster, str(tmp), config(tmp)), tmp)
    assert rc == 0, text
    return f"sqlite:///{tmp}/mlflow.db", run_id(tmp)


def _same_training(tmp, text: str, reference: tuple[str, str], rid: str | None = None) -> tuple[str, str]:
    from mlflow.tracking import MlflowClient

    assert "Traceback" not in text, text
    uri, rid = f"sqlite:///{tmp}/mlflow.db", rid or run_id(tmp)
    assert MlflowClient(uri).get_run(rid).info.status == "FINISHED"
    losses, want = metric_series(uri, rid, "train/loss"), metric_series(*reference, "train/loss")
    assert [s for s, _ in losses] == list(range(1, STEPS + 1)), "no step lost or logged twice"
    # W changes the order of the gradients' sums: float noise, ~1e-6 on losses that fall to ~1e-4
    np.testing.assert_allclose([v for _, v in losses], [v for _, v in want], rtol=1e-4, atol=1e-5)
    assert metric_series(uri, rid, "val/loss")[-1][1] == pytest.approx(
        metric_series(*reference, "val/loss")[-1][1], rel=1e-4
    )
    return uri, rid


def test_a_lost_node_shrinks_the_group_and_a_node_that_comes_back_grows_it(cluster, tmp_path, reference):
    """The node lost holds a worker (and Ray Train's preemption watcher where one runs: the
    orchestrator turns it off, orchestrator/run/ray_env.py); the monitor, on the head, keeps the run's
    link all along.  The run
    goes on at W=2 from its newest checkpoint; a node that joins then grows it back to W=3."""
    nodes = _three_nodes(cluster)
    tmp = tmp_path / "lost"
    run = driver(cluster, str(tmp), config(tmp, sleep_s=0.1, brake=True))
    wait_for(run, tmp, "a first checkpoint", lambda: checkpointed(tmp))
    head = cluster.head_node.node_id
    assert alive_actor_nodes(cluster, "MonitorState") == {head}, "the run's monitor must live on the driver's node"
    watcher = alive_actor_nodes(cluster, "PreemptionWatcher")
    victim = next((n for n in nodes if n.node_id in watcher), nodes[-1])
    cluster.remove_node(victim, allow_graceful=False)  # its raylet and every process under it
    wait_for(run, tmp, "the run going on at W=2", lambda: 2 in workers_logged(tmp))
    assert alive_actor_nodes(cluster, "MonitorState") == {head}, "the monitor outlives the lost node"
    cluster.add_node(num_cpus=1)  # the node comes back (a new raylet with the same resources)
    wait_for(run, tmp, "the group grown back to W=3", lambda: worker_stretches(tmp)[-3:] == [3, 2, 3])
    lift_brake(tmp)  # all the test waits for has happened: the rest of the run trains at full speed
    rc, text = finish(run, tmp)
    assert rc == 0, text
    uri, rid = _same_training(tmp, text, reference)
    assert logged_workers(uri, rid) == [3, 2, 3], "W goes 3 -> 2 -> 3"
    assert "worker_pool.cc" not in text, "Ray's message on the lost node is one line, not the raylet's log"
    assert "capacity returned: 3 workers fit where the group has 2" in text, text
    from mlflow.tracking import MlflowClient

    # at least the one grow that W shows (a look that saw the new node before its raylet took the
    # workers may decide once more: the group still grows once, as W above says)
    assert int(MlflowClient(uri).get_run(rid).data.tags["elastic.capacity_returned"]) >= 1
    assert alive_actor_nodes(cluster, "MonitorState") == set(), "the run's monitor ends with the run"


def test_a_drained_node_is_left_before_its_deadline_without_a_restart(cluster, tmp_path, reference):
    """A notice: Ray drains a worker node with 30 s left (what the autoscaler does with a cloud's
    warning that it reclaims a spot node), and the node dies once the run is off it.  The run leaves it
    first, by a planned resize to W=2 on the other nodes at a checkpoint: no group restart, no step
    trained twice, FINISHED with the uninterrupted run's losses; the driver says so in one line and
    MLflow records it."""
    nodes = _three_nodes(cluster)
    tmp = tmp_path / "drained"
    cfg = config(tmp, sleep_s=0.1, brake=True)
    cfg["train"]["sample_log_dir"] = f"{tmp}/samples"  # each step each rank trains, a line
    run = driver(cluster, str(tmp), cfg)
    wait_for(run, tmp, "a first checkpoint", lambda: checkpointed(tmp))
    victim = nodes[-1]  # at W=3 on three 1-CPU nodes every node holds a worker
    deadline = time.time() + 30
    drain(cluster, victim.node_id, 30)
    wait_for(run, tmp, "the run going on at W=2", lambda: 2 in workers_logged(tmp), timeout=60)
    assert time.time() < deadline, "the run left the drained node only after its deadline"
    # the cloud takes the node (here as soon as the run has left it: waiting out the rest of the
    # notice would only train braked steps on the other nodes)
    cluster.remove_node(victim, allow_graceful=False)
    lift_brake(tmp)
    rc, text = finish(run, tmp)
    assert rc == 0, text
    uri, rid = _same_training(tmp, text, reference)
    assert logged_workers(uri, rid) == [3, 2], "W goes 3 -> 2 once, and stays"
    assert re.search(r"node \w{8} drained \(preemption, \d+ s\): moving W 3 -> 2 at step \d+", text), text
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    tags = client.get_run(rid).data.tags
    assert tags.get("elastic.restarts", "0") == "0", "a planned resize, not a restart after a failure"
    assert tags["elastic.drains"] == "1" and "moving W 3 -> 2" in tags["elastic.drain_reason"]
    assert [m.value for m in client.get_metric_history(rid, "drain/workers")] == [1.0]
    assert not client.get_metric_history(rid, "restarts")
    trained = [json.loads(line)["step"] for f in glob.glob(f"{tmp}/samples/*-rank0-*.jsonl") for line in open(f)]
    assert sorted(trained) == list(range(1, STEPS + 1)), "every step trained once (rank 0's lines, all groups)"


def test_a_drain_during_an_overlapping_resize_moves_the_run_off_both_drained_nodes(cluster, tmp_path, reference):
    """Five 1-CPU nodes, W=3 with overlapping resizes: a notice on a node of the group starts the new
    group of 2 beside the old one, on the two idle nodes; a second notice arrives for one of those
    while the overlap is under way.  The run hands over and leaves that node at once too (W stays 2,
    on nodes not drained): no step trained twice, no restart counted, FINISHED as the uninterrupted run."""
    worker_nodes(cluster, 5, cpus=1)
    deadline = time.time() + 120
    while free_cpus(cluster) < 5:
        assert time.time() < deadline, "the five worker nodes' CPUs are not free after 120 s"
        time.sleep(1)
    refresh_train_view(cluster)
    tmp = tmp_path / "overlap_drained"
    # the old group trains on (braked) while the new one starts: slow enough that it cannot finish first
    # (135 of the 300 steps trained before the handover at 0.15 s a micro-batch, this machine loaded 10x)
    cfg = config(tmp, sleep_s=0.2, brake=True, resize_mode="overlap")
    cfg["train"]["sample_log_dir"] = f"{tmp}/samples"
    run = driver(cluster, str(tmp), cfg)
    wait_for(run, tmp, "a first checkpoint", lambda: checkpointed(tmp))
    old = busy_nodes(cluster)
    assert len(old) == 3, old
    first = sorted(old)[0]
    drain(cluster, first, 60)
    idle = {n.node_id for n in cluster.worker_nodes} - old
    # the new group's workers come up on the idle nodes while the old group trains on
    wait_for(run, tmp, "the new group beside the old one", lambda: idle & busy_nodes(cluster))
    second = sorted(idle & busy_nodes(cluster))[0]
    drain(cluster, second, 60)
    drained = {first, second}
    wait_for(
        run,
        tmp,
        "the run off both drained nodes",
        lambda: len(on := busy_nodes(cluster)) == 2 and not on & drained and 2 in workers_logged(tmp),
        timeout=120,
    )
    for node in [n for n in cluster.worker_nodes if n.node_id in drained]:
        cluster.remove_node(node, allow_graceful=False)  # the cloud takes them
    lift_brake(tmp)
    rc, text = finish(run, tmp)
    assert rc == 0, text
    uri, rid = _same_training(tmp, text, reference)
    assert logged_workers(uri, rid) == [3, 2], "W goes 3 -> 2 and stays 2, off the drained nodes"
    from mlflow.tracking import MlflowClient

    tags = MlflowClient(uri).get_run(rid).data.tags
    assert tags.get("elastic.restarts", "0") == "0" and tags["elastic.drains"] == "2", tags
    trained = [json.loads(line)["step"] for f in glob.glob(f"{tmp}/samples/*-rank0-*.jsonl") for line in open(f)]
    assert sorted(trained) == list(range(1, STEPS + 1)), "every step trained once (rank 0's lines, all groups)"


# A driver joined to the node named in TEST_DRIVER_NODE (a test cluster's nodes share one address, where
# Ray joins the head; the head is never drained: Ray accepts its drain and ignores it), then the CLI.
_ON_NODE = (
    "import os, runpy, sys\n"
    "import ray._private.services as s\n"
    "pick = s.get_node_to_connect_for_driver\n"
    "name = os.environ['TEST_DRIVER_NODE']\n"
    "s.get_node_to_connect_for_driver = lambda gcs, **kw: pick(gcs, **{**kw, 'node_name': name})\n"
    "sys.argv = ['orchestrator', *sys.argv[1:]]\n"
    "runpy.run_module('orchestrator', run_name='__main__', alter_sys=True)\n"
)


def test_a_drain_of_the_drivers_own_node_stops_at_a_checkpoint_and_exits_resumable(cluster, tmp_path, reference):
    """The driver runs on a node of its own (no CPUs) that gets a preemption notice: it cannot be
    moved, so the group stops at a checkpoint (rank 0 saves at its next push) and the driver exits
    75 with one line that names the node and the exact resume command; MLflow says KILLED with the
    line as the drain's tag, no failure.  The command, run from another node, finishes the run as
    the uninterrupted one, every step logged once."""
    import subprocess
    import sys

    from mlflow.tracking import MlflowClient

    from tests.multinode.runs import ROOT

    _three_nodes(cluster)
    host = cluster.add_node(num_cpus=0, node_name="driver-node")
    cluster.wait_for_nodes()
    tmp = tmp_path / "driver_drained"
    try:
        cfg = config(tmp, sleep_s=0.1, brake=True)
        os.makedirs(tmp, exist_ok=True)
        with open(tmp / "cfg.yaml", "w") as f:
            yaml.safe_dump(cfg, f)
        env = dict(os.environ, RAY_ADDRESS=cluster.address, PYTHONPATH=ROOT, TEST_DRIVER_NODE="driver-node")
        env.pop("ELASTIC_KEEP_RAY", None)
        run = subprocess.Popen(
            [sys.executable, "-c", _ON_NODE, "train", str(tmp / "cfg.yaml"), "--no-progress"],
            cwd=tmp,
            env=env,
            stdout=open(tmp / "out.txt", "w"),
            stderr=open(tmp / "err.txt", "w"),
            text=True,
        )
        wait_for(run, tmp, "a first checkpoint", lambda: checkpointed(tmp))
        drain(cluster, host.node_id, 30)
        rc, text = finish(run, tmp, timeout=120)
        rid = run_id(tmp)
        line = re.search(  # the node named is the one the driver joined (the head is never drained)
            rf"the driver's node {host.node_id[:8]} is being drained \(preemption, \d+ s left\): stopped after step "
            r"(\d+) at its checkpoint at step (\d+); resume it from another node with: (.+ -m orchestrator resume \S+)",
            text,
        )
        assert rc == 75 and line, (rc, text)
        assert line.group(1) == line.group(2), "the stop's checkpoint holds every step logged"
        assert line.group(3).endswith(f" -m orchestrator resume {rid}") and "Traceback" not in text, text
        uri = f"sqlite:///{tmp}/mlflow.db"
        run_info = MlflowClient(uri).get_run(rid)
        assert run_info.info.status == "KILLED" and "elastic.failure" not in run_info.data.tags
        assert run_info.data.tags["elastic.drain_reason"] == line.group(0)
    finally:
        cluster.remove_node(host, allow_graceful=False)  # the cloud takes it
    lift_brake(tmp)
    rc, text = resume(cluster, tmp, rid)  # the printed command, from another node (the head)
    assert rc == 0, text
    _same_training(tmp, text, reference, rid)
    client = MlflowClient(uri)
    assert client.get_run(rid).data.tags["elastic.resumes"] == "1"
    # the first driver's drain is carried into the resumed run's timeline: a `drain` row, the run stopped there
    table = json.load(open(client.download_artifacts(rid, "timeline.json", str(tmp))))
    drains = [r for r in (dict(zip(table["columns"], row)) for row in table["data"]) if r["kind"] == "drain"]
    assert [(d["first_step"], d["workers"], d["mode"]) for d in drains] == [(int(line.group(1)), 0, "stop")], table


def test_a_killed_driver_resumes_from_the_bucket_with_nothing_on_local_disk(cluster, tmp_path, reference, s3_server):
    """Checkpoints in a bucket of a real S3-compatible server (every node reaches it): the driver
    SIGKILLed after a checkpoint, ``orchestrator resume`` in another process finishes the run from
    the bucket as the uninterrupted run; a half-written checkpoint left by the dead writers is
    ignored and cleaned up, and no checkpoint ever lands on a local disk."""
    _three_nodes(cluster)
    tmp = tmp_path / "s3"
    bucket = s3_server.create_bucket(f"run-{uuid.uuid4().hex[:12]}")
    storage = f"s3://{bucket}/runs"
    cfg = config(tmp, sleep_s=0.05, brake=True)
    cfg["checkpoint"]["storage_path"] = storage
    run = driver(cluster, str(tmp), cfg)
    wait_for(
        run,
        tmp,
        "a checkpoint in the bucket at step >= 20",
        lambda: any(step >= 20 for _, step in _complete(s3_server, storage)),
    )
    run.kill()  # SIGKILL: the driver alone (it joined the cluster: no processes of its own)
    run.wait(60)
    lift_brake(tmp)  # the resume trains the rest at full speed
    found = _complete(s3_server, storage)
    assert max(step for _, step in found) < STEPS, "the run finished before it could be killed"
    folder = found[0][0]
    rid = folder[len("elastic-") :]
    half = f"{bucket}/runs/{folder}/checkpoint_step{STEPS - 1:08d}/state.pt"  # a writer that died mid-upload
    with s3_server.filesystem().open_output_stream(half) as f:
        f.write(b"the first part of a state file")

    rc, text = resume(cluster, tmp, rid)
    assert rc == 0, text
    assert f"checkpoints    {storage}/{folder}" in text and "skipping corrupt checkpoint" not in text, text
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp}/mlflow.db"
    tags = MlflowClient(uri).get_run(rid).data.tags
    assert tags["elastic.resumes"] == "1" and tags["elastic.storage_path"] == storage
    _same_training(tmp, text, reference, rid)
    keys = s3_server.keys(bucket)
    assert half not in keys, "the half-written checkpoint was cleaned up"
    assert not [k for k in keys if k.endswith("/driver.lock")], "the resumed driver released its lease"
    assert max(step for _, step in _complete(s3_server, storage)) == STEPS
    local = glob.glob(f"{tmp}/**/checkpoint_step*", recursive=True) + glob.glob(
        os.path.expanduser(f"~/ray_results/elastic-{rid}*")
    )
    assert not local and not (tmp / "ray_runs").exists(), local


_STEP = re.compile(r"/(elastic-[^/]+)/checkpoint_step(\d+)[^/]*/manifest\.json$")


def _complete(s3_server, storage: str) -> list[tuple[str, int]]:
    """``[(run folder, step)]`` of the complete checkpoints (their manifest written) under ``storage``."""
    return [
        (m.group(1), int(m.group(2))) for key in s3_server.keys(storage[len("s3://") :]) if (m := _STEP.search(key))
    ]
