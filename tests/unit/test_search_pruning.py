"""search.pruning: the driver's verdicts on a running trial's values, with a real in-memory Optuna
study and pruner (what the driver tells the trial's run, and what Optuna keeps)."""

from __future__ import annotations

import optuna
import pytest

from search.pruning import Pruning, Verdict
from search.records import PendingTrial, Pruned, RunningTrial
from search.space import parse_space
from tests.search_helpers import base_config

optuna.logging.set_verbosity(optuna.logging.WARNING)


def setup(tmp_path, metric: str = "val/accuracy", pruner=None) -> tuple[Pruning, RunningTrial]:
    pruner = pruner if pruner is not None else {"name": "threshold", "lower": 0.3, "n_warmup_steps": 20}
    space = parse_space(
        {
            "base": base_config(tmp_path),
            "objective": {"metric": metric},
            "sampler": {"name": "random", "seed": 0},
            "pruner": pruner,
            "report_against": "steps",
            "params": {"optimizer.lr": {"choices": [0.1]}},
        }
    )
    study = optuna.create_study(directions=space.directions, pruner=space.build_pruner())
    trial = study.ask()
    p = PendingTrial(trial, {}, None, {"CPU": 0.5}, "k")  # type: ignore[arg-type]
    return Pruning(space, study, samples_per_step=32.0), RunningTrial.launched(p, actor=None, ref=None, t0=0.0)


def test_a_verdict_covers_every_relayed_value_and_names_the_judged_step(tmp_path):
    pruning, r = setup(tmp_path)
    assert pruning.judged_metrics == ["val/accuracy"]  # the run waits for the verdict at its next evaluation
    assert pruning.verdict_for(r, []) is None
    assert pruning.verdict_for(r, [(10, "val/accuracy", 0.1, 320, None)]) == Verdict(
        10, False
    )  # warmup: no pruning yet
    # the driver lags: two evaluations arrive at once; the first past the warmup condemns the trial
    assert pruning.verdict_for(
        r, [(20, "val/accuracy", 0.2, 640, None), (30, "val/accuracy", 0.9, 960, None)]
    ) == Verdict(30, True)
    assert r.pruned == Pruned(20, 0.2, 640)
    assert pruning.verdict_for(r, [(40, "val/accuracy", 0.95, 1280, None)]) == Verdict(40, True)
    frozen = pruning.study.trials[0]
    assert frozen.intermediate_values == {10: 0.1, 20: 0.2}  # nothing after the verdict reached the study
    pruning.study.tell(r.trial, state=optuna.trial.TrialState.PRUNED)
    assert pruning.study.trials[0].value == 0.2  # Optuna's value of a PRUNED trial: the judged one


@pytest.mark.parametrize(
    "metric, pruner, judged, verdict",
    [
        ("train/loss", None, [], Verdict(10, False)),  # a per-step metric: judged without the wait
        ("val/accuracy", "none", [], None),  # no pruner: values are reported, nothing judged
    ],
)
def test_what_is_judged_and_waited_for(tmp_path, metric, pruner, judged, verdict):
    pruning, r = setup(tmp_path, metric, pruner)
    assert pruning.judged_metrics == judged
    assert pruning.verdict_for(r, [(10, metric, 0.5, 320, None)]) == verdict
    assert pruning.study.trials[0].intermediate_values == {10: 0.5}
