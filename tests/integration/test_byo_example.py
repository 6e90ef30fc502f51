"""Your own model and data end to end on a real local Ray: the example user project (examples/user_project) run
from the CLI with its factories named by ``--set``, and with ``fit()`` from a script whose package is
only on the script's ``sys.path`` (so it reaches the workers through ``py_modules``), one factory
sent by value and ``resume`` of that run telling how to resume it from Python."""

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.integration

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SRC = os.path.join(ROOT, "examples", "user_project", "src")
SMALL = [
    "data.params.n_train=2048",
    "data.params.n_val=512",
    "train.epochs=2",
    "scaling.cpus_per_worker=0.5",
    "batch.size=128",
    "batch.max_local_batch=64",
    "optimizer.lr=0.05",
    "optimizer.base_batch_size=64",
    "batch.policy=fixed",
    "batch.max_size=null",
    "optimizer.mf_rule=fixed",
]  # 32 steps, lr 0.1 at B = 128


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ("ELASTIC_KEEP_RAY", "RAY_ADDRESS")}
    env.update(extra)
    return env


def test_cli_with_factories_named_by_set(tmp_path):
    sets = [
        "data.factory=my_workload.data:rings",
        "data.params.classes=3",
        "model.factory=my_workload.model:ring_net",
        "model.params.width=64",
        *SMALL,
        f"tracking.uri=sqlite:///{tmp_path}/mlflow.db",
        f"checkpoint.storage_path={tmp_path}/runs",
    ]
    cmd = [
        sys.executable,
        "-m",
        "orchestrator",
        "train",
        os.path.join(ROOT, "configs", "quickstart.yaml"),
        "--no-progress",
    ] + [a for s in sets for a in ("--set", s)]
    out = subprocess.run(
        cmd, cwd=tmp_path, env=_env(PYTHONPATH=f"{ROOT}:{SRC}"), capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stdout + out.stderr
    acc = float(re.search(r"val/accuracy\s+([0-9.]+)", out.stdout).group(1))
    assert acc > 0.6, out.stdout  # 3 rings: chance is 1/3
    from mlflow.tracking import MlflowClient

    run_id = re.search(r"MLflow run id\s+(\w+)", out.stdout).group(1)
    params = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db").get_run(run_id).data.params
    assert params["data.factory"] == "my_workload.data:rings" and params["model.params.width"] == "64"


def test_fit_from_a_script_ships_the_package_and_by_value_functions(tmp_path):
    script = tmp_path / "train_rings.py"
    script.write_text(
        textwrap.dedent(f"""
        import json, sys
        sys.path.insert(0, {SRC!r})  # importable here only: not installed, not on PYTHONPATH
        from orchestrator import fit
        from my_workload.data import rings
        from my_workload.model import ring_net

        common = dict(overrides={SMALL!r} + ["checkpoint.storage_path={tmp_path}/runs"],
                      tracking_uri="sqlite:///{tmp_path}/mlflow.db", progress=False)
        config = {os.path.join(ROOT, "examples", "user_project", "config.yaml")!r}
        a = fit(config, model_fn=ring_net, data_fn=rings, **common)
        b = fit(config, model_fn=lambda width=64, depth=2, classes=3: ring_net(width, depth, classes), **common)
        print(json.dumps({{"a": [a.run_id, a.status, a.metrics], "b": [b.run_id, b.status, b.metrics]}}))
    """)
    )
    out = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=_env(PYTHONPATH=ROOT),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    for key in ("a", "b"):
        run_id, status, metrics = res[key]
        assert status == "FINISHED" and metrics["val/accuracy"] > 0.6, res
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    pa, pb = client.get_run(res["a"][0]).data.params, client.get_run(res["b"][0]).data.params
    assert pa["model.factory"] == "my_workload.model:ring_net" and pa["data.factory"] == "my_workload.data:rings"
    assert pb["model.factory"].startswith("python:__main__.<lambda>")
    # resume of the by-value run: one line saying how to resume it from Python, exit 2
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestrator",
            "resume",
            res["b"][0],
            "--tracking-uri",
            f"sqlite:///{tmp_path}/mlflow.db",
        ],
        cwd=tmp_path,
        env=_env(PYTHONPATH=ROOT),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and f"fit(resume='{res['b'][0]}', model_fn=<__main__.<lambda>>)" in lines[0], lines
