"""The monitor's parts alone (orchestrator/run/monitor.py, orchestrator/run/resizing.py), without Ray and
without the actor's routing: the handover of one resize, the message buffer and its ack, the
driver's verdicts, the user-error rule and the coordinator's decisions told through ``emit``."""

import time

from orchestrator.record.events import CapacityReturned, NodeDrained
from orchestrator.run.monitor import MessageBuffer, UserErrors, Verdicts
from orchestrator.run.resizing import Handover, ResizeCoordinator, ResizeCosts, workers_in
from trainers.link.messages import (
    FirstStep,
    HandoverAnswer,
    PhaseStart,
    Resize,
    ResizeDecided,
    ResizeSkipped,
    WorkloadFailed,
)
from trainers.policies.resize import WorkerCount, WorkersForBatch


def _resize(mode: str) -> Resize:
    return Resize(from_workers=1, to=2, mode=mode, step=10, time=0.0, ready=mode == "restart")


def test_a_restart_is_due_at_once_an_overlap_once_its_new_group_is_ready():
    h = Handover()
    assert h.due() is None and not h.ready(1)  # nothing decided: a ready new group waits for nothing
    h.begin(_resize("restart"))
    assert h.due() is h.resize
    h = Handover()
    h.begin(_resize("overlap"))
    assert h.due() is None and h.answer(1) == HandoverAnswer()
    assert h.ready(1) and h.due() is h.resize


def test_a_handover_gives_the_new_phase_its_checkpoint_once():
    h = Handover()
    h.begin(_resize("overlap"))
    h.ready(1)
    h.handed_over(0, 12, "/ckpt/step12")
    assert h.resize is None and h.due() is None and h.handed(0) and not h.handed(1)
    assert h.answer(1) == HandoverAnswer(path="/ckpt/step12")
    (done,) = h.take()
    assert (done.handover_step, done.path) == (12, "/ckpt/step12") and h.take() == []
    h.cancel(1)  # a late cancel does not take the checkpoint back
    assert h.answer(1) == HandoverAnswer(path="/ckpt/step12")


def test_a_cancelled_new_group_is_told_so_and_a_failed_start_falls_back_to_restart():
    h = Handover()
    h.begin(_resize("overlap"))
    h.cancel(1)
    assert h.answer(1) == HandoverAnswer(cancel=True) and not h.ready(1)
    h = Handover()
    h.begin(_resize("overlap"))
    h.fall_back()
    assert (h.resize.mode, h.due()) == ("restart", h.resize)


def test_the_buffer_drains_once_and_its_ack_never_goes_back():
    b = MessageBuffer()
    b.put([(1, {"a": 1.0})], [{"kind": "x"}])
    b.add({"kind": "y"})
    assert b.drain(acked=5) == ([(1, {"a": 1.0})], [{"kind": "x"}, {"kind": "y"}])
    assert b.drain(acked=2) == ([], []) and b.acked == 5


def test_a_stop_is_never_taken_back_and_the_judged_step_only_grows():
    v = Verdicts()
    v.judge(10, False)
    assert (v.stop, v.judged) == (False, 10)
    v.judge(20, True)
    v.judge(15, False)
    assert (v.stop, v.judged) == (True, 20)
    v = Verdicts()
    v.request_stop()
    assert v.stop


def _failed(where: str, deterministic: bool) -> WorkloadFailed:
    """An error at ``where`` (its signature: the place and the exception type)."""
    return WorkloadFailed(
        rank=0, phase=0, where=where, error="ValueError: boom", traceback="", deterministic=deterministic
    )


def test_a_user_error_ends_the_run_when_deterministic_or_met_again():
    u = UserErrors()
    u.met(_failed("a", False))
    u.met(_failed("b", False))
    assert u.fatal is None  # each may pass with a restart
    again = _failed("a", False)
    u.met(again)
    assert u.fatal is again
    u.met(_failed("c", True))
    assert u.fatal is again  # the first that ends the run stays
    u = UserErrors()
    first = _failed("d", True)
    u.met(first)
    assert u.fatal is first


def test_the_coordinator_tells_its_decisions_and_starts_them_in_the_handover():
    said, h = [], Handover()
    costs = ResizeCosts(only_if_pays=True)
    c = ResizeCoordinator(
        WorkerCount(WorkersForBatch(), 16, 1, 4), None, {"CPU": 1.0}, lambda: {"CPU": 1.0}, costs, h, said.append
    )
    costs.starting(0, 100.0)
    c.observe(
        [(40, {"batch/global": 48.0})],
        [
            PhaseStart(phase=0, workers=2, step=30, resumed=True, threads=1, entered=0.0, built=0.0),
            FirstStep(step=31, phase=0, time=130.0),
        ],
    )
    assert costs.start_s == 30.0  # the cold start, measured from the first step
    # a short remainder does not pay for a 30 s start: skipped, nothing begun
    assert c.on_batch_change(41, 64, 2, remaining_samples=640, samples_per_s=64.0).workers == 0
    assert isinstance(said[-1], ResizeSkipped) and h.resize is None
    assert c.capacity_check(0, 3) == 3  # B=48 wants 3, one more fits
    assert [type(e) for e in said[-2:]] == [CapacityReturned, ResizeDecided] and h.resize.to == 3
    assert c.capacity_check(0, 3) == 0  # one at a time


def test_workers_in_counts_what_every_resource_allows():
    assert workers_in({"CPU": 3.5, "GPU": 2.0}, {"CPU": 1.0, "GPU": 1.0}) == 2
    assert workers_in({"CPU": 3.0}, {"CPU": 1.0, "GPU": 1.0}) == 0
    assert workers_in({"CPU": 3.0}, {"CPU": 1.0, "GPU": 0.0}) == 3


def _drained(overlap: dict | None = {"CPU": 1.0}, min_workers: int = 2):  # noqa: B006 - read only
    said, h = [], Handover()
    c = ResizeCoordinator(
        WorkerCount(WorkersForBatch(), 16, min_workers, 3), overlap, {"CPU": 1.0}, dict, ResizeCosts(), h, said.append
    )
    c.observe(
        [(40, {"batch/global": 48.0})],
        [
            PhaseStart(
                phase=0, workers=3, step=30, resumed=True, threads=1, entered=0.0, built=0.0, nodes=("a", "b", "c")
            )
        ],
    )
    return c, h, said


def test_a_drained_node_of_the_group_is_left_by_a_planned_resize_with_b_unchanged():
    c, h, said = _drained()
    assert c.drain_notice(0, {"x": None}, room=3) == 0 and h.resize is None  # not one of the group's nodes
    deadline = time.time() + 30
    assert c.drain_notice(0, {"b": deadline}, room=0) == 2  # no room beside: break before make
    drained, decided = said[-2:]
    assert isinstance(drained, NodeDrained) and isinstance(decided, ResizeDecided)
    assert (drained.node, drained.workers, drained.lost, drained.to, drained.mode) == ("b", 3, 1, 2, "restart")
    assert drained.deadline == deadline and not drained.waits
    assert drained.reason.startswith("node b drained (preemption, 30 s): moving W 3 -> 2 at step 40"), drained.reason
    assert decided.batch == 48 and decided.workers == 2  # B stays: W is only a resource
    assert h.resize.to == 2 and h.resize.ready  # rank 0 hands over at its next push
    assert c.drain_notice(0, {"b": deadline}, room=0) == 0  # decided once


def test_a_drain_overlaps_where_room_allows_and_waits_below_min_workers():
    c, h, said = _drained()
    assert c.drain_notice(0, {"a": None}, room=2) == 2 and h.resize.mode == "overlap" and not h.resize.ready
    assert "no deadline" in said[-2].reason
    c, h, said = _drained(overlap=None)
    assert c.drain_notice(0, {"a": None}, room=2) == 2 and h.resize.mode == "restart"  # resize_mode: restart
    c, h, said = _drained(min_workers=3)
    assert c.drain_notice(0, {"c": None}, room=0) == 3  # min_workers 3: 2 are left, the new group waits
    assert h.resize.mode == "restart" and said[-2].waits and "below scaling.min_workers 3" in said[-2].reason
    c, h, said = _drained(min_workers=3)
    assert c.drain_notice(0, {"c": None}, room=1) == 3  # one free beside the 2 left: a restart, no wait
    assert h.resize.mode == "restart" and not said[-2].waits and "min_workers" not in said[-2].reason
    c, h, said = _drained(min_workers=3)
    assert c.drain_notice(0, {"c": None}, room=3) == 3 and h.resize.mode == "overlap" and not said[-2].waits
    c, h, said = _drained()
    assert c.drain_notice(0, {"a": None, "c": None}, room=0) == 2  # two of three gone: min_workers 2 still
    assert said[-2].lost == 2 and said[-2].waits
