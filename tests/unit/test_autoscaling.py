"""The run's requests to an autoscaling cluster (orchestrator/run/autoscaling.py) without Ray: the whole
need sent at each change (a resize's decision, its handover, a shrink, the end), sent again while a
change is under way, asked ahead where the batch plan knows when W grows; an overlap judged with the
room the autoscaler can add; and the driver's states waiting for the nodes asked for, never starting
a group small (a fake monitor and fake ``fit()`` phases, as tests/unit/test_phases.py)."""

from __future__ import annotations

import threading
from functools import partial
from typing import Any

from orchestrator.record.events import OverlapFellBack, ResizeHandedOver, ResizeRecord
from orchestrator.run.autoscaling import RESEND_S, NodeSupply, NodeSupplyListener, bundles
from orchestrator.run.cluster_limits import ClusterLimits
from orchestrator.run.monitor import MonitorState
from orchestrator.run.outcome import Finished, RayTrainFailed
from orchestrator.run.resizing import Handover, ResizeCoordinator, ResizeCosts
from tests.helpers import StateLink, make_config
from tests.unit.test_phases import FakeFit, FakeTracker, _group, make_runner
from trainers.link.messages import FirstStep, ResizeDecided, ResizeSkipped
from trainers.policies.plan import workers_ahead
from trainers.policies.resize import WorkerCount, WorkersForBatch

LIMITS = ClusterLimits(autoscaling=True, max_resources={"CPU": 4.0}, source="test")
ONE = {"CPU": 1.0}


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _supply(tmp_path, limits: ClusterLimits = LIMITS, ahead=None, **scaling: Any) -> tuple[NodeSupply, list, Clock]:
    cfg = make_config(
        tmp_path,
        "mem://",
        batch={"size": 32, "max_local_batch": 32},
        scaling={"min_workers": 1, "max_workers": 4, "cpus_per_worker": 1, **scaling},
    )
    sent: list[int] = []
    clock = Clock()
    plan = ahead if ahead is not None else partial(workers_ahead, cfg)
    supply = NodeSupply(cfg.scaling, limits, ahead=plan, send=lambda b: sent.append(len(b)), clock=clock)
    return supply, sent, clock


def _decided(to: int, mode: str) -> ResizeDecided:
    return ResizeDecided(step=10, batch=32 * to, workers=to, reason="test", mode=mode)


def _handed_over(frm: int, to: int, mode: str) -> ResizeHandedOver:
    return ResizeHandedOver(
        resize=ResizeRecord(
            from_workers=frm, to=to, mode=mode, step=10, time=0.0, decided=0.0, fit_returned=0.0, phase=1
        )
    )


def test_bundles_are_one_worker_each():
    assert bundles({"CPU": 1.0, "GPU": 1.0}, 2) == [{"CPU": 1.0, "GPU": 1.0}] * 2 and bundles(ONE, 0) == []


def test_the_whole_need_is_sent_at_each_change_and_withdrawn_at_the_end(tmp_path):
    supply, sent, _ = _supply(tmp_path)
    assert supply.active
    supply.starting(1)
    supply.on_event(_decided(1, ""))  # the group stays: nothing new
    supply.on_event(_decided(2, "restart"))  # the new group reuses the old group's node: 2 in all
    supply.on_event(_handed_over(1, 2, "restart"))
    supply.on_event(_decided(4, "overlap"))  # both groups at once
    supply.on_event(_handed_over(2, 4, "overlap"))  # the old group's nodes may go
    supply.withdraw()
    assert sent == [1, 2, 6, 4, 0]


def test_a_shrink_lets_nodes_go(tmp_path):
    """scaling.policy goodput shrinking W: the smaller need is sent at the decision (a restart) or at
    the handover (an overlap: both groups until then), so the autoscaler removes the nodes left idle."""
    supply, sent, _ = _supply(tmp_path)
    supply.starting(4)
    supply.on_event(_decided(2, "restart"))
    supply.on_event(_handed_over(4, 2, "restart"))
    supply.on_event(_decided(1, "overlap"))
    supply.on_event(_handed_over(2, 1, "overlap"))
    assert sent == [4, 2, 3, 1]


def test_a_resize_not_made_drops_its_group(tmp_path):
    supply, sent, _ = _supply(tmp_path)
    supply.starting(1)
    supply.on_event(_decided(3, "overlap"))
    supply.on_event(OverlapFellBack(workers=3, error=None))  # a restart: the new group alone
    supply.on_event(ResizeSkipped(step=10, batch=96, workers=1, wanted=3, gain_s=1.0, cost_s=2.0, reason="no"))
    assert sent == [1, 4, 3, 1]


def test_the_need_is_sent_again_while_a_change_is_under_way(tmp_path):
    """Ray Train's coordinator writes the same request slot: until the new group trains, the driver's
    need goes out again every RESEND_S; once it trains, its placement holds its nodes."""
    supply, sent, clock = _supply(tmp_path)
    supply.starting(1)
    clock.t += RESEND_S / 2
    supply.resend()
    clock.t += RESEND_S
    supply.resend()
    assert sent == [1, 1]
    supply.on_event(FirstStep(step=1, phase=0))
    clock.t += 10 * RESEND_S
    supply.resend()
    assert sent == [1, 1]


def test_nothing_is_asked_without_an_autoscaler_or_with_request_ahead_off(tmp_path):
    for supply, sent, _ in (
        _supply(tmp_path, limits=ClusterLimits()),
        _supply(tmp_path, request_ahead=False),
    ):
        assert not supply.active and supply.grow_room() is None and supply.room_wait_s(60.0) == 60.0
        supply.starting(1)
        supply.on_event(_decided(2, "restart"))
        supply.resend()
        supply.withdraw()
        assert sent == []


def test_the_wait_for_nodes_is_node_wait_s(tmp_path):
    supply, _, _ = _supply(tmp_path, node_wait_s=90)
    assert supply.room_wait_s(60.0) == 90.0 and supply.room_wait_s(0.0) == 90.0
    assert _supply(tmp_path, limits=ClusterLimits(autoscaling=True))[0].grow_room() is None  # limits not known


def test_the_plan_asks_ahead_for_a_batch_that_follows_the_epoch(tmp_path):
    """A schedule doubles B at epoch 2 (W 1 -> 2): the second node is asked for once the run, at its
    pace, is a node's launch time (plus a margin) from epoch 2, before the decision."""
    cfg = make_config(
        tmp_path,
        "mem://",
        batch={"size": 32, "max_local_batch": 32, "policy": "schedule", "schedule": [[2, 64]]},
        scaling={"min_workers": 1, "max_workers": 2, "cpus_per_worker": 1, "resize_mode": "restart"},
    )
    sent: list[int] = []
    clock = Clock()
    supply = NodeSupply(
        cfg.scaling, LIMITS, ahead=partial(workers_ahead, cfg), send=lambda b: sent.append(len(b)), clock=clock
    )
    listener = NodeSupplyListener(supply)
    supply.starting(1)
    supply.on_event(FirstStep(step=1, phase=0))
    supply.launched_in(20.0)  # a node took 20 s here: ask 30 s ahead
    listener.on_records([(1, {"epoch": 0.0, "batch/global": 32.0}, 100.0), (50, {"epoch": 1.0}, 150.0)])
    clock.t += 10
    supply.resend()
    assert sent == [1]  # at 1 epoch per 50 s, epoch 2 is 50 s away: not yet
    listener.on_records([(70, {"epoch": 1.5, "batch/global": 32.0}, 175.0)])
    clock.t += 10
    supply.resend()
    assert sent == [1, 2] and supply.foreseen == 2  # epoch 2 is 25 s away
    supply.on_event(_decided(2, "restart"))  # the decision: the same need, nothing new to send
    supply.on_event(_handed_over(1, 2, "restart"))
    assert sent == [1, 2]
    listener.on_records([(90, {"epoch": 2.5, "batch/global": 64.0}, 200.0)])
    clock.t += 10
    supply.resend()  # B stays at 64 after epoch 2: nothing more foreseen
    assert sent[-1] == 2 and supply.foreseen == 0


def test_the_lead_is_a_launch_time_and_a_margin_within_half_the_idle_timeout(tmp_path):
    supply, _, _ = _supply(tmp_path)
    assert supply.lead_s() == 130.0  # nothing measured: a cloud node's guess
    supply.launched_in(20.0)
    assert supply.lead_s() == 30.0
    short = ClusterLimits(autoscaling=True, max_resources={"CPU": 4.0}, idle_timeout_s=6.0)
    supply, _, _ = _supply(tmp_path, limits=short)
    supply.launched_in(20.0)
    assert supply.lead_s() == 3.0  # a node asked for earlier would idle past the timeout


def test_workers_ahead_only_where_the_plan_knows(tmp_path):
    def cfg(**batch):
        return make_config(
            tmp_path,
            "mem://",
            batch={"size": 32, "max_local_batch": 32, **batch},
            scaling={"min_workers": 1, "max_workers": 4},
        )

    schedule = cfg(policy="schedule", schedule=[[2, 64], [4, 128]])
    assert [workers_ahead(schedule, e, 32, 1) for e in (1.9, 2.0, 4.5)] == [1, 2, 4]
    assert workers_ahead(schedule, 4.5, 128, 4) == 4
    assert workers_ahead(cfg(policy="noise_scale", max_size=128), 3.0, 32, 1) is None  # measured: only the run knows
    goodput = make_config(tmp_path, "mem://", scaling={"max_workers": 4, "policy": "goodput"})
    assert workers_ahead(goodput, 3.0, 32, 1) is None


def test_an_overlap_counts_the_room_the_autoscaler_can_add_for_a_bigger_group_only():
    said: list = []

    def coordinator(grow_room):
        return ResizeCoordinator(
            WorkerCount(WorkersForBatch(), 32, 1, 4),
            ONE,
            ONE,
            lambda: {"CPU": 0.0},  # the cluster is full now
            ResizeCosts(),
            Handover(),
            said.append,
            grow_room=grow_room,
        )

    assert coordinator(lambda: {"CPU": 3.0}).on_batch_change(5, 64, 1).mode == "overlap"  # 2 more can come
    assert coordinator(lambda: {"CPU": 1.0}).on_batch_change(5, 64, 1).mode == "restart"  # not both groups
    assert coordinator(None).on_batch_change(5, 64, 1).mode == "restart"
    # a shrink never waits for new nodes: only the room there now
    assert coordinator(lambda: {"CPU": 3.0})._mode(1, grow=False) == "restart"


# --------------------------------------------------------------------------- the driver's states


def _runner(tmp_path, monkeypatch, plays, resize_mode: str, free: dict[str, float], **scaling: Any):
    """A runner on an autoscaling cluster whose free CPUs are ``free["CPU"]`` (a test adds a node)."""
    import ray

    cfg = make_config(
        tmp_path,
        "mem://",
        batch={"size": 32, "max_local_batch": 32},
        scaling={"min_workers": 1, "max_workers": 4, "cpus_per_worker": 1, "resize_mode": resize_mode, **scaling},
    )
    monkeypatch.setattr(ray, "available_resources", lambda: dict(free))
    sent: list[int] = []
    supply = NodeSupply(cfg.scaling, LIMITS, ahead=partial(workers_ahead, cfg), send=lambda b: sent.append(len(b)))
    state = MonitorState(
        WorkerCount(WorkersForBatch(), 32, 1, 4),
        overlap_resources=ONE if resize_mode == "overlap" else None,
        available=lambda: dict(free),
        grow_room=lambda: {"CPU": 4.0 - 1.0},
    )
    runner = make_runner(cfg, FakeTracker(), poll_s=0.01, nodes=supply, link=StateLink(state))
    started: list[tuple[int, int, bool, float]] = []

    def trainer(workers: int, phase: int, handover: bool) -> FakeFit:
        started.append((phase, workers, handover, free["CPU"]))
        free["CPU"] -= workers  # the group holds its workers' CPUs until its fit() returns

        def play(m: MonitorState, ph: int) -> Any:
            try:
                return plays[phase](m, ph)
            finally:
                free["CPU"] += workers

        return FakeFit(play, state, phase)

    monkeypatch.setattr(runner, "_trainer", trainer)
    monkeypatch.setattr("orchestrator.run.phases.refresh_nodes", lambda: True)
    return runner, sent, started


def _changes(sent: list[int]) -> list[int]:
    """The needs sent, each change once (the same need is sent again while a change is under way)."""
    return [n for i, n in enumerate(sent) if i == 0 or sent[i - 1] != n]


def _node_joins(free: dict[str, float], cpus: float, after_s: float) -> None:
    threading.Timer(after_s, lambda: free.update(CPU=free["CPU"] + cpus)).start()


def test_a_run_waits_for_its_first_node_and_a_restart_for_the_new_groups_nodes(tmp_path, monkeypatch):
    """Only the head at first: phase 0 starts once the node asked for it is up (never on nothing); the
    restart's group of 2 starts once both its nodes are (never 1 of 2, to be grown by another restart);
    the request is withdrawn at the end."""
    free = {"CPU": 0.0}

    def old(m: MonitorState, phase: int) -> str:
        _group(m, phase, 1, 0)
        assert m.on_batch_change(10, 64, 1).mode == "restart"
        m.handed_over(phase, 10, "/store/checkpoint_step00000010_resize")
        _node_joins(free, 1.0, 0.2)  # the second node comes (the first is freed as this group ends)
        return "old"

    def new(m: MonitorState, phase: int) -> str:
        _group(m, phase, 2, 10)
        return "done"

    runner, sent, started = _runner(tmp_path, monkeypatch, {0: old, 1: new}, "restart", free)
    _node_joins(free, 1.0, 0.2)
    assert runner.run() == Finished("done")
    assert [(p, w, h) for p, w, h, _ in started] == [(0, 1, False), (1, 2, False)]
    assert [cpus for *_, cpus in started] == [1.0, 2.0], "each group started once its nodes were there"
    assert _changes(sent) == [1, 2, 0] and runner.nodes.launch_s is not None


def test_an_overlap_trains_on_while_the_new_groups_nodes_come(tmp_path, monkeypatch):
    free = {"CPU": 0.0}
    go = threading.Event()

    def old(m: MonitorState, phase: int) -> str:
        _group(m, phase, 1, 0)
        assert m.on_batch_change(10, 64, 1).mode == "overlap"  # 2 more nodes can come beside this one
        _node_joins(free, 2.0, 0.3)
        while not m.push([], []).handover:  # trains on until the new group is ready
            go.wait(0.005)
        m.handed_over(phase, 14, "/store/checkpoint_step00000014_resize")
        return "old"

    def new(m: MonitorState, phase: int) -> str:
        m.ready(phase)
        while not m.handover(phase).decided:
            go.wait(0.005)
        _group(m, phase, 2, 14)
        return "done"

    runner, sent, started = _runner(tmp_path, monkeypatch, {0: old, 1: new}, "overlap", free)
    _node_joins(free, 1.0, 0.1)
    assert runner.run() == Finished("done")
    assert [(p, w, h) for p, w, h, _ in started] == [(0, 1, False), (1, 2, True)]
    assert started[1][3] == 2.0, "the new group started once the room for it was there"
    assert _changes(sent) == [1, 3, 2, 0]


def test_a_failed_run_withdraws_its_request(tmp_path, monkeypatch):
    free = {"CPU": 1.0}

    def broken(m: MonitorState, phase: int) -> None:
        _group(m, phase, 1, 0)
        raise RuntimeError("out of failures")

    runner, sent, _ = _runner(tmp_path, monkeypatch, {0: broken}, "restart", free)
    assert isinstance(runner.run(), RayTrainFailed)
    assert _changes(sent) == [1, 0]
