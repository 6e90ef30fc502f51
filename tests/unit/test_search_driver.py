"""search.driver's scheduling without Ray: slots, duplicates (completed and running twins), trials
that fail on the spot, the timeout.  Runs and their actors are faked; the study is a real in-memory
Optuna study, so what the driver tells it is what a real search stores."""

from __future__ import annotations

import copy
import time
from typing import Any

import optuna
import pytest

from search.capacity import Capacity
from search.driver import SearchDriver, SearchOptions
from search.records import PendingTrial, RunningTrial
from search.space import parse_space
from search.trial import TrialResult

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


class FakeDriver(SearchDriver):
    """The real loop; runs are faked: ``_watch`` finishes the oldest running trial with ``outcomes``."""

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
        super().__init__(space, study, SearchOptions(progress=False, **options), "memory")
        self.slots.capacity = Capacity({"CPU": 8.0})
        self.outcomes = outcomes
        self.launched: list[int] = []
        self.most_running = 0

    def _launch(self, p: PendingTrial) -> None:
        self.slots.capacity.take(p.need)
        self.running[p.trial.number] = RunningTrial.launched(p, actor=f"actor{p.trial.number}", ref=None, t0=0.0)
        self.launched.append(p.trial.number)
        self.most_running = max(self.most_running, len(self.running))

    def _watch(self) -> None:
        self._finish(self.running.pop(min(self.running)))
        self._refresh()

    def _result(self, r: RunningTrial) -> tuple[TrialResult, bool]:
        return self.outcomes.get(r.trial.number, finished(0.5)), True


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
    assert d.launched == [0, 2] and d.most_running == 1
    assert d.study.trials[1].user_attrs["duplicate_of"] == 0 and d.records[1].duplicate_of == 0
    assert d.slots.capacity.used == {"CPU": 0.0} and d.slots.to_ask == 0 and d.slots.pending is None


def test_a_running_twin_is_waited_for_then_its_value_reused():
    d = FakeDriver([A, A], {0: finished(0.7)}, parallel=2)
    assert run(d, 2) == [("COMPLETE", 0.7), ("COMPLETE", 0.7)]
    assert d.launched == [0]


def test_a_failed_twin_lets_the_waiting_trial_run():
    died = TrialResult(
        run_id=None, status="FAILED", stopped=False, steps=0, wall_s=0.0, worker_seconds=0.0, error="boom"
    )
    d = FakeDriver([A, A], {0: died, 1: finished(0.6)}, parallel=2)
    assert run(d, 2) == [("FAIL", None), ("COMPLETE", 0.6)]
    assert d.launched == [0, 1]
    assert d.study.trials[0].user_attrs["error"] == "boom"


def test_parallel_slots_and_on_the_spot_failures(capsys):
    d = FakeDriver([BAD, A, B, BAD], {}, parallel=2)
    assert [s for s, _ in run(d, 4)] == ["FAIL", "COMPLETE", "COMPLETE", "FAIL"]
    assert d.launched == [1, 2] and d.most_running == 2
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

    class Interrupted(FakeDriver):
        def _watch(self) -> None:
            raise KeyboardInterrupt

    d = Interrupted([A, B], {}, parallel=2)
    with pytest.raises(KeyboardInterrupt):
        d._loop(2, time.time())
    d._abort("interrupted (Ctrl-C)")
    trials = d.study.trials
    assert [t.state.name for t in trials] == ["FAIL", "FAIL", "WAITING", "WAITING"]
    assert trials[0].user_attrs["error"] == "interrupted (Ctrl-C)"
    assert {t.user_attrs["retry_of"]: t.params for t in trials[2:]} == {0: trials[0].params, 1: trials[1].params}
    assert [r.state for r in d.records] == ["FAIL", "FAIL"] and not d.running


def test_a_running_trials_restart_is_written_and_the_trial_goes_on(monkeypatch, capsys):
    """The trial actor's poll hands over a restart of its group (a node lost): the driver writes
    its line and the trial stays running."""
    import search.driver

    class Actor:
        class poll:  # noqa: N801 - stands for the actor method's handle
            @staticmethod
            def remote(n: int) -> dict[str, Any]:
                note = {"step": 15, "workers": 1, "restarts": 1, "cause": "WorkerHealthCheckFailedError: lost"}
                return {"values": [], "run_id": "r1", "step": 16, "restarts": [note]}

    d = FakeDriver([A], {})
    d._launch(d._ask())
    d.running[0].actor = Actor()
    monkeypatch.setattr(search.driver.ray, "get", lambda ref, timeout=None: ref)
    d._poll()
    assert capsys.readouterr().err == (
        "trial 0: its group restarted after a worker failed (WorkerHealthCheckFailedError: lost); "
        "it goes on from its checkpoint at step 15 with 1 worker (restart 1)\n"
    )
    assert list(d.running) == [0] and d.running[0].run_id == "r1"


def test_the_driver_keeps_a_dozen_things_or_fewer():
    """Slots, pruning, liveness and where trials write are objects of their own."""
    d = FakeDriver([A], {})
    assert len(vars(d)) - len(("outcomes", "launched", "most_running")) <= 12, sorted(vars(d))
    assert d.objectives == ["val/accuracy"] and d.running is d.slots.running
