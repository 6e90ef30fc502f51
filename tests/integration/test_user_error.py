"""The user's own dataset raising on one record in the first epoch (no pre-flight check can see it):
one line naming the user's file, line and exception, the run id and its link, exit 1, the run
FAILED with the failure tagged and the whole traceback logged, and no restart spent on it."""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys

from tests.byo_workloads import CorruptRecord

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_an_error_in_the_users_dataset_is_one_line_with_its_place_and_is_not_retried(ray_cluster, tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    env = {k: v for k, v in os.environ.items() if k != "ELASTIC_KEEP_RAY"}
    env.update(RAY_ADDRESS=ray_cluster.get_runtime_context().gcs_address, PYTHONPATH=ROOT)
    sets = [
        "data.factory=tests.byo_workloads:corrupt_digits",
        "data.params.bad=100",
        "model.name=null",
        "model.factory=tests.byo_workloads:mlp",
        "scaling.max_workers=1",
        "scaling.min_workers=1",
        "scaling.max_failures=3",
        f"checkpoint.storage_path={tmp_path}/ray_runs",
    ]
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestrator",
            "train",
            os.path.join(ROOT, "configs", "quickstart.yaml"),
            "--no-progress",
            "--tracking-uri",
            uri,
        ]
        + [a for s in sets for a in ("--set", s)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=400,
        env=env,
    )
    said = out.stdout + out.stderr
    assert out.returncode == 1, said[-3000:]
    line = (
        inspect.getsource(CorruptRecord.__getitem__)
        .splitlines()
        .index('            raise ValueError(f"corrupt record {i}")')
        + CorruptRecord.__getitem__.__code__.co_firstlineno
    )
    want = f"error: byo_workloads.py:{line} in __getitem__: ValueError: corrupt record 100"
    assert want in out.stderr.splitlines(), said[-3000:]
    assert "Traceback" not in said and "worker group restarted" not in said, said[-3000:]
    run_id = re.search(r"MLflow run id\s+(\w+)", out.stdout).group(1)
    assert f"/runs/{run_id}" in out.stdout and "python -m orchestrator ui" in out.stdout, out.stdout
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    run = client.get_run(run_id)
    assert run.info.status == "FAILED"
    assert run.data.tags["elastic.failure"].startswith(want[len("error: ") :]), run.data.tags["elastic.failure"]
    assert "not retried" in run.data.tags["elastic.failure"]
    assert "elastic.restarts" not in run.data.tags  # the deterministic error spent no restart
    text = open(client.download_artifacts(run_id, "failure/traceback.txt", str(tmp_path))).read()
    assert "byo_workloads.py" in text and "ValueError: corrupt record 100" in text
