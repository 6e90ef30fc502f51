"""The reviewer's view in a real browser: a real run with a batch change and a resize, served by
``python -m orchestrator ui``, opened in headless Chromium at the link the command prints.

MLflow 3's run overview lists a run's system metrics above its other metrics in its metrics table
(``RunViewMetricsTable``: keys under ``system/`` first whenever there are both); the run's description
(``mlflow.note.content``), which the overview shows above that table, leads with the training metrics."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time

import pytest

from orchestrator.run.runner import run_training
from tests.helpers import make_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")

pytestmark = pytest.mark.skipif(
    CHROMIUM is None,
    reason="no chromium on PATH (.ci/run installs Debian's 'chromium' package; apt-get install chromium)",
)


def _dom(url: str) -> str:
    out = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--window-size=1400,2000",
            "--virtual-time-budget=20000",
            "--dump-dom",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return out.stdout


def test_the_printed_link_opens_the_run_with_its_batch_and_resize(ray_cluster, tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cfg = make_config(
        tmp_path,
        uri,
        optimizer={"base_batch_size": 32},
        batch={"size": 32, "max_local_batch": 32, "policy": "schedule", "schedule": [[1, 64]]},
        scaling={"min_workers": 1, "max_workers": 2, "resize_mode": "restart", "cpus_per_worker": 0.5},
        train={"epochs": 2},
        tracking={"uri": uri, "experiment": "ui", "run_name": "ui-run"},
    )
    summary = run_training(cfg, progress=False)
    assert summary.status == "FINISHED" and summary.resizes, summary

    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "ui", "--tracking-uri", uri],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONPATH": ROOT},
    )
    try:
        lines, link, t0 = [], None, time.monotonic()
        while link is None and time.monotonic() - t0 < 120:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            m = re.search(
                r"(http://127\.0\.0\.1:\d+/#/experiments/\d+/runs/"
                + summary.run_id
                + r"\?workflowType=machine_learning)",
                line,
            )
            link = m.group(1) if m else None
        assert link, "".join(lines)
        dom = _dom(link)
        # the run page, in the model-training view, with the policy's batch, the workers and the resize
        assert "ui-run" in dom
        for metric in ("batch/global", "workers", "resize/to", "val/accuracy"):
            assert metric in dom, metric
        assert "Model training" in dom
        # the description: what was trained, its final training metrics, how B and W changed
        assert "No description" not in dom
        assert "B 32 -&gt; 64 at step" in dom and "W 1 -&gt; 2 at step" in dom, dom
        first_training = min(dom.index(k) for k in ("val/accuracy", "train/loss"))
        assert first_training < dom.index("system/cpu_utilization_percentage")
    finally:
        proc.terminate()
        proc.wait(30)
    assert proc.returncode is not None
