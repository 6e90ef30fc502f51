"""The link's monitor (trainers/link/monitor.py) without Ray: who hands over when, in both modes."""

from trainers.link.messages import HandoverAnswer, PushAnswer, ResizeAnswer, ResizeDecided
from trainers.link.monitor import MonitorState, has_room
from trainers.resize import WorkersForBatch

CPU = {"CPU": 0.5}


def monitor(free: float | None, **kw) -> MonitorState:
    """max_local_batch 32, 1..4 workers; ``free`` CPUs in the cluster (None: overlap off)."""
    return MonitorState(WorkersForBatch(), 32, 1, 4, overlap_resources=None if free is None else CPU,
                        available=lambda: {"CPU": free or 0.0}, **kw)


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
