"""search.study_progress: the line written for each finished trial, and the bar's fallbacks."""

from __future__ import annotations

import pytest

from search.records import TrialRecord
from search.study_progress import ProgressBar, trial_line, write_line

PARAMS = {"optimizer.lr": 0.123456, "schedule.warmup": "linear"}


@pytest.mark.parametrize(
    "rec, line",
    [
        (
            TrialRecord(3, "COMPLETE", [0.91234], PARAMS, steps=40, wall_s=12.4),
            "trial 3 COMPLETE  val/accuracy=0.9123  40 steps, 12 s  [optimizer.lr=0.1235 schedule.warmup=linear]",
        ),
        (
            TrialRecord(4, "PRUNED", [0.5], PARAMS, steps=20, wall_s=3.0, pruned_at=20),
            "trial 4 PRUNED  pruned at step 20 (val/accuracy=0.5)  20 steps, 3 s  "
            "[optimizer.lr=0.1235 schedule.warmup=linear]",
        ),
        (TrialRecord(5, "FAIL", None, {}, error="invalid config: x"), "trial 5 FAIL  error: invalid config: x  []"),
        (
            TrialRecord(6, "COMPLETE", [0.9], PARAMS, duplicate_of=3),
            "trial 6 COMPLETE  val/accuracy=0.9  same config as trial 3: its value, not run again  "
            "[optimizer.lr=0.1235 schedule.warmup=linear]",
        ),
    ],
)
def test_trial_line(rec, line):
    assert trial_line(rec, ["val/accuracy"]) == line


def test_without_a_bar_lines_go_to_stderr(capsys):
    bar = ProgressBar(3, enabled=False)
    bar.show(1, "-", 0, 0, 0)
    bar.write("one")
    write_line("two")
    bar.close()
    out = capsys.readouterr()
    assert out.out == "" and out.err == "one\ntwo\n"


def test_a_trial_whose_group_restarted_is_one_line_with_its_cause_and_step():
    """What a trial's actor hears of its run (``search.trial.RestartNotes``) and the driver's line for
    it: a worker lost with its node, the group back from the trial's newest checkpoint."""
    from orchestrator.record.events import GroupFailed, GroupRestarted
    from search.study_progress import restart_line
    from search.trial import RestartNotes
    from trainers.link.messages import FirstStep

    notes = RestartNotes()
    notes.record_event(FirstStep(step=1, phase=0))
    assert notes.take() == []
    notes.record_event(GroupFailed(phase=0, message="WorkerHealthCheckFailedError: A worker health check failed."))
    notes.record_event(GroupRestarted(step=15, workers=1, restarts=1))
    notes.record_event(GroupRestarted(step=0, workers=2, restarts=2))  # no failure heard first, no checkpoint yet
    taken = notes.take()
    assert notes.take() == [] and [restart_line(7, n) for n in taken] == [
        "trial 7: its group restarted after a worker failed (WorkerHealthCheckFailedError: A worker health check "
        "failed.); it goes on from its checkpoint at step 15 with 1 worker (restart 1)",
        "trial 7: its group restarted; it goes on from step 0 (no checkpoint yet) with 2 workers (restart 2)",
    ]
