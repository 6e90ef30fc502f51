"""``search show --target``: each trial's work and seconds to a target value of the objective, and the trial
that got there soonest (a real Optuna journal study and a real MLflow store, no Ray)."""

from __future__ import annotations

import optuna

from search.commands import main
from search.view import work_to_target


def test_work_to_target_first_report_that_reaches_it():
    curve = {20: 30.0, 40: 18.0, 60: 14.5, 80: 13.9, 100: 12.0}
    assert work_to_target(curve, 14.0, "minimize") == 80
    assert work_to_target(curve, 11.0, "minimize") is None
    assert work_to_target({5: 0.5, 10: 0.9, 15: float("nan")}, 0.8, "maximize") == 10
    assert work_to_target({30: 9.0, 10: 20.0}, 10.0, "minimize") == 30  # in step order, whatever the dict's order


def test_show_target_names_the_trial_with_least_work(tmp_path, capsys):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    exp = client.create_experiment("s")
    storage = str(tmp_path / "j.journal")
    study = optuna.create_study(
        study_name="lm",
        direction="minimize",
        storage=optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(storage)),
    )
    study.set_user_attr("objectives", ["val/perplexity"])
    study.set_user_attr("tracking_uri", uri)
    study.set_user_attr("base_config", {"batch": {"size": 4}})
    curves = {0: {20: 30.0, 40: 15.0, 60: 13.0}, 1: {20: 25.0, 40: 13.5, 60: 11.0}, 2: {20: 40.0, 40: 35.0}}
    for number, curve in curves.items():
        run = client.create_run(exp)
        start = run.info.start_time
        for i, (step, value) in enumerate(sorted(curve.items())):
            client.log_metric(run.info.run_id, "val/perplexity", value, timestamp=start + 1000 * (i + 1), step=step)
        t = study.ask({"batch.size": optuna.distributions.CategoricalDistribution([4, 8])})
        t.set_user_attr("mlflow_run_id", run.info.run_id)
        for step, value in curve.items():
            t.report(value, step)
        study.tell(
            t,
            min(curve.values()) if number != 2 else None,
            state=optuna.trial.TrialState.COMPLETE if number != 2 else optuna.trial.TrialState.PRUNED,
        )
    assert main(["show", "lm", "--storage", storage, "--target", "14"]) == 0
    out = capsys.readouterr().out
    assert "to_target_work" in out and "to_target_s" in out
    assert "to val/perplexity <= 14: least work trial 1 (40 base steps of samples or tokens, 2.0 s)" in out
    assert "soonest in time: trial 1 after 2.0 s" in out
    assert main(["show", "lm", "--storage", storage, "--target", "5"]) == 0
    assert "to val/perplexity <= 5: no trial reached it" in capsys.readouterr().out
