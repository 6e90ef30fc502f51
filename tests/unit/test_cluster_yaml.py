"""cluster.yaml and its on-prem variant pass Ray's own cluster-launcher validation."""

import os

import pytest
import yaml

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


@pytest.mark.parametrize("path", ["cluster.yaml", "configs/cluster-onprem.yaml"])
def test_cluster_config_passes_ray_validation(path):
    # What `ray up` does first: fill in the provider's defaults, then validate (schema + rules).
    from ray.autoscaler._private.util import prepare_config, validate_config

    with open(os.path.join(ROOT, path)) as f:
        cfg = yaml.safe_load(f)
    validate_config(prepare_config(dict(cfg)))
    assert any("pip install" in c for c in cfg["setup_commands"])


def test_cluster_has_a_gpu_worker_type_with_min_max():
    with open(os.path.join(ROOT, "cluster.yaml")) as f:
        cfg = yaml.safe_load(f)
    gpu = cfg["available_node_types"]["gpu_worker"]
    assert gpu["min_workers"] == 0 and gpu["max_workers"] >= 1
    assert cfg["head_node_type"] == "head"


def test_gpu_config_is_a_valid_training_config():
    from orchestrator.config import read_yaml, validate

    cfg = validate(read_yaml(os.path.join(ROOT, "configs", "cifar10_resnet.yaml")))
    assert cfg.scaling.use_gpu and cfg.batch.policy == "noise_scale"


def test_ray_validation_rejects_a_broken_cluster_config():
    """The check above can fail: an unknown top-level key is refused."""
    from ray.autoscaler._private.util import prepare_config, validate_config

    with open(os.path.join(ROOT, "configs/cluster-onprem.yaml")) as f:
        cfg = yaml.safe_load(f)
    cfg["min_worker"] = 2
    with pytest.raises(Exception, match="min_worker"):
        validate_config(prepare_config(cfg))
