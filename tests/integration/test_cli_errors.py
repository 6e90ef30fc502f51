"""Bad input: one clear line naming the field, exit status 2, nothing started."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from orchestrator.cli import main
from orchestrator.config import ConfigError, apply_overrides, flatten, load_config

GOOD = textwrap.dedent("""
    data: {name: digits}
    model: {name: mlp, norm: none}
    batch: {size: 32, max_local_batch: 16}
    scaling: {min_workers: 1, max_workers: 2}
""")

# (yaml text or None for GOOD, overrides, expected message fragment)
CASES = {
    "unknown_key": (None, ["batch.sizee=3"], "batch.sizee: unknown key; allowed keys here: size, max_local_batch"),
    "unknown_section": (None, ["optimiser.lr=1"], "optimiser: unknown key"),
    "wrong_type": (None, ["batch.size=abc"], "batch.size: expects an integer, got the string"),
    "zero_batch": (None, ["batch.size=0"], "batch.size: must be > 0 (got 0)"),
    "negative_batch": (None, ["batch.size=-4"], "batch.size: must be > 0 (got -4)"),
    "max_local_above_batch": (None, ["batch.max_local_batch=64"],
                              "batch.max_local_batch: 64 is above batch.size 32"),
    "min_above_max_workers": (None, ["scaling.min_workers=3"],
                              "scaling.min_workers: 3 is above scaling.max_workers 2"),
    "unknown_model": (None, ["model.name=vgg"], "model.name: unknown 'vgg'; expected one of mlp, cnn, resnet18, resnet50"),
    "unknown_dataset": (None, ["data.name=mnist"], "data.name: unknown 'mnist'; expected one of digits, synthetic, cifar10"),
    "unknown_optimizer": (None, ["optimizer.name=rmsprop"], "optimizer.name: unknown 'rmsprop'"),
    "missing_cifar_root": (None, ["data.name=cifar10", "data.root=/nonexistent/cifar"],
                           "data.root: no CIFAR-10 at '/nonexistent/cifar/cifar-10-batches-py'"),
    "cifar_without_root": (None, ["data.name=cifar10"], "data.root: required for cifar10"),
    "unreadable_yaml": ("data: {name: digits\nmodel: [", [], "is not valid YAML at line"),
    "not_a_mapping": ("- 1\n- 2\n", [], "must be a mapping of sections"),
    "sync_bn_on_cpu": (None, ["model.sync_bn=true"], "model.sync_bn: PyTorch's SyncBatchNorm runs on GPUs only"),
    "bad_override_syntax": (None, ["batch.size"], "--set batch.size: expected section.key=value"),
    "storage_uri": (None, ["checkpoint.storage_path=s3://bucket/runs"],
                    "checkpoint.storage_path: URIs are not supported (got 's3://bucket/runs'); give a directory path"),
    "keep_one": (None, ["checkpoint.keep=1"], "checkpoint.keep: 1 leaves no older checkpoint to fall back to"),
    # issue #18 item 7: one of each class (all fields of each: tests/unit/test_config_classes.py)
    "non_finite": (None, ["optimizer.lr=.inf"], "optimizer.lr: must be a finite number"),
    "bool_for_int": (None, ["batch.size=true"], "batch.size: expects an integer, got the boolean true"),
    "int_for_bool": (None, ["scaling.use_gpu=1"], "scaling.use_gpu: expects true or false"),
    "duplicate_key": (GOOD + "batch: {size: 64}\n", [], "batch: given twice"),
    "batch_above_dataset": (None, ["data.val_fraction=0.99"], "batch.size: 32 is above the 18 training samples"),
    "no_effect": (None, ["schedule.poly_power=3"], "schedule.poly_power: has no effect unless schedule.decay is poly"),
    "bad_shape": (None, ["data.name=synthetic", "data.shape=[64]", "model.name=cnn"],
                  "data.shape: model cnn cannot take inputs of shape [64]"),
    "empty_storage": (None, ["checkpoint.storage_path=''"], "checkpoint.storage_path: empty"),
    "missing_tracking_folder": (None, ["tracking.uri=sqlite:///nowhere/mlflow.db"], "tracking.uri: sqlite:///nowhere"),
    "empty_experiment": (None, ["tracking.experiment=''"], "tracking.experiment: empty"),
}


def _write(tmp_path, text):
    p = tmp_path / "cfg.yaml"
    p.write_text(GOOD if text is None else text)
    return str(p)


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
        from orchestrator.config import load_config
        load_config("configs/quickstart.yaml")
        print(json.dumps({m: m in sys.modules for m in ("trainers.loop", "ray")}))
    """)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"trainers.loop": False, "ray": False}


def test_cli_exit_status_from_a_real_process(tmp_path):
    p = _write(tmp_path, None)
    out = subprocess.run([sys.executable, "-m", "orchestrator", "train", p, "--set", "batch.size=0"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert out.stderr.strip() == "error: batch.size: must be > 0 (got 0)"




@pytest.mark.parametrize("override, start", [
    ("scaling.use_gpu=true", "error: scaling.use_gpu:"),
    ("scaling.cpus_per_worker=64", "error: scaling.max_workers x cpus_per_worker:"),
])
def test_impossible_resources_fail_fast_with_no_run(tmp_path, override, start):
    """Ray Train would wait forever for resources this local cluster can never have: the driver
    checks once Ray is up and stops with exit 2 before any MLflow run or checkpoint exists."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    config = os.path.join(root, "configs", "quickstart.yaml")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    out = subprocess.run([sys.executable, "-m", "orchestrator", "train", config, "--no-progress", "--set", override,
                          "--set", f"checkpoint.storage_path={tmp_path}/ray_runs",
                          "--tracking-uri", f"sqlite:///{tmp_path}/mlflow.db"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=240,
                         env={**env, "PYTHONPATH": root})
    assert out.returncode == 2, out.stderr[-2000:]
    err = out.stderr.strip()
    assert err.startswith(start) and "\n" not in err and "Traceback" not in err, err
    assert not (tmp_path / "ray_runs").exists()
    if (tmp_path / "mlflow.db").exists():  # opened early (while Ray started): it must hold no run
        from mlflow.tracking import MlflowClient

        client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
        exps = [e.experiment_id for e in client.search_experiments()]
        assert not exps or not client.search_runs(exps)
