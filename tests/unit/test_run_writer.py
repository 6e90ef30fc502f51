"""The run's writer (orchestrator/record/run_writer.py) against a client that records its calls: rows in
batches MLflow takes, the ack only for what was written, and an outage that keeps everything."""

import pytest

import orchestrator.record.run_writer as run_writer
from orchestrator.record.run_writer import MAX_BATCH, RunWriter


class Client:
    """MLflow's client as the writer calls it; every call fails like an unreachable server while ``down``."""

    def __init__(self) -> None:
        self.batches: list[list] = []
        self.tags: dict[str, str] = {}
        self.closed: str | None = None
        self.down = False
        self.refuse = False

    def _call(self) -> None:
        if self.refuse:
            raise ValueError("INVALID_PARAMETER_VALUE")  # the store refused the request itself
        if self.down:
            from tests.unit.test_tracking import _server_down

            raise _server_down()

    def log_batch(self, run_id, metrics):
        self._call()
        self.batches.append([(m.key, m.step, m.value, m.timestamp) for m in metrics])

    def set_tag(self, run_id, key, value):
        self._call()
        self.tags[key] = value

    def set_terminated(self, run_id, status):
        self._call()
        self.closed = status


def _writer(monkeypatch, timeout_s=300.0):
    monkeypatch.setattr(run_writer, "RETRY_S", 0.0)
    w = RunWriter(Client(), "run", "http://user:secret@tracking:5000", timeout_s)
    said: list[str] = []
    w.warn = said.append
    return w, said


def test_rows_go_in_batches_mlflow_takes_and_carry_their_time(monkeypatch):
    w, _ = _writer(monkeypatch)
    n = 2 * MAX_BATCH + 5
    w.cover([(s, {"train/loss": 1.0}) for s in range(1, n + 1)])
    w.add_points([("train/loss", s, 1.0, 100.0 + s / 1000) for s in range(1, n + 1)])
    assert w.client.batches == [] and w.written_upto == -1  # buffered until a flush
    w.flush()
    assert [len(b) for b in w.client.batches] == [MAX_BATCH, MAX_BATCH, 5]
    assert w.client.batches[0][0] == ("train/loss", 1, 1.0, 100001)  # ms
    assert w.written_upto == n and w.unrecorded() == (0, 0, None)


def test_a_flush_is_due_every_flush_s(monkeypatch):
    w, _ = _writer(monkeypatch)
    monkeypatch.setattr(run_writer, "FLUSH_S", 3600.0)
    w.flush()
    assert not w.due()
    monkeypatch.setattr(run_writer, "FLUSH_S", 0.0)
    assert w.due()


def test_an_outage_keeps_rows_and_tags_and_the_ack_until_the_store_answers(monkeypatch):
    w, said = _writer(monkeypatch)
    back = []
    w.on_back = lambda: back.append(True)
    w.cover([(1, {"a": 1.0})])
    w.add_points([("a", 1, 1.0, 1.0)])
    w.flush()
    w.client.down = True
    w.cover([(2, {"a": 2.0, "b": 3.0}), (3, {"a": 4.0})])
    w.add_points([("a", 2, 2.0, 2.0), ("b", 2, 3.0, 2.0), ("a", 3, 4.0, 3.0)])
    w.flush()
    w.set_tags({"elastic.failure": "http://user:secret@tracking:5000 said no", "elastic.restarts": 1})
    assert w.outage is not None and w.written_upto == 1 and w.unrecorded() == (2, 3, 2)
    assert len(said) == 1 and "secret" not in said[0] and "does not answer" in said[0]
    assert w.outage_expired() is None and back == []  # tried again (RETRY_S is 0): still away
    w.client.down = False
    assert w.outage_expired() is None
    assert w.outage is None and w.written_upto == 3 and back == [True] and "answers again" in said[-1]
    assert [r[:3] for r in w.client.batches[-1]] == [("a", 2, 2.0), ("b", 2, 3.0), ("a", 3, 4.0)]
    assert w.client.tags == {"elastic.failure": "http://user:***@tracking:5000 said no", "elastic.restarts": "1"}


def test_a_store_away_past_the_timeout_is_given_up_and_not_called_again(monkeypatch):
    w, said = _writer(monkeypatch, timeout_s=0.0)
    w.client.down = True
    w.cover([(1, {"a": 1.0})])
    w.add_points([("a", 1, 1.0, 1.0)])
    w.flush()
    lost = w.outage_expired()
    assert isinstance(lost, run_writer.TrackingLost) and "did not answer for 0 s" in str(lost)
    assert w.lost and w.outage_expired() is None and w.await_store() is None
    w.client.down = False
    w.set_tags({"x": 1})
    w.flush(force=True)
    assert w.client.tags == {} and w.client.batches == []  # nothing more is tried
    line = w.lost_message(lost, 7, "/ckpt", "resume it")
    assert "1 step records (1 metric values) from step 1 on were not recorded" in line and line.endswith("resume it")


def test_a_refused_request_raises_at_once(monkeypatch):
    w, said = _writer(monkeypatch)
    w.client.refuse = True
    w.add_points([("a", 1, 1.0, 1.0)])
    with pytest.raises(ValueError):
        w.flush()
    with pytest.raises(ValueError):
        w.set_tags({"x": 1})
    assert w.outage is None and said == []


def test_closing_a_run_the_store_does_not_answer_for_is_a_warning(monkeypatch):
    w, said = _writer(monkeypatch)
    w.close("FINISHED")
    assert w.client.closed == "FINISHED"
    w.client.down = True
    w.close("FAILED")
    assert w.client.closed == "FINISHED" and "was not closed FAILED there" in said[-1] and "secret" not in said[-1]
