"""Where an autoscaler's limits are read (orchestrator/run/cluster_limits.py), without Ray: an autoscaling
config, the head's autoscaler command line, a KubeRay RayCluster, the autoscaler's status, and the
order the driver asks them in (the first that answers wins; an autoscaler with unreadable limits is
said, not refused)."""

from __future__ import annotations

import json

import pytest
import yaml

from orchestrator.config.feasibility import judge
from orchestrator.config.schema import validate
from orchestrator.run import cluster_limits as CL
from orchestrator.run.cluster_limits import ClusterLimits, configured_node_types, from_config, monitor_config_path

_FROM_MONITOR = CL._from_monitor  # the real reader (tests replace the module's attribute)

FAKE = {  # bench/fake_cluster.py's shape: a head without CPUs, up to 2 nodes of 1 CPU
    "max_workers": 2,
    "idle_timeout_minutes": 0.1,
    "provider": {"type": "fake_multinode"},
    "head_node_type": "ray.head.default",
    "available_node_types": {
        "ray.head.default": {"resources": {"CPU": 0}, "max_workers": 0},
        "cpu_worker": {"resources": {"CPU": 1}, "min_workers": 0, "max_workers": 2},
    },
}


def test_an_autoscaling_config_gives_its_limits_and_a_fixed_one_none():
    got = from_config(FAKE, "FILE")
    assert got == ClusterLimits(autoscaling=True, max_resources={"CPU": 2.0}, source="FILE", idle_timeout_s=6.0)
    assert from_config({k: v for k, v in FAKE.items() if k != "idle_timeout_minutes"}, "F").idle_timeout_s == 300
    fixed = {**FAKE, "max_workers": 0}
    assert from_config(fixed, "FILE") == ClusterLimits(autoscaling=False, source="FILE")
    readonly = {**FAKE, "provider": {"type": "readonly"}}
    assert not from_config(readonly, "FILE").autoscaling
    assert from_config({"cluster_name": "x"}, "FILE") is None  # not an autoscaling config
    # a node type that leaves its resources to detection: it autoscales, to limits not known
    vague = {**FAKE, "available_node_types": {**FAKE["available_node_types"], "cpu_worker": {"max_workers": 2}}}
    assert from_config(vague, "FILE") == ClusterLimits(autoscaling=True, source="FILE", idle_timeout_s=6.0)


def _monitor(gcs: str, config: str | None) -> list[str]:
    argv = ["python3", "-u", "/venv/site-packages/ray/autoscaler/_private/monitor.py", "--logs-dir=/tmp/x"]
    return argv + [f"--gcs-address={gcs}"] + ([f"--autoscaling-config={config}"] if config else [])


def test_the_head_autoscaler_of_this_cluster_names_its_config():
    cmdlines = [
        ["python3", "-m", "something", "--autoscaling-config=/not/a/monitor.yaml"],
        _monitor("10.0.0.9:6379", "/other/cluster.yaml"),  # another cluster's autoscaler on the machine
        _monitor("192.0.2.2:50739", "/tmp/ours.yaml"),
    ]
    assert monitor_config_path(cmdlines, "192.0.2.2:50739") == "/tmp/ours.yaml"
    assert monitor_config_path(cmdlines, "127.0.0.1:50739") == "/tmp/ours.yaml"  # the same port, another name
    assert monitor_config_path(cmdlines, "192.0.2.2:6380") is None
    assert monitor_config_path([_monitor("192.0.2.2:50739", None)], "192.0.2.2:50739") is None  # a fixed head


def test_the_autoscaler_status_tells_a_configured_autoscaler_from_a_read_only_one():
    readonly = {
        "autoscaler_report": {
            "active_nodes": {"node_c29dd09f9e76ae0bbf04e16e597fa102beda7cab0b9c75821d827bf4": 1},
            "node_type_mapping": {"c29d": "node_c29dd09f9e76ae0bbf04e16e597fa102beda7cab0b9c75821d827bf4"},
            "pending_launches": {},
            "pending_nodes": [],
        }
    }
    assert configured_node_types(readonly) == set()
    configured = {
        "autoscaler_report": {
            "active_nodes": {"ray.head.default": 1},
            "pending_launches": {"cpu_worker": 1},
            "pending_nodes": [["ip", "gpu_worker", "setting-up"]],
        }
    }
    assert configured_node_types(configured) == {"ray.head.default", "cpu_worker", "gpu_worker"}
    assert configured_node_types({}) == set()


def _no_source(monkeypatch) -> None:
    monkeypatch.setattr(CL, "_from_gcs", lambda: None)
    monkeypatch.setattr(CL, "_bootstrap", lambda path: None)
    monkeypatch.setattr(CL, "_from_monitor", lambda gcs: None)
    monkeypatch.setattr(CL, "_from_kuberay", lambda: None)


def test_the_first_source_that_answers_wins(monkeypatch, tmp_path):
    _no_source(monkeypatch)
    path = tmp_path / "cluster.yaml"
    path.write_text(json.dumps(FAKE))  # the JSON that ray.cluster_utils writes is YAML too
    monkeypatch.setattr(CL, "_from_monitor", _FROM_MONITOR)
    monkeypatch.setattr(CL, "_cmdlines", lambda: [_monitor("192.0.2.2:50739", str(path))])
    got = CL.read_limits("192.0.2.2:50739")
    assert got.max_resources == {"CPU": 2.0} and got.source == f"the autoscaler's --autoscaling-config {path}"
    gcs = ClusterLimits(autoscaling=True, max_resources={"CPU": 8.0}, source="Ray's cluster config (GCS)")
    monkeypatch.setattr(CL, "_from_gcs", lambda: gcs)
    assert CL.read_limits("192.0.2.2:50739") is gcs


def test_an_autoscaler_whose_limits_nobody_can_read_is_assumed_to_hold_the_run(monkeypatch):
    _no_source(monkeypatch)
    monkeypatch.setattr(CL, "_status_types", lambda gcs: {"cpu_worker", "ray.head.default"})
    monkeypatch.setattr(CL.ray, "is_initialized", lambda: True)
    got = CL.read_limits("192.0.2.2:50739")
    assert got.autoscaling and got.max_resources is None
    scaling = validate({"scaling": {"max_workers": 2}}).scaling
    line, refusal = judge(scaling, {"CPU": 1.0}, got)  # 1 CPU now: the autoscaler may add the rest
    assert refusal is None and line.startswith(
        "the cluster autoscales (its autoscaler reports node types cpu_worker, ray.head.default)"
    )
    assert "no ~/ray_bootstrap_config.yaml" in line and line.endswith("largest group (2 CPU)") and "\n" not in line
    # a fixed cluster (a read-only autoscaler only): nothing assumed, the check uses what it has
    monkeypatch.setattr(CL, "_status_types", lambda gcs: set())
    fixed = CL.read_limits("192.0.2.2:50739")
    assert not fixed.autoscaling and judge(scaling, {"CPU": 2.0}, fixed) == (None, None)
    assert judge(scaling, {"CPU": 1.0}, fixed)[1].startswith("scaling.max_workers x cpus_per_worker: 2 x 1 = 2 CPUs")


def _group(cpu: str, **spec) -> dict:
    container = {"name": "ray", "resources": {"limits": {"cpu": cpu, "memory": "4G"}}}
    return {"rayStartParams": {}, "template": {"spec": {"containers": [container]}}, **spec}


@pytest.mark.parametrize("autoscaling", [True, False])
def test_a_kuberay_pod_reads_its_raycluster(monkeypatch, tmp_path, autoscaling):
    """In a KubeRay pod: the RayCluster read as the pod's service account, turned into the autoscaler's
    config by Ray's own KubeRay code (here the API's answer is a RayCluster written out)."""
    from ray.autoscaler._private.kuberay import node_provider

    cr = {
        "metadata": {"name": "rc", "namespace": "team"},
        "spec": {
            "enableInTreeAutoscaling": autoscaling,
            "headGroupSpec": _group("0"),
            "workerGroupSpecs": [_group("2", groupName="small", minReplicas=0, maxReplicas=3, replicas=0)],
        },
    }
    asked = []

    def get(self, path):
        asked.append((self._namespace, path))
        return cr

    monkeypatch.setattr(node_provider.KubernetesHttpApiClient, "get", get)
    (tmp_path / "namespace").write_text("team\n")
    monkeypatch.setattr(CL, "SERVICE_ACCOUNT", str(tmp_path))
    env = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "RAY_CLUSTER_NAME": "rc"}
    got = CL._from_kuberay(env)
    assert asked == [("team", "rayclusters/rc")] and got.source == "RayCluster team/rc"
    if autoscaling:
        assert got.autoscaling and got.max_resources["CPU"] == 6.0  # 3 pods of 2 CPUs, a head of none
    else:
        assert not got.autoscaling and got.max_resources is None
    assert CL._from_kuberay({"RAY_CLUSTER_NAME": "rc"}) is None  # not in a pod

    def forbidden(self, path):
        raise RuntimeError("403 Forbidden")

    monkeypatch.setattr(node_provider.KubernetesHttpApiClient, "get", forbidden)
    assert CL._from_kuberay(env) is None  # an account without the right: not known


def test_the_bootstrap_config_of_a_ray_up_head(tmp_path):
    path = tmp_path / "ray_bootstrap_config.yaml"
    path.write_text(yaml.safe_dump(FAKE))
    assert CL._bootstrap(str(path)).max_resources == {"CPU": 2.0}
    assert CL._bootstrap(str(tmp_path / "missing.yaml")) is None
    path.write_text("not: [valid")
    assert CL._bootstrap(str(path)) is None
