"""What a resumed run reads back of its earlier drivers (orchestrator/record/history.py) from a real SQLite
MLflow store: the stretches of B and W exactly up to the last step the killed driver wrote, the
resizes it measured, and the stand-still between the drivers left out of the stretches' wall time."""

from __future__ import annotations

from orchestrator.config.schema import validate
from orchestrator.record.history import (
    RESIZES_ARTIFACT,
    earlier_drains,
    earlier_resizes,
    earlier_timeline,
    resize_saver,
)
from orchestrator.record.params import ConfigRecord
from orchestrator.record.run_tracker import RunTracker


def _rec(step: int, b: int, w: int, t: float) -> tuple:
    return (
        step,
        {"train/loss": 1.0 / step, "batch/global": float(b), "workers": float(w), "batch/samples": float(b)},
        t,
    )


RESIZE = {
    "from": 1,
    "to": 2,
    "mode": "restart",
    "step": 45,
    "time": 146.0,
    "latency_s": 9.0,
    "overlap_s": 0.0,
    "teardown_s": 2.0,
    "start_s": 5.0,
    "setup_s": 2.0,
}


def test_a_killed_drivers_stretches_and_resizes_read_back_exactly(tmp_path):
    cfg = validate({"tracking": {"uri": f"sqlite:///{tmp_path}/mlflow.db", "experiment": "t"}})
    killed = RunTracker(ConfigRecord.from_config(cfg))
    killed.log_metrics([_rec(s, 32, 1, 100.0 + s) for s in range(1, 46)])
    killed.log_metrics([_rec(46, 64, 2, 155.0)])  # the resized group's first step
    resize_saver(killed.log_text, print)([RESIZE])
    killed.flush()  # what the driver acked when it was killed: written, nothing held back released
    assert earlier_resizes(killed.client, killed.run_id) == [RESIZE]

    tl = earlier_timeline(killed.client, killed.run_id)
    assert [(r["first_step"], r["last_step"], r["batch"], r["workers"], r["samples"]) for r in tl.rows()] == [
        (1, 45, 32, 1, 45 * 32),
        (46, 46, 64, 2, 64),
    ]  # the jump at 46 was written at once, not held
    assert tl.rows()[1]["resize_latency_s"] == 9.0 and tl.resizes == [RESIZE]
    # the resumed driver: replayed steps already there are skipped, the 100 s without a driver is no training
    tl.add_records([_rec(46, 64, 2, 300.0)] + [_rec(s, 64, 2, 256.0 + s) for s in range(47, 50)])
    (_, second) = tl.rows()
    assert (second["last_step"], second["samples"]) == (49, 4 * 64)
    assert second["wall_s"] == (305.0 - 145.0) - (303.0 - 155.0)  # from the first stretch's end, less the gap


def test_a_run_without_resizes_or_steps_reads_back_empty(tmp_path):
    cfg = validate({"tracking": {"uri": f"sqlite:///{tmp_path}/mlflow.db", "experiment": "t"}})
    tr = RunTracker(ConfigRecord.from_config(cfg))
    assert earlier_resizes(tr.client, tr.run_id) == [] and earlier_timeline(tr.client, tr.run_id).rows() == []
    assert earlier_drains(tr.client, tr.run_id) == [] and earlier_timeline(tr.client, tr.run_id).drains == []
    assert RESIZES_ARTIFACT.startswith("timeline/")


def test_a_killed_drivers_holds_come_back_with_its_timeline_and_its_open_group_ends_at_its_last_step(tmp_path):
    """The run's cost carried across a resume (orchestrator/record/cost.py): what the killed driver's
    groups held, saved at each change, read back; the group it was training with counts until its
    last logged step."""
    from orchestrator.record.cost import Holds
    from orchestrator.record.history import holds_saver

    cfg = validate({"tracking": {"uri": f"sqlite:///{tmp_path}/mlflow.db", "experiment": "t"}})
    killed = RunTracker(ConfigRecord.from_config(cfg))
    killed.log_metrics([_rec(s, 32, 1, 100.0 + s) for s in range(1, 46)])
    killed.log_metrics([_rec(46, 64, 2, 155.0), _rec(47, 64, 2, 156.0)])
    holds = Holds()
    holds.held(0, 1, 0.5, 0.0, 90.0)
    holds.released(0, 147.0)
    holds.held(1, 2, 0.5, 0.0, 148.0)
    holds_saver(killed.log_text, print)(holds.as_dict(150.0))  # saved once phase 1 started
    killed.flush()

    tl = earlier_timeline(killed.client, killed.run_id)
    assert [(h.phase, h.workers, h.start, h.end) for h in tl.holds.holds] == [(0, 1, 90.0, 147.0), (1, 2, 148.0, 156.0)]
    assert tl.cost().worker_s == 57.0 + 2 * 8.0 and tl.holds.driver == 1


def test_a_drained_drivers_drain_rows_come_back_in_the_resumed_runs_timeline(tmp_path):
    """A driver that left a drained node (its NodeDrained through the timeline listener, which saves
    the drains at once) and was then killed: the resumed driver's timeline, read back from MLflow,
    holds the first driver's ``drain`` row at its step, with its notice and deadline, beside the
    stretches, and the new driver's rows come after it."""
    from orchestrator.record.events import NodeDrained
    from orchestrator.record.history import DRAINS_ARTIFACT, drain_saver
    from orchestrator.record.listeners import TimelineListener

    cfg = validate({"tracking": {"uri": f"sqlite:///{tmp_path}/mlflow.db", "experiment": "t"}})
    killed = RunTracker(ConfigRecord.from_config(cfg))
    first = TimelineListener(on_drain=drain_saver(killed.log_text, print))
    records = [_rec(s, 48, 3, 100.0 + s) for s in range(1, 41)]
    first.on_records(records)
    killed.log_metrics(records)
    notice = NodeDrained(
        step=40, node="1a2b3c4d" * 7, deadline=170.0, time=141.0, workers=3, lost=1, to=2, mode="restart",
        waits=False, reason="node 1a2b3c4d drained (preemption, 29 s): moving W 3 -> 2 at step 40",
    )  # fmt: skip
    first.on_event(notice)
    tail = [_rec(s, 48, 2, 105.0 + s) for s in range(41, 46)]
    first.on_records(tail)
    killed.log_metrics(tail)
    killed.flush()  # then SIGKILL: nothing else of this driver reaches MLflow
    want = {"step": 40, "time": 141.0, "node": "1a2b3c4d" * 7, "deadline": 170.0, "from": 3, "to": 2, "mode": "restart"}
    assert DRAINS_ARTIFACT.startswith("timeline/") and earlier_drains(killed.client, killed.run_id) == [want]

    resumed = earlier_timeline(killed.client, killed.run_id)
    resumed.add_records([_rec(s, 48, 2, 300.0 + s) for s in range(46, 50)])  # the new driver's steps
    table = resumed.table()
    kinds = list(zip(table["kind"], table["first_step"], table["last_step"], table["workers"]))
    assert kinds == [("train", 1, 40, 3), ("drain", 40, 40, 2), ("train", 41, 49, 2)]
    row = table["kind"].index("drain")
    assert (table["begin_s"][row], table["end_s"][row], table["mode"][row]) == (141.0 - 101.0, 170.0 - 101.0, "restart")


def test_a_resumed_runs_timeline_table_replaces_the_earlier_drivers_one(tmp_path):
    """Each driver of a run logs the whole run's timeline as ``timeline.json``: the resumed driver's
    table replaces the killed one's (MLflow's ``log_table`` would append it: the first driver's rows,
    then the whole run's again) and stays a table in MLflow's UI (its ``mlflow.loggedArtifacts`` tag)."""
    import json

    from mlflow.tracking import MlflowClient

    from orchestrator.record.plots import RunPlots
    from orchestrator.record.timeline import Timeline

    cfg = validate({"tracking": {"uri": f"sqlite:///{tmp_path}/mlflow.db", "experiment": "t"}})
    tracker = RunTracker(ConfigRecord.from_config(cfg))
    client = MlflowClient(cfg.tracking.uri)
    for upto in (40, 90):  # the first driver's timeline, then the resumed run's, which holds it
        timeline = Timeline()
        timeline.add_records([_rec(s, 48, 3, 100.0 + s) for s in range(1, upto + 1)])
        RunPlots(client, tracker.run_id).timeline(timeline)
    table = json.load(open(client.download_artifacts(tracker.run_id, "timeline.json", str(tmp_path))))
    rows = [dict(zip(table["columns"], row)) for row in table["data"]]
    assert [(r["kind"], r["first_step"], r["last_step"]) for r in rows] == [("train", 1, 90)]
    tag = json.loads(client.get_run(tracker.run_id).data.tags["mlflow.loggedArtifacts"])
    assert tag == [{"path": "timeline.json", "type": "table"}]
