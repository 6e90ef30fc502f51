"""Shared fixtures.  One local Ray for all integration tests (starting Ray costs ~10 s)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
os.environ.setdefault("ELASTIC_KEEP_RAY", "1")  # runs inside tests must not stop the shared Ray


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory):
    """A real local Ray with 2 CPUs (this machine's size); workers use fractional CPUs."""
    from orchestrator.runner import ensure_ray

    import ray

    ensure_ray(verbose=False, num_cpus=2)
    yield ray
    ray.shutdown()


@pytest.fixture()
def tracking_uri(tmp_path):
    return f"sqlite:///{tmp_path}/mlflow.db"
