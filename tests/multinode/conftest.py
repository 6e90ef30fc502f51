"""The multi-node tier: a real Ray cluster of several nodes on this machine, started and stopped by
the tests (``ray.cluster_utils.Cluster``: a head and worker nodes, each its own raylet).

The head has no CPUs: it is the driver's node (the driver, Ray Train's controller and the run's
monitor live there, as on a real cluster's head), and the worker nodes hold the training workers.
Ray's health check is shortened so a lost node is noticed in a few seconds (a user does the same
with ``ray start --head --system-config``; README, "On a cluster")."""

from __future__ import annotations

import pytest

HEALTH = {
    "health_check_initial_delay_ms": 1000,
    "health_check_period_ms": 1000,
    "health_check_timeout_ms": 1000,
    "health_check_failure_threshold": 3,
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


def pytest_collection_modifyitems(config, items):
    """The autoscaling tests (tests/multinode/test_autoscaling_cluster.py) start a Ray head of their own, which
    must never run beside the tier's ``cluster`` (session-scoped: alive from its first test to the
    session's end): they run first in the tier, whatever order the files were given in."""
    slots = [i for i, item in enumerate(items) if item.path.parent.name == "multinode"]
    tier = [items[i] for i in slots]
    tier.sort(key=lambda item: item.path.name != AUTOSCALING_MODULE)  # stable: the rest keep their order
    for i, item in zip(slots, tier):
        items[i] = item
