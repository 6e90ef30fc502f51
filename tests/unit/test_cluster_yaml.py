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
    from orchestrator.config.schema import read_yaml, validate

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


# --------------------------------------------------------------------------- security of the cluster files


def _load(path):
    with open(os.path.join(ROOT, path)) as f:
        return f.read(), yaml.safe_load(f.seek(0) or f)


@pytest.mark.parametrize("path", ["cluster.yaml", "configs/cluster-onprem.yaml"])
def test_every_ray_start_turns_on_token_authentication(path):
    _, cfg = _load(path)
    starts = [
        c for key in ("head_start_ray_commands", "worker_start_ray_commands") for c in cfg[key] if "ray start" in c
    ]
    assert len(starts) == 2
    assert all(c.startswith("RAY_AUTH_MODE=token ray start") for c in starts), starts
    # the token reaches every node through the launcher's file mounts (over SSH), never through git
    assert cfg["file_mounts"]["/home/ubuntu/.ray/auth_token"] == "~/.ray/auth_token"


@pytest.mark.parametrize("path", ["cluster.yaml", "configs/cluster-onprem.yaml"])
def test_no_personal_ssh_key_is_uploaded_to_the_head(path):
    _, cfg = _load(path)
    key = cfg["auth"].get("ssh_private_key")
    # none named: the AWS launcher makes a key pair for this cluster; named: a dedicated one
    assert key is None or not os.path.basename(key).startswith("id_"), key


@pytest.mark.parametrize("path", ["cluster.yaml", "configs/cluster-onprem.yaml"])
def test_uploads_leave_out_databases_journals_and_secrets(path):
    import fnmatch

    _, cfg = _load(path)
    excluded = cfg["rsync_exclude"]
    for name in ("mlflow.db", "optuna.journal", ".env", "prod.env", "ray_runs"):
        assert any(fnmatch.fnmatch(name, pat) for pat in excluded), name
    # `ray job submit --working-dir .` honours .gitignore: the same files stay out of job uploads
    with open(os.path.join(ROOT, ".gitignore")) as f:
        ignored = [line.strip() for line in f if line.strip() and not line.startswith("#")]
    for name in ("mlflow.db", "optuna.journal", ".env", "prod.env", "study.journal"):
        assert any(fnmatch.fnmatch(name, pat) for pat in ignored), name


def test_the_header_submit_command_keeps_its_results_outside_the_job_folder():
    text, _ = _load("cluster.yaml")
    header = "\n".join(line for line in text.splitlines() if line.startswith("#"))
    assert "--tracking-uri sqlite:////" in header  # an absolute path: outlives the job's working dir
    assert "checkpoint.storage_path=/" in header
