"""Pruning frees what it condemns, on a real local Ray with a real MLflow store: a pruned trial stops
within one evaluation interval of the value it was judged at (however fast it trains), its line,
its Optuna record and its MLflow run give that step and the value logged there, and a trial that
reached its planned end before the verdict is never called pruned.

Two trials of a learning rate so small that the validation loss creeps down from about 2.3, far
above the threshold pruner's upper bound of 1 (every value it judges condemns the trial, and no two
are equal): one of 10 epochs (450 steps, a few ms each: a stop that travelled the old way let
hundreds of steps pass) and one of 0.55 epoch, whose last step (25) is its first value past the
pruner's warmup, so the pruner condemns it only after it has finished."""

from __future__ import annotations

import optuna
import pytest
from mlflow.tracking import MlflowClient

from search.commands import main
from search.study_storage import open_storage
from tests.helpers import metric_series
from tests.search_helpers import base_config, write_space

EVAL_EVERY = 10
SHORT_STEPS = 25  # 0.55 epoch of 1438 samples at B = 32: 790.9 samples, reached at step 25


@pytest.mark.integration
def test_a_pruned_trial_stops_within_one_evaluation_and_a_finished_one_is_never_pruned(
    ray_cluster, tmp_path, tracking_uri, capsys
):
    storage = str(tmp_path / "optuna.journal")
    base = base_config(
        tmp_path, optimizer={"lr": 1e-3, "mf": 0.9}, train={"epochs": 10, "eval_every": EVAL_EVERY, "log_every": 5}
    )
    space = write_space(
        tmp_path,
        "pruned",
        base=base,
        objective={"metric": "val/loss", "direction": "minimize"},
        sampler={"name": "grid", "seed": 0},
        report_against="steps",
        pruner={"name": "threshold", "upper": 1.0, "n_warmup_steps": 21},
        params={"train.epochs": {"choices": [10, 0.55]}},
    )
    assert (
        main(["run", space, "--storage", storage, "--tracking-uri", tracking_uri, "--no-progress", "--parallel", "2"])
        == 0
    )
    err = capsys.readouterr().err
    study = optuna.load_study(study_name="pruned", storage=open_storage(storage))
    by_epochs = {t.params["train.epochs"]: t for t in study.trials}
    long, short = by_epochs[10], by_epochs[0.55]
    client = MlflowClient(tracking_uri)

    # the long trial: condemned at its first value past the warmup, stopped by its next evaluation
    assert long.state == optuna.trial.TrialState.PRUNED, (long.state, long.user_attrs)
    judged = long.user_attrs["pruned_at_step"]
    assert judged >= 21 and judged % EVAL_EVERY == 0, judged
    run_id = long.user_attrs["mlflow_run_id"]
    last_trained = metric_series(tracking_uri, run_id, "train/loss")[-1][0]
    assert judged <= last_trained <= judged + EVAL_EVERY, (judged, last_trained)
    assert long.user_attrs["steps"] == last_trained
    logged = dict(metric_series(tracking_uri, run_id, "val/loss"))[judged]  # the value at the judged step
    assert logged > 1.0
    assert long.value == pytest.approx(logged) and max(long.intermediate_values) == judged
    assert f"trial {long.number} PRUNED  pruned at step {judged} (val/loss={logged:.4g})" in err
    tags = client.get_run(run_id).data.tags
    assert tags["search.state"] == "PRUNED" and tags["search.pruned_at_step"] == str(judged)
    assert tags["search.value"] == f"{logged:.6g}"

    # the short trial reached its planned end before the pruner's verdict on its last value
    assert short.state == optuna.trial.TrialState.COMPLETE, (short.state, short.user_attrs)
    assert short.user_attrs["steps"] == SHORT_STEPS and "pruned_at_step" not in short.user_attrs
    short_run = client.get_run(short.user_attrs["mlflow_run_id"])
    assert short_run.data.tags["search.state"] == "COMPLETE" and short_run.info.status == "FINISHED"
    final = metric_series(tracking_uri, short_run.info.run_id, "val/loss")[-1]
    assert final[0] == SHORT_STEPS and final[1] > 1.0  # condemned at its last step, after it had finished
    assert short.value == pytest.approx(final[1]) and SHORT_STEPS in short.intermediate_values
    assert f"trial {short.number} COMPLETE  val/loss={final[1]:.4g}" in err
