"""The KubeRay RayJob manifests (deploy/rayjob.py and the examples beside it): every field is one the
RayJob CRD (``ray.io/v1``) defines, of its type, with the fields it requires; the worker group's
``minReplicas``/``maxReplicas`` follow ``scaling.min_workers``/``max_workers`` of the config run (a
search: times its parallel trials); the committed examples are what the generator prints now.

No package on this machine's registries ships the CRD, so the field table below is taken from
KubeRay's own CRD (``ray-operator/config/crd/bases/ray.io_rayjobs.yaml``, ray-project/kuberay at
feeaf72fa): the properties and ``required`` lists of the objects the manifests fill in."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]

# object -> {field: type}; the pod templates are Kubernetes' own PodTemplateSpec (not checked here)
FIELDS: dict[str, dict[str, str]] = {
    "RayJob": {"apiVersion": "string", "kind": "string", "metadata": "object", "spec": "object"},
    "RayJobSpec": {
        "activeDeadlineSeconds": "integer",
        "backoffLimit": "integer",
        "clusterSelector": "object",
        "deletionStrategy": "object",
        "entrypoint": "string",
        "entrypointNumCpus": "number",
        "entrypointNumGpus": "number",
        "entrypointResources": "string",
        "jobId": "string",
        "managedBy": "string",
        "metadata": "object",
        "preRunningDeadlineSeconds": "integer",
        "rayClusterSpec": "object",
        "runtimeEnvYAML": "string",
        "shutdownAfterJobFinishes": "boolean",
        "submissionMode": "string",
        "submitterConfig": "object",
        "submitterPodTemplate": "object",
        "suspend": "boolean",
        "ttlSecondsAfterFinished": "integer",
    },
    "RayClusterSpec": {
        "authOptions": "object",
        "autoscalerOptions": "object",
        "enableInTreeAutoscaling": "boolean",
        "gcsFaultToleranceOptions": "object",
        "headGroupSpec": "object",
        "headServiceAnnotations": "object",
        "historyServerOptions": "object",
        "managedBy": "string",
        "networkPolicy": "object",
        "rayVersion": "string",
        "suspend": "boolean",
        "tlsOptions": "object",
        "upgradeStrategy": "object",
        "workerGroupSpecs": "array",
    },
    "HeadGroupSpec": {
        "enableIngress": "boolean",
        "headService": "object",
        "ingressOptions": "object",
        "labels": "object",
        "rayStartParams": "object",
        "resources": "object",
        "serviceType": "string",
        "template": "object",
    },
    "WorkerGroupSpec": {
        "groupName": "string",
        "idleTimeoutSeconds": "integer",
        "labels": "object",
        "maxReplicas": "integer",
        "minReplicas": "integer",
        "numOfHosts": "integer",
        "priority": "integer",
        "rayStartParams": "object",
        "replicas": "integer",
        "resources": "object",
        "scaleStrategy": "object",
        "suspend": "boolean",
        "template": "object",
    },
}
REQUIRED = {
    "RayClusterSpec": {"headGroupSpec"},
    "HeadGroupSpec": {"template"},
    "WorkerGroupSpec": {"groupName", "maxReplicas", "minReplicas", "template"},
}
TYPES = {"string": str, "object": dict, "array": list, "boolean": bool, "integer": int, "number": (int, float)}


def _generator():
    spec = importlib.util.spec_from_file_location("rayjob", ROOT / "deploy" / "rayjob.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def crd_problems(doc: dict[str, Any]) -> list[str]:
    """Each field of ``doc`` the CRD does not define, of another type, or required and missing."""
    problems = []

    def check(obj: dict[str, Any], kind: str, where: str) -> None:
        for key, value in obj.items():
            want = FIELDS[kind].get(key)
            if want is None:
                problems.append(f"{where}.{key}: not a field of {kind}")
            elif not isinstance(value, TYPES[want]) or (want == "integer" and isinstance(value, bool)):
                problems.append(f"{where}.{key}: {type(value).__name__}, the CRD says {want}")
        problems.extend(f"{where}.{key}: required by {kind}" for key in REQUIRED.get(kind, set()) - set(obj))

    check(doc, "RayJob", "")
    spec = doc.get("spec", {})
    check(spec, "RayJobSpec", ".spec")
    cluster = spec.get("rayClusterSpec", {})
    check(cluster, "RayClusterSpec", ".spec.rayClusterSpec")
    check(cluster.get("headGroupSpec", {}), "HeadGroupSpec", ".spec.rayClusterSpec.headGroupSpec")
    for i, group in enumerate(cluster.get("workerGroupSpecs", [])):
        check(group, "WorkerGroupSpec", f".spec.rayClusterSpec.workerGroupSpecs[{i}]")
    return problems


EXAMPLES = {
    "rayjob-train.yaml": ["train", "configs/cifar10_resnet.yaml"],
    "rayjob-search.yaml": ["search", "configs/search_quickstart.yaml", "--parallel", "2"],
}


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_the_committed_examples_are_what_the_generator_prints_and_fit_the_crd(name, capsys):
    assert _generator().main(EXAMPLES[name]) == 0
    printed = capsys.readouterr().out
    committed = (ROOT / "deploy" / name).read_text()
    assert printed == committed, f"deploy/{name} is stale: run python deploy/rayjob.py {' '.join(EXAMPLES[name])}"
    doc = yaml.safe_load(committed)
    assert doc["apiVersion"] == "ray.io/v1" and doc["kind"] == "RayJob"
    assert crd_problems(doc) == []


def test_the_crd_check_finds_a_wrong_field_type_and_a_missing_required_one():
    doc = _generator().train_manifest("configs/quickstart.yaml")
    group = doc["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]
    group["maxReplicas"] = "2"
    del group["minReplicas"]
    doc["spec"]["backofLimit"] = 0
    assert sorted(crd_problems(doc)) == [
        ".spec.backofLimit: not a field of RayJobSpec",
        ".spec.rayClusterSpec.workerGroupSpecs[0].maxReplicas: str, the CRD says integer",
        ".spec.rayClusterSpec.workerGroupSpecs[0].minReplicas: required by WorkerGroupSpec",
    ]


def test_the_worker_group_follows_the_configs_scaling(tmp_path):
    gen = _generator()
    config = tmp_path / "elastic.yaml"
    config.write_text(
        yaml.safe_dump({"scaling": {"min_workers": 2, "max_workers": 6, "use_gpu": True, "gpus_per_worker": 1}})
    )
    doc = gen.train_manifest(str(config), storage="s3://b/runs")
    (group,) = doc["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    assert (group["minReplicas"], group["replicas"], group["maxReplicas"]) == (2, 2, 6)
    (worker,) = group["template"]["spec"]["containers"]
    assert worker["resources"]["limits"]["nvidia.com/gpu"] == "1" and worker["image"].endswith("-gpu")
    assert doc["spec"]["rayClusterSpec"]["enableInTreeAutoscaling"] is True
    assert doc["spec"]["rayClusterSpec"]["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"
    assert doc["spec"]["entrypoint"].endswith("--set checkpoint.storage_path=s3://b/runs")
    assert crd_problems(doc) == []


def test_a_search_holds_its_parallel_trials_and_no_password():
    gen = _generator()
    doc = gen.search_manifest("configs/search_quickstart.yaml", parallel=3, trials=12)
    (group,) = doc["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    assert (group["minReplicas"], group["maxReplicas"]) == (1, 3)  # max_workers 1 per trial, 3 at once
    assert "--trials 12 --parallel 3" in doc["spec"]["entrypoint"]
    (head,) = doc["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"]
    secret = {e["name"]: e for e in head["env"]}["PGPASSWORD"]["valueFrom"]["secretKeyRef"]
    assert secret == {"name": gen.STUDY_SECRET, "key": "password"}
    study = doc["spec"]["entrypoint"].split("--storage ")[1].split()[0]
    assert "@" in study and ":" not in study.split("//")[1].split("@")[0]  # a user, never its password


def test_a_training_rayjob_retries_into_its_own_run():
    doc = _generator().train_manifest("configs/quickstart.yaml")
    name = doc["metadata"]["name"]
    assert f"--run-key {name} " in doc["spec"]["entrypoint"] and doc["spec"]["backoffLimit"] == 2
    search = _generator().search_manifest("configs/search_quickstart.yaml", parallel=2, trials=4)
    assert search["spec"]["backoffLimit"] == 0 and "--run-key" not in search["spec"]["entrypoint"]
