"""search.records: a running trial's reports to the pruner and how its run's result becomes a state."""

from __future__ import annotations

import math
from typing import Any

import pytest

from search.records import PendingTrial, Pruned, ReportUnit, RunningTrial, SearchSummary, TrialRecord
from search.trial import TrialResult


class FakeTrial:
    def __init__(self) -> None:
        self.reported: list[tuple[float, int]] = []

    def report(self, value: float, step: int) -> None:
        self.reported.append((value, step))


def running(**changes: Any) -> RunningTrial:
    p = PendingTrial(FakeTrial(), {"optimizer.lr": 0.1}, None, {"CPU": 1.0}, "k")  # type: ignore[arg-type]
    r = RunningTrial.launched(p, actor="actor", ref="ref", t0=0.0)
    for k, v in changes.items():
        setattr(r, k, v)
    return r


def result(**changes: Any) -> TrialResult:
    res = TrialResult(
        run_id="r",
        status="FINISHED",
        stopped=False,
        steps=10,
        wall_s=1.0,
        worker_seconds=2.0,
        last={"val/accuracy": 0.9},
    )
    for k, v in changes.items():
        setattr(res, k, v)
    return res


def test_launched_keeps_the_pending_trials_fields():
    r = running()
    assert (r.values, r.need, r.key, r.actor, r.ref, r.last_step, r.pruned_at) == (
        {"optimizer.lr": 0.1},
        {"CPU": 1.0},
        "k",
        "actor",
        "ref",
        -1,
        None,
    )


def test_report_skips_steps_already_reported():
    r = running()
    r.report([(5, "val/accuracy", 0.5), (10, "val/accuracy", 0.6)])
    r.report([(10, "val/accuracy", 0.6), (15, "val/accuracy", 0.7)])
    assert r.trial.reported == [(0.5, 5), (0.6, 10), (0.7, 15)]
    assert (r.last_step, r.last_value) == (15, 0.7)


def test_values_are_reported_at_equal_work_in_base_steps():
    """Comparing trials at equal work: a trial at B = 128 (base 32) reports its value of step 10 at base step 40,
    where a B = 32 trial reports its step 40; with report_against: steps both report at 10."""
    unit = ReportUnit("samples", 32.0)
    small, large = running(), running()
    small.report([(s, "val/accuracy", 0.1 * i, 32 * s, None) for i, s in enumerate((10, 20, 30, 40), 1)], unit)
    large.report([(10, "val/accuracy", 0.7, 1280, None)], unit)
    assert small.trial.reported == [(0.1, 10), (0.2, 20), pytest.approx((0.3, 30)), (0.4, 40)]
    assert large.trial.reported == [(0.7, 40)] and large.reported == 40 and large.last_step == 10
    by_steps = running()
    by_steps.report([(10, "val/accuracy", 0.7, 1280, None)], ReportUnit("steps", 32.0))
    assert by_steps.trial.reported == [(0.7, 10)]


def test_language_models_report_at_tokens_and_one_value_per_optuna_step():
    unit = ReportUnit("samples", 8.0, tokens_per_step=8 * 64.0)
    r = running()
    # T = 128 here: 2x the tokens of the unit's T = 64 per sequence
    r.report([(1, "val/loss", 3.0, 8, 1024), (2, "val/loss", 2.9, 16, 2048), (3, "val/loss", 2.8, 17, 2100)], unit)
    assert r.trial.reported == [(3.0, 2), (2.9, 4)]  # step 3 falls on base step 4 again: skipped
    assert (r.last_step, r.last_value, r.reported) == (3, 2.9, 4)


@pytest.mark.parametrize(
    "r, res, expected",
    [
        (running(), result(), ("COMPLETE", [0.9], None)),
        (running(pruned=Pruned(5, 0.4), last_value=0.7), result(stopped=True), ("PRUNED", [0.4], None)),
        (running(pruned=Pruned(5, math.nan)), result(stopped=True), ("PRUNED", None, None)),
        (running(pruned=Pruned(5, 0.4)), result(stopped=True, error="boom"), ("FAIL", None, "boom")),
        # condemned, but the run reached its planned end before the stop reached it: not pruned
        (running(pruned=Pruned(5, 0.4)), result(stopped=False), ("COMPLETE", [0.9], None)),
        (
            running(),
            result(last={}),
            (
                "FAIL",
                None,
                "objective val/accuracy was never reported by the run; check train.eval_every / the metric name",
            ),
        ),
        (
            running(),
            result(last={"val/accuracy": math.inf}),
            ("FAIL", None, "objective val/accuracy is not finite (the run diverged)"),
        ),
        (running(), result(status="KILLED"), ("FAIL", None, "the run ended KILLED")),
    ],
)
def test_outcome(r, res, expected):
    out = r.outcome(res, ["val/accuracy"])
    assert (out.state, out.values, out.error) == expected


def test_run_figures_as_objectives():
    out = running().outcome(result(), ["val/accuracy", "worker_seconds"])
    assert (out.state, out.values) == ("COMPLETE", [0.9, 2.0])


def test_summary_counts():
    recs = [
        TrialRecord(0, "COMPLETE", [1.0], {}, steps=3),
        TrialRecord(1, "FAIL", None, {}, steps=2),
        TrialRecord(2, "COMPLETE", [2.0], {}),
    ]
    s = SearchSummary("s", "st", "p", "uri", "0", recs, 3, [], 1.0)
    assert (s.count("COMPLETE"), s.count("PRUNED"), s.count("FAIL"), s.total_steps) == (2, 0, 1, 5)


def test_the_pruner_judges_each_value_and_nothing_after_its_verdict_reaches_the_study():
    """The trial is condemned at the value the pruner judged (its step, value and samples), not at
    the last one relayed; values relayed after the verdict are not reported."""
    r = running()
    verdicts = iter([False, True])
    values = [
        (10, "val/accuracy", 0.5, 320, None),
        (20, "val/accuracy", 0.4, 640, None),
        (30, "val/accuracy", 0.9, 960, None),
    ]
    assert r.report(values, ReportUnit("steps"), lambda: next(verdicts)) is True
    assert r.pruned == Pruned(20, 0.4, 640) and r.pruned_at == 20
    assert r.trial.reported == [(0.5, 10), (0.4, 20)] and r.last_step == 30

    def judged_again() -> bool:
        raise AssertionError("judged after the verdict")

    assert r.report([(40, "val/accuracy", 0.95, 1280, None)], ReportUnit("steps"), judged_again) is True
    assert r.trial.reported == [(0.5, 10), (0.4, 20)] and r.last_step == 40 and r.pruned.value == 0.4
    out = r.outcome(result(stopped=True, last={"val/accuracy": 0.95}), ["val/accuracy"])
    assert (out.state, out.values) == ("PRUNED", [0.4])
