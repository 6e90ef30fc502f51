"""The example user project (examples/user_project) fulfils the factory contract without this project."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from trainers.data.sampler import fetch
from trainers.workload.factory import build_datasets, probe

PROJECT = Path(__file__).resolve().parents[2] / "examples" / "user_project"


@pytest.fixture()
def on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(PROJECT / "src"))


def test_its_factories_pass_probe(on_path):
    assert (
        probe(
            "my_workload.model:ring_net",
            "my_workload.data:rings",
            "cross_entropy",
            model_params={"width": 16, "depth": 1},
            data_params={"n_train": 64, "n_val": 16},
            global_batch=64,
        )
        is None
    )


def test_its_dataset_batches_match_single_samples(on_path):
    train, val = build_datasets("my_workload.data:rings", {"n_train": 32, "n_val": 8})
    x, y = fetch(train, [3, 1, 4])
    assert x.shape == (3, 2) and y.dtype == torch.long
    assert torch.equal(x[1], train[1][0]) and int(y[2]) == int(train[4][1])
    assert len(val) == 8


def test_it_imports_nothing_from_this_project():
    for py in (PROJECT / "src").rglob("*.py"):
        tree = ast.parse(py.read_text())
        for node in ast.walk(tree):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            for name in names:
                assert name.split(".")[0] not in {"orchestrator", "trainers", "search"}, (py, name)
