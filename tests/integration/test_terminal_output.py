"""What a person sees in the terminal: ``fit()`` in a notebook prints no MLflow or Ray chatter
(only the bar and its lines), and the CLI's summary names commands that run this interpreter."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import yaml

from tests.helpers import printed_command

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CONFIG = {
    "data": {"name": "digits"},
    "model": {"name": "mlp", "norm": "none", "hidden": 16},
    "optimizer": {"name": "sgd", "lr": 0.05, "mf": 0.9, "base_batch_size": 64},
    "batch": {"size": 64, "max_local_batch": 64},
    "scaling": {"min_workers": 1, "max_workers": 1, "cpus_per_worker": 0.5},
    "train": {"epochs": 0.5, "seed": 0},
}

# MLflow's INFO lines ("2026/11/25 11:11:42 INFO mlflow.store.db.utils: Creating initial MLflow database
# tables...", the system-metrics monitor's), alembic's migrations, and its run links ("🏃 View run ... at ...")
NOISE = re.compile(r"\bINFO\b|🏃|🧪|View run|View experiment|alembic|Context impl")


def test_fit_prints_no_mlflow_or_ray_chatter(ray_cluster, tmp_path, capfd):
    from orchestrator import fit

    uri = f"sqlite:///{tmp_path}/fresh.db"  # a new store: MLflow creates and migrates its tables
    cfg = {
        **CONFIG,
        "checkpoint": {"storage_path": str(tmp_path / "runs")},
        "tracking": {"uri": uri, "experiment": "notebook"},
    }
    result = fit(cfg, progress=False)
    assert result.status == "FINISHED"
    out, err = capfd.readouterr()
    noise = [line for line in (out + err).splitlines() if NOISE.search(line)]
    assert not noise, noise


def test_the_summary_names_commands_that_run_this_interpreter(ray_cluster, tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    path = tmp_path / "c.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                **CONFIG,
                "checkpoint": {"storage_path": str(tmp_path / "runs")},
                "tracking": {"uri": uri, "experiment": "cli"},
            }
        )
    )
    env = dict(os.environ, PYTHONPATH=ROOT, RAY_ADDRESS=ray_cluster.get_runtime_context().gcs_address)
    env["PATH"] = os.pathsep.join([str(tmp_path)] + env.get("PATH", "").split(os.pathsep))
    (tmp_path / "python").write_text("#!/bin/sh\nexit 3\n")  # a `python` on PATH that is not this one
    (tmp_path / "python").chmod(0o755)
    out = subprocess.run(
        [sys.executable, "-m", "orchestrator", "train", str(path), "--no-progress"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    argv = printed_command(out.stdout, "serve it first: ", " ui --tracking-uri")
    assert argv[0] != "python", out.stdout
    served = subprocess.run(
        argv + ["ui", "--help"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )  # the command as printed runs this package's CLI
    assert served.returncode == 0 and "--tracking-uri" in served.stdout, served.stdout + served.stderr
