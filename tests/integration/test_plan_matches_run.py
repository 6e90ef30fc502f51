"""``plan`` is what a run logs: on a real local Ray, a run with gradual warmup, cosine decay and a
batch schedule that grows B and resizes the group 1 -> 2 workers logs, at every step, exactly the
``lr``, ``mf``, ``batch/global``, ``workers`` and the local slicing that ``make_plan`` previews (both
ask the same ``trainers.policies.policy_set.PolicySet``), and ``plan --format csv`` prints that plan."""

import csv
import io
import subprocess
import sys

import numpy as np
import pytest
import yaml

from orchestrator.preview import make_plan
from orchestrator.run.runner import run_training
from tests.helpers import dense_series, make_config

pytestmark = pytest.mark.integration

N = 1438  # digits training samples at val_fraction 0.2


def test_plan_matches_what_the_run_logs(ray_cluster, tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cfg = make_config(
        tmp_path,
        uri,
        optimizer={"base_batch_size": 16, "lr": 0.05, "mf": 0.9, "mf_rule": "per_worker_batch", "mf_ref_batch": 16},
        batch={"size": 32, "max_local_batch": 32, "policy": "schedule", "schedule": [[1, 64]]},
        schedule={"warmup": "gradual", "warmup_epochs": 0.5, "decay": "cosine"},
        scaling={"min_workers": 1, "max_workers": 2, "cpus_per_worker": 0.5, "resize_mode": "restart"},
        train={"epochs": 2, "eval_every": 0},
    )
    plan = make_plan(cfg, every=1)
    steps1 = -(-N // 32)
    assert plan.total_steps == steps1 + -(-N // 64)
    assert [int(r["step"]) for r in plan.rows] == list(range(1, plan.total_steps + 1))
    # what a user reads: `plan --format csv` of the same config file is that plan, row for row
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    out = subprocess.run(
        [sys.executable, "-m", "orchestrator", "plan", str(path), "--format", "csv", "--every", "1"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    rows = list(csv.DictReader(io.StringIO(out.stdout)))
    assert list(rows[0]) == [
        "step",
        "epoch",
        "lr",
        "mf",
        "batch_global",
        "workers",
        "batch_local",
        "accum_steps",
        "batch_samples",
    ]
    assert len(rows) == len(plan.rows)
    for row, want in zip(rows, plan.rows):
        for col in ("step", "lr", "mf", "batch_global", "workers", "batch_local", "accum_steps", "batch_samples"):
            assert float(row[col]) == pytest.approx(float(want[col]), rel=1e-9, abs=1e-12), (col, row, want)
    assert float(rows[0]["mf"]) == pytest.approx(0.9**2)  # b = 32 on one worker = 2 x mf_ref_batch

    run = run_training(cfg, progress=False)
    assert run.status == "FINISHED"
    assert [(r["from"], r["to"], r["mode"]) for r in run.resizes] == [(1, 2, "restart")]
    for key, col in (
        ("lr", "lr"),
        ("mf", "mf"),
        ("batch/global", "batch_global"),
        ("workers", "workers"),
        ("batch/local", "batch_local"),
        ("batch/accum_steps", "accum_steps"),
        ("batch/samples", "batch_samples"),
    ):
        logged = dense_series(uri, run.run_id, key)
        assert [s for s, _ in logged] == [int(r["step"]) for r in plan.rows], key
        np.testing.assert_allclose(
            [v for _, v in logged], [float(r[col]) for r in plan.rows], rtol=0, atol=1e-9, err_msg=key
        )
    # the run really went through warmup, decay, the batch change and the resize
    rows = {int(r["step"]): r for r in plan.rows}
    assert rows[steps1]["workers"] == 1 and rows[steps1 + 1]["workers"] == 2
    assert rows[steps1]["batch_global"] == 32 and rows[steps1 + 1]["batch_global"] == 64  # the policy's B
    assert rows[steps1]["batch_samples"] == N - 32 * (steps1 - 1)  # the epoch's short last batch
    assert rows[1]["lr"] < rows[steps1 // 2]["lr"] and rows[plan.total_steps]["lr"] < rows[steps1 + 1]["lr"]


@pytest.mark.parametrize("policy", ["ramp", "seesaw"])
def test_plan_matches_the_run_for_the_literature_batch_schedules(ray_cluster, tmp_path, policy):
    """A linear batch ramp (Megatron/OLMo) and Seesaw (B x 2 and LR x 1/sqrt(2) at a step schedule's
    milestone, with AdamW's timescale weight-decay rule) log, at every step, the plan's B and LR (and
    the weight decay)."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    if policy == "ramp":
        sections = {
            "batch": {
                "size": 32,
                "max_local_batch": 32,
                "policy": "ramp",
                "ramp_to": 96,
                "ramp_epochs": 1,
                "round_to": 32,
            },
            "schedule": {"warmup": "gradual", "warmup_epochs": 0.5, "decay": "cosine"},
        }
    else:
        sections = {
            "optimizer": {
                "name": "adamw",
                "lr": 0.003,
                "base_batch_size": 32,
                "weight_decay": 0.01,
                "wd_rule": "timescale",
            },
            "batch": {"size": 32, "max_local_batch": 32, "policy": "seesaw"},
            "schedule": {"scaling_rule": "sqrt", "decay": "seesaw", "milestones": [1], "decay_factor": 0.5},
        }
    cfg = make_config(tmp_path, uri, train={"epochs": 2, "eval_every": 0}, **sections)
    plan = make_plan(cfg, every=1)
    run = run_training(cfg, progress=False)
    assert run.status == "FINISHED"
    pairs = [("lr", "lr"), ("batch/global", "batch_global"), ("batch/samples", "batch_samples")]
    if policy == "seesaw":  # the weight decay in effect is logged next to the LR (the timescale rule moves it)
        pairs.append(("train/weight_decay", "weight_decay"))
    for key, col in pairs:
        logged = dense_series(uri, run.run_id, key)
        assert [s for s, _ in logged] == [int(r["step"]) for r in plan.rows], key
        np.testing.assert_allclose(
            [v for _, v in logged], [float(r[col]) for r in plan.rows], rtol=0, atol=1e-9, err_msg=key
        )
    sizes = sorted({int(r["batch_global"]) for r in plan.rows})
    assert sizes == ([32, 64, 96] if policy == "ramp" else [32, 64])  # the batch really changed
    if policy == "seesaw":
        rows = plan.rows
        cut = next(i for i, r in enumerate(rows) if r["batch_global"] == 64)
        assert rows[cut]["lr"] == pytest.approx(rows[cut - 1]["lr"] / 2**0.5)
        assert rows[cut]["weight_decay"] == pytest.approx(0.01 * 2**0.5)
