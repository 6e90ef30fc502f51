"""The driver's look at the nodes Ray drains (orchestrator/run/drains.py), without Ray: its pace, and
nothing draining where no Ray answers."""

from __future__ import annotations

from orchestrator.run.drains import DrainWatch, draining_nodes


def test_the_draining_nodes_are_read_once_a_second_and_passed_on_as_read():
    now, reads = [100.0], []

    def source():
        reads.append(now[0])
        return {"n1": 130.0} if now[0] >= 101.0 else {}

    watch = DrainWatch(every_s=1.0, source=source, clock=lambda: now[0])
    assert watch.poll_drain_notices() == {}  # the first look is due at once
    now[0] = 100.5
    assert watch.poll_drain_notices() is None  # between looks: not asked
    now[0] = 101.0
    assert watch.poll_drain_notices() == {"n1": 130.0}
    assert reads == [100.0, 101.0]


def test_without_a_ray_nothing_is_draining():
    assert draining_nodes() == {}


def test_the_drivers_own_node_is_told_apart_from_the_others_and_asked_once():
    asked = []

    def own() -> str:
        asked.append(1)
        return "driver-node"

    watch = DrainWatch(source=dict, own=own)
    assert watch.own_drain({}) is None and asked == []  # nothing draining: Ray is not asked
    assert watch.own_drain({"worker-node": 130.0}) is None
    assert watch.own_drain({"worker-node": 130.0, "driver-node": 140.0}) == ("driver-node", 140.0)
    assert watch.own_drain({"driver-node": None}) == ("driver-node", None) and asked == [1]
    assert DrainWatch(own=lambda: None).own_drain({"n": 1.0}) is None  # no Ray: no node of its own


def test_a_drained_drivers_end_is_killed_resumable_and_tagged_a_drain_not_a_failure():
    """The driver's own node drained (orchestrator/run/phases.py ``driver_drained``): KILLED, exit 75
    (try again: a job system's retry resumes the run by its key), one line with the node, where it
    stopped and the exact resume command, under the drain's tag rather than ``elastic.failure``."""
    import re
    import time

    from orchestrator.config.command import cli
    from orchestrator.run.outcome import EXIT_DRAINED, DriverDrained, Resume, ending
    from trainers.link import tags as T

    end = DriverDrained("1a2b3c4d" * 7, time.time() + 20.4, steps=57, checkpoint=55)
    said = ending(end, Resume("0123abcd", "sqlite:///x/mlflow.db"))
    assert (said.status, said.exit_code, said.tag, EXIT_DRAINED) == ("KILLED", 75, T.DRAIN_REASON, 75)
    assert re.fullmatch(
        r"the driver's node 1a2b3c4d is being drained \(preemption, 2\d s left\): stopped after step 57 at its "
        rf"checkpoint at step 55; resume it from another node with: {re.escape(cli())} resume 0123abcd",
        said.message,
    ), said.message
    early = ending(DriverDrained("1a2b3c4d", None, steps=3, checkpoint=None), Resume("0123abcd"))
    assert "no deadline" in early.message and "nothing to resume" in early.message
    assert ending(DriverDrained("n", None, 1, 1), Resume("r", from_python=True)).message.endswith(
        "fit(resume='r', ...) with the same functions"
    )
