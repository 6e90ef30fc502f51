"""On a real local Ray: an epoch's short last global batch split over W workers leaves one worker a
single sample, which a BatchNorm1d layer cannot train on.  The run used to fail there with a
ValueError inside training (and leave a FAILED MLflow run); the layer now uses its running
statistics for that one forward (trainers/workload/batchnorm.py) and the run finishes.  A config
whose every step would meet a single sample is refused before Ray starts (tests/unit/test_pipeline.py)."""

import math

import pytest

from orchestrator.config.prepare import prepare
from orchestrator.run.runner import run_training
from tests.helpers import metric_series

pytestmark = pytest.mark.integration


def test_a_one_sample_slice_of_the_epochs_tail_trains_through_batchnorm(ray_cluster, tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    # 66 synthetic samples, 13 held out: 53 to train; B = 10 over W = 2 gives slices of 5 and 5, and the
    # epoch's last batch of 3 samples gives slices of 2 and 1
    cfg = prepare(
        {
            "data": {"name": "synthetic", "size": 66, "shape": [6]},
            "model": {"name": "mlp", "norm": "batch", "hidden": 16},
            "optimizer": {"name": "sgd", "lr": 0.05, "mf": 0.9, "base_batch_size": 10},
            "batch": {"size": 10, "max_local_batch": 8},
            "scaling": {"min_workers": 2, "max_workers": 2, "cpus_per_worker": 0.5},
            "train": {"epochs": 1, "seed": 0, "log_every": 1},
            "checkpoint": {"storage_path": str(tmp_path / "ray_runs")},
            "tracking": {"uri": uri, "experiment": "bn-tail"},
        }
    )
    summary = run_training(cfg, progress=False)
    assert summary.status == "FINISHED", summary.error
    assert summary.steps == math.ceil(53 / 10)
    samples = metric_series(uri, summary.run_id, "batch/samples")
    assert samples[-1] == (6, 3.0)
    assert {v for _, v in metric_series(uri, summary.run_id, "workers")} == {2.0}
    assert all(math.isfinite(v) for _, v in metric_series(uri, summary.run_id, "train/loss"))
