"""Rank 0 waits for the driver's verdict on a judged value (a pruned search trial) at its next
judged value: the channel (trainers/link/channel.py) against the real monitor logic
(orchestrator/run/monitor.py ``MonitorState``), without Ray."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from orchestrator.run.monitor import MonitorState
from trainers.link.channel import Channel
from trainers.link.messages import PushAnswer, ResizeAnswer
from trainers.link.runtime import Runtime


class FakeMonitor:
    """The channel's seam to the monitor (``MonitorCalls``) over a ``MonitorState``, answering at
    once; ``on_push`` plays the driver between two pushes."""

    def __init__(self, state: MonitorState, on_push: Callable[[int], None]) -> None:
        self.state, self.on_push, self.pushes = state, on_push, 0

    def send(self, method: str, *args: Any) -> Any:
        answer = getattr(self.state, method)(*args)
        if method == "push":
            self.pushes += 1
            self.on_push(self.pushes)
        return answer

    def answer(self, pending: Any) -> Any:
        return pending


@pytest.fixture(autouse=True)
def _no_verdict_poll_wait(monkeypatch):
    monkeypatch.setattr("trainers.link.channel.VERDICT_POLL_S", 0.0)


def channel(on_push: Callable[[int], None]) -> tuple[Channel, MonitorState, FakeMonitor]:
    state = MonitorState()
    mon = FakeMonitor(state, on_push)
    return Channel(None, None, enabled=True, judged=["val/accuracy"], monitor=mon), state, mon


def test_the_monitor_answers_with_the_drivers_verdict():
    m = MonitorState()
    assert m.push([], []) == PushAnswer(judged=-1)
    m.judged(20, stop=False)
    m.judged(10, stop=False)  # a late verdict never takes the watermark back
    assert m.push([], []).judged == 20 and not m.push([], []).stop
    m.judged(30, stop=True)
    assert m.push([], []) == PushAnswer(stop=True, judged=30)


def test_rank_0_waits_at_the_next_judged_value_until_the_previous_one_is_judged():
    box: dict[str, Any] = {"armed": False}

    def driver(pushes: int) -> None:  # once armed, the verdict on step 10 comes at the 5th push
        if box["armed"] and pushes == 5:
            box["m"].judged(10, stop=True)

    ch, state, mon = channel(driver)
    box["m"] = state
    ch.log(10, {"val/accuracy": 0.1, "train/loss": 2.0})
    assert ch.flush() is False and mon.pushes == 1  # the first judged value: nothing to wait for
    for s in range(11, 20):
        ch.log(s, {"train/loss": 2.0})
        assert ch.flush() is False  # values the driver does not judge never wait
    assert mon.pushes == 10
    mon.pushes, box["armed"] = 0, True
    ch.log(20, {"val/accuracy": 0.1, "train/loss": 2.0})
    assert ch.flush() is True  # waited (empty pushes) for the verdict on step 10: stop at step 20
    assert mon.pushes == 6  # the verdict lands just after the 5th push was answered: the 6th brings it
    records, _ = state.drain()
    assert [r[0] for r in records] == list(range(10, 21))


def test_a_verdict_already_in_costs_no_wait_and_a_last_push_never_waits():
    ch, state, mon = channel(lambda pushes: None)
    ch.log(10, {"val/accuracy": 0.5})
    ch.flush()
    state.judged(10, stop=False)
    ch.log(20, {"val/accuracy": 0.6})
    assert ch.flush() is False and mon.pushes == 2  # the answer to the push just sent carried it
    ch.log(30, {"val/accuracy": 0.7})
    assert ch.flush(wait=True) is False and mon.pushes == 3  # the group's last push: it ends anyway


def test_every_rank_knows_which_steps_carry_a_judged_value():
    rt = Runtime(judged_metrics=["val/accuracy"])
    assert rt.judges({"val/accuracy": 0.5, "train/loss": 1.0}) and not rt.judges({"train/loss": 1.0})
    assert not Runtime().judges({"val/accuracy": 0.5})


class GoneAfter(FakeMonitor):
    """The monitor answers ``calls`` times, then is gone (its driver stopped without waiting)."""

    def __init__(self, calls: int) -> None:
        super().__init__(MonitorState(), lambda _: None)
        self.left = calls

    def answer(self, pending: Any) -> Any:
        from trainers.link.channel import MonitorGone

        if self.left <= 0:
            raise MonitorGone("The actor died unexpectedly before finishing this task.")
        self.left -= 1
        return pending


def test_a_monitor_gone_is_a_stop_and_the_channel_goes_quiet(capsys):
    """A driver that stopped without waiting for its group kills the monitor while rank 0 pushes:
    rank 0 stops at that push as if told to (the group ends at a checkpoint and returns; a failed
    group is one Ray Train would start again for a driver that is no longer there), says so once,
    and its later calls answer without the monitor; unconfirmed records stay for the checkpoint."""
    ch = Channel(None, None, enabled=True, monitor=GoneAfter(calls=1))
    ch.log(1, {"train/loss": 1.0})
    assert ch.flush() is False  # sent; nothing pending to answer yet
    ch.log(2, {"train/loss": 0.9})
    assert ch.flush() is False  # the first push's answer came
    ch.log(3, {"train/loss": 0.8})
    assert ch.flush() is True  # the second push's answer: the monitor is gone
    assert "the driver's monitor is gone" in capsys.readouterr().out
    assert ch.flush(wait=True) is True  # the group's last push (Trainer.end) returns at once
    assert ch.ask_resize(4, 64, 1) == ResizeAnswer()  # keep the group: it is stopping anyway
    ch.handed_over(0, 4, "/ckpt")
    assert [r[0] for r in ch.pending()] == [1, 2, 3]  # none confirmed (no driver drained them): kept
    assert capsys.readouterr().out == ""  # said once


def test_a_group_started_early_whose_monitor_is_gone_takes_no_handover():
    ch = Channel(None, None, enabled=True, monitor=GoneAfter(calls=1))
    assert ch.await_handover(1, poll_s=0.0) is None  # "ready" answered, then gone: called off
    assert ch.flush() is True


def test_ray_monitor_turns_a_dead_actor_into_monitor_gone():
    """The product's seam (RayMonitor) raises MonitorGone for Ray's actor errors (ActorDiedError,
    ActorUnavailableError: both RayActorError) and lets every other error through."""
    from ray import exceptions as ray_exceptions

    from trainers.link.channel import MonitorGone, RayMonitor

    class FakeRay:
        exceptions = ray_exceptions

        def __init__(self, error: Exception) -> None:
            self.error = error

        def get(self, pending: Any) -> Any:
            raise self.error

    mon = RayMonitor.__new__(RayMonitor)
    mon._ray = FakeRay(ray_exceptions.ActorDiedError())
    with pytest.raises(MonitorGone):
        mon.answer(object())
    mon._ray = FakeRay(ray_exceptions.ActorUnavailableError("unreachable", None))
    with pytest.raises(MonitorGone):
        mon.answer(object())
    mon._ray = FakeRay(ValueError("a bug"))
    with pytest.raises(ValueError):
        mon.answer(object())
