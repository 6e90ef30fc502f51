"""Resume never starts over silently (orchestrator/run/run_info.py), and credentials never leave the
process (orchestrator/config/uris.py)."""

from __future__ import annotations

import json
import os

import pytest
import torch

from orchestrator.config.schema import ConfigError, validate
from orchestrator.config.uris import absolute_tracking_uri, redact_uri
from orchestrator.record.params import public_config
from orchestrator.run.run_info import (
    RUN_INFO,
    DriverLock,
    check_resumable,
    find_run,
    read_run_info,
    run_folder,
    write_run_info,
)


@pytest.mark.parametrize(
    "uri, shown",
    [
        ("postgresql://alice:s3cret@db:5432/mlflow", "postgresql://alice:***@db:5432/mlflow"),
        ("https://tok@mlflow.example/", "https://***@mlflow.example/"),
        ("https://mlflow.example/?token=abc&x=1", "https://mlflow.example/?token=***&x=1"),
        ("http://mlflow:5000", "http://mlflow:5000"),
        ("sqlite:////abs/mlflow.db", "sqlite:////abs/mlflow.db"),
    ],
)
def test_credentials_are_redacted(uri, shown):
    assert redact_uri(uri) == shown
    assert "s3cret" not in redact_uri(uri) and "abc" not in redact_uri(uri)


def test_run_info_holds_absolute_locations_and_no_credentials(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = validate(
        {"checkpoint": {"storage_path": "ray_runs"}, "tracking": {"uri": "postgresql://alice:s3cret@db/mlflow"}}
    )
    folder = run_folder(str(tmp_path / "ray_runs"), "elastic-r1")
    write_run_info(folder, "r1", "postgresql://alice:s3cret@db/mlflow", public_config(cfg))
    text = open(os.path.join(folder, RUN_INFO)).read()
    assert "s3cret" not in text
    info = json.loads(text)
    assert info["config"]["checkpoint"]["storage_path"] == str(tmp_path / "ray_runs")
    assert not [f for f in os.listdir(folder) if ".tmp" in f], "written atomically (temp file renamed)"
    # a resume from elsewhere must be given the credentials again: one line, exit 2
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    with pytest.raises(ConfigError, match=r"^--tracking-uri: the run's tracking URI postgresql://alice:\*\*\*@db"):
        find_run(folder)
    assert find_run(folder, "postgresql://alice:s3cret@db/mlflow")[1] == "postgresql://alice:s3cret@db/mlflow"


def test_a_relative_store_is_pinned_to_an_absolute_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = validate({"tracking": {"uri": "sqlite:///mlflow.db"}})
    write_run_info(
        run_folder(str(tmp_path / "ray_runs"), "elastic-r1"), "r1", "sqlite:///mlflow.db", public_config(cfg)
    )
    info = read_run_info(run_folder(str(tmp_path / "ray_runs"), "elastic-r1"))
    assert info["tracking_uri"] == absolute_tracking_uri("sqlite:///mlflow.db") == f"sqlite:///{tmp_path}/mlflow.db"


def test_a_damaged_run_info_is_one_line(tmp_path):
    folder = tmp_path / "elastic-r1"
    folder.mkdir()
    (folder / RUN_INFO).write_text('{"run_id": "r1", "tracking')
    with pytest.raises(ConfigError, match=r"^run: .*elastic_run.json is damaged \(JSONDecodeError"):
        find_run(str(folder))


def _store_with_history(tmp_path, steps: int):
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    run_id = client.create_run(client.create_experiment("e")).info.run_id
    client.log_batch(run_id, metrics=[Metric("train/loss", 1.0, 0, s) for s in range(1, steps + 1)])
    return uri, run_id


def test_a_run_with_history_but_no_loadable_checkpoint_is_refused(tmp_path):
    from trainers.loop.checkpoint import write_checkpoint

    uri, run_id = _store_with_history(tmp_path, 5)
    storage, name = str(tmp_path / "ray_runs"), f"elastic-{run_id}"
    with pytest.raises(ConfigError, match=rf"^run: {run_id} trained 5 steps but has no loadable checkpoint"):
        check_resumable(run_id, uri, storage, name)
    ckpt = os.path.join(storage, name, "checkpoint_step00000004")
    write_checkpoint(ckpt, {"model": {"w": torch.zeros(2)}})
    with open(os.path.join(ckpt, "state.pt"), "r+b") as f:  # corrupt it: still refused
        f.write(b"xx")
    with pytest.raises(ConfigError, match="1 found, none intact"):
        check_resumable(run_id, uri, storage, name)
    write_checkpoint(os.path.join(storage, name, "checkpoint_step00000003"), {"model": {"w": torch.zeros(2)}})
    check_resumable(run_id, uri, storage, name)  # an intact one: fine


def test_a_run_missing_from_the_store_or_a_missing_store_is_refused(tmp_path):
    uri, _ = _store_with_history(tmp_path, 1)
    with pytest.raises(ConfigError, match="^run: nope is not in the tracking store"):
        check_resumable("nope", uri, str(tmp_path), "elastic-nope")
    with pytest.raises(ConfigError, match="^--tracking-uri: .* does not exist"):
        check_resumable("r", f"sqlite:///{tmp_path}/other.db", str(tmp_path), "elastic-r")
    assert not (tmp_path / "other.db").exists()


def test_one_driver_per_run(tmp_path):
    first = DriverLock(str(tmp_path / "run")).acquire("r1")
    with pytest.raises(ConfigError, match=rf"^run: r1 is being trained by a live driver \(pid {os.getpid()} on "):
        DriverLock(str(tmp_path / "run")).acquire("r1")
    first.release()
    DriverLock(str(tmp_path / "run")).acquire("r1").release()  # free again once the driver ended
