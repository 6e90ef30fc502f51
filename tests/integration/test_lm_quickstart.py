"""The built-in language model on a real local Ray: configs/lm_quickstart.yaml (the GPT on byte-level tokens of
Python's own sources) learns within a fraction of an epoch, and logs the token metrics."""

import math
import os

import numpy as np
import pytest

from orchestrator.config.prepare import load_config
from orchestrator.run.runner import run_training
from tests.helpers import metric_series, migrated_store
from trainers.workload.build import train_size

pytestmark = pytest.mark.integration

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def test_lm_quickstart_perplexity_falls(ray_cluster, tmp_path):
    store = migrated_store(f"sqlite:///{tmp_path}/mlflow.db")
    cfg = load_config(
        os.path.join(ROOT, "configs", "lm_quickstart.yaml"),
        # a validation set of 2% (~490 windows, not the shipped 10%: a pass of those costs
        # ~25 training steps, more than these 0.1 epoch of training between four of them)
        [
            "train.epochs=0.1",
            "schedule.warmup_epochs=0.02",
            "schedule.decay=none",
            "schedule.min_lr=0",
            "data.val_fraction=0.02",
            "train.eval_every=20",
            "train.log_every=5",
            f"tracking.uri={store}",
            f"checkpoint.storage_path={tmp_path}/runs",
        ],
    )
    s = run_training(cfg, progress=False)
    assert s.status == "FINISHED" and s.steps == math.ceil(0.1 * train_size(cfg) / 32)
    uri = s.tracking_uri
    ppl = [v for _, v in metric_series(uri, s.run_id, "val/perplexity")]
    loss = [v for _, v in metric_series(uri, s.run_id, "val/loss")]
    assert len(ppl) >= 3 and all(b < a for a, b in zip(ppl, ppl[1:])) and ppl[-1] < 0.9 * ppl[0], ppl
    np.testing.assert_allclose(ppl, np.exp(loss), rtol=1e-6)
    train = [v for _, v in metric_series(uri, s.run_id, "train/loss")]
    assert np.mean(train[-5:]) < np.mean(train[:5])
    assert {v for _, v in metric_series(uri, s.run_id, "batch/global_tokens")} == {32 * 128.0}
    seen = metric_series(uri, s.run_id, "tokens_seen")
    assert seen[-1][1] == metric_series(uri, s.run_id, "samples_seen")[-1][1] * 128
    assert all(v > 0 for _, v in metric_series(uri, s.run_id, "throughput/tokens_per_s"))
