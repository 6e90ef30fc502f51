"""``scaling.placement`` on a real cluster of two 2-CPU worker nodes (and a head without CPUs): a
group of two 1-CPU workers is packed onto one node (``pack``) or spread over both (``spread``), as
the workers' actors' nodes show while the run trains; each node the workers used has its system
metrics in the run under its own node id, the driver's (head) node as MLflow's plain ``system/``."""

from __future__ import annotations

import signal
import sqlite3

import pytest

from tests.multinode.runs import alive_actor_nodes, checkpointed, config, driver, finish, wait_for, worker_nodes

pytestmark = [pytest.mark.multinode, pytest.mark.timeout(600)]


@pytest.mark.parametrize("placement, nodes_used", [("pack", 1), ("spread", 2)])
def test_placement_puts_the_workers_where_it_says(cluster, tmp_path, placement, nodes_used):
    worker_nodes(cluster, 2, cpus=2)
    run = driver(
        cluster, str(tmp_path), config(tmp_path, sleep_s=0.2, min_workers=2, max_workers=2, placement=placement)
    )
    try:
        wait_for(run, tmp_path, "a first checkpoint", lambda: checkpointed(tmp_path))
        used = alive_actor_nodes(cluster, "RayTrainWorker")
        assert len(used) == nodes_used, (placement, used)
        assert used <= {n.node_id for n in cluster.worker_nodes}, "no worker on the driver's node"
    finally:
        run.send_signal(signal.SIGTERM)  # the run stops at its next push
        rc, text = finish(run, tmp_path, timeout=120)
    assert "Traceback" not in text, text
    with sqlite3.connect(f"{tmp_path}/mlflow.db") as db:
        keys = {k for (k,) in db.execute("select distinct key from metrics where key like 'system/%'")}
    assert not [k for k in keys if k.startswith("system/worker-")], "rank 0's node is logged once, by the driver"
    nodes = {k.split("/")[1] for k in keys if k.count("/") == 2}
    assert {n[:6] for n in used} == {label[-6:] for label in nodes}, sorted(keys)  # the nodes the workers used
    for label in nodes:
        assert {f"system/{label}/cpu_utilization_percentage", f"system/{label}/network_receive_megabytes"} <= keys
    assert "system/cpu_utilization_percentage" in keys  # the driver's machine
