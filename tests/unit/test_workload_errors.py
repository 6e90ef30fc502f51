"""Every bad workload input is one line naming the field, exit status 2, no
traceback, and nothing started (no MLflow store created); ``python -m orchestrator train`` in
process (no Ray: the probe runs on the driver before it would start)."""

from __future__ import annotations

import textwrap

import pytest

from orchestrator.cli import main

PKG = "byo_cases_pkg"

OK_MODULE = textwrap.dedent("""
    import torch
    from torch import nn

    NOT_CALLABLE = 3

    class Points(torch.utils.data.Dataset):
        def __init__(self, n):
            g = torch.Generator().manual_seed(n)
            self.x = torch.randn(n, 4, generator=g)
            self.y = (self.x.sum(1) > 0).long()
        def __len__(self):
            return len(self.y)
        def __getitem__(self, i):
            return self.x[i], self.y[i]

    def data(n_train=256, n_val=64):
        return Points(n_train), Points(n_val)

    def tiny():
        return Points(10), Points(10)

    def not_pair():
        return [1, 2, 3]

    def model(width=8):
        return nn.Sequential(nn.Linear(4, width), nn.ReLU(), nn.Linear(width, 2))

    def not_module():
        return "a model"

    def bn_model():
        return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))

    def mean_loss(out, y):
        return nn.functional.cross_entropy(out, y)
""")

GOOD = textwrap.dedent(f"""
    data: {{factory: "{PKG}.ok:data"}}
    model: {{factory: "{PKG}.ok:model"}}
    batch: {{size: 32, max_local_batch: 16}}
""")

# name -> (yaml text or None for GOOD, overrides, the field that must start the message, a fragment)
CASES = {
    "no_colon": (None, [f"data.factory={PKG}.ok.data"], "data.factory", "is not of the form 'package.module:function'"),
    "not_importable": (
        None,
        ["model.factory=no_such_pkg_17.models:net"],
        "model.factory",
        "cannot import 'no_such_pkg_17.models': no module named 'no_such_pkg_17'",
    ),
    "raises_on_import": (
        None,
        [f"data.factory={PKG}.raises:data"],
        "data.factory",
        f"importing '{PKG}.raises' raised RuntimeError: boom while importing",
    ),
    "missing_attribute": (
        None,
        [f"model.factory={PKG}.ok:modle"],
        "model.factory",
        f"'{PKG}.ok' has no attribute 'modle'; did you mean 'model'?",
    ),
    "not_callable": (None, [f"data.factory={PKG}.ok:NOT_CALLABLE"], "data.factory", "is a int, not a callable"),
    "data_wrong_type": (
        None,
        [f"data.factory={PKG}.ok:not_pair"],
        "data.factory",
        "returned list, expected a (train, val) pair of map-style datasets",
    ),
    "model_wrong_type": (
        None,
        [f"model.factory={PKG}.ok:not_module"],
        "model.factory",
        "returned str, expected a torch.nn.Module",
    ),
    "smaller_than_batch": (
        None,
        [f"data.factory={PKG}.ok:tiny"],
        "data.factory",
        "the training set has 10 samples, fewer than the global batch of 32",
    ),
    "loss_not_per_sample": (
        None,
        [f"model.loss={PKG}.ok:mean_loss"],
        "model.loss",
        "returned shape [] for 2 samples, expected [2]",
    ),
    "unknown_loss": (None, ["model.loss=mse"], "model.loss", "'mse' is neither one of"),
    "bad_params": (None, ["model.params.depth=3"], "model.params", "model() takes no argument 'depth'"),
    "name_and_factory": (
        GOOD.replace("data: {", "data: {name: digits, "),
        [],
        "data.factory",
        "give either data.name ('digits') or data.factory",
    ),
    "model_name_and_factory": (
        None,
        ["model.name=gpt", f"model.factory={PKG}.ok:model"],
        "model.factory",
        "give either model.name ('gpt') or model.factory",
    ),
    "image_model_on_factory_data": (None, ["model.name=cnn"], "model.name", "needs a built-in image dataset"),
    "text_path_missing": (
        None,
        ["data.name=text", "data.path=/nonexistent/corpus.txt", "model.name=gpt"],
        "data.path",
        "no text file at '/nonexistent/corpus.txt'",
    ),
}


@pytest.fixture(scope="module")
def package_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("byo_pkgs")
    pkg = root / PKG
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "ok.py").write_text(OK_MODULE)
    (pkg / "raises.py").write_text("raise RuntimeError('boom while importing')\n")
    return root


@pytest.fixture()
def in_tmp(tmp_path, package_dir, monkeypatch):
    monkeypatch.syspath_prepend(str(package_dir))
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return tmp_path


def _train(tmp_path, text, overrides):
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(GOOD if text is None else text)
    return main(["train", str(cfg), "--no-progress"] + [a for o in overrides for a in ("--set", o)])


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_workload_is_one_line_exit_2_nothing_started(case, in_tmp, capsys):
    text, overrides, field, fragment = CASES[case]
    code = _train(in_tmp, text, overrides)
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"error: {field}: "), lines[0]
    assert fragment in lines[0], lines[0]
    assert "Traceback" not in err
    assert not (in_tmp / "mlflow.db").exists() and not (in_tmp / "mlruns").exists()


def test_cli_swaps_the_files_builtin_for_a_factory(in_tmp, capsys):
    """--set data.factory / model.factory replace the file's data.name / model.name (plan starts nothing)."""
    cfg = in_tmp / "cfg.yaml"
    cfg.write_text("data: {name: digits}\nmodel: {name: cnn}\nbatch: {size: 32, max_local_batch: 16}\n")
    code = main(
        [
            "plan",
            str(cfg),
            "--format",
            "csv",
            "--set",
            f"data.factory={PKG}.ok:data",
            "--set",
            f"model.factory={PKG}.ok:model",
        ]
    )
    out = capsys.readouterr()
    assert code == 0, out.err
    last = out.out.strip().splitlines()[-1].split(",")
    assert (last[0], last[1]) == (str(256 // 32 * 5), "5.0")  # 5 epochs (the default) of the factory's 256 samples


def test_batchnorm_model_warns_once_on_the_driver(in_tmp, capsys):
    cfg = in_tmp / "cfg.yaml"
    cfg.write_text(GOOD)
    code = main(["plan", str(cfg), "--set", f"model.factory={PKG}.ok:bn_model"])
    err = capsys.readouterr().err
    assert code == 0
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "BatchNorm" in warnings[0] and "per micro-batch" in warnings[0]
