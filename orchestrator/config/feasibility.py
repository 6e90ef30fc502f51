"""Can the cluster ever run this config's worker groups?  Asked before the first ``fit()``, so an
impossible request is a one-line error instead of a run that waits forever.

Ray Train waits, and retries, for a worker group the cluster cannot place: ``use_gpu`` on a
cluster without GPUs, or ``max_workers x cpus_per_worker`` above every CPU it will ever have,
keeps a run "pending" forever.  :func:`check_feasible` answers before the first ``fit()``; it is
a pure function of the config's ``scaling`` section and two resource dicts, so it is tested without Ray.

What the cluster can *ever* have is the larger of what it has now (``ray.cluster_resources()``)
and what its autoscaler may grow it to.  Ray shows no public API for the latter: the driver reads
it wherever the autoscaler keeps it (orchestrator/run/cluster_limits.py: Ray's cluster config in
GCS, ``~/ray_bootstrap_config.yaml``, the head's ``--autoscaling-config``, a KubeRay RayCluster),
and :func:`max_resources` turns an autoscaling config's node types (``resources``, ``max_workers``)
into those limits.  Where none is known the check uses the cluster's current totals, except on a
cluster whose autoscaler runs with limits nobody could read: then nothing is refused for lack of
capacity the autoscaler might add (:func:`judge` says which limits it assumed).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from orchestrator.config.schema import ScalingConfig


class Limits(Protocol):
    """What the driver read of the cluster's autoscaler (orchestrator/run/cluster_limits.py ``ClusterLimits``):
    whether one runs, the most it may grow the cluster to (None: not known), where that was read, and
    where nothing was found."""

    autoscaling: bool
    max_resources: Mapping[str, float] | None
    source: str
    tried: tuple[str, ...]


BOOTSTRAP_CONFIG = "~/ray_bootstrap_config.yaml"
"""Where ``ray up`` puts the autoscaling config on the head node."""


def _g(x: float) -> str:
    return f"{x:g}"


def capacity(cluster_total: Mapping[str, float], autoscaler_max: Mapping[str, float] | None) -> dict[str, float]:
    """Per resource, the most the cluster can ever have: now, or after the autoscaler's growth."""
    out = {k: float(v) for k, v in cluster_total.items()}
    for k, v in (autoscaler_max or {}).items():
        out[k] = max(out.get(k, 0.0), float(v))
    return out


def judge(scaling: ScalingConfig, cluster_total: Mapping[str, float], limits: Limits) -> tuple[str | None, str | None]:
    """Before the first ``fit()``: ``(note, refusal)``, each one line or None.  The refusal when the
    largest group ``scaling`` asks for can never fit (:func:`check_feasible`); on a cluster whose
    autoscaler runs with limits nobody could read, no refusal (it might add the room) but a note of
    what the run assumes."""
    if not limits.autoscaling or limits.max_resources is not None:
        return None, check_feasible(scaling, cluster_total, limits.max_resources)
    wanted = ", ".join(f"{v:g} {k}" for k, v in scaling.at_most().items())
    note = (
        f"the cluster autoscales ({limits.source}) but its limits could not be read here "
        f"({'; '.join(limits.tried)}): assuming it can grow to this run's largest group ({wanted})"
    )
    return note, None


def check_feasible(
    scaling: ScalingConfig, cluster_total: Mapping[str, float], autoscaler_max: Mapping[str, float] | None
) -> str | None:
    """``None`` when the largest worker group ``scaling`` asks for fits what the cluster can ever have,
    else one line naming the field, what it needs, what the cluster can have, and the fix.

    ``cluster_total``: ``ray.cluster_resources()``; ``autoscaler_max``: what the autoscaler may grow
    the cluster to (orchestrator/run/cluster_limits.py; ``None`` = not autoscaling or not known).
    The group needs ``max_workers x cpus_per_worker`` CPUs and, with ``use_gpu``, ``max_workers x
    gpus_per_worker`` GPUs (the elastic run asks for its largest group; a smaller one may fit but
    never the requested size).
    """
    cap, need = capacity(cluster_total, autoscaler_max), scaling.at_most()
    ever = "the cluster has" if autoscaler_max is None else "the cluster can ever have (autoscaler limits included)"
    if scaling.use_gpu:
        gpus = cap.get("GPU", 0.0)
        if gpus <= 0:
            return (
                f"scaling.use_gpu: true but {ever} no GPU; set scaling.use_gpu: false or start Ray on GPU nodes "
                f"(ray start --num-gpus)"
            )
        if need["GPU"] > gpus:
            fit = math.floor(gpus / scaling.gpus_per_worker)
            return (
                f"scaling.max_workers x gpus_per_worker: {scaling.max_workers} x {_g(scaling.gpus_per_worker)} "
                f"= {_g(need['GPU'])} "
                f"GPUs, but {ever} {_g(gpus)}; lower scaling.max_workers to at most {fit} or "
                f"scaling.gpus_per_worker"
            )
    cpus = cap.get("CPU", 0.0)
    if need["CPU"] > cpus:
        fit = math.floor(cpus / scaling.cpus_per_worker)
        fix = (
            f"lower scaling.max_workers to at most {fit} or scaling.cpus_per_worker"
            if fit >= 1
            else f"lower scaling.cpus_per_worker to at most {_g(cpus)}"
        )
        return (
            f"scaling.max_workers x cpus_per_worker: {scaling.max_workers} x {_g(scaling.cpus_per_worker)} "
            f"= {_g(need['CPU'])} "
            f"CPUs, but {ever} {_g(cpus)}; {fix}"
        )
    return None


def max_resources(autoscaling_config: Mapping[str, Any]) -> dict[str, float] | None:
    """The most of each resource a cluster with this autoscaling config can have (``None`` if its
    node types do not all declare ``resources``).

    The head node counts once; worker nodes are at most each type's ``max_workers`` and, all
    types together, the cluster's ``max_workers``.  Per resource this takes the richest types
    first, which bounds any mix the autoscaler can launch.
    """
    types = autoscaling_config.get("available_node_types")
    if not isinstance(types, Mapping) or not types:
        return None
    head = autoscaling_config.get("head_node_type")
    total_cap = autoscaling_config.get("max_workers")
    workers: list[tuple[Mapping[str, Any], int]] = []
    out: dict[str, float] = {}
    for name, spec in types.items():
        if not isinstance(spec, Mapping) or not isinstance(spec.get("resources"), Mapping):
            return None
        res = spec["resources"]
        if name == head:
            for k, v in res.items():
                out[k] = out.get(k, 0.0) + float(v)
        count = spec.get("max_workers", total_cap if total_cap is not None else 0)
        workers.append((res, int(count or 0)))
    names = {k for res, _ in workers for k in res}
    for k in names:
        left = int(total_cap) if total_cap is not None else sum(n for _, n in workers)
        for res, n in sorted(workers, key=lambda w: -float(w[0].get(k, 0))):
            take = min(n, left)
            out[k] = out.get(k, 0.0) + take * float(res.get(k, 0))
            left -= take
            if left <= 0:
                break
    return out
