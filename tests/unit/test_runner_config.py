"""run_training reads the config once into what each part takes (orchestrator/run/runner.py): the
driver never sees the config, and a config part that cannot be read leaves nothing half-done."""

from __future__ import annotations

import pytest

from orchestrator.run import runner
from orchestrator.run.cluster_limits import ClusterLimits
from tests.helpers import make_config


def test_a_record_that_cannot_be_read_stops_the_ray_this_run_started_and_opens_no_mlflow_run(tmp_path, monkeypatch):
    stopped, opened = [], []
    monkeypatch.setattr(runner, "_start_ray", lambda *a: (True, ClusterLimits()))
    monkeypatch.setattr(runner, "stop_ray", lambda: stopped.append(True))
    monkeypatch.setattr(runner, "RunTracker", lambda *a, **k: opened.append(a))

    def unreadable(cfg):
        raise OSError("the text corpus cannot be read")

    monkeypatch.setattr(runner.ConfigRecord, "from_config", staticmethod(unreadable))
    with pytest.raises(OSError, match="cannot be read"):
        runner.run_training(make_config(tmp_path, f"sqlite:///{tmp_path}/mlflow.db"), progress=False)
    assert stopped == [True] and opened == []


def test_the_driver_is_given_the_record_and_the_plan_never_the_config(tmp_path, monkeypatch):
    """What _Driver takes is the MLflow record, the groups' plan, the node supply and the final
    model's builder (which keeps the config: rebuilding the model is the one part that needs it),
    never the config itself."""
    from orchestrator.config.schema import RootConfig

    seen: list = []

    class Stop(Exception):
        pass

    def driver(*args, **kwargs):
        seen.extend([*args, *kwargs.values()])
        raise Stop

    monkeypatch.setattr(runner, "_start_ray", lambda *a: (False, ClusterLimits()))
    monkeypatch.setattr(runner, "_Driver", driver)
    with pytest.raises(Stop):
        runner.run_training(make_config(tmp_path, f"sqlite:///{tmp_path}/mlflow.db"), progress=False)
    record, plan = seen[0], seen[1]
    assert isinstance(record, runner.ConfigRecord) and isinstance(plan, runner.GroupPlan)
    assert not any(isinstance(x, RootConfig) for x in seen)
    assert record.params["data.name"] == "digits" and plan.storage_path == str(tmp_path / "ray_runs")
