"""One bad config, every entry point: ``python -m orchestrator train``, ``plan`` and ``resume``,
``python -m search run`` (a space whose base is that config), and ``fit()`` from a script, each in
a real process, print the same one line on stderr and exit with status 2, with no Ray started and no
MLflow run, study or checkpoint folder created.  (``ray job submit ... -- python -m orchestrator
train CONFIG`` runs the very command tested here on the cluster.)

Each entry point runs in its own fresh interpreter, which goes through every bad config in turn the
way ``python -m`` does (``runpy.run_module(..., run_name="__main__")``): five processes in all,
since each start imports torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

BASE = {
    "data": {"name": "digits"},
    "model": {"name": "mlp", "norm": "none", "hidden": 16},
    "optimizer": {"name": "sgd", "lr": 0.05, "mf": 0.9, "base_batch_size": 32},
    "batch": {"size": 32, "max_local_batch": 16},
    "scaling": {"min_workers": 1, "max_workers": 1, "cpus_per_worker": 0.5},
    "train": {"epochs": 1},
}

# name -> (a change to BASE, the start of the one line every entry point must print)
CASES = {
    "unknown_key": (
        {"optimizer": {"momentum": 0.9}},
        "optimizer.momentum: unknown key; did you mean optimizer.mf? (allowed keys here: name, lr,",
    ),
    "non_finite": (
        {"train": {"epochs": float("nan")}},
        "train.epochs: must be a finite number (got nan); .inf and .nan are not allowed",
    ),
    "wrong_type": (
        {"batch": {"size": "many"}},
        "batch.size: expects an integer, got the string 'many'; write plain digits",
    ),
    "bad_workload": (
        {"model": {"factory": "no_such_pkg_31.models:net"}},
        "model.factory: cannot import 'no_such_pkg_31.models': no module named 'no_such_pkg_31'",
    ),
    "bn_single_samples": (
        {"model": {"norm": "batch"}, "batch": {"max_local_batch": 1}},
        "batch.max_local_batch: 1 puts one sample through the model at a time, and model mlp's "
        "BatchNorm cannot train on one sample",
    ),
}


def _config(tmp, name: str) -> dict:
    raw = yaml.safe_load(yaml.safe_dump(BASE))
    change, _ = CASES[name]
    for section, values in change.items():
        raw.setdefault(section, {}).update(values)
    if "factory" in raw["model"]:
        for key in ("name", "norm", "hidden"):
            raw["model"].pop(key)
    raw["checkpoint"] = {"storage_path": str(tmp / "ray_runs")}
    raw["tracking"] = {"uri": f"sqlite:///{tmp}/mlflow.db", "experiment": "entry-points"}
    return raw


# Each script gets [(name, argv)] as JSON and prints
# {"results": {name: [exit status, stderr]}, "ray": ..., "mlflow": ...}.
RUN_MODULE = textwrap.dedent("""
    import contextlib, io, json, runpy, sys
    module, cases = sys.argv[1], json.loads(sys.argv[2])
    results = {}
    for name, argv in cases:
        err = io.StringIO()
        sys.argv = [module, *argv]
        with contextlib.redirect_stderr(err):
            try:
                runpy.run_module(module, run_name="__main__", alter_sys=True)
                code = 0
            except SystemExit as e:
                code = e.code
        results[name] = [code, err.getvalue()]
    ray = sys.modules.get("ray")
    started = bool(ray and ray.is_initialized())
    print(json.dumps({"results": results, "ray": started, "mlflow": "mlflow" in sys.modules}))
""")

FIT = textwrap.dedent("""
    import contextlib, io, json, sys
    from orchestrator import fit
    from orchestrator.config.schema import ConfigError
    results = {}
    for name, argv in json.loads(sys.argv[2]):
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            try:
                fit(argv[0], progress=False)
                code = 0
            except ConfigError as e:  # what a script sees; the CLI prints the same line
                print(f"error: {e}", file=sys.stderr)
                code = 2
        results[name] = [code, err.getvalue()]
    ray = sys.modules.get("ray")
    started = bool(ray and ray.is_initialized())
    print(json.dumps({"results": results, "ray": started, "mlflow": "mlflow" in sys.modules}))
""")


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    """{entry point: {case: (exit status, stderr)}} and what each process left behind."""
    tmp = tmp_path_factory.mktemp("entry")
    argv: dict[str, list] = {"train": [], "plan": [], "resume": [], "search run": [], "fit()": []}
    for name in CASES:
        folder = tmp / name
        folder.mkdir()
        raw = _config(folder, name)
        cfg = folder / "config.yaml"
        cfg.write_text(yaml.safe_dump(raw, sort_keys=False))
        space = folder / "space.yaml"
        space.write_text(
            yaml.safe_dump(
                {
                    "base": str(cfg),
                    "objective": {"metric": "val/accuracy"},
                    "params": {"optimizer.lr": {"low": 0.01, "high": 0.5, "log": True}},
                }
            )
        )
        run = folder / "runs" / "elastic-r1"  # a run folder whose recorded config is the bad one
        run.mkdir(parents=True)
        (run / "elastic_run.json").write_text(
            json.dumps({"run_id": "r1", "tracking_uri": raw["tracking"]["uri"], "config": raw})
        )
        argv["train"].append((name, ["train", str(cfg), "--no-progress"]))
        argv["plan"].append((name, ["plan", str(cfg)]))
        argv["resume"].append((name, ["resume", str(run), "--no-progress"]))
        argv["search run"].append(
            (name, ["run", str(space), "--no-progress", "--storage", str(folder / "optuna.journal")])
        )
        argv["fit()"].append((name, [str(cfg)]))
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "MLFLOW_TRACKING_URI")}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    out = {}
    for entry, cases in argv.items():
        module = "search" if entry == "search run" else "orchestrator"
        script = FIT if entry == "fit()" else RUN_MODULE
        p = subprocess.run(
            [sys.executable, "-c", script, module, json.dumps(cases)],
            cwd=tmp,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert p.returncode == 0, p.stderr[-3000:]
        out[entry] = json.loads(p.stdout.strip().splitlines()[-1])
    return tmp, out


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_same_line_and_exit_2_from_every_entry_point(outcomes, case):
    _, out = outcomes
    lines = {}
    for entry, res in out.items():
        code, err = res["results"][case]
        assert code == 2, f"{entry}: exit {code}\n{err}"
        err = err.strip()
        assert "\n" not in err and "Traceback" not in err, f"{entry}: {err}"
        lines[entry] = err
    assert len(set(lines.values())) == 1, json.dumps(lines, indent=1)
    assert lines["train"].startswith("error: " + CASES[case][1]), lines["train"]


def test_no_ray_no_mlflow_run_nothing_written(outcomes):
    tmp, out = outcomes
    for entry, res in out.items():
        assert res["ray"] is False, f"{entry} started Ray"
        assert res["mlflow"] is False, f"{entry} imported MLflow"
    for name in CASES:
        folder = tmp / name
        assert sorted(p.name for p in folder.iterdir()) == ["config.yaml", "runs", "space.yaml"], name
    assert not (tmp / "mlflow.db").exists() and not (tmp / "optuna.journal").exists()
