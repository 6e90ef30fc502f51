"""The end-of-run summary the CLI prints: the stretches of B and W with their resize latency, the
final metrics, the model and the link to the run; ``--register`` names the registered model."""

from __future__ import annotations

import os
from types import SimpleNamespace

from orchestrator.cli import _parser, _summary, main
from orchestrator.run.runner import RunSummary

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_summary_prints_the_phase_table_the_metrics_the_model_and_the_link():
    phases = [
        {
            "batch": 32,
            "workers": 1,
            "first_step": 1,
            "last_step": 50,
            "steps": 50,
            "samples": 1600,
            "wall_s": 12.34,
            "worker_s": 15.0,
            "resize_latency_s": None,
        },
        {
            "batch": 72,
            "workers": 2,
            "first_step": 51,
            "last_step": 80,
            "steps": 30,
            "samples": 2160,
            "wall_s": 20.0,
            "worker_s": 47.25,
            "resize_latency_s": 7.25,
        },
    ]
    s = RunSummary(
        run_id="abc123",
        tracking_uri="sqlite:///mlflow.db",
        experiment_id="1",
        status="FINISHED",
        steps=80,
        wall_s=61.0,
        final={"val/accuracy": 0.97, "train/loss": 0.1},
        storage_path="/x",
        train_run_name="elastic-abc123",
        first_step_s=9.5,
        start={"launch_s": 2.0, "ray_s": 0.5, "driver_s": 0.25, "group_s": 3.0, "worker_s": 2.5, "build_s": 1.0},
        phases=phases,
        worker_seconds=62.25,
        model_uri="models:/m-1",
        registered="digits/3",
    )
    text = _summary(s, SimpleNamespace(tracking=SimpleNamespace(experiment="quickstart")))
    lines = text.splitlines()
    assert "run finished: 80 steps in 61.0 s (first step after 9.5 s)" in text
    assert (
        "  to the first step: command 2.0 s, Ray up 0.5 s, driver 0.2 s, Ray Train group 3.0 s, worker start 2.5 s, "
        "build 1.0 s" in lines
    )  # where the 9.5 s went (EventBook.start_parts), each part named
    head = next(i for i, line in enumerate(lines) if line.split()[:3] == ["steps", "B", "W"])
    assert lines[head].split() == ["steps", "B", "W", "samples", "wall_s", "worker-s", "resize_latency_s"]
    assert lines[head + 2].split() == ["1-50", "32", "1", "1600", "12.3", "15.0"]
    assert lines[head + 3].split() == ["51-80", "72", "2", "2160", "20.0", "47.2", "7.2"]
    assert "  cost           62 worker-seconds" in lines  # the run's, every worker group's
    assert "val/accuracy   0.9700" in text and "models:/m-1 (registered digits/3)" in text
    assert "/#/experiments/1/runs/abc123?workflowType=machine_learning" in text


def test_register_names_the_model_and_an_empty_name_is_refused_before_anything_starts(capsys):
    args = _parser().parse_args(["train", "configs/quickstart.yaml", "--register", "digits-cnn"])
    assert args.register == "digits-cnn"
    assert _parser().parse_args(["train", "configs/quickstart.yaml"]).register is None
    assert main(["train", os.path.join(ROOT, "configs", "quickstart.yaml"), "--register", " "]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --register: empty model name;") and "\n" not in err
