"""Search-test helpers shared by the unit and integration tiers: a tiny base config and a space file."""

from __future__ import annotations

import yaml


def base_config(tmp, **sections) -> dict:
    raw = {
        "data": {"name": "digits"},
        "model": {"name": "mlp", "norm": "none", "hidden": 32},
        "optimizer": {"name": "sgd", "lr": 0.05, "mf": 0.9, "base_batch_size": 32},
        "batch": {"size": 32, "max_local_batch": 32},
        "scaling": {"min_workers": 1, "max_workers": 1, "cpus_per_worker": 0.5, "max_failures": 0},
        "train": {"epochs": 1, "seed": 0, "log_every": 5, "eval_every": 10},
        "checkpoint": {"storage_path": str(tmp / "ray_runs")},
        "tracking": {"experiment": "search-tests"},
    }
    for name, values in sections.items():
        raw.setdefault(name, {}).update(values)
    return raw


def write_space(tmp, name: str, **space) -> str:
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(space, sort_keys=False))
    return str(path)
