"""A resize happens only when it pays (``scaling.resize_when: pays``, the default): on a real local
Ray, a run whose batch doubles for its short last epoch needs 2 workers, but the group's start
measured on this cluster is longer than anything the second worker could save before training
ends, so the group stays at 1 worker and the run says why (metrics ``resize/skipped_*``, tag
``elastic.resize_skipped_reason``)."""

import pytest
from mlflow.tracking import MlflowClient

from orchestrator.run.runner import run_training
from tests.helpers import make_config, metric_series

pytestmark = pytest.mark.integration


def test_a_resize_that_cannot_pay_is_skipped(ray_cluster, tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cfg = make_config(
        tmp_path,
        uri,
        batch={"size": 32, "max_local_batch": 32, "policy": "schedule", "schedule": [[1, 64]]},
        scaling={
            "min_workers": 1,
            "max_workers": 2,
            "cpus_per_worker": 0.5,
            "resize_mode": "restart",
            "resize_when": "pays",
        },
        train={"epochs": 2, "eval_every": 0, "log_every": 5},
    )
    run = run_training(cfg, progress=False)
    assert run.status == "FINISHED" and run.resizes == []
    assert {w for _, w in metric_series(uri, run.run_id, "workers")} == {1.0}
    assert {b for _, b in metric_series(uri, run.run_id, "batch/global")} == {32.0, 64.0}  # B grew all the same
    ((step, gain),) = metric_series(uri, run.run_id, "resize/skipped_gain_s")
    ((_, cost),) = metric_series(uri, run.run_id, "resize/skipped_cost_s")
    assert 0 <= gain < cost, (gain, cost)
    tags = MlflowClient(uri).get_run(run.run_id).data.tags
    assert tags["elastic.resizes_skipped"] == "1"
    assert "keeping the group" in tags["elastic.resize_skipped_reason"]
