"""search.driver's scheduling without Ray: slots, duplicates (completed and running twins), trials
that fail on the spot, the timeout.  The driver runs its trials on a fake ``TrialRuns`` (the seam
to Ray, ``search.trial_runs``); the study is a real in-memory Optuna study, so what the driver tells
it is what a real search stores."""

from __future__ import annotations

import copy
import time
from collections.abc import Mapping
from typing import Any

import optuna
import pytest

from search.capacity import Capacity
from search.driver import SearchDriver, SearchOptions
from search.pruning import Verdict
from search.records import PendingTrial, RunningTrial
from search.space import parse_space
from search.trial import TrialResult
from search.trial_runs import RunWatch

optuna.logging.set_verbosity(optuna.logging.WARNING)

BASE = {
    "data": {"name": "digits"},
    "model": {"name": "mlp", "norm": "none", "hidden": 32},
    "optimizer": {"name": "sgd", "lr": 0.05, "mf": 0.9, "base_batch_size": 32},
    "batch": {"size": 32, "max_local_batch": 16},
    "schedule": {"warmup_epochs": 0.5},
    "train": {"epochs": 2},
    "tracking": {"uri": "sqlite:////tmp/never-opened.db"},
}
A = {"schedule.warmup": "none", "schedule.scaling_rule": "linear"}
B = {"schedule.warmup": "none", "schedule.scaling_rule": "sqrt"}
BAD = {"schedule.warmup": "legw", "schedule.scaling_rule": "linear"}  # legw needs sqrt: fails when asked


class FakeRuns:
    """``TrialRuns`` without Ray: a started trial's run is a note; each ``wait`` returns the oldest
    running trial with its result from ``outcomes``; ``polls`` is what a trial's ``poll`` answers."""

    def __init__(self, outcomes: dict[int, TrialResult]) -> None:
        self.outcomes = outcomes
        self.launched: list[int] = []
        self.in_flight: set[int] = set()
        self.most_running = 0
        self.polls: dict[int, dict[str, Any]] = {}
        self.verdicts: list[tuple[int, int, bool]] = []

    def connect(self, verbose: bool, runtime_env: dict[str, Any] | None) -> None:
        pass

    def capacity(self) -> Capacity:
        return Capacity({"CPU": 8.0})

    def start(self, p: PendingTrial, parent_run_id: str | None, tags: dict[str, str], watch: RunWatch) -> RunningTrial:
        self.launched.append(p.trial.number)
        self.in_flight.add(p.trial.number)
        self.most_running = max(self.most_running, len(self.in_flight))
        return RunningTrial.launched(p, actor=f"actor{p.trial.number}", ref=None, t0=0.0)

    def wait(self, running: Mapping[int, RunningTrial], timeout_s: float) -> set[int]:
        return {min(running)}

    def poll(self, running: Mapping[int, RunningTrial]) -> dict[int, dict[str, Any]]:
        return {n: self.polls.pop(n) for n in running if n in self.polls}

    def send_verdict(self, r: RunningTrial, verdict: Verdict) -> None:
        self.verdicts.append((r.trial.number, verdict.step, verdict.stop))

    def reap(self, r: RunningTrial) -> TrialResult:
        self.in_flight.discard(r.trial.number)
        return self.outcomes.get(r.trial.number, finished(0.5))

    def close(self) -> None:
        self.in_flight.clear()

    def disconnect(self) -> None:
        pass


class FakeDriver(SearchDriver):
    """The real driver and loop on ``FakeRuns``."""

    def __init__(self, configs: list[dict[str, Any]], outcomes: dict[int, TrialResult], **options: Any) -> None:
        space = parse_space(
            {
                "base": copy.deepcopy(BASE),
                "objective": {"metric": "val/accuracy"},
                "sampler": {"name": "random", "seed": 0},
                "pruner": "none",
                "params": {
                    "schedule.warmup": {"choices": ["none", "legw"]},
                    "schedule.scaling_rule": {"choices": ["linear", "sqrt"]},
                },
            }
        )
        study = optuna.create_study(directions=space.directions)
        for c in configs:
            study.enqueue_trial(c)
        self.fake = FakeRuns(outcomes)
        super().__init__(space, study, SearchOptions(progress=False, **options), "memory", runs=self.fake)
        self.slots.capacity = self.fake.capacity()


def finished(value: float) -> TrialResult:
    return TrialResult(
        run_id=None,
        status="FINISHED",
        stopped=False,
        steps=10,
        wall_s=1.0,
        worker_seconds=1.0,
        last={"val/accuracy": value},
    )


def run(d: FakeDriver, n: int) -> list[tuple[str, Any]]:
    d._loop(n, time.time())
    return [(t.state.name, t.value) for t in d.study.get_trials(deepcopy=False)]


def test_a_completed_config_is_not_run_again():
    d = FakeDriver([A, A, B], {0: finished(0.7), 2: finished(0.8)})
    assert run(d, 3) == [("COMPLETE", 0.7), ("COMPLETE", 0.7), ("COMPLETE", 0.8)]
    assert d.fake.launched == [0, 2] and d.fake.most_running == 1
    assert d.study.trials[1].user_attrs["duplicate_of"] == 0 and d.book.records[1].duplicate_of == 0
    assert d.slots.capacity.used == {"CPU": 0.0} and d.slots.to_ask == 0 and d.slots.pending is None


def test_a_running_twin_is_waited_for_then_its_value_reused():
    d = FakeDriver([A, A], {0: finished(0.7)}, parallel=2)
    assert run(d, 2) == [("COMPLETE", 0.7), ("COMPLETE", 0.7)]
    assert d.fake.launched == [0]


def test_a_failed_twin_lets_the_waiting_trial_run():
    died = TrialResult(
        run_id=None, status="FAILED", stopped=False, steps=0, wall_s=0.0, worker_seconds=0.0, error="boom"
    )
    d = FakeDriver([A, A], {0: died, 1: finished(0.6)}, parallel=2)
    assert run(d, 2) == [("FAIL", None), ("COMPLETE", 0.6)]
    assert d.fake.launched == [0, 1]
    assert d.study.trials[0].user_attrs["error"] == "boom"


def test_parallel_slots_and_on_the_spot_failures(capsys):
    d = FakeDriver([BAD, A, B, BAD], {}, parallel=2)
    assert [s for s, _ in run(d, 4)] == ["FAIL", "COMPLETE", "COMPLETE", "FAIL"]
    assert d.fake.launched == [1, 2] and d.fake.most_running == 2
    assert d.study.trials[0].user_attrs["error"].startswith("invalid config: ")
    err = capsys.readouterr().err.splitlines()
    # trial 3 is asked only once trial 1 has freed a slot
    assert [line.split("  ")[0] for line in err] == [
        "trial 0 FAIL",
        "trial 1 COMPLETE",
        "trial 3 FAIL",
        "trial 2 COMPLETE",
    ]


def test_timeout_starts_nothing_more(capsys):
    d = FakeDriver([A, B], {}, timeout_s=0.0)
    assert run(d, 2) == [("WAITING", None), ("WAITING", None)]  # the enqueued ones, never asked
    assert capsys.readouterr().err == "--timeout reached: 2 trial(s) not started\n"


def test_a_pending_trial_that_cannot_fit_an_idle_cluster_is_a_bug():
    d = FakeDriver([A], {})
    d.slots.capacity = Capacity({"CPU": 0.5})  # asked before capacity existed: never_fits could not fail it
    d.slots.capacity.never_fits = lambda need: None  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="a trial does not fit an idle cluster"):
        run(d, 1)


def test_an_interrupted_driver_fails_its_running_trials_and_queues_their_configs_again():
    """Ctrl-C / SIGTERM: the running trials are FAIL and their configs WAITING
    (user attribute retry_of), so the next run of the study evaluates them first."""

    class Interrupted(FakeRuns):
        def wait(self, running: Mapping[int, RunningTrial], timeout_s: float) -> set[int]:
            raise KeyboardInterrupt

    d = FakeDriver([A, B], {}, parallel=2)
    d.runs = Interrupted({})
    with pytest.raises(KeyboardInterrupt):
        d._loop(2, time.time())
    assert d._abort("interrupted (Ctrl-C)") == 2  # what the command says it stopped
    trials = d.study.trials
    assert [t.state.name for t in trials] == ["FAIL", "FAIL", "WAITING", "WAITING"]
    assert trials[0].user_attrs["error"] == "interrupted (Ctrl-C)"
    assert {t.user_attrs["retry_of"]: t.params for t in trials[2:]} == {0: trials[0].params, 1: trials[1].params}
    assert [r.state for r in d.book.records] == ["FAIL", "FAIL"] and not d.running


def test_a_running_trials_restart_is_written_and_the_trial_goes_on(capsys):
    """The trial's poll hands over a restart of its group (a node lost): the driver writes its line
    and the trial stays running."""
    d = FakeDriver([A], {})
    d._launch(d._ask())
    note = {"step": 15, "workers": 1, "restarts": 1, "cause": "WorkerHealthCheckFailedError: lost"}
    d.fake.polls[0] = {"values": [], "run_id": "r1", "step": 16, "restarts": [note]}
    d._poll()
    assert capsys.readouterr().err == (
        "trial 0: its group restarted after a worker failed (WorkerHealthCheckFailedError: lost); "
        "it goes on from its checkpoint at step 15 with 1 worker (restart 1)\n"
    )
    assert list(d.running) == [0] and d.running[0].run_id == "r1"
    assert d.study.trials[0].user_attrs["mlflow_run_id"] == "r1"  # found again if this driver dies


def test_the_driver_keeps_a_dozen_things_or_fewer():
    """Where trials run, slots, pruning, liveness, where trials write and the books are objects of their own."""
    d = FakeDriver([A], {})
    assert len(vars(d)) - len(("fake",)) <= 12, sorted(vars(d))
    assert d.objectives == ["val/accuracy"] and d.running is d.slots.running


def test_a_stopped_search_says_how_many_trials_it_stopped():
    """search/commands.py: the line a stopped ``search run`` ends with names what it stopped."""
    from search.commands import interrupted_line
    from search.driver import SearchInterrupted

    assert interrupted_line(SearchInterrupted(2)).startswith(
        "interrupted: 2 running trials were stopped, recorded FAIL"
    )
    assert interrupted_line(SearchInterrupted(1)).startswith("interrupted: 1 running trial was stopped")
    assert interrupted_line(SearchInterrupted(0)) == (
        "interrupted: no trial was running; run the same command again to finish its trials"
    )
    assert interrupted_line(KeyboardInterrupt()).startswith("interrupted before any trial ran;")
