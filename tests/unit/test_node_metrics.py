"""System metrics of every node (orchestrator/record/node_metrics.py): each node of the run's newest worker
group but the driver's under its own MLflow node id, a node the run leaves let go and a lost one
dropped, each (metric, step) once; the sampler's figures are MLflow's own (a real sample of this machine)."""

from __future__ import annotations

from orchestrator.record.node_metrics import NODE_EVERY_S, REFRESH_EVERY, NodeSampler, NodeSystemMetrics, node_label


class Cluster:
    """Nodes by id, and what each node's sampler answers (None: the node is gone)."""

    def __init__(self, nodes: dict[str, str]) -> None:
        self.nodes = dict(nodes)
        self.spawned: list[str] = []
        self.ended: list[str] = []
        self.gone: set[str] = set()

    def spawn(self, node: str) -> str:
        self.spawned.append(node)
        return node  # the "actor" is its node's id

    def ask(self, samplers: dict) -> dict:
        return {n: None if n in self.gone else {"cpu_utilization_percentage": 10.0} for n in samplers}

    def end(self, samplers: dict) -> None:
        self.ended += list(samplers)


def _metrics(cluster: Cluster, rows: list) -> NodeSystemMetrics:
    return NodeSystemMetrics(
        rows.extend,
        "head",
        1000.0,
        nodes=lambda: cluster.nodes,
        spawn=cluster.spawn,
        asker=cluster.ask,
        ender=cluster.end,
    )


def test_each_node_of_the_group_but_the_drivers_logs_under_its_own_node_id():
    cluster = Cluster({"head": "h0", "aaaaaaaa11": "gpu-1", "bbbbbbbb22": "gpu-1", "cccccccc33": "other-job"})
    rows: list = []
    nm = _metrics(cluster, rows)
    assert nm.tick(now=1000.0) == 0  # no group yet: nothing sampled
    nm.follow(["head", "aaaaaaaa11", "bbbbbbbb22", "bbbbbbbb22"])  # rank per node: two nodes on one host
    rows.clear()
    assert nm.tick(now=1000.0 + 2 * NODE_EVERY_S) == 2
    assert sorted(cluster.spawned) == ["aaaaaaaa11", "bbbbbbbb22"]  # no sampler on the driver's node
    assert sorted((r.key, r.step) for r in rows) == [
        ("system/gpu-1-aaaaaa/cpu_utilization_percentage", 2),
        ("system/gpu-1-bbbbbb/cpu_utilization_percentage", 2),
    ]
    nm.tick(now=1000.0 + 2 * NODE_EVERY_S + 1)  # within the same window: the next step, not the same one twice
    steps = sorted(r.step for r in rows if "aaaaaa" in r.key)
    assert steps == [2, 3]


def test_a_resized_group_moves_the_samplers_and_a_lost_node_is_dropped():
    cluster = Cluster({"head": "h0", "n1": "w1", "n2": "w2", "n3": "w3"})
    rows: list = []
    nm = _metrics(cluster, rows)
    nm.follow(["n1", "n2"])
    nm.tick(now=1000.0)
    nm.follow(["n2", "n3"])  # the next group left n1 (an autoscaler may now remove it)
    nm.tick(now=1000.0 + NODE_EVERY_S)
    assert set(nm.samplers) == {"n2", "n3"} and cluster.ended == ["n1"]
    cluster.gone.add("n3")  # lost: its actor died with it
    del cluster.nodes["n3"]
    nm.tick(now=1000.0 + 2 * NODE_EVERY_S)
    assert set(nm.samplers) == {"n2"} and cluster.ended == ["n1", "n3"]
    for i in range(3, REFRESH_EVERY + 3):  # a lost node is not looked for again
        nm.tick(now=1000.0 + i * NODE_EVERY_S)
    assert cluster.spawned == ["n1", "n2", "n3"]
    assert {r.key.split("/")[1] for r in rows} == {
        node_label("w1", "n1"),
        node_label("w2", "n2"),
        node_label("w3", "n3"),
    }
    nm.stop()  # one last round, then the samplers end
    assert cluster.ended == ["n1", "n3", "n2"] and not nm.samplers


def test_a_node_label_is_a_valid_metric_key_part():
    assert node_label("ip-10-0-0-7.ec2.internal", "0123456789ab") == "ip-10-0-0-7.ec2.internal-012345"
    assert node_label("host:with/odd chars", "abcdef99") == "host_with_odd_chars-abcdef"


def test_the_sampler_takes_mlflows_figures_of_this_machine():
    figures = NodeSampler().sample()
    assert {"cpu_utilization_percentage", "system_memory_usage_megabytes", "network_receive_megabytes"} <= set(figures)
    assert all(isinstance(v, float) for v in figures.values())


def test_a_search_trial_samples_its_own_machine_only(tmp_path):
    from orchestrator.config.schema import validate
    from orchestrator.record.params import ConfigRecord
    from orchestrator.record.run_tracker import RunTracker

    cfg = validate({"tracking": {"uri": f"sqlite:///{tmp_path}/mlflow.db", "experiment": "t"}})
    parent = RunTracker(ConfigRecord.from_config(cfg))
    trial = RunTracker(ConfigRecord.from_config(cfg), parent_run_id=parent.run_id)
    assert parent.system.sample_nodes and not trial.system.sample_nodes
    assert trial.system.start_nodes() is False and trial.system.nodes is None
    trial.end()
    parent.end()


def test_each_node_once_rank_0_sends_its_node_only_where_the_driver_samples_neither():
    """The duplicate: rank 0 sent its process's view of its node (``system/worker-<host>/...``) on top
    of the driver's samples of the same node (MLflow's monitor for the driver's machine, a sampler
    per node of the group).  The driver says what it samples (``DriverSystemMetrics.sampled``, into
    the workers' Runtime) and rank 0 sends its node only where neither covers it."""
    from orchestrator.record.system_metrics import DriverSystemMetrics
    from trainers.link.runtime import Runtime

    training = Runtime(driver_node="head", nodes_sampled=True)  # a training run: every node of the group
    assert not training.sends_system_metrics("head") and not training.sends_system_metrics("worker-1")
    trial = Runtime(driver_node="head", nodes_sampled=False)  # a search trial: its own machine only
    assert not trial.sends_system_metrics("head") and trial.sends_system_metrics("worker-1")
    # a driver whose monitor could not start (no Ray, no psutil) samples nothing: rank 0 sends its node
    idle = DriverSystemMetrics("run", "sqlite:///unused.db")
    assert idle.sampled() == {"driver_node": "", "nodes_sampled": False}
    assert Runtime(**idle.sampled()).sends_system_metrics("worker-1")


def test_a_channel_told_not_to_send_system_metrics_samples_nothing(monkeypatch):
    from trainers.link import channel as ch

    monkeypatch.setattr(ch, "RayMonitor", lambda name, namespace: object())  # no Ray: the seam only
    assert ch.Channel("monitor", None, enabled=True, system=False)._system is None
    assert ch.Channel("monitor", None, enabled=True)._system is not None
