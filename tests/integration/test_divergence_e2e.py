"""A diverged run on a real local Ray ends FAILED with one line naming the step, the value and the
last finite checkpoint; the diverged model is not logged; the CLI exits 1."""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_a_diverged_run_ends_failed_and_keeps_its_last_finite_checkpoint(ray_cluster, tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    env = {k: v for k, v in os.environ.items() if k != "ELASTIC_KEEP_RAY"}
    env["RAY_ADDRESS"] = ray_cluster.get_runtime_context().gcs_address  # the tier's shared local Ray
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
            "--set",
            "optimizer.lr=1e6",
            "--set",
            "schedule.warmup=none",
            "--set",
            "checkpoint.every_steps=2",
            "--set",
            f"checkpoint.storage_path={tmp_path}/ray_runs",
            "--set",
            "scaling.max_workers=1",
            "--set",
            "scaling.min_workers=1",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=400,
        env={**env, "PYTHONPATH": ROOT},
    )
    assert out.returncode == 1, out.stderr[-3000:]
    assert "training diverged at step" in out.stdout + out.stderr
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert run.info.status == "FAILED"
    failure = run.data.tags["elastic.failure"]
    assert failure.startswith("training diverged at step"), failure
    assert not [a for a in client.list_artifacts(run.info.run_id) if a.path == "model"], "no diverged model"
    if "checkpoint is " in failure:  # the named checkpoint is there and intact
        from trainers.loop.checkpoint import verify_checkpoint

        path = failure.split("checkpoint is ")[1].split(";")[0]
        verify_checkpoint(path)


def test_rollback_on_a_real_ray_goes_back_halves_the_lr_and_stops_past_the_limit(ray_cluster, tmp_path):
    """train.on_nonfinite: rollback through the whole stack (on the shared local Ray): each rollback
    is a printed line, an MLflow metric (rollbacks, lr_factor) and a tag; past train.max_rollbacks
    the run ends FAILED."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    env = {k: v for k, v in os.environ.items() if k != "ELASTIC_KEEP_RAY"}
    env["RAY_ADDRESS"] = ray_cluster.get_runtime_context().gcs_address
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
            "--set",
            "optimizer.lr=1e6",
            "--set",
            "schedule.warmup=gradual",
            "--set",
            "schedule.warmup_epochs=3",
            "--set",
            "train.epochs=4",
            "--set",
            "train.on_nonfinite=rollback",
            "--set",
            "train.max_rollbacks=2",
            "--set",
            "checkpoint.every_steps=2",
            "--set",
            f"checkpoint.storage_path={tmp_path}/ray_runs",
            "--set",
            "scaling.max_workers=1",
            "--set",
            "scaling.min_workers=1",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=400,
        env={**env, "PYTHONPATH": ROOT},
    )
    said = out.stdout + out.stderr
    assert out.returncode == 1, said[-3000:]
    assert said.count("rolled back to step") == 2, said[-3000:]
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert run.info.status == "FAILED"
    assert "after 2 rollback(s)" in run.data.tags["elastic.failure"]
    assert run.data.tags["elastic.rollbacks"] == "2" and "rolled back to step" in run.data.tags["elastic.rollback.1"]
    assert [m.value for m in client.get_metric_history(run.info.run_id, "rollbacks")] == [1.0, 2.0]
    assert [m.value for m in client.get_metric_history(run.info.run_id, "lr_factor")] == [0.5, 0.25]
