"""The link's monitor (orchestrator/run/monitor.py) without Ray: who hands over when, in both modes."""

from orchestrator.record.events import CapacityReturned
from orchestrator.run.monitor import MonitorState
from orchestrator.run.resizing import has_room
from trainers.link.messages import HandoverAnswer, PhaseStart, PushAnswer, ResizeAnswer, ResizeDecided
from trainers.policies.resize import WorkerCount, WorkersForBatch

CPU = {"CPU": 0.5}


def monitor(free: float | None, **kw) -> MonitorState:
    """max_local_batch 32, 1..4 workers; ``free`` CPUs in the cluster (None: overlap off)."""
    return MonitorState(
        WorkerCount(WorkersForBatch(), 32, 1, 4),
        overlap_resources=None if free is None else CPU,
        available=lambda: {"CPU": free or 0.0},
        **kw,
    )


def test_has_room():
    assert has_room({"CPU": 1.5}, {"CPU": 0.5}, 3)
    assert not has_room({"CPU": 1.0}, {"CPU": 0.5}, 3)
    assert not has_room({"CPU": 8.0}, {"CPU": 1, "GPU": 1}, 2)  # no GPU at all
    assert has_room({"CPU": 8.0, "GPU": 2.0}, {"CPU": 1, "GPU": 1}, 2)


def test_no_resize_while_the_batch_fits():
    m = monitor(free=2.0)
    assert m.on_batch_change(10, 32, 1) == ResizeAnswer(0, "")
    assert m.push([], []).handover is False
    assert [type(e) for e in m.drain()[1]] == [ResizeDecided]


def test_overlap_when_the_cluster_has_room():
    m = monitor(free=1.5)
    assert m.on_batch_change(45, 64, 1) == ResizeAnswer(2, "overlap")
    ev = m.drain()[1][-1]
    assert (ev.kind, ev.mode, ev.workers) == ("resize_decision", "overlap", 2)
    # the old group trains on: no handover until the new group (phase 1) is ready
    assert m.push([(46, {})], []).handover is False
    assert m.handover(1) == HandoverAnswer()
    # a restarted old group asking again gets the same decision, not a second resize
    assert m.on_batch_change(45, 64, 1) == ResizeAnswer(2, "overlap")
    m.ready(1)
    assert m.push([(50, {})], []).handover is True
    m.handed_over(0, 51, "/store/run/checkpoint_step00000051_resize")
    assert m.handover(1) == HandoverAnswer(path="/store/run/checkpoint_step00000051_resize")
    (done,) = m.take_handovers()
    assert (done.mode, done.from_workers, done.to, done.step, done.handover_step) == ("overlap", 1, 2, 45, 51)
    assert m.take_handovers() == []
    # the new group's own next decision is a fresh one
    assert m.on_batch_change(60, 64, 2) == ResizeAnswer(0, "")


def test_restart_when_there_is_no_room_or_overlap_is_off():
    for m in (monitor(free=0.5), monitor(free=None)):
        assert m.on_batch_change(45, 64, 1) == ResizeAnswer(2, "restart")
        assert m.push([], []).handover is True  # the old group checkpoints at once anyway


def test_called_off_when_the_old_group_ends_first():
    m = monitor(free=1.5)
    m.on_batch_change(45, 64, 1)
    m.ready(1)
    m.cancel_overlap(1)
    assert m.handover(1) == HandoverAnswer(cancel=True)
    assert m.take_handovers() == []


def test_fall_back_to_restart_when_the_new_group_cannot_start():
    m = monitor(free=1.5)
    assert m.on_batch_change(45, 64, 1).mode == "overlap"
    assert m.push([], []).handover is False
    m.fall_back_to_restart()
    assert m.push([], []).handover is True  # the old group checkpoints at its next flush and ends
    m.handed_over(0, 47, "/store/run/checkpoint_step00000047_resize")
    assert m.take_handovers()[0].mode == "restart"
    # and later resizes of this run do not try to overlap again
    assert m.on_batch_change(90, 128, 2) == ResizeAnswer(4, "restart")


def test_stop_and_acks():
    m = monitor(free=None)
    assert m.push([(1, {"a": 1.0})], [{"kind": "x"}]) == PushAnswer(stop=False, acked=-1, handover=False)
    records, events = m.drain()
    assert records == [(1, {"a": 1.0})] and events == [{"kind": "x"}]
    assert m.push([(2, {"a": 2.0})], []).acked == -1  # drained is not yet logged
    assert m.drain(acked=1)[0] == [(2, {"a": 2.0})]
    m.request_stop()
    assert m.push([], []) == PushAnswer(stop=True, acked=1, handover=False)
    m.drain(acked=0)  # an ack never goes back
    assert m.push([], []).acked == 1


# -- a resize only when it pays (trainers/policies/resize.py resize_pays) ------------------------------


def test_resize_pays_formula():
    from trainers.policies.resize import resize_pays

    # 100 s left at 1 -> 2 workers; a restart stands still for the 20 s start: gain 50 > 20
    e = resize_pays(10_000, 100.0, 1, 2, start_s=20.0, pause_s=0.5, overlap=False)
    assert e.pays and e.gain_s == 50.0 and e.cost_s == 20.0
    # 30 s left: the ideal gain 15 s is below the 20 s start
    e = resize_pays(3_000, 100.0, 1, 2, start_s=20.0, pause_s=0.5, overlap=False)
    assert not e.pays and e.gain_s == 15.0 and "keeping the group" in e.reason
    # overlap: the old group trains on through the start; only (T - start) runs faster
    e = resize_pays(3_000, 100.0, 1, 4, start_s=20.0, pause_s=0.5, overlap=True)
    assert e.pays and e.gain_s == 7.5 and e.cost_s == 0.5
    # ... and a group that could never take over before training ends is not started
    e = resize_pays(1_000, 100.0, 1, 2, start_s=20.0, pause_s=0.5, overlap=True)
    assert not e.pays and e.gain_s == 0.0 and "before a new group could start" in e.reason


def test_a_resize_that_cannot_pay_is_skipped_and_says_why():
    from trainers.link.messages import FirstStep, ResizeSkipped

    m = monitor(free=None, only_if_pays=True)
    # nothing measured yet (no start time, no throughput): the resize goes ahead as before
    assert m.on_batch_change(45, 64, 1, remaining_samples=1000, samples_per_s=None) == ResizeAnswer(2, "restart")
    m = monitor(free=None, only_if_pays=True)
    # the first group was started cold at t=100 and made its first step at t=115: a start costs 15 s here
    m.starting(0, 100.0)
    m.push([], [FirstStep(step=1, phase=0, time=115.0)])
    assert m.on_batch_change(45, 64, 1, remaining_samples=1000, samples_per_s=100.0) == ResizeAnswer(0, "")
    (_, ev) = m.drain()[1]
    assert isinstance(ev, ResizeSkipped) and (ev.workers, ev.wanted, ev.gain_s, ev.cost_s) == (1, 2, 5.0, 15.0)
    assert m.take_handovers() == [] and m.push([], []).handover is False
    # a long way to go: the same batch change grows the group
    assert m.on_batch_change(46, 64, 1, remaining_samples=100_000, samples_per_s=100.0) == ResizeAnswer(2, "restart")


def test_resize_always_ignores_the_economics():
    m = monitor(free=None)  # only_if_pays off (scaling.resize_when: always)
    m.set_costs(start_s=15.0)
    assert m.on_batch_change(45, 64, 1, remaining_samples=10, samples_per_s=100.0) == ResizeAnswer(2, "restart")


def test_the_overlap_pause_measured_here_prices_the_next_resize():
    m = monitor(free=1.5, only_if_pays=True)
    m.set_costs(start_s=10.0, pause_s=30.0)  # a slow handover measured before
    # 40 s left: (40 - 10) * (1 - 1/2) = 15 s saved < 30 s pause
    assert m.on_batch_change(45, 64, 1, remaining_samples=4000, samples_per_s=100.0) == ResizeAnswer(0, "")
    m.set_costs(pause_s=0.2)
    assert m.on_batch_change(46, 64, 1, remaining_samples=4000, samples_per_s=100.0) == ResizeAnswer(2, "overlap")


def _grown(free: float, overlap: bool = False) -> MonitorState:
    """A monitor (1 CPU per worker, 1..4 workers of max_local_batch 16) whose phase-0 group asked for
    3 workers at B=48 and was started by Ray with 2 (a node was lost); ``free`` CPUs now."""
    one = {"CPU": 1.0}
    m = MonitorState(
        WorkerCount(WorkersForBatch(), 16, 1, 4),
        overlap_resources=one if overlap else None,
        available=lambda: {"CPU": free},
        per_worker=one,
    )
    m.push(
        [(40, {"batch/global": 48.0})],
        [PhaseStart(phase=0, workers=2, step=30, resumed=True, threads=1, entered=0.0, built=0.0)],
    )
    m.drain()
    return m


def test_capacity_that_returns_grows_a_shrunken_group_at_its_next_push():
    assert _grown(free=0.0).capacity_check(0, 3) == 0  # nothing came back
    m = _grown(free=1.0)
    assert m.capacity_check(1, 3) == 0  # another phase's group: nothing known about it
    assert m.capacity_check(0, 2) == 0  # the group has what it asked for
    assert m.capacity_check(0, 3) == 3
    back, decided = m.drain()[1]
    assert isinstance(back, CapacityReturned) and (back.workers, back.to, back.fit, back.mode) == (2, 3, 3, "restart")
    assert (decided.kind, decided.workers, decided.mode, decided.step) == ("resize_decision", 3, "restart", 40)
    assert m.push([], []) == PushAnswer(handover=True, to=3)  # rank 0 hands over to 3 at its next push
    assert m.capacity_check(0, 3) == 0  # decided once
    assert m.on_batch_change(41, 48, 3) == ResizeAnswer(3, "restart")  # a batch change meanwhile follows it
    m.handed_over(0, 45, "/store/run/checkpoint_step00000045_resize")
    (done,) = m.take_handovers()
    assert (done.from_workers, done.to, done.handover_step) == (2, 3, 45)
    # the driver looks again while the old group's fit() tears down: that group has handed over
    assert m.capacity_check(0, 3) == 0 and m.push([], []).handover is False


def test_capacity_grows_only_as_far_as_the_batch_wants_and_overlaps_when_both_groups_fit():
    m = _grown(free=8.0, overlap=True)
    assert m.capacity_check(0, 4) == 3  # B=48 of max_local_batch 16 wants 3, not the 4 asked nor the 10 that fit
    assert m.drain()[1][-1].mode == "overlap"
    assert m.push([], []).handover is False  # the new group starts beside this one first
