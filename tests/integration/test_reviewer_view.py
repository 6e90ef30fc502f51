"""What a reviewer finds in MLflow after a real run on a local Ray: the final
model as an MLflow PyTorch model with a signature (loadable), each checkpoint as a LoggedModel with its
step and metrics, the best of them by val/loss registered, the datasets as inputs, system metrics from the
driver and from the workers' node, the resize timeline (table and chart), only the params that
apply, the git source, and the summary's stretches of B and W."""

from __future__ import annotations

import json
import os
import subprocess

import numpy as np
import pytest

from orchestrator.run.runner import run_training
from tests.helpers import make_config, metric_series

pytestmark = pytest.mark.integration

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_a_run_logs_its_model_system_metrics_timeline_and_source(ray_cluster, tmp_path):
    import mlflow.pytorch
    import torch
    from mlflow.models import get_model_info
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cfg = make_config(
        tmp_path,
        uri,
        optimizer={"base_batch_size": 32},
        batch={"size": 32, "max_local_batch": 32, "policy": "schedule", "schedule": [[1, 64]]},
        scaling={"min_workers": 1, "max_workers": 2, "resize_mode": "restart", "cpus_per_worker": 0.5},
        train={"epochs": 2},
        tracking={"uri": uri, "experiment": "review", "register_pick": "best"},
        checkpoint={"keep": 5},
    )
    s = run_training(cfg, progress=False, register_model="digits-mlp")
    assert s.status == "FINISHED" and len(s.resizes) == 1, s
    client = MlflowClient(uri)
    run = client.get_run(s.run_id)

    # the summary's stretches: B 32 on 1 worker, then B 64 on 2 after the resize (with its latency)
    assert [(p["batch"], p["workers"]) for p in s.phases] == [(32, 1), (64, 2)]
    assert s.phases[0]["resize_latency_s"] is None and s.phases[1]["resize_latency_s"] == s.resizes[0]["latency_s"]
    assert sum(p["samples"] for p in s.phases) == 2 * 1438

    # the model: an MLflow PyTorch model with a signature, loadable, registered under the name given
    info = get_model_info(s.model_uri)
    assert info.signature is not None and tuple(info.signature.inputs.inputs[0].shape) == (-1, 1, 8, 8)
    model = mlflow.pytorch.load_model(s.model_uri)
    x = torch.from_numpy(np.random.default_rng(0).random((3, 1, 8, 8), dtype=np.float32))
    assert tuple(model(x).shape) == (3, 10)
    models = client.search_logged_models([s.experiment_id])
    assert {m.source_run_id for m in models} == {s.run_id}
    (final,) = [m for m in models if m.name == "final_model"]
    assert s.model_uri == final.model_uri and {x.step for x in final.metrics} == {s.steps}
    # each checkpoint a LoggedModel at its step, referring to the checkpoint's folder, its val metrics linked
    checkpoints = {int(m.tags["elastic.checkpoint.step"]): m for m in models if m.model_type == "checkpoint"}
    assert {45, s.steps} <= set(checkpoints), sorted(checkpoints)  # the resize's (epoch 1's end) and the last
    for step, m in checkpoints.items():
        assert (
            os.path.isdir(m.tags["elastic.checkpoint.uri"])
            and f"checkpoint_step{step:08d}" in m.tags["elastic.checkpoint.uri"]
        )
        assert {x.key for x in m.metrics} >= {"val/loss", "val/accuracy", "train/loss"}
        assert {x.step for x in m.metrics} == {step}
    outputs = {(o.model_id, o.step) for o in run.outputs.model_outputs}
    assert {(m.model_id, step) for step, m in checkpoints.items()} <= outputs
    assert len(metric_series(uri, s.run_id, "val/loss")) == len(
        {st for st, _ in metric_series(uri, s.run_id, "val/loss")}
    )
    # the best by val/loss (search_logged_models ordered by it) is what --register registered
    (best, *_) = client.search_logged_models(
        [s.experiment_id],
        filter_string=f"source_run_id = '{s.run_id}'",
        order_by=[{"field_name": "metrics.val/loss", "ascending": True}],
    )
    (version,) = client.search_model_versions("name='digits-mlp'")
    assert version.run_id == s.run_id and s.registered == f"digits-mlp/{version.version}"
    registered = client.get_logged_model(version.source.removeprefix("models:/"))
    best_step = {x.step for x in best.metrics}
    assert registered.name in ("final_model", "best_model") and {x.step for x in registered.metrics} == best_step

    # the datasets: digits, in the training and the validation context
    inputs = {
        ({t.key: t.value for t in d.tags}["mlflow.data.context"], d.dataset.name) for d in run.inputs.dataset_inputs
    }
    assert inputs == {("training", "digits"), ("validation", "digits")}

    # system metrics: the one machine once, as the driver's (MLflow's monitor); rank 0, on the same
    # node, sends no second copy of it under another name (system/worker-<host>/...)
    keys = set(run.data.metrics)
    assert "system/cpu_utilization_percentage" in keys and "system/system_memory_usage_megabytes" in keys
    assert not [k for k in keys if k.startswith("system/") and k.count("/") == 2], sorted(keys)

    # the resize timeline: one table (stretches and the resize, with its parts) and one chart,
    # not a one-dot chart per part
    arts = {a.path for a in client.list_artifacts(s.run_id)} | {
        a.path for a in client.list_artifacts(s.run_id, "plots")
    }
    assert {"timeline.json", "plots/timeline.png", "plots/training_curves.png"} <= arts
    with open(client.download_artifacts(s.run_id, "timeline.json", str(tmp_path))) as f:
        table = json.load(f)
    rows = [dict(zip(table["columns"], r)) for r in table["data"]]
    assert [r["kind"] for r in rows] == ["train", "resize", "train"]
    assert rows[1]["mode"] == "restart" and rows[1]["teardown_s"] > 0
    assert "resize/to" in keys and not [k for k in keys if k in ("resize/setup_s", "resize/start_s")]
    # the resize's chart is a line across the stretch it opened, not a lone dot
    assert [v for _, v in metric_series(uri, s.run_id, "resize/to")] == [2.0, 2.0]

    # the description: what was trained, its final training metrics, how B and W changed
    note = run.data.tags["mlflow.note.content"]
    assert note.startswith("**mlp** on **digits**: ") and "\n- val/accuracy **" in note
    assert "B 32 -> 64 at step 46; W 1 -> 2 at step 46 (1 resize of the worker group)" in note, note

    # only the params that apply; the git source of the project
    assert run.data.params["batch.schedule"] and "data.size" not in run.data.params
    assert not [k for k in run.data.params if k.startswith("schedule.auto_")]
    if os.path.exists(os.path.join(ROOT, ".git")):
        head = subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
        assert run.data.tags["mlflow.source.git.commit"] == head
        assert run.data.tags["mlflow.source.name"]
