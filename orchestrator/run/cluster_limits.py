"""What an autoscaling cluster can grow to, read wherever its autoscaler keeps it, and whether one runs.

Ray shows no public API for an autoscaler's limits.  :func:`read_limits` asks, first found wins:

1. **Ray's cluster config in GCS** (``ray._private.state.state.get_max_resources_from_cluster_config``,
   what Ray Train checks a group against): reported by platforms that run the autoscaler with a
   known config.  Ray 2.60 itself reports none (``ray up``, ``ray start --autoscaling-config`` and
   KubeRay leave it empty), so it is usually absent.
2. **``~/ray_bootstrap_config.yaml``**: where ``ray up`` puts the config on the head node.
3. **The head's autoscaler process**: a head started with ``ray start --head --autoscaling-config=FILE``
   keeps its limits only in ``FILE``, whose path is on the command line of the autoscaler it starts
   (Ray's ``autoscaler/_private/monitor.py --autoscaling-config=FILE --gcs-address=ADDR``); found
   among this machine's processes (``/proc``) as the monitor of this cluster's GCS, so on the head
   node only (where ``ray job submit`` runs the driver).
4. **KubeRay**: in a pod of a RayCluster (``KUBERNETES_SERVICE_HOST``; the operator sets
   ``RAY_CLUSTER_NAME``; the namespace is the pod's service account's), the RayCluster resource read
   from the Kubernetes API with the pod's service-account token, turned into the autoscaler's own
   config by Ray's KubeRay code (group ``maxReplicas`` and each group's resources).  It works where
   that account may read its RayCluster (the operator grants the head's account that when in-tree
   autoscaling is on); ``spec.enableInTreeAutoscaling: false`` is a fixed cluster.  What cannot be
   read: a driver outside the pod, an account without that right, limits set outside the
   RayCluster (a cloud's node-pool quota, a cluster autoscaler that cannot place the pods).

Whether an autoscaler runs when none of these answers: Ray's v1 autoscaler writes its status to the
internal KV (``__autoscaling_status``) every update; a cluster without an autoscaling config runs it
too, with a read-only provider whose node types are the anonymous ``node_<id>``, so any other node
type name there means a configured autoscaler (:func:`configured_node_types`); the v2 autoscaler's
status (``ray.autoscaler.v2.sdk.get_cluster_status``) is read the same way.  Then the run is not
refused for capacity the autoscaler may add: :func:`orchestrator.config.feasibility.judge` says which limits the run
assumed (orchestrator/run/runner.py prints it).
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import ray
import yaml

from orchestrator.config.feasibility import BOOTSTRAP_CONFIG, max_resources

log = logging.getLogger(__name__)

STATUS_KEY = "__autoscaling_status"  # ray_constants.DEBUG_AUTOSCALING_STATUS: the v1 autoscaler's status
SERVICE_ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
DEFAULT_IDLE_TIMEOUT_MINUTES = 5  # the default of Ray's cluster launcher (ray/autoscaler/aws/defaults.yaml)
_READONLY_TYPE = re.compile(r"^node_[0-9a-f]+$")  # ray.autoscaler._private.util.format_readonly_node_type
_MONITOR = ("autoscaler/_private/monitor.py", "autoscaler/v2/monitor.py")


@dataclass(frozen=True)
class ClusterLimits:
    """What the driver knows of the cluster's autoscaler.

    ``autoscaling``: an autoscaler may add nodes; ``max_resources``: the most of each resource the
    cluster can grow to (None: not known, or not autoscaling); ``source``: where the limits were read
    (or what showed an autoscaler runs); ``tried``: the places asked that gave nothing;
    ``idle_timeout_s``: how long a node may stay idle before the autoscaler removes it (None: not known)."""

    autoscaling: bool = False
    max_resources: dict[str, float] | None = None
    source: str = ""
    tried: tuple[str, ...] = field(default_factory=tuple)
    idle_timeout_s: float | None = None


def from_config(config: Mapping[str, Any], source: str) -> ClusterLimits | None:
    """The limits an autoscaling config gives (None when it is no such config)."""
    if not isinstance(config, Mapping) or not isinstance(config.get("available_node_types"), Mapping):
        return None
    provider = config.get("provider") or {}
    head, total = config.get("head_node_type"), config.get("max_workers")
    workers = [
        spec.get("max_workers", total or 0) or 0
        for name, spec in config["available_node_types"].items()
        if name != head and isinstance(spec, Mapping)
    ]
    grows = provider.get("type") != "readonly" and any(workers) and (total is None or total > 0)
    idle = config.get("idle_timeout_minutes", DEFAULT_IDLE_TIMEOUT_MINUTES)
    return ClusterLimits(
        autoscaling=grows,
        max_resources=max_resources(config) if grows else None,
        source=source,
        idle_timeout_s=float(idle) * 60 if isinstance(idle, (int, float)) and grows else None,
    )


def read_yaml(path: str) -> Mapping[str, Any] | None:
    try:
        with open(os.path.expanduser(path)) as f:
            data = yaml.safe_load(f)
    except (OSError, yaml.YAMLError):
        return None
    return data if isinstance(data, Mapping) else None


# --------------------------------------------------------------------------- the head's autoscaler


def monitor_config_path(cmdlines: Iterable[list[str]], gcs_address: str) -> str | None:
    """The ``--autoscaling-config`` of the autoscaler that serves ``gcs_address`` among the processes'
    command lines ``cmdlines`` (None: no such process here, or it runs without one)."""
    port = gcs_address.rsplit(":", 1)[-1]
    for argv in cmdlines:
        if not any(arg.endswith(m) for arg in argv for m in _MONITOR):
            continue
        opts = dict(arg[2:].split("=", 1) for arg in argv if arg.startswith("--") and "=" in arg)
        served = opts.get("gcs-address", "")
        if served == gcs_address or served.rsplit(":", 1)[-1] == port:
            return opts.get("autoscaling-config") or None
    return None


def _cmdlines() -> Iterable[list[str]]:
    """This machine's processes' command lines (Linux ``/proc``; nothing elsewhere)."""
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                raw = f.read()
        except OSError:
            continue
        if b"monitor.py" in raw:
            yield raw.decode(errors="replace").rstrip("\0").split("\0")


def _from_monitor(gcs_address: str) -> ClusterLimits | None:
    path = monitor_config_path(_cmdlines(), gcs_address)
    if path is None:
        return None
    config = read_yaml(path)  # JSON is YAML too (ray.cluster_utils writes JSON)
    return from_config(config, f"the autoscaler's --autoscaling-config {path}") if config else None


# --------------------------------------------------------------------------- KubeRay


def _from_kuberay(env: Mapping[str, str] = os.environ) -> ClusterLimits | None:
    """The RayCluster's limits, read as the pod's service account (None: not in a KubeRay pod, or not
    allowed to read its RayCluster)."""
    name = env.get("RAY_CLUSTER_NAME")
    if not env.get("KUBERNETES_SERVICE_HOST") or not name:
        return None
    try:
        with open(os.path.join(SERVICE_ACCOUNT, "namespace")) as f:
            namespace = f.read().strip()
        # Ray's own KubeRay code (what its autoscaler runs): one GET, no retries
        from ray.autoscaler._private.kuberay.autoscaling_config import (  # only in a KubeRay pod
            _derive_autoscaling_config_from_ray_cr,
        )
        from ray.autoscaler._private.kuberay.node_provider import (  # only in a KubeRay pod
            KubernetesHttpApiClient,
        )

        cr = KubernetesHttpApiClient(namespace).get(f"rayclusters/{name}")
        where = f"RayCluster {namespace}/{name}"
        if not cr.get("spec", {}).get("enableInTreeAutoscaling"):
            return ClusterLimits(autoscaling=False, source=where)
        return from_config(_derive_autoscaling_config_from_ray_cr(cr), where)
    except Exception as e:  # no right to read it, no API server: the limits are not known
        log.debug("could not read the RayCluster %s: %s", name, e)
        return None


# --------------------------------------------------------------------------- the autoscaler's status


def configured_node_types(status: Mapping[str, Any]) -> set[str]:
    """The node types an autoscaler's status (v1's ``__autoscaling_status``) names that a configured
    autoscaler has (a read-only one, on a cluster without autoscaling config, names only the
    anonymous ``node_<id>`` types)."""
    report = status.get("autoscaler_report") or {}
    names: set[str] = set()
    for key in ("active_nodes", "pending_launches", "idle_nodes"):
        names |= set(report.get(key) or {})
    names |= set((report.get("node_type_mapping") or {}).values())
    names |= {entry[1] for entry in report.get("pending_nodes") or [] if len(entry) > 1}
    return {n for n in names if isinstance(n, str) and not _READONLY_TYPE.match(n)}


def _status_types(gcs_address: str) -> set[str] | None:
    """The configured node types the running autoscaler reports (None: no autoscaler status found)."""
    try:
        from ray.autoscaler.v2.utils import is_autoscaler_v2

        if is_autoscaler_v2():
            from ray.autoscaler.v2.sdk import get_cluster_status  # only with the v2 autoscaler

            status = get_cluster_status(gcs_address)
            nodes = [*status.active_nodes, *status.idle_nodes, *status.pending_nodes]
            names = {getattr(n, "ray_node_type_name", "") for n in nodes}
            names |= {getattr(p, "ray_node_type_name", "") for p in status.pending_launches}
            return {n for n in names if n and not _READONLY_TYPE.match(n)}
        from ray.experimental.internal_kv import _internal_kv_get

        raw = _internal_kv_get(STATUS_KEY)
    except Exception as e:  # Ray's private status changed: nothing known of an autoscaler
        log.debug("could not read the autoscaler's status: %s", e)
        return None
    if not raw:
        return None
    try:
        return configured_node_types(json.loads(raw))
    except (ValueError, TypeError, AttributeError):
        return None


def _from_gcs() -> ClusterLimits | None:
    try:
        from ray._private.state import state

        found = state.get_max_resources_from_cluster_config()
    except Exception as e:  # Ray's private state changed: not known there
        log.debug("could not read Ray's cluster config: %s", e)
        return None
    if not found:
        return None
    return ClusterLimits(
        autoscaling=True, max_resources={k: float(v) for k, v in found.items()}, source="Ray's cluster config (GCS)"
    )


def read_limits(gcs_address: str | None = None) -> ClusterLimits:
    """The cluster's autoscaler limits (see the module docstring for where they are looked for).
    ``gcs_address``: this cluster's (default: the one this process joined)."""
    if gcs_address is None and ray.is_initialized():
        gcs_address = ray.get_runtime_context().gcs_address
    tried: list[str] = []
    readers = [
        ("no cluster config in GCS", _from_gcs),
        (f"no {BOOTSTRAP_CONFIG}", lambda: _bootstrap(BOOTSTRAP_CONFIG)),
        (
            "no autoscaler with --autoscaling-config on this machine",
            lambda: _from_monitor(gcs_address) if gcs_address else None,
        ),
        ("not in a KubeRay pod that may read its RayCluster", _from_kuberay),
    ]
    for missing, reader in readers:
        found = reader()
        if found is not None:
            return found
        tried.append(missing)
    types = _status_types(gcs_address) if gcs_address and ray.is_initialized() else None
    if types:
        return ClusterLimits(
            autoscaling=True, source=f"its autoscaler reports node types {', '.join(sorted(types))}", tried=tuple(tried)
        )
    return ClusterLimits(tried=tuple(tried))


def _bootstrap(path: str) -> ClusterLimits | None:
    config = read_yaml(path)
    return from_config(config, path) if config is not None else None
