"""A run that resized, its driver killed after a checkpoint, resumed: the summary table, the
``elastic.resizes`` tag and the timeline artifact cover the whole run (the resize before the kill
and the stretch trained before it), not only the last driver's part; so does what the run cost
(``cost/worker_seconds``, the table's ``worker-s``: the killed driver's groups counted too)."""

from __future__ import annotations

import glob
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import yaml

from orchestrator.record.history import RESIZES_ARTIFACT
from tests.helpers import braked_mlp, make_config

pytestmark = pytest.mark.integration

EPOCHS = 6


def _newest_step(folder_glob: str) -> int:
    steps = [int(re.search(r"checkpoint_step(\d+)", p).group(1)) for p in glob.glob(f"{folder_glob}/checkpoint_step*")]
    return max(steps, default=-1)


def test_a_resumed_run_reports_the_resizes_and_stretches_of_every_driver(ray_cluster, tmp_path):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    # B 32 on 1 worker for the first epoch (45 steps), then B 64 on 2 (a restart resize) to the
    # planned end at step 45 + 5 * 23.  The built-in mlp's math as tests.byo_workloads:slow_mlp: the
    # grown group's steps sleep 100 ms while the brake file exists (one micro-batch a step), which
    # the test puts there once the first group has written its resize checkpoint (the second group
    # is still starting then), so the kill lands mid-run (~11 s of steps left past step 50) on any
    # machine's speed; lifted after the kill, the resume trains the rest at full speed
    cfg = make_config(
        tmp_path,
        uri,
        optimizer={"base_batch_size": 32},
        batch={"size": 32, "max_local_batch": 32, "policy": "schedule", "schedule": [[1, 64]]},
        scaling={"min_workers": 1, "max_workers": 2, "resize_mode": "restart", "cpus_per_worker": 0.5},
        train={"epochs": EPOCHS},
        checkpoint={"every_steps": 10},
    )
    raw = cfg.model_dump(mode="json")
    brake = tmp_path / "brake"
    raw["model"] = braked_mlp(brake, 0.1)
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(raw))
    env = dict(os.environ, RAY_ADDRESS=ray_cluster.get_runtime_context().gcs_address)
    env.pop("ELASTIC_KEEP_RAY", None)
    driver = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "train", str(path), "--no-progress"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    client, run_id, deadline = MlflowClient(uri), None, time.time() + 240
    while time.time() < deadline:  # the resize measured (logged) and a checkpoint of the bigger group
        if driver.poll() is not None:
            pytest.fail(f"the driver ended early ({driver.returncode}): {driver.communicate()}")
        folders = glob.glob(f"{tmp_path}/ray_runs/elastic-*")
        run_id = run_id or (os.path.basename(min(folders, key=len))[len("elastic-") :] if folders else None)
        if run_id and not brake.exists() and _newest_step(f"{tmp_path}/ray_runs/elastic-{run_id}") >= 45:
            brake.touch()  # the first group's resize checkpoint: the grown group trains braked
        if (
            run_id
            and _newest_step(f"{tmp_path}/ray_runs/elastic-{run_id}-r0p*") >= 50
            and client.get_metric_history(run_id, "resize/latency_s")
            # the resize's record, written just after its metric (the tracking listener runs first)
            and any(a.path == RESIZES_ARTIFACT for a in client.list_artifacts(run_id, "timeline"))
        ):
            break
        time.sleep(0.2)
    else:
        pytest.fail("the run never resized and checkpointed")
    os.killpg(driver.pid, signal.SIGKILL)
    driver.wait()
    brake.unlink()

    out = subprocess.run(
        [sys.executable, "-m", "orchestrator", "resume", run_id, "--tracking-uri", uri, "--no-progress"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.tags["elastic.resumes"] == "1"
    # every resize measured, the killed driver's included (the resumed one may resize too: its elastic
    # group can start smaller while the killed driver's workers still hold their CPUs)
    measured = sorted(m.step for m in client.get_metric_history(run_id, "resize/latency_s"))
    assert measured[0] == 45 and run.data.tags["elastic.resizes"] == str(len(measured)), run.data.tags
    # the summary table: the first driver's stretch at B 32 on 1 worker, then B 64 on 2 after the
    # resize (with its latency), to the planned last step
    # (steps, B, W, samples, wall_s, worker-s, resize_latency_s)
    rows = re.findall(
        r"^\s+(\d+)-(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)[ \t]*([\d.]*)[ \t]*$", out.stdout, re.M
    )
    assert [tuple(map(int, r[:4])) for r in rows[:2]] == [(1, 45, 32, 1), (46, int(rows[1][1]), 64, 2)], out.stdout
    assert rows[1][7], "the resize's latency is in the table"
    assert int(rows[-1][1]) == 45 + (EPOCHS - 1) * 23 and sum(int(r[4]) for r in rows) == EPOCHS * 1438, out.stdout
    # what the run cost, both drivers' groups: the stretches' worker-seconds sum to the run's, and each
    # stretch's groups held at least its W workers for the time it trained (its wall less the resize)
    cost = run.data.metrics["cost/worker_seconds"]
    assert sum(float(r[6]) for r in rows) == pytest.approx(cost, abs=0.1 * len(rows)), out.stdout
    for r in rows:
        trained = float(r[5]) - float(r[7] or 0.0)
        assert float(r[6]) >= int(r[3]) * trained - 0.2, (r, out.stdout)
    said = re.search(r"^  cost +([\d,]+) worker-seconds$", out.stdout, re.M)
    assert said and int(said.group(1).replace(",", "")) == round(cost), out.stdout
    assert f"- cost: {said.group(1)} worker-seconds ({len(rows)} stretch" in run.data.tags["mlflow.note.content"]
    # the timeline artifact: the stretches and every resize, the first one's included
    import json

    table = json.load(open(client.download_artifacts(run_id, "timeline.json", str(tmp_path))))
    rows = [dict(zip(table["columns"], row)) for row in table["data"]]
    assert [r["kind"] for r in rows[:3]] == ["train", "resize", "train"], table
    assert len({(r["kind"], r["first_step"], r["last_step"]) for r in rows}) == len(rows), "a row twice"
    assert sorted(r["first_step"] for r in rows if r["kind"] == "resize") == measured
    assert sum(r["worker_s"] for r in rows if r["kind"] == "train") == pytest.approx(cost)
