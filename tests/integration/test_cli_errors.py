"""Bad input: one clear line naming the field, exit status 2, nothing started."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.config_cases import CASES, GOOD, _write


def test_bad_input_never_imports_ray_or_creates_a_run(tmp_path):
    """In a fresh interpreter: every bad case exits 2 before Ray is even imported."""
    paths = {}
    for name, (text, overrides, _) in CASES.items():
        p = tmp_path / f"{name}.yaml"
        p.write_text(GOOD if text is None else text)
        paths[name] = [str(p)] + [a for o in overrides for a in ("--set", o)]
    script = textwrap.dedent(f"""
        import json, sys
        from orchestrator.cli import main
        codes = {{n: main(["train"] + a) for n, a in {json.dumps(paths)}.items()}}
        print(json.dumps({{"codes": codes, "ray": "ray" in sys.modules, "mlflow": "mlflow" in sys.modules}}))
    """)
    out = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert set(res["codes"].values()) == {2}
    assert res["ray"] is False and res["mlflow"] is False
    assert not os.path.exists(tmp_path / "mlflow.db")


def test_loading_a_config_imports_neither_the_worker_loop_nor_ray():
    """Validating a YAML loads the components' config classes, not the loop they run in."""
    script = textwrap.dedent("""
        import json, sys
        from orchestrator.config.prepare import load_config
        load_config("configs/quickstart.yaml")
        print(json.dumps({m: m in sys.modules for m in ("trainers.loop.trainer", "ray")}))
    """)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"trainers.loop.trainer": False, "ray": False}


def test_cli_exit_status_from_a_real_process(tmp_path):
    p = _write(tmp_path, None)
    out = subprocess.run(
        [sys.executable, "-m", "orchestrator", "train", p, "--set", "batch.size=0"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2
    assert out.stderr.strip() == "error: batch.size: must be > 0 (got 0); set a value > 0 such as 64"


@pytest.mark.parametrize(
    "override, start",
    [
        ("scaling.use_gpu=true", "error: scaling.use_gpu:"),
        ("scaling.cpus_per_worker=64", "error: scaling.max_workers x cpus_per_worker:"),
    ],
)
def test_impossible_resources_fail_fast_with_no_run(ray_cluster, tmp_path, override, start):
    """Ray Train would wait forever for resources this cluster (the tier's shared local Ray, 2 CPUs,
    no GPU, joined as a user's driver joins one) can never have: the driver checks once Ray is up
    and stops with exit 2 before any MLflow run or checkpoint exists."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    config = os.path.join(root, "configs", "quickstart.yaml")
    env = dict(os.environ, RAY_ADDRESS=ray_cluster.get_runtime_context().gcs_address)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestrator",
            "train",
            config,
            "--no-progress",
            "--set",
            override,
            "--set",
            f"checkpoint.storage_path={tmp_path}/ray_runs",
            "--tracking-uri",
            f"sqlite:///{tmp_path}/mlflow.db",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
        env={**env, "PYTHONPATH": root},
    )
    assert out.returncode == 2, out.stderr[-2000:]
    err = out.stderr.strip()
    assert err.startswith(start) and "\n" not in err and "Traceback" not in err, err
    assert not (tmp_path / "ray_runs").exists()
    if (tmp_path / "mlflow.db").exists():  # opened early (while Ray started): it must hold no run
        from mlflow.tracking import MlflowClient

        client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
        exps = [e.experiment_id for e in client.search_experiments()]
        assert not exps or not client.search_runs(exps)
