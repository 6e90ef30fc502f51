"""The training counters (a checkpoint component) and the push pace of the loop."""

import pytest

from trainers.policies.plan import TrainState


def test_train_state_round_trip_in_place():
    s = TrainState(step=7, epoch=1, cursor=96, samples_seen=1200, finished=True)
    t = TrainState()
    t.load_state_dict(s.state_dict())
    assert t == s


def test_train_state_of_an_old_checkpoint_loads_without_its_retired_keys():
    t = TrainState()
    t.load_state_dict({"step": 7, "epoch": 1, "cursor": 96, "samples_seen": 1200, "restarts": 3,
                       "finished": False, "extra": {"gns": {"ema": 0.5}}})
    assert t == TrainState(step=7, epoch=1, cursor=96, samples_seen=1200)
    assert "restarts" not in t.state_dict() and "extra" not in t.state_dict()


def test_train_state_refuses_unknown_keys():
    with pytest.raises(KeyError, match="stepz"):
        TrainState().load_state_dict({"stepz": 1})


def test_push_interval_follows_the_step_pace_but_never_below_log_every():
    from trainers.loop.meter import push_interval

    assert push_interval(10, 0.25, steps=10, seconds=0.02) == 125  # 500 steps/s -> a push per 0.25 s
    assert push_interval(10, 0.25, steps=10, seconds=5.0) == 10    # slow steps: every log_every steps
    assert push_interval(10, 0.0, steps=10, seconds=0.02) == 10    # time-based pushes turned off
    assert push_interval(1, 0.25, steps=3, seconds=1e-6) == 10_000  # capped
