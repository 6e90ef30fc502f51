"""search.liveness: heartbeats tell a dead driver's trials from a live one's (journal and RDB), a lost
trial's config is queued again (grid points included), and a re-run of the same command takes an
unfinished, dead invocation over.  Threads only (no processes): a "driver" here is a ``Heartbeat``."""

from __future__ import annotations

import time

import optuna
import pytest

from search.liveness import (
    BEAT_ATTR,
    INVOCATION_ATTR,
    RETRY_ATTR,
    Heartbeat,
    StudyStore,
    fail_stale,
    grace_s,
    lost_numbers,
    request_key,
    requeue,
    start_invocation,
    wait_for_verdict,
)
from search.study_storage import open_storage

optuna.logging.set_verbosity(optuna.logging.WARNING)
pytestmark = pytest.mark.filterwarnings("ignore")


def journal_store(tmp_path, sampler=None) -> StudyStore:
    storage = open_storage(str(tmp_path / "j.journal"))
    return StudyStore(optuna.create_study(study_name="s", storage=storage, sampler=sampler), storage)


def test_journal_live_driver_keeps_its_trials_and_a_dead_ones_are_failed(tmp_path):
    store = journal_store(tmp_path)
    study = store.study
    live = Heartbeat(store, 0.3)
    live.start()
    mine = study.ask()
    live.watch(mine.number)
    orphan = study.ask()  # asked by a driver that never beats again
    Heartbeat(store, 0.3).watch(orphan.number)
    try:
        time.sleep(2 * grace_s(0.3))  # the live one beat several times meanwhile
        lost = fail_stale(store, 0.3)
        assert [t.number for t in lost] == [orphan.number]
        states = {t.number: t.state for t in study.get_trials()}
        assert states == {mine.number: optuna.trial.TrialState.RUNNING, orphan.number: optuna.trial.TrialState.FAIL}
        assert fail_stale(store, 0.3) == []  # a second look changes nothing
    finally:
        live.stop()
    time.sleep(grace_s(0.3) + 0.3)
    assert [t.number for t in fail_stale(store, 0.3)] == [mine.number]  # its driver stopped beating


def test_journal_stale_is_judged_from_the_beat_attribute(tmp_path):
    store = journal_store(tmp_path)
    study = store.study
    t = study.ask()
    Heartbeat(store, 10).watch(t.number)
    beat = study.trials[0].system_attrs[BEAT_ATTR]
    assert fail_stale(store, 10, now=lambda: beat + grace_s(10) - 1) == []
    assert [x.number for x in fail_stale(store, 10, now=lambda: beat + grace_s(10) + 1)] == [t.number]


def test_rdb_uses_optunas_heartbeat_and_spares_a_live_driver(tmp_path):
    storage = open_storage(f"sqlite:///{tmp_path}/o.db", heartbeat_s=1)
    study = optuna.create_study(study_name="s", storage=storage)
    store = StudyStore(study, storage)
    dead = study.ask()
    Heartbeat(store, 1).watch(dead.number)  # one beat, then the driver "dies"
    live = Heartbeat(store, 1)
    live.start()
    mine = study.ask()
    live.watch(mine.number)
    try:
        time.sleep(grace_s(1) + 1.5)
        assert [t.number for t in fail_stale(store, 1)] == [dead.number]
        assert study.trials[mine.number].state == optuna.trial.TrialState.RUNNING
    finally:
        live.stop()


def test_a_lost_grid_point_is_queued_again_and_counts_as_not_tried(tmp_path):
    from search.space import parse_space
    from search.study import grid_remaining
    from tests.search_helpers import base_config

    space = parse_space(
        {
            "base": base_config(tmp_path),
            "objective": {"metric": "val/accuracy"},
            "sampler": {"name": "grid"},
            "pruner": "none",
            "params": {"optimizer.lr": {"choices": [0.1, 0.2, 0.3]}},
        }
    )
    store = journal_store(tmp_path, space.build_sampler())
    study = store.study
    done = study.ask()
    space.sample(done)
    study.tell(done, 0.5)
    lost_trial = study.ask()
    lost_values = space.sample(lost_trial)
    Heartbeat(store, 1).watch(lost_trial.number)
    assert grid_remaining(study, space) == 1
    lost = fail_stale(store, 1, now=lambda: time.time() + 100)
    assert [t.number for t in lost] == [lost_trial.number]
    requeue(study, lost[0])
    assert grid_remaining(study, space) == 2  # the lost point and the one never tried
    again = study.ask()
    assert again.user_attrs[RETRY_ATTR] == lost_trial.number
    assert space.sample(again) == lost_values
    assert lost_numbers(study.get_trials()) == {lost_trial.number}


def test_rerun_of_the_same_command_takes_a_dead_invocation_over(tmp_path):
    store = journal_store(tmp_path)
    study = store.study
    key = request_key("space text", 3)
    first, taken = start_invocation(store, key, 3, 10)
    assert taken is None and first.left() == 3
    for value in (1.0, None):  # one evaluated, one lost with the driver
        t = study.ask()
        t.set_user_attr(INVOCATION_ATTR, first.id)
        if value is not None:
            study.tell(t, value)
    lost = fail_stale(store, 10, now=lambda: time.time() + 100)
    requeue(study, lost[0])
    assert first.finished() == 1
    later = time.time() + 100
    other, taken = start_invocation(store, request_key("space text", 5), 5, 10, now=lambda: later)
    assert taken is None and other.left() == 5  # another command: a new request
    second, taken = start_invocation(store, key, 3, 10, now=lambda: later)
    assert taken == first.id and second.total == 3 and second.left() == 2
    third, taken = start_invocation(store, key, 3, 10, now=lambda: later + 100)
    assert taken == second.id and third.left() == 2  # a chain of deaths keeps the count
    third.beat(done=True)
    fourth, taken = start_invocation(store, key, 3, 10, now=lambda: later + 200)
    assert taken is None and fourth.left() == 3  # a finished command run again adds trials


def test_a_fresh_invocation_gets_a_grace_period_before_it_is_taken_over(tmp_path):
    store = journal_store(tmp_path)
    key = request_key("x", 2)
    first, _ = start_invocation(store, key, 2, 10)
    clock = [time.time()]
    slept = []

    def sleep(s):
        slept.append(s)
        clock[0] += s

    said = []
    second, taken = start_invocation(store, key, 2, 10, now=lambda: clock[0], say=said.append, sleep=sleep)
    assert slept and grace_s(10) - 1 < slept[0] <= grace_s(10) + 1 and "waiting" in said[0]
    assert taken == first.id  # it did not beat again: dead
    second.beat(stopped=True)  # a driver stopped by Ctrl-C or an error: taken over at once, no wait
    slept.clear()
    _, taken = start_invocation(store, key, 2, 10, now=lambda: clock[0], sleep=sleep)
    assert taken == second.id and not slept


def test_wait_for_verdict_waits_only_for_fresh_running_trials(tmp_path):
    store = journal_store(tmp_path)
    study = store.study
    slept = []
    wait_for_verdict(store, 10, print, sleep=slept.append)
    assert slept == []  # nothing RUNNING
    t = study.ask()
    Heartbeat(store, 10).watch(t.number)
    said = []
    wait_for_verdict(store, 10, said.append, sleep=slept.append)
    assert len(slept) == 1 and 0 < slept[0] <= grace_s(10) + 1 and str(t.number) in said[0]
