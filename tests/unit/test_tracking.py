"""The MLflow tracker on a real SQLite store (no Ray): piecewise metrics are logged where their
per-step series bends (a change of value or of slope), with the step before each bend and the
last step, so the per-step series is exact."""

import os
import time

import numpy as np
import pytest

import orchestrator.record.run_tracker as tracking
import orchestrator.record.run_writer as run_writer
from orchestrator.config.schema import validate
from orchestrator.record.params import ConfigRecord
from orchestrator.record.run_tracker import RunTracker
from tests.helpers import dense_series, metric_series


def _tracker(tmp_path):
    cfg = validate({"tracking": {"uri": f"sqlite:///{tmp_path}/mlflow.db", "experiment": "t"}})
    return RunTracker(ConfigRecord.from_config(cfg)), cfg.tracking.uri


def test_stepwise_metrics_are_logged_at_changes_and_plateau_ends(tmp_path):
    tr, uri = _tracker(tmp_path)
    lr = [0.1] * 5 + [0.2] * 3 + [0.05] * 4  # steps 1..12
    records = [(s, {"lr": v, "train/loss": 1.0 / s}) for s, v in enumerate(lr, start=1)]
    tr.log_metrics(records[:6])  # a push ends inside the second plateau
    tr.log_metrics(records[6:])
    tr.end()
    assert metric_series(uri, tr.run_id, "lr") == [(1, 0.1), (5, 0.1), (6, 0.2), (8, 0.2), (9, 0.05), (12, 0.05)]
    assert dense_series(uri, tr.run_id, "lr") == [(s, v) for s, v in enumerate(lr, start=1)]
    assert [s for s, _ in metric_series(uri, tr.run_id, "train/loss")] == list(range(1, 13))  # every step
    assert [s for s, _ in tr.series.history["lr"]] == [1, 5, 6, 8, 9, 12]  # what the plots draw


def test_a_resumed_tracker_logs_nothing_twice(tmp_path):
    tr, uri = _tracker(tmp_path)
    tr.log_metrics([(s, {"workers": 2.0, "train/loss": 0.5}) for s in range(1, 5)])
    tr.end()
    cfg = validate({"tracking": {"uri": uri, "experiment": "t"}})
    again = RunTracker(ConfigRecord.from_config(cfg), run_id=tr.run_id)
    again.log_metrics([(s, {"workers": 2.0 if s < 6 else 4.0, "train/loss": 0.5}) for s in range(3, 8)])
    again.end()
    assert metric_series(uri, tr.run_id, "workers") == [(1, 2.0), (4, 2.0), (5, 2.0), (6, 4.0), (7, 4.0)]
    assert [s for s, _ in metric_series(uri, tr.run_id, "train/loss")] == list(range(1, 8))


def _samples_seen(batches):
    out, total = [], 0
    for b in batches:
        total += b
        out.append(float(total))
    return out


def test_linear_metrics_are_logged_where_their_slope_changes(tmp_path):
    tr, uri = _tracker(tmp_path)
    batches = [64] * 6 + [30] + [64] * 6 + [30] + [128] * 4  # epoch tails, then the batch doubles
    seen = _samples_seen(batches)
    n = 414  # 6*64 + 30 samples an epoch
    epoch = [(s - 1) // 7 + (sum(batches[(s - 1) // 7 * 7 : s]) / n) for s in range(1, len(batches) + 1)]
    records = [
        (s, {"samples_seen": v, "epoch": e, "train/loss": 1.0}) for s, (v, e) in enumerate(zip(seen, epoch), start=1)
    ]
    for i in range(0, len(records), 5):  # pushes end anywhere in a segment
        tr.log_metrics(records[i : i + 5])
    tr.end()
    logged = metric_series(uri, tr.run_id, "samples_seen")
    assert [s for s, _ in logged] == [1, 6, 7, 13, 14, 18]  # where the per-step increment changes
    assert dense_series(uri, tr.run_id, "samples_seen") == list(enumerate(seen, start=1))
    got = dense_series(uri, tr.run_id, "epoch")
    assert [s for s, _ in got] == list(range(1, 19))
    np.testing.assert_allclose([v for _, v in got], epoch, rtol=1e-12)
    assert len(metric_series(uri, tr.run_id, "epoch")) < len(epoch)


def test_repeated_steps_are_ignored_and_held_points_show_up_every_hold_s(tmp_path, monkeypatch):
    tr, uri = _tracker(tmp_path)
    tr.log_metrics([(s, {"samples_seen": 10.0 * s}) for s in range(1, 6)])
    tr.log_metrics([(s, {"samples_seen": 999.0}) for s in range(3, 6)], flush=True)  # a replay: steps already seen
    assert metric_series(uri, tr.run_id, "samples_seen") == [(1, 10.0)]  # 2..5 lie on one line: held
    monkeypatch.setattr(tracking, "HOLD_S", 0.0)
    tr.log_metrics([(6, {"samples_seen": 60.0})])
    assert metric_series(uri, tr.run_id, "samples_seen") == [(1, 10.0), (6, 60.0)]  # the UI caught up
    tr.end()
    assert dense_series(uri, tr.run_id, "samples_seen") == [(s, 10.0 * s) for s in range(1, 7)]


@pytest.mark.parametrize("values", [[1.0, 2.0, 4.0, 8.0], [3.0, 1.0, 3.0, 1.0], [0.5, 0.5, 0.25, 0.125]])
def test_a_series_that_bends_every_step_keeps_every_step(tmp_path, values):
    tr, uri = _tracker(tmp_path)
    tr.log_metrics([(s, {"samples_seen": v}) for s, v in enumerate(values, start=1)])
    tr.end()
    assert metric_series(uri, tr.run_id, "samples_seen") == list(enumerate(values, start=1))


def test_a_resumed_driver_continues_piecewise_series_exactly(tmp_path):
    """The driver dies holding the tail of a segment; the checkpoint's newest record (kept by the
    channel even once acknowledged) gives the resumed tracker the point where training goes on."""
    from trainers.link.channel import Channel
    from trainers.link.messages import PushAnswer

    seen = _samples_seen([64] * 9 + [30] + [64] * 5)  # bends at step 10 (an epoch tail)
    records = [(s, {"samples_seen": v, "train/loss": 1.0}, 1.7e9 + s) for s, v in enumerate(seen, start=1)]
    tr, uri = _tracker(tmp_path)
    rep = Channel(None, None, enabled=False, monitor=object())  # records kept until acknowledged
    for r in records[:9]:
        rep.log(*r)
    tr.log_metrics(records[:9], flush=True)
    rep.receive(PushAnswer(acked=tr.writer.written_upto))
    pending = rep.pending()  # what the checkpoint at step 9 carries
    assert pending == [[9, records[8][1], records[8][2]]]
    # The driver is killed: steps 2..9 were held, never logged.  The resumed run restores step 9.
    cfg = validate({"tracking": {"uri": uri, "experiment": "t"}})
    again = RunTracker(ConfigRecord.from_config(cfg), run_id=tr.run_id)
    again.log_metrics([tuple(r) for r in pending] + records[9:])
    again.end()
    assert dense_series(uri, tr.run_id, "samples_seen") == list(enumerate(seen, start=1))
    # a checkpoint written before records carried their time still replays
    old = Channel(None, None, enabled=False, monitor=object())
    old.replay([[9, records[8][1]]])
    assert old.pending()[0][:2] == [9, records[8][1]] and old.pending()[0][2] > 1.7e9 + 100


def test_rows_carry_the_time_their_step_ran(tmp_path):
    """A row's MLflow timestamp is when its step ran on the worker, not when the driver wrote it
    (rows are written in batches, up to FLUSH_S late), also for a piecewise point held back."""
    from mlflow.tracking import MlflowClient

    tr, uri = _tracker(tmp_path)
    t0 = 1.7e9
    lr = [0.1] * 6 + [0.2] * 6
    records = [(s, {"lr": v, "train/loss": 1.0 / s}, t0 + 0.25 * s) for s, v in enumerate(lr, start=1)]
    for i in range(0, len(records), 4):
        tr.log_metrics(records[i : i + 4])
    tr.log_metrics([(13, {"lr": 0.2, "train/loss": 0.1})])  # no time: when it is logged
    tr.end()
    client = MlflowClient(uri)
    for key in ("lr", "train/loss"):
        hist = sorted(client.get_metric_history(tr.run_id, key), key=lambda m: m.step)
        assert [m.timestamp for m in hist if m.step <= 12] == [
            int(1000 * (t0 + 0.25 * m.step)) for m in hist if m.step <= 12
        ]
        assert abs(hist[-1].timestamp / 1000 - time.time()) < 60
    assert [m.step for m in client.get_metric_history(tr.run_id, "lr")] == [1, 6, 7, 13]
    assert all(s >= 12 for s in tr.series.held_times())  # only the times a held point may still need


def test_rows_are_written_in_batches_and_only_written_steps_are_acknowledged(tmp_path, monkeypatch):
    """Rows wait in the driver up to FLUSH_S; the ack (``written_upto``) covers only what MLflow
    holds, so records of a driver killed with rows in its buffer are sent again on resume."""
    from trainers.link.channel import Channel
    from trainers.link.messages import PushAnswer

    monkeypatch.setattr(run_writer, "FLUSH_S", 3600.0)
    tr, uri = _tracker(tmp_path)
    rep = Channel(None, None, enabled=False, monitor=object())
    records = [(s, {"train/loss": 1.0 / s, "workers": 1.0}) for s in range(1, 13)]
    for r in records[:4]:
        rep.log(*r)
    tr.log_metrics(records[:4])
    assert metric_series(uri, tr.run_id, "train/loss") == [] and tr.writer.written_upto == -1
    monkeypatch.setattr(run_writer, "FLUSH_S", 0.0)
    tr.log_metrics(records[4:6])  # the interval has passed: steps 1..6 are written in one call
    for r in records[4:6]:
        rep.log(*r)
    assert [s for s, _ in metric_series(uri, tr.run_id, "train/loss")] == list(range(1, 7))
    assert tr.writer.written_upto == 6
    rep.receive(PushAnswer(acked=tr.writer.written_upto))
    monkeypatch.setattr(run_writer, "FLUSH_S", 3600.0)
    for r in records[6:9]:
        rep.log(*r)
    tr.log_metrics(records[6:9])  # buffered, then the driver dies
    rep.receive(PushAnswer(acked=tr.writer.written_upto))
    assert [r[0] for r in rep.pending()] == [7, 8, 9]  # unwritten: they ride in the next checkpoint
    cfg = validate({"tracking": {"uri": uri, "experiment": "t"}})
    again = RunTracker(ConfigRecord.from_config(cfg), run_id=tr.run_id)
    again.log_metrics([tuple(r) for r in rep.pending()] + records[9:])
    again.end()
    assert metric_series(uri, tr.run_id, "train/loss") == [(s, 1.0 / s) for s in range(1, 13)]
    assert dense_series(uri, tr.run_id, "workers") == [(s, 1.0) for s in range(1, 13)]


# -- a tracking store that stops answering ------------------------------------------------------------


def _server_down():
    """The error MLflow raises for a server that refuses connections (its HTTP library's error as
    the context of an MlflowException), as a real client to a closed port produces it."""
    import requests
    from mlflow.exceptions import MlflowException

    try:
        try:
            raise requests.exceptions.ConnectionError("Connection refused")
        except requests.exceptions.ConnectionError as e:
            raise MlflowException(f"API request to http://127.0.0.1:1/api failed with exception {e}") from e
    except MlflowException as wrapped:
        return wrapped


class _Outage:
    """The tracker's client, but every write fails like an unreachable server while ``down``."""

    def __init__(self, client):
        self.client, self.down, self.calls = client, False, 0

    def __getattr__(self, name):
        real = getattr(self.client, name)
        if name not in ("log_batch", "set_tag", "set_terminated"):
            return real

        def call(*args, **kwargs):
            self.calls += 1
            if self.down:
                raise _server_down()
            return real(*args, **kwargs)

        return call


def _watched(tmp_path, monkeypatch, timeout_s=300.0):
    monkeypatch.setattr(run_writer, "RETRY_S", 0.0)
    cfg = validate(
        {"tracking": {"uri": f"sqlite:///{tmp_path}/mlflow.db", "experiment": "t", "outage_timeout_s": timeout_s}}
    )
    tr = RunTracker(ConfigRecord.from_config(cfg))
    tr.client = tr.writer.client = _Outage(tr.client)  # every write goes through the writer
    said = []
    tr.writer.warn = said.append
    return tr, cfg.tracking.uri, said


def test_an_outage_keeps_every_record_and_tag_until_the_store_answers(tmp_path, monkeypatch):
    tr, uri, said = _watched(tmp_path, monkeypatch)
    records = [(s, {"train/loss": 1.0 / s, "workers": 1.0}) for s in range(1, 31)]
    tr.log_metrics(records[:10], flush=True)
    assert tr.writer.written_upto == 10
    tr.client.down = True
    tr.log_metrics(records[10:20], flush=True)  # nothing raised: training goes on
    tr.set_tags({"elastic.restarts": 1})
    tr.log_metrics(records[20:25], flush=True)
    assert tr.writer.written_upto == 10  # rank 0 keeps steps 11.. in its checkpoints
    assert tr.writer.outage is not None and tr.outage_expired() is None
    assert tr.writer.unrecorded() == (15, 30, 11)
    assert len(said) == 1 and "does not answer" in said[0] and "ConnectionError" in said[0]
    tr.client.down = False
    tr.log_metrics(records[25:], flush=True)
    assert tr.writer.outage is None and tr.writer.written_upto == 30 and "answers again" in said[-1]
    tr.end()
    assert metric_series(uri, tr.run_id, "train/loss") == [(s, 1.0 / s) for s in range(1, 31)]
    from mlflow.tracking import MlflowClient

    run = MlflowClient(uri).get_run(tr.run_id)
    assert run.data.tags["elastic.restarts"] == "1" and run.info.status == "FINISHED"


def test_a_store_away_past_the_timeout_is_given_up_with_what_was_not_recorded(tmp_path, monkeypatch):
    tr, uri, said = _watched(tmp_path, monkeypatch, timeout_s=0.2)
    tr.log_metrics([(s, {"train/loss": 1.0}) for s in range(1, 6)], flush=True)
    tr.client.down = True
    tr.log_metrics([(s, {"train/loss": 1.0, "lr": 0.1}) for s in range(6, 10)], flush=True)
    assert tr.outage_expired() is None  # within the window
    time.sleep(0.25)
    lost = tr.outage_expired()
    assert isinstance(lost, run_writer.TrackingLost) and "did not answer for 0.2 s" in str(lost)
    assert tr.writer.lost and tr.outage_expired() is None  # said once
    calls = tr.client.calls
    tr.log_metrics([(10, {"train/loss": 1.0, "lr": 0.1})], flush=True)
    tr.set_tags({"elastic.failure": "x"})
    tr.end("FAILED")  # nothing more is tried: the run stays RUNNING for resume
    assert tr.client.calls == calls
    line = tr.lost_message(lost, 10, "/ckpt/elastic-r (newest at step 8)", "python -m orchestrator resume r")
    assert "5 step records (10 metric values) from step 6 on were not recorded" in line
    assert line.endswith("once the server answers again: python -m orchestrator resume r")
    assert "/ckpt/elastic-r (newest at step 8)" in line
    from mlflow.tracking import MlflowClient

    assert MlflowClient(uri).get_run(tr.run_id).info.status == "RUNNING"


def test_a_refused_request_is_not_an_outage(tmp_path, monkeypatch):
    """A bad request (here a run that does not exist) fails at once: waiting would not cure it."""
    from mlflow.exceptions import MlflowException

    tr, _, _ = _watched(tmp_path, monkeypatch)
    tr.run_id = tr.writer.run_id = "no-such-run"
    with pytest.raises(MlflowException):
        tr.log_metrics([(1, {"train/loss": 1.0})], flush=True)
    assert not run_writer.unavailable(RuntimeError("bad value"))
    assert run_writer.unavailable(_server_down())


def test_a_real_client_to_a_closed_port_is_an_outage_and_each_call_is_bounded(monkeypatch):
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    from tests.helpers import free_port

    for key in run_writer.HTTP_LIMITS:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "7")  # a person's own setting stays
    uri = f"http://127.0.0.1:{free_port()}"
    run_writer.bound_http_requests(uri)
    assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "1" and os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "7"
    with pytest.raises(Exception) as info:
        MlflowClient(uri).log_batch("r", metrics=[Metric("a", 1.0, 0, 1)])
    assert run_writer.unavailable(info.value)


def test_what_the_end_leaves_is_written_before_the_status_and_the_cost_goes_past_an_earlier_drivers(tmp_path):
    """RunTracker.end with the driver's end: the failure line as a tag, the traceback as an artifact
    (credentials redacted), the cost at the last trained step (a resumed run whose earlier driver
    logged its cost there: the next free one), the description, then the status."""
    from mlflow.tracking import MlflowClient

    from orchestrator.record.cost import Cost
    from trainers.link import tags as T

    first, uri = _tracker(tmp_path)
    first.log_metrics([(s, {"train/loss": 1.0 / s, "workers": 2.0, "batch/global": 64.0}) for s in range(1, 11)])
    first.end("KILLED", cost=Cost(5.0, 0.0, 1))
    tr = RunTracker(first.record, run_id=first.run_id)  # a resume with nothing left to train
    assert tr.trained_steps == 10
    trace = "Traceback ...\nRuntimeError: s3://key:s3cret@bucket/x not found"
    tr.end(
        "FAILED",
        failure={T.FAILURE: "the group failed"},
        texts={"failure/traceback.txt": trace},
        cost=Cost(42.0, 0.0, 1),
        resumes=1,
    )
    client = MlflowClient(uri)
    run = client.get_run(tr.run_id)
    assert run.info.status == "FAILED" and run.data.tags[T.FAILURE] == "the group failed"
    assert metric_series(uri, tr.run_id, "cost/worker_seconds") == [(10, 5.0), (11, 42.0)]
    note = run.data.tags[T.NOTE]
    assert "10 steps" in note and "resumed 1 time" in note and "W 2" in note and "- cost: 42 worker-seconds" in note
    saved = client.download_artifacts(tr.run_id, "failure/traceback.txt", str(tmp_path))
    with open(saved) as f:
        text = f.read()
    assert "RuntimeError" in text and "s3cret" not in text


def test_a_plain_end_writes_no_description_and_a_lost_store_is_left_running(tmp_path):
    from mlflow.tracking import MlflowClient

    from trainers.link import tags as T

    tr, uri = _tracker(tmp_path)
    tr.log_metrics([(1, {"train/loss": 1.0})])
    tr.end()  # a test's or a tool's close: no cost, no description
    run = MlflowClient(uri).get_run(tr.run_id)
    assert run.info.status == "FINISHED" and T.NOTE not in run.data.tags
    gone, _ = _tracker(tmp_path)
    gone.lost = True  # the driver found the store gone itself: nothing more is written
    gone.end("FAILED", failure={T.FAILURE: "never written"})
    run = MlflowClient(uri).get_run(gone.run_id)
    assert run.info.status == "RUNNING" and T.FAILURE not in run.data.tags


def test_a_run_that_reached_its_end_loses_an_earlier_drivers_failure_and_gets_its_final_tags(tmp_path):
    """RunTracker.log_final_model without weights to log (no checkpoint): the failure an earlier
    driver left is cleared, the final worker count and the resizes are tagged, no model."""
    from mlflow.tracking import MlflowClient

    from trainers.link import tags as T

    tr, uri = _tracker(tmp_path)
    tr.set_tags({T.FAILURE: "an earlier driver's"})
    tr.log_metrics([(s, {"train/loss": 1.0 / s, "workers": 3.0}) for s in range(1, 4)])
    tr.flush(force=True)
    assert tr.log_final_model(None, build=lambda: None, resizes=2) == (None, None)
    tr.end()
    tags = MlflowClient(uri).get_run(tr.run_id).data.tags
    assert T.FAILURE not in tags and tags[T.FINAL_WORKERS] == "3" and tags[T.RESIZES] == "2"
