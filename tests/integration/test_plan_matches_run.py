"""``plan`` is what a run logs: on a real local Ray, a run with gradual warmup, cosine decay and a
batch schedule that grows B and resizes the group 1 -> 2 workers logs, at every step, exactly the
``lr``, ``mf``, ``batch/global`` and ``workers`` that ``make_plan`` previews (both ask the same
``trainers.policies.policy_set.PolicySet``)."""

import numpy as np
import pytest

from orchestrator.plan import make_plan
from orchestrator.runner import run_training
from tests.helpers import dense_series, make_config

pytestmark = pytest.mark.integration

N = 1438  # digits training samples at val_fraction 0.2


def test_plan_matches_what_the_run_logs(ray_cluster, tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cfg = make_config(tmp_path, uri,
                      optimizer={"base_batch_size": 16, "lr": 0.05, "mf": 0.9, "mf_rule": "per_worker_batch",
                                 "mf_ref_batch": 16},
                      batch={"size": 32, "max_local_batch": 32, "policy": "schedule", "schedule": [[1, 64]]},
                      schedule={"warmup": "gradual", "warmup_epochs": 0.5, "decay": "cosine"},
                      scaling={"min_workers": 1, "max_workers": 2, "cpus_per_worker": 0.5,
                               "resize_mode": "restart"},
                      train={"epochs": 2, "eval_every": 0})
    plan = make_plan(cfg, every=1)
    steps1 = -(-N // 32)
    assert plan.total_steps == steps1 + -(-N // 64)
    assert [int(r["step"]) for r in plan.rows] == list(range(1, plan.total_steps + 1))

    run = run_training(cfg, progress=False)
    assert run.status == "FINISHED"
    assert [(r["from"], r["to"], r["mode"]) for r in run.resizes] == [(1, 2, "restart")]
    for key, col in (("lr", "lr"), ("mf", "mf"), ("batch/global", "batch_global"), ("workers", "workers"),
                     ("batch/samples", "batch_samples")):
        logged = dense_series(uri, run.run_id, key)
        assert [s for s, _ in logged] == [int(r["step"]) for r in plan.rows], key
        np.testing.assert_allclose([v for _, v in logged], [float(r[col]) for r in plan.rows], rtol=0, atol=1e-9,
                                   err_msg=key)
    # the run really went through warmup, decay, the batch change and the resize
    rows = {int(r["step"]): r for r in plan.rows}
    assert rows[steps1]["workers"] == 1 and rows[steps1 + 1]["workers"] == 2
    assert rows[steps1]["batch_global"] == 32 and rows[steps1 + 1]["batch_global"] == 64  # the policy's B
    assert rows[steps1]["batch_samples"] == N - 32 * (steps1 - 1)  # the epoch's short last batch
    assert rows[1]["lr"] < rows[steps1 // 2]["lr"] and rows[plan.total_steps]["lr"] < rows[steps1 + 1]["lr"]
