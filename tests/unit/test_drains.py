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
