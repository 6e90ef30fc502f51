"""A run on a real local autoscaling cluster: Ray's fake multi-node provider (bench/fake_cluster.py), a
head without CPUs whose autoscaler launches 1-CPU worker nodes on demand (at most 2) and removes
nodes idle for 6 s (``idle_timeout_minutes`` 0.1).

The quickstart at 1 CPU per worker grows its batch, and with it W 1 -> 2.  The run must start with
only the head, get a node launched for its first group, get the second node launched before its new
group is started (asked for at the decision: orchestrator/run/autoscaling.py), grow onto it in one
handover (never a group started 1 of 2 and grown by another restart), launch no more nodes than W
ever needs, remove none while it trains, and leave them idle at the end so the autoscaler removes
them.  The limits come from the head's ``--autoscaling-config`` (orchestrator/run/cluster_limits.py):
a run within them is not refused, one beyond them is (exit 2, one line).

A shrinking W (``scaling.policy: goodput``) letting nodes go is pinned by the request logic's unit
tests (tests/unit/test_autoscaling.py): a real goodput run shrinks only after minutes of measured
step times on this machine.

This module's head must never run beside the tier's session ``cluster`` (two Rays of the tier at
once): tests/multinode/conftest.py runs it first in the tier, and its fixture is module-scoped."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from bench.fake_cluster import FakeAutoscalingCluster
from orchestrator.record.history import RESIZES_ARTIFACT
from tests.multinode.runs import ROOT, logged_workers, run_id

pytestmark = [pytest.mark.multinode, pytest.mark.timeout(900)]

QUICKSTART = os.path.join(ROOT, "configs", "quickstart.yaml")


@pytest.fixture(scope="module")
def autoscaling():
    head = FakeAutoscalingCluster(max_nodes=2, cpus_per_node=1, idle_timeout_minutes=0.1).start()
    try:
        yield head
    finally:
        head.stop()  # its processes and the nodes it launched, never `ray stop`


def _train(head: FakeAutoscalingCluster, tmp, *overrides: str, timeout: float = 600) -> subprocess.CompletedProcess:
    sets = [
        "scaling.cpus_per_worker=1",
        f"tracking.uri=sqlite:///{tmp}/mlflow.db",
        f"checkpoint.storage_path={tmp}/ray_runs",
        *overrides,
    ]
    cmd = [sys.executable, "-m", "orchestrator", "train", QUICKSTART, "--no-progress"]
    for s in sets:
        cmd += ["--set", s]
    return subprocess.run(
        cmd, cwd=tmp, env=head.driver_env(PYTHONPATH=ROOT), capture_output=True, text=True, timeout=timeout
    )


def test_a_run_beyond_the_autoscalers_limits_is_refused_before_it_starts(autoscaling, tmp_path):
    """The limits are the head's --autoscaling-config (2 nodes of 1 CPU), read though the cluster has no
    worker node yet: 3 workers are refused at once (exit 2, one line, no run), no node launched."""
    out = _train(autoscaling, tmp_path, "scaling.max_workers=3", timeout=240)
    assert out.returncode == 2, out.stdout + out.stderr
    err = out.stderr.strip()
    assert err == (
        "error: scaling.max_workers x cpus_per_worker: 3 x 1 = 3 CPUs, but the cluster can ever have "
        "(autoscaler limits included) 2; lower scaling.max_workers to at most 2 or scaling.cpus_per_worker"
    ), err
    assert not (tmp_path / "ray_runs").exists() and autoscaling.worker_nodes() == (0, 0)


def test_a_growing_batch_gets_its_nodes_ahead_grows_once_and_lets_them_go(autoscaling, tmp_path):
    from mlflow.tracking import MlflowClient

    assert autoscaling.worker_nodes() == (0, 0), "only the head at first"
    out = _train(autoscaling, tmp_path)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    assert "note: the cluster autoscales" not in text, "its limits were read: nothing assumed"
    uri, rid = f"sqlite:///{tmp_path}/mlflow.db", run_id(tmp_path)
    client = MlflowClient(uri)
    assert client.get_run(rid).info.status == "FINISHED"

    # one handover, from a group of 1 straight to a group of 2 (never 1 of 2 grown by another restart)
    assert logged_workers(uri, rid) == [1, 2], text
    assert "of 2 asked" not in text and "capacity returned" not in text, text
    with open(client.download_artifacts(rid, RESIZES_ARTIFACT, str(tmp_path))) as f:
        (resize,) = json.load(f)
    assert (resize["from"], resize["to"]) == (1, 2)

    # the nodes: one for the first group, the second asked for at the decision and launched before the
    # new group was started; no more than W ever needs, none removed while the run trained
    events = autoscaling.node_events()
    launches = [t for t, kind, n in events for _ in range(n) if kind == "launched"]
    assert len(launches) == 2, events
    assert launches[1] < resize["fit_called"], "the second node was asked for before its group started"
    last_step = max(m.timestamp for m in client.get_metric_history(rid, "train/loss")) / 1000
    assert not [t for t, kind, _ in events if kind == "terminated" and t < last_step], events

    # the run withdrew its request at its end: its idle nodes are removed
    assert autoscaling.wait_idle_removed(timeout_s=180), autoscaling.node_events()
    assert autoscaling.worker_nodes() == (2, 0), "two nodes ever joined, none is left"
