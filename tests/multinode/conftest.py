"""The multi-node tier: a real Ray cluster of several nodes on this machine, started and stopped by
the tests (``ray.cluster_utils.Cluster``: a head and worker nodes, each its own raylet).

The head has no CPUs: it is the driver's node (the driver, Ray Train's controller and the run's
monitor live there, as on a real cluster's head), and the worker nodes hold the training workers.
Ray's health check is shortened so a lost node is noticed in about a second (a user does the same
with ``ray start --head --system-config``; README, "On a cluster"): a killed raylet refuses the
check's connection at once, so two misses half a second apart declare it dead, while a live raylet
slow to answer on a loaded machine has 3 s for each answer (never taken for dead)."""

from __future__ import annotations

import pytest

HEALTH = {
    "health_check_initial_delay_ms": 1000,
    "health_check_period_ms": 500,
    "health_check_timeout_ms": 3000,
    "health_check_failure_threshold": 2,
}


@pytest.fixture(scope="session")
def cluster(s3_server):
    """One cluster for the whole tier (each test shapes its worker nodes: ``runs.worker_nodes``).
    The nodes start after the S3-compatible server (tests/conftest.py): every node's processes
    reach the bucket through the standard variables, as a real cluster's nodes are configured."""
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "_system_config": HEALTH})
    yield c
    from tests.multinode.runs import close_probes

    close_probes()  # the process that answered the tests' questions about it (tests/multinode/probe.py)
    c.shutdown()  # stops every node it started (by their processes), never `ray stop`


AUTOSCALING_MODULE = "test_autoscaling_cluster.py"
# the only tests on 2-CPU worker nodes: last, so the 1-CPU nodes the others use are reshaped once
TWO_CPU_MODULE = "test_placement.py"


def _place(item) -> int:
    return {AUTOSCALING_MODULE: 0, TWO_CPU_MODULE: 2}.get(item.path.name, 1)


def pytest_collection_modifyitems(config, items):
    """The autoscaling tests (tests/multinode/test_autoscaling_cluster.py) start a Ray head of their own, which
    must never run beside the tier's ``cluster`` (session-scoped: alive from its first test to the
    session's end): they run first in the tier, whatever order the files were given in.  The tests
    on 2-CPU nodes run last (each ``runs.worker_nodes`` change of node size starts new nodes: ~4 s each)."""
    slots = [i for i, item in enumerate(items) if item.path.parent.name == "multinode"]
    tier = [items[i] for i in slots]
    tier.sort(key=_place)  # stable: the rest keep their order
    for i, item in zip(slots, tier):
        items[i] = item
