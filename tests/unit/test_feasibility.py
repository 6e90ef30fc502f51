"""Impossible resources (a run would wait forever for them): a pure check on resource dicts, no Ray."""

from __future__ import annotations

import pytest

from orchestrator.config.feasibility import capacity, check_feasible, max_resources
from orchestrator.config.schema import validate


def cfg(**scaling):
    """A validated config's scaling section (what ``check_feasible`` reads)."""
    return validate({"scaling": scaling}).scaling


LAPTOP = {"CPU": 8.0, "memory": 1e10, "node:127.0.0.1": 1.0}


@pytest.mark.parametrize(
    "scaling",
    [
        {"max_workers": 8},
        {"max_workers": 4, "cpus_per_worker": 2},
        {"max_workers": 2, "cpus_per_worker": 0.5},
    ],
)
def test_fits(scaling):
    assert check_feasible(cfg(**scaling), LAPTOP, None) is None


def test_gpu_on_a_cluster_without_gpus():
    msg = check_feasible(cfg(use_gpu=True), LAPTOP, None)
    assert msg.startswith("scaling.use_gpu: true but the cluster has no GPU;") and "\n" not in msg


def test_too_many_cpus_names_the_product_and_a_fix():
    msg = check_feasible(cfg(max_workers=5, cpus_per_worker=2), LAPTOP, None)
    assert msg == (
        "scaling.max_workers x cpus_per_worker: 5 x 2 = 10 CPUs, but the cluster has 8; "
        "lower scaling.max_workers to at most 4 or scaling.cpus_per_worker"
    )


def test_one_worker_larger_than_the_cluster():
    msg = check_feasible(cfg(max_workers=1, cpus_per_worker=16), LAPTOP, None)
    assert msg.endswith("lower scaling.cpus_per_worker to at most 8")


def test_too_many_gpus():
    msg = check_feasible(cfg(max_workers=4, use_gpu=True, gpus_per_worker=1), {"CPU": 64, "GPU": 2}, None)
    assert msg.startswith("scaling.max_workers x gpus_per_worker: 4 x 1 = 4 GPUs, but the cluster has 2;")
    assert check_feasible(cfg(max_workers=4, use_gpu=True, gpus_per_worker=0.5), {"CPU": 64, "GPU": 2}, None) is None


def test_an_autoscaler_can_add_what_is_missing():
    # a cluster at zero workers: the head has 2 CPUs now, the autoscaler may grow to 34 CPUs and 4 GPUs
    now, later = {"CPU": 2.0}, {"CPU": 34.0, "GPU": 4.0}
    assert check_feasible(cfg(max_workers=4, use_gpu=True, cpus_per_worker=8), now, later) is None
    msg = check_feasible(cfg(max_workers=8, cpus_per_worker=8), now, later)
    assert "but the cluster can ever have (autoscaler limits included) 34" in msg


def test_capacity_takes_the_larger_of_now_and_later():
    assert capacity({"CPU": 8, "GPU": 1}, {"CPU": 4, "TPU": 2}) == {"CPU": 8, "GPU": 1, "TPU": 2}
    assert capacity({"CPU": 8}, None) == {"CPU": 8}


AUTOSCALING = {
    "max_workers": 5,
    "head_node_type": "head",
    "available_node_types": {
        "head": {"resources": {"CPU": 2}, "max_workers": 0},
        "cpu": {"resources": {"CPU": 8}, "min_workers": 0, "max_workers": 4},
        "gpu": {"resources": {"CPU": 4, "GPU": 2}, "max_workers": 2},
    },
}


def test_max_resources_of_an_autoscaling_config():
    # CPU: head 2 + the 5 richest worker slots by CPU (4 x 8 + 1 x 4); GPU: head 0 + 2 x 2
    assert max_resources(AUTOSCALING) == {"CPU": 2 + 4 * 8 + 1 * 4, "GPU": 4.0}


def test_max_resources_without_a_global_cap():
    conf = {**AUTOSCALING}
    del conf["max_workers"]
    assert max_resources(conf) == {"CPU": 2 + 4 * 8 + 2 * 4, "GPU": 4.0}


def test_max_resources_unknown_when_a_type_does_not_declare_them():
    conf = {
        **AUTOSCALING,
        "available_node_types": {**AUTOSCALING["available_node_types"], "auto": {"node_config": {}, "max_workers": 3}},
    }
    assert max_resources(conf) is None
    assert max_resources({"cluster_name": "x"}) is None
