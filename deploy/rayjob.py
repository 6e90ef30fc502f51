"""A KubeRay RayJob manifest for a training run or a search, sized from the config it runs.

    python deploy/rayjob.py train configs/quickstart.yaml > rayjob.yaml
    python deploy/rayjob.py search configs/search_quickstart.yaml --parallel 2 > rayjob-search.yaml
    kubectl apply -f rayjob.yaml

KubeRay creates a RayCluster (a head pod that runs the driver and no training, like cluster.yaml's
head, and one worker group), then submits the entrypoint with ``ray job submit``.  One worker pod holds
one training worker (``scaling.cpus_per_worker`` CPUs, ``scaling.gpus_per_worker`` GPUs with
``use_gpu``): the group's ``minReplicas``/``maxReplicas`` are ``scaling.min_workers``/``max_workers``
(a search: ``max_workers`` times ``--parallel`` trials), and Ray's autoscaler in the head
(``enableInTreeAutoscaling``) adds pods as the run's batch and worker count grow.  The committed
examples beside this file are what these two commands print (tests/unit/test_rayjob.py)."""

from __future__ import annotations

import argparse
import math
import os
import sys
from typing import Any

import ray
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, ROOT)

from orchestrator.config import schema  # noqa: E402
from search.space import load_space  # noqa: E402

PY = f"py{sys.version_info.major}{sys.version_info.minor}"
IMAGE = f"rayproject/ray:{ray.__version__}-{PY}"  # the project installed on top of it: --image (README)
STORAGE = "s3://YOUR-BUCKET/ray_runs"  # shared by every pod: an object store (or a volume on all of them)
TRACKING = "http://mlflow.YOUR-NAMESPACE.svc:5000"  # an MLflow server the pods reach
STUDY = "postgresql://optuna@postgres.YOUR-NAMESPACE.svc/optuna"  # the study's RDB; its password: PGPASSWORD
STUDY_SECRET = "optuna-db"  # the Kubernetes Secret whose key "password" becomes PGPASSWORD on the head
HEAD = {"cpu": "2", "memory": "8Gi"}  # the driver, Ray Train's controller, the run's monitor
MEMORY_PER_CPU_GI = 4


def _worker_resources(s: schema.ScalingConfig) -> dict[str, Any]:
    cpus = max(1, math.ceil(s.cpus_per_worker))
    amounts: dict[str, Any] = {"cpu": str(cpus), "memory": f"{cpus * MEMORY_PER_CPU_GI}Gi"}
    if s.use_gpu:
        amounts["nvidia.com/gpu"] = str(max(1, math.ceil(s.gpus_per_worker)))
    return {"limits": dict(amounts), "requests": dict(amounts)}


def _container(name: str, image: str, resources: dict[str, Any], env: list[dict[str, Any]]) -> dict[str, Any]:
    c: dict[str, Any] = {"name": name, "image": image, "resources": resources}
    if env:
        c["env"] = [dict(e) for e in env]  # each pod its own copy (no YAML anchors)
    return c


def manifest(
    name: str,
    entrypoint: str,
    scaling: schema.ScalingConfig,
    min_replicas: int,
    max_replicas: int,
    image: str = IMAGE,
    code: str | None = None,
    head_env: list[dict[str, Any]] | None = None,
    retries: int = 0,
) -> dict[str, Any]:
    """A ``ray.io/v1`` RayJob: the entrypoint, a head group without CPUs for Ray, and one worker group of
    ``min_replicas`` to ``max_replicas`` pods sized for one training worker each.  ``code``: a URI of
    the project's code (a zip) for the job's ``working_dir``; None: the image holds it.  ``retries``: the
    RayJob's ``backoffLimit`` (only for an entrypoint that resumes its own run when started again)."""
    image = image.replace(f"-{PY}", f"-{PY}-gpu") if scaling.use_gpu and image == IMAGE else image
    env: list[dict[str, Any]] = [{"name": "MLFLOW_TRACKING_URI", "value": TRACKING}]
    head = env + (head_env or [])
    spec: dict[str, Any] = {
        "entrypoint": entrypoint,
        "shutdownAfterJobFinishes": True,
        "ttlSecondsAfterFinished": 600,
        "backoffLimit": retries,
        "rayClusterSpec": {
            "rayVersion": ray.__version__,
            "enableInTreeAutoscaling": True,
            "autoscalerOptions": {"idleTimeoutSeconds": 60},
            "headGroupSpec": {
                "rayStartParams": {"num-cpus": "0", "dashboard-host": "0.0.0.0"},
                "template": {
                    "spec": {
                        "containers": [
                            _container("ray-head", image, {"limits": dict(HEAD), "requests": dict(HEAD)}, head)
                        ]
                    }
                },
            },
            "workerGroupSpecs": [
                {
                    "groupName": "gpu-workers" if scaling.use_gpu else "cpu-workers",
                    "replicas": min_replicas,
                    "minReplicas": min_replicas,
                    "maxReplicas": max_replicas,
                    "rayStartParams": {},
                    "template": {
                        "spec": {"containers": [_container("ray-worker", image, _worker_resources(scaling), env)]}
                    },
                }
            ],
        },
    }
    if code:
        spec["runtimeEnvYAML"] = yaml.safe_dump({"working_dir": code}, sort_keys=False)
    return {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": name}, "spec": spec}


def _job_name(path: str, kind: str) -> str:
    stem = os.path.splitext(os.path.basename(path))[0].replace("_", "-").lower()
    return (stem if stem.startswith(kind) else f"{kind}-{stem}")[:63]


def train_manifest(config: str, storage: str = STORAGE, **kw: Any) -> dict[str, Any]:
    """The RayJob of ``python -m orchestrator train CONFIG`` (``config``: a path in the project)."""
    raw = schema.apply_overrides(schema.read_yaml(os.path.join(ROOT, config)), [f"checkpoint.storage_path={storage}"])
    cfg: schema.RootConfig = schema.validate(raw)  # the fields only: the data is on the cluster, not here
    s = cfg.scaling
    name = _job_name(config, "train")
    # the RayJob's name as the run key: a retry (backoffLimit) resumes the same MLflow run from its newest
    # checkpoint instead of starting a second one (README, "RayJob retries and backoffLimit")
    entry = (
        f"python -m orchestrator train {config} --no-progress --run-key {name} --set checkpoint.storage_path={storage}"
    )
    return manifest(name, entry, s, s.min_workers, s.max_workers, retries=2, **kw)


def search_manifest(space: str, parallel: int, trials: int, study: str = STUDY, **kw: Any) -> dict[str, Any]:
    """The RayJob of ``python -m search run SPACE --parallel N`` (``space``: a path in the project):
    up to ``parallel`` trials at once, each of at most ``scaling.max_workers`` workers; the study in
    the RDB ``study`` (its password from the Secret :data:`STUDY_SECRET`, never in the manifest).
    The trials' checkpoints go where the space's base config puts them (``checkpoint.storage_path``
    in its ``overrides``: a bucket every pod reaches)."""
    base = load_space(os.path.join(ROOT, space)).base
    s = schema.validate(base).scaling
    entry = f"python -m search run {space} --trials {trials} --parallel {parallel} --storage {study} --no-progress"
    password = {"name": "PGPASSWORD", "valueFrom": {"secretKeyRef": {"name": STUDY_SECRET, "key": "password"}}}
    kw.pop("storage", None)
    return manifest(
        _job_name(space, "search"), entry, s, s.min_workers, s.max_workers * parallel, head_env=[password], **kw
    )


def render(doc: dict[str, Any], command: str) -> str:
    head = (
        f"# Generated by: python deploy/{command}\n"
        "# Before applying: the image (with this project installed), the MLflow server, the storage.\n"
    )
    return head + yaml.safe_dump(doc, sort_keys=False, width=1000)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="deploy/rayjob.py", description=__doc__.splitlines()[0])
    p.add_argument("kind", choices=["train", "search"])
    p.add_argument("config", help="a training config (train) or a search space (search), as a path in the project")
    p.add_argument("--parallel", type=int, default=2, help="search: trials at once (default 2)")
    p.add_argument("--trials", type=int, default=20, help="search: trials in all (default 20)")
    p.add_argument("--image", default=IMAGE, help=f"the pods' image, with this project installed (default {IMAGE})")
    p.add_argument("--code", help="a URI of the project's code as a zip, for the job's working_dir")
    p.add_argument("--storage", default=STORAGE, help=f"checkpoint.storage_path for every pod (default {STORAGE})")
    args = p.parse_args(argv)
    if args.parallel < 1 or args.trials < 1:
        print("error: --parallel and --trials: give a positive count, e.g. --parallel 2", file=sys.stderr)
        return 2
    kw = {"image": args.image, "code": args.code, "storage": args.storage}
    try:
        if args.kind == "train":
            doc = train_manifest(args.config, **kw)
        else:
            doc = search_manifest(args.config, args.parallel, args.trials, **kw)
    except (schema.ConfigError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    shown = " ".join(
        ["rayjob.py", args.kind, args.config] + (["--parallel", str(args.parallel)] if args.kind == "search" else [])
    )
    sys.stdout.write(render(doc, shown))
    return 0


if __name__ == "__main__":
    sys.exit(main())
