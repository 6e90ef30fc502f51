"""Rank 0 waits for the driver's verdict on a judged value (a pruned search trial) at its next
judged value: the channel (trainers/link/channel.py) against the real monitor logic
(orchestrator/run/monitor.py ``MonitorState``), without Ray."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from orchestrator.run.monitor import MonitorState
from trainers.link.channel import Channel
from trainers.link.messages import PushAnswer
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
