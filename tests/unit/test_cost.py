"""What a run cost (orchestrator/record/cost.py): each worker group's hold of its resources, from its
``fit()`` call to its return, in worker-seconds (GPU-seconds where it held GPUs), shared out over the
timeline's stretches of constant B and W and carried across a resume."""

from __future__ import annotations

import json

import pytest

from orchestrator.record.cost import Cost, Hold, Holds, cost_of, split
from orchestrator.record.listeners import TimelineListener
from orchestrator.record.note import describe
from orchestrator.record.params import public_config
from orchestrator.record.timeline import Timeline, format_table
from tests.helpers import make_config
from trainers.link.messages import PhaseStart


def _rec(step: int, b: int, w: int, t: float) -> tuple:
    return (step, {"batch/global": float(b), "workers": float(w), "batch/samples": float(b)}, t)


def _start(phase: int, workers: int, t: float) -> PhaseStart:
    return PhaseStart(phase=phase, workers=workers, step=0, resumed=False, threads=1, entered=t, built=t)


def _two_stretches(tl: Timeline, resize_at: float, end: float) -> None:
    """B 32 on 1 worker at t = 10..resize_at (a step a second), then B 64 on 2 from resize_at + 10 to ``end``."""
    steps = [_rec(i + 1, 32, 1, 10.0 + i) for i in range(int(resize_at - 10.0) + 1)]
    n = len(steps)
    steps += [_rec(n + 1 + i, 64, 2, resize_at + 10.0 + i) for i in range(int(end - resize_at - 10.0) + 1)]
    tl.add_records(steps)


def test_an_overlapping_resize_counts_both_groups_while_both_hold():
    """The old group (1 worker) holds 0..50; the new one (2 workers) is started beside it at 30 and
    holds until 100: 20 s of both, charged to the stretch the old group was training."""
    tl = Timeline()
    tl.holds.held(0, 1, 0.5, 0.0, 0.0)
    tl.holds.held(1, 2, 0.5, 0.0, 30.0)
    tl.holds.released(0, 50.0)
    tl.holds.released(1, 100.0)
    _two_stretches(tl, resize_at=45.0, end=95.0)
    assert [(r["workers"], r["first_step"]) for r in tl.rows()] == [(1, 1), (2, 37)]
    # stretch 1 (to its last step at 45): old group 0..45 = 45, new group 30..45 = 2 x 15
    # stretch 2 (from 45): old group 45..50 = 5, new group 45..100 = 2 x 55
    assert [c.worker_s for c in tl.costs()] == [75.0, 115.0]
    total = tl.cost()
    assert total == Cost(worker_s=1 * 50 + 2 * 70, gpu_s=0.0, stretches=2)
    assert sum(r["worker_s"] for r in tl.rows()) == total.worker_s
    # at least W x wall for the time the stretch trained (wall less the resize that opened it)
    rows = tl.rows()
    assert rows[0]["worker_s"] >= 1 * rows[0]["wall_s"]


def test_a_restart_resize_counts_the_new_groups_start_and_the_old_ones_teardown():
    """Break before make: the old group holds until its fit() returned (teardown included), then the
    new group from its fit() call (placement group, workers' start, restore) to its return."""
    tl = Timeline()
    tl.holds.held(0, 1, 1.0, 0.0, 0.0)
    tl.holds.released(0, 48.0)  # checkpointed at 45, torn down by 48
    tl.holds.held(1, 2, 1.0, 0.0, 50.0)  # its first step at 55: 5 s of start for 2 workers
    tl.holds.released(1, 97.0)
    _two_stretches(tl, resize_at=45.0, end=95.0)
    first, second = tl.costs()
    assert first.worker_s == 45.0  # 0 (the fit() call) to the stretch's last step: the first group's start too
    assert second.worker_s == 3.0 + 2 * 47.0  # the old group's teardown and the new group's start and end
    assert tl.cost().worker_s == 48.0 + 2 * 47.0
    rows = tl.rows()
    trained = rows[1]["wall_s"] - 10.0  # the stretch's wall less the 10 s stand-still of the resize
    assert rows[1]["worker_s"] >= 2 * trained


def test_an_elastic_group_counts_the_workers_that_started_and_a_restart_with_fewer_splits_the_hold():
    holds = Holds()
    holds.held(0, 4, 1.0, 1.0, 0.0)  # asked for 4; 3 fit
    holds.started(0, 3, 5.0)  # its first start: 3 from the fit() call on
    holds.started(0, 3, 40.0)  # restarted after a failure with as many: the hold goes on
    holds.started(0, 2, 60.0)  # restarted with 2 (a node lost)
    holds.released(0, 100.0)
    assert [(h.workers, h.start, h.end) for h in holds.holds] == [(3, 0.0, 60.0), (2, 60.0, 100.0)]
    assert cost_of(holds.holds) == Cost(worker_s=3 * 60 + 2 * 40, gpu_s=3 * 60 + 2 * 40)
    before = holds.version
    holds.started(7, 1, 1.0)  # a phase this driver never started: nothing
    assert holds.version == before


def test_a_hold_still_open_counts_until_now_and_the_driver_closes_it_at_its_end():
    holds = Holds()
    holds.held(0, 2, 0.5, 0.0, 10.0)
    assert cost_of(holds.holds).worker_s == 0.0 and cost_of(holds.holds, now=15.0).worker_s == 10.0
    holds.close_open(20.0)
    holds.released(0, 99.0)  # the fit() thread returning after the driver ended changes nothing
    assert cost_of(holds.holds, now=1e9).worker_s == 20.0


def test_split_shares_every_second_out_over_the_stretches():
    holds = [Hold(0, 1, 1.0, 0.0, 0.0, 10.0), Hold(1, 3, 1.0, 2.0, 8.0, 30.0)]
    parts = split(holds, [5.0, 12.0, 25.0])
    assert [p.worker_s for p in parts] == [5.0, 5.0 + 3 * 4, 3 * 18]  # the last stretch: to the end
    assert sum(p.worker_s for p in parts) == cost_of(holds).worker_s and split(holds, []) == []
    assert sum(p.gpu_s for p in parts) == cost_of(holds).gpu_s == 2 * 3 * 22


def test_a_resume_carries_the_earlier_drivers_cost_and_its_own_phases_are_its_own():
    """The killed driver's holds come back from what it saved; its group still held when it was
    killed counts until its last logged step (or the save, if later); the new driver's phase 0 is
    not the killed driver's phase 0."""
    first = Timeline()
    first.holds.held(0, 1, 1.0, 0.0, 0.0)
    first.holds.started(0, 1, 2.0)
    first.holds.released(0, 48.0)
    first.holds.held(1, 2, 1.0, 0.0, 50.0)  # training when the driver was killed
    first.add_records([_rec(s, 32, 1, 10.0 + s) for s in range(1, 36)] + [_rec(36, 64, 2, 60.0), _rec(37, 64, 2, 70.0)])
    saved = json.loads(json.dumps(first.holds.as_dict(now=65.0)))  # its last save (the artifact)

    resumed = Timeline()
    resumed.holds = Holds.from_dict(saved)
    resumed.add_records([_rec(s, 32, 1, 10.0 + s) for s in range(1, 36)] + [_rec(36, 64, 2, 60.0)])
    resumed.resume()  # the earlier part read back up to step 36 (t = 60); saved at 65: the later
    assert [h.end for h in resumed.holds.holds] == [48.0, 65.0]
    assert resumed.cost().worker_s == 48.0 + 2 * 15.0
    # the new driver, 200 s later: its own phase 0 (2 workers from the start); its group first logs
    # the steps its checkpoint carried, which the killed driver ran (until 68) but had not written
    resumed.holds.held(0, 2, 1.0, 0.0, 260.0)
    resumed.holds.started(0, 2, 265.0)
    resumed.add_records([_rec(37, 64, 2, 66.0), _rec(38, 64, 2, 68.0)])
    resumed.add_records([_rec(s, 64, 2, 270.0 + s) for s in range(39, 43)])
    resumed.holds.released(0, 320.0)
    assert [(h.driver, h.phase, h.workers) for h in resumed.holds.holds] == [(0, 0, 1), (0, 1, 2), (1, 0, 2)]
    assert [h.end for h in resumed.holds.holds] == [48.0, 68.0, 320.0]  # the killed group: to the last step it ran
    total = resumed.cost()
    assert total.worker_s == 48.0 + 2 * 18.0 + 2 * 60.0 and total.stretches == 2
    assert sum(r["worker_s"] for r in resumed.rows()) == pytest.approx(total.worker_s)
    # the stand-still between the drivers: from the last step the killed driver ran to the new group's first
    second = resumed.rows()[1]
    assert second["paused_s"] == 309.0 - 68.0 and second["wall_s"] == (312.0 - 45.0) - (309.0 - 68.0)
    assert second["worker_s"] >= 2 * second["wall_s"]
    assert Holds.from_dict(None).holds == [] and Holds.from_dict({"holds": [{"phase": 1}]}).holds == []


def test_the_timeline_listener_writes_down_the_started_workers_and_saves_once_per_change():
    saved: list[dict] = []
    listener = TimelineListener(on_holds=saved.append)
    holds = listener.timeline.holds
    holds.group(0, 4, {"CPU": 0.5, "GPU": 1.0}).called(0.0)  # the fit() thread
    listener.on_records([_rec(1, 32, 3, 5.0)])
    listener.on_event(_start(0, 3, 2.0))  # 3 of 4 started
    listener.on_records([_rec(2, 32, 3, 6.0)])  # nothing changed: no save
    holds.group(0, 4, {"CPU": 0.5}).returned(9.0)
    listener.on_records([_rec(3, 32, 3, 7.0)])
    assert [[(h["workers"], h["end"]) for h in s["holds"]] for s in saved] == [[(4, None)], [(3, None)], [(3, 9.0)]]
    assert listener.timeline.table()["worker_s"] == [27.0] and listener.timeline.table()["gpu_s"] == [27.0]


def test_the_summary_table_and_the_description_say_what_the_run_cost(tmp_path):
    tl = Timeline()
    tl.holds.held(0, 2, 1.0, 1.0, 0.0)
    tl.holds.released(0, 61.5)
    tl.add_records([_rec(s, 32, 2, float(s)) for s in range(1, 61)])
    lines = format_table(tl.rows()).splitlines()
    assert lines[0].split() == ["steps", "B", "W", "samples", "wall_s", "worker-s", "gpu-s", "resize_latency_s"]
    assert lines[2].split() == ["1-60", "32", "2", "1920", "59.0", "123.0", "123.0"]
    config = public_config(make_config(tmp_path, "sqlite:///x.db"))
    history = {"train/loss": [(1, 2.0), (60, 1.0)]}
    assert "\n- cost: 123 worker-seconds, 123 GPU-seconds (1 stretch)" in describe(
        config, history, "FINISHED", cost=tl.cost()
    )
    assert "cost" not in describe(config, history, "FINISHED", cost=Cost())
    assert Cost(1234.4, 0.0, 4).line() == "1,234 worker-seconds (4 stretches)"


def test_the_runner_writes_down_each_phases_hold_from_its_fit_call_to_its_return(tmp_path, monkeypatch):
    """A restart resize on the fake phases (tests/unit/test_phases.py): phase 0 held 1 worker, phase 1
    2 (its PhaseStart's), one after the other, each from its fit() call to its return."""
    from orchestrator.run.outcome import Finished
    from tests.unit.test_phases import _group, _runner

    def old(m, phase):
        _group(m, phase, 1, 0)
        assert m.on_batch_change(10, 64, 1).mode == "restart"
        m.handed_over(phase, 10, "/store/checkpoint_step00000010_resize")
        return "old"

    def new(m, phase):
        _group(m, phase, 2, 10)
        return "done"

    runner, _, _ = _runner(tmp_path, monkeypatch, {0: old, 1: new}, "restart")
    saved: list[dict] = []
    listener = TimelineListener(on_holds=saved.append)
    runner.listeners.append(listener)
    assert runner.run() == Finished("done")
    a, b = listener.timeline.holds.holds
    assert (a.phase, a.workers, a.cpus, a.gpus, b.phase, b.workers) == (0, 1, 0.5, 0.0, 1, 2)
    assert a.start <= a.end <= b.start <= b.end and a.started and b.started
    assert saved and saved[-1]["holds"][0]["end"] == a.end


def test_a_resume_that_ends_at_the_same_step_logs_its_cost_at_the_next_free_step():
    """The cost rows go at the last trained step; a later driver that ends at a step an earlier one
    already logged its cost at (a resume with nothing left to train) takes the next free one, so
    no (metric, step) is logged twice and the newest row is the run's whole cost."""
    from orchestrator.record.run_tracker import cost_step

    assert cost_step({"train/loss": [(1, 2.0), (58, 0.5)]}) == 58
    earlier = {"train/loss": [(58, 0.5)], "cost/worker_seconds": [(30, 9.0), (58, 21.0)]}
    assert cost_step(earlier) == 59
    assert cost_step({**earlier, "cost/gpu_seconds": [(59, 3.0)]}) == 60
