"""Your own data on a real local Ray: a factory's map-style dataset through the DataLoader path keeps
the invariants: W = 1 and W = 3 train on the same global batches with the same loss series and
final parameters, and a run checkpointed mid-epoch at W = 3 resumes exactly at W = 1."""

import glob
import os
import shutil

import numpy as np
import pytest
import torch

from orchestrator.run.runner import run_training
from tests.helpers import final_model, make_config, metric_series, read_sample_log

pytestmark = pytest.mark.integration

STEPS = 29  # ceil(1438 / 50): one epoch of the digits training split
FACTORY = dict(
    data={"name": None, "factory": "tests.byo_workloads:digits", "loader": {"workers": 0}},
    model={"name": None, "factory": "tests.byo_workloads:mlp", "params": {"hidden": 32}},
)


def _cfg(tmp, uri, w, samples, **extra):
    sections = {
        **FACTORY,
        "scaling": {"max_workers": w, "min_workers": w},
        "train": {"epochs": 1, "sample_log_dir": str(samples), "log_every": 1},
        "checkpoint": {"storage_path": str(tmp / "ray_runs"), "every_steps": 10, "keep": 5},
    }
    sections.update(extra)
    return make_config(tmp, uri, **sections)


@pytest.fixture(scope="module")
def runs(ray_cluster, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("byo_invariance")
    uri = f"sqlite:///{tmp}/mlflow.db"
    out = {}
    for w in (1, 3):
        s = run_training(_cfg(tmp, uri, w, tmp / f"samples-w{w}"), progress=False)
        assert s.status == "FINISHED" and s.steps == STEPS
        out[w] = s
    return tmp, uri, out


def _batches(folder):
    by_step = {}
    for r in sorted(read_sample_log(str(folder)), key=lambda r: (r["step"], r["rank"])):
        by_step.setdefault(r["step"], []).extend(r["ids"])
    return by_step


def test_same_global_batches_losses_and_parameters_at_w1_and_w3(runs):
    tmp, uri, out = runs
    b1, b3 = _batches(tmp / "samples-w1"), _batches(tmp / "samples-w3")
    assert b1 == b3 and sorted(i for s in b1.values() for i in s) == list(range(1438))
    l1 = np.array([v for _, v in metric_series(uri, out[1].run_id, "train/loss")])
    l3 = np.array([v for _, v in metric_series(uri, out[3].run_id, "train/loss")])
    assert len(l1) == len(l3) == STEPS
    assert np.max(np.abs(l3 - l1) / np.abs(l1)) < 1e-4
    assert l1[-1] < l1[0]
    m1, m3 = final_model(uri, out[1].run_id, tmp / "m1"), final_model(uri, out[3].run_id, tmp / "m3")
    for name, p in m1.items():
        torch.testing.assert_close(m3[name], p, rtol=1e-4, atol=1e-5)
    assert {v for _, v in metric_series(uri, out[3].run_id, "workers")} == {3.0}


def test_mid_epoch_checkpoint_at_w3_resumes_exactly_at_w1(runs):
    tmp, uri, out = runs
    s3 = out[3]
    folder = os.path.join(s3.storage_path, s3.train_run_name)
    ckpts = sorted(glob.glob(f"{folder}*/checkpoint_step*"))
    steps = [int(p.rsplit("checkpoint_step", 1)[1]) for p in ckpts]
    assert 10 in steps and STEPS in steps
    for p, st in zip(ckpts, steps):
        if st > 10:
            shutil.rmtree(p)  # the newest left is step 10: a third of the way into the epoch
    samples = tmp / "samples-resumed"
    s = run_training(_cfg(tmp, uri, 1, samples), progress=False, resume_run_id=s3.run_id)
    assert s.status == "FINISHED"
    resumed, ref = _batches(samples), _batches(tmp / "samples-w1")
    assert sorted(resumed) == list(range(11, STEPS + 1))
    assert all(resumed[k] == ref[k] for k in resumed)  # the rest of the epoch, in the same global batches
    got = final_model(uri, s3.run_id, tmp / "m-resumed")
    want = final_model(uri, out[1].run_id, tmp / "m1b")
    for name, p in want.items():
        torch.testing.assert_close(got[name], p, rtol=1e-4, atol=1e-5)
