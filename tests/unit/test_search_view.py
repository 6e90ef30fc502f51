"""search.view: what a study's parent run shows, from real (in-memory) Optuna trials: the history
points, the settled prefix parallel trials leave, the best-trial note with its link, the table."""

from __future__ import annotations

import csv
import io
import json

import optuna
import pytest
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState, create_trial

from search.view import (
    Point,
    best_note,
    best_points,
    objective_points,
    run_link,
    settled_upto,
    table_csv,
    table_json,
    trial_run_name,
    trials_table,
)

LR = {"optimizer.lr": FloatDistribution(0.001, 1.0, log=True)}


def trial(number: int, state: str = "COMPLETE", value: float | None = None, lr: float = 0.1, **attrs):
    t = create_trial(
        state=getattr(TrialState, state),
        value=value if state == "COMPLETE" else None,
        params={"optimizer.lr": lr},
        distributions=LR,
        user_attrs=attrs,
    )
    t.number = number
    return t


def steps_values(points: list[Point]) -> list[tuple[int, float]]:
    return [(p.step, p.value) for p in points]


def test_trial_runs_are_named_by_their_number():
    assert trial_run_name(7) == "trial-7"
    assert run_link("3", "abc") == "#/experiments/3/runs/abc"


def test_settled_upto_is_the_prefix_of_ended_trials():
    assert settled_upto([]) == -1
    assert settled_upto([trial(0, "RUNNING")]) == -1
    ts = [trial(0, value=0.5), trial(1, "RUNNING"), trial(2, "PRUNED"), trial(3, "FAIL")]
    assert settled_upto(ts) == 0
    ts[1] = trial(1, value=0.6)
    assert settled_upto(ts) == 3


def test_objective_points_are_complete_trials_at_their_number():
    ts = [trial(0, value=0.5), trial(1, "PRUNED"), trial(2, "FAIL"), trial(3, value=0.7), trial(4, "RUNNING")]
    pts = objective_points(ts, ["val/accuracy"], skip=set())
    assert [(p.key, p.step, p.value) for p in pts] == [("trials/val_accuracy", 0, 0.5), ("trials/val_accuracy", 3, 0.7)]
    assert steps_values(objective_points(ts, ["val/accuracy"], skip={0})) == [(3, 0.7)]


@pytest.mark.parametrize(
    "direction, expected",
    [
        ("maximize", [(1, 0.5), (2, 0.5), (3, 0.8), (4, 0.8)]),
        ("minimize", [(1, 0.5), (2, 0.5), (3, 0.5), (4, 0.2)]),
    ],
)
def test_best_so_far_follows_trial_numbers_and_starts_at_the_first_complete_trial(direction, expected):
    ts = [trial(0, "FAIL"), trial(1, value=0.5), trial(2, "PRUNED"), trial(3, value=0.8), trial(4, value=0.2)]
    pts = best_points(ts, "loss", direction, after=-1, upto=4)
    assert {p.key for p in pts} == {"trials/best_loss"}
    assert steps_values(pts) == expected
    assert steps_values(best_points(ts, "loss", direction, after=2, upto=3)) == expected[2:3]


def test_a_late_lower_numbered_trial_counts_for_the_steps_after_it():
    """Trial 1 ends after trial 2: best-so-far at step 2 must include trial 1's better value, which
    is why the tracker logs step N only once every trial <= N has ended."""
    ts = [trial(0, value=0.5), trial(1, "RUNNING"), trial(2, value=0.6)]
    upto = settled_upto(ts)
    assert steps_values(best_points(ts, "acc", "maximize", -1, upto)) == [(0, 0.5)]
    ts[1] = trial(1, value=0.9)
    assert steps_values(best_points(ts, "acc", "maximize", upto, settled_upto(ts))) == [(1, 0.9), (2, 0.9)]


def test_the_note_links_the_best_trial_to_its_run_with_its_values_and_params():
    best = trial(
        3,
        value=0.91234567,
        lr=0.05,
        mlflow_run_id="r3",
        config_values={"optimizer.lr": 0.05, "schedule.warmup": "none"},
    )
    note = best_note("s", "7", ["val/accuracy"], ["maximize"], [best], {"COMPLETE": 3, "PRUNED": 1})
    assert note.startswith("**Best trial: [trial-3](#/experiments/7/runs/r3)**, `val/accuracy` = 0.912346")
    assert "| `optimizer.lr` | 0.05 |" in note and "| `schedule.warmup` | none |" in note
    assert "4 trials (3 complete, 1 pruned)" in note
    assert "`trials/val_accuracy` and `trials/best_val_accuracy`" in note
    empty = best_note("s", "7", ["val/accuracy"], ["maximize"], [], {"FAIL": 2})
    assert "No complete trial yet (2 trials: 2 fail)" in empty


def test_the_note_lists_a_pareto_front():
    study = optuna.create_study(directions=["maximize", "minimize"])
    for number, (a, w) in enumerate([(0.9, 10.0), (0.8, 5.0)]):
        study.add_trial(create_trial(values=[a, w], user_attrs={"mlflow_run_id": f"r{number}"}))
    note = best_note("s", "1", ["val/accuracy", "wall_s"], ["maximize", "minimize"], study.best_trials, {"COMPLETE": 2})
    assert "**Pareto front: [trial-0](#/experiments/1/runs/r0)**" in note
    assert "**Pareto front: [trial-1](#/experiments/1/runs/r1)**" in note and "| best trial's param" not in note


def test_the_table_has_a_row_per_trial_with_params_objective_and_run():
    ts = [
        trial(1, "PRUNED", lr=0.2, mlflow_run_id="r1", steps=10, pruned_at_step=10),
        trial(
            0,
            value=0.75,
            lr=0.1,
            mlflow_run_id="r0",
            steps=45,
            wall_s=3.5,
            config_values={"optimizer.lr": 0.1, "batch.size": 64},
        ),
        trial(2, "FAIL", lr=0.3, error="invalid config: x, y"),
    ]
    columns, rows = trials_table(ts, ["val/accuracy"])
    assert columns == [
        "number",
        "run_name",
        "state",
        "val/accuracy",
        "optimizer.lr",
        "batch.size",
        "steps",
        "wall_s",
        "duplicate_of",
        "pruned_at_step",
        "error",
        "run_id",
    ]
    assert rows[0] == [0, "trial-0", "COMPLETE", 0.75, 0.1, 64, 45, 3.5, None, None, None, "r0"]
    assert rows[1] == [1, "trial-1", "PRUNED", None, 0.2, None, 10, None, None, 10, None, "r1"]
    assert rows[2][2:4] == ["FAIL", None] and rows[2][-2:] == ["invalid config: x, y", None]
    back = list(csv.reader(io.StringIO(table_csv(columns, rows))))
    assert back[0] == columns and back[3][-2] == "invalid config: x, y" and back[2][3] == ""
    split = json.loads(table_json(columns, rows))
    assert split == {"columns": columns, "data": rows}
