"""The metric-series compressor (orchestrator/record/series.py) alone, no MLflow: which points it keeps,
with which times, and what a resumed run's history changes."""

import pytest

from orchestrator.record.series import PIECEWISE, STEPWISE, SeriesCompressor

NOW = 5000.0  # the wall time of the call: a record without a time gets it


def _steps(points):
    return [(k, s, v) for k, s, v, _ in points]


def _dense(points):
    """Each step's value read off the straight lines between ``points`` (what MLflow draws)."""
    out = []
    for (s0, v0), (s1, v1) in zip(points, points[1:]):
        out += [(s, v0 + (v1 - v0) * (s - s0) / (s1 - s0)) for s in range(s0, s1)]
    return out + points[-1:]


def test_the_piecewise_metrics_are_what_the_tracker_compresses():
    assert {"lr", "workers", "batch/global", "samples_seen", "epoch"} <= set(PIECEWISE)
    assert "train/loss" not in PIECEWISE and STEPWISE <= set(PIECEWISE)


def test_a_constant_stretch_keeps_its_ends_and_every_other_metric_keeps_every_step():
    c = SeriesCompressor()
    lr = [0.1] * 5 + [0.2] * 3  # steps 1..8
    out = c.add([(s, {"lr": v, "train/loss": 1.0 / s}) for s, v in enumerate(lr, start=1)], NOW)
    # the stretch's ends and the jump's first step; 7..8 lie on one line with 6: held
    assert [(s, v) for k, s, v in _steps(out) if k == "lr"] == [(1, 0.1), (5, 0.1), (6, 0.2)]
    assert [s for k, s, _ in _steps(out) if k == "train/loss"] == list(range(1, 9))
    assert _steps(c.release(NOW)) == [("lr", 8, 0.2)]
    assert c.history["lr"] == [(1, 0.1), (5, 0.1), (6, 0.2), (8, 0.2)]
    assert c.release(NOW) == []  # nothing held any more


def test_a_slope_is_kept_where_it_changes_and_the_lines_give_every_step():
    c = SeriesCompressor()
    seen = [64.0 * s for s in range(1, 7)] + [384.0 + 30.0] + [414.0 + 64.0 * s for s in range(1, 5)]
    out = c.add([(s, {"samples_seen": v}) for s, v in enumerate(seen, start=1)], NOW) + c.release(NOW)
    kept = [(s, v) for _, s, v in _steps(out)]
    assert [s for s, _ in kept] == [1, 6, 7, 11]
    assert _dense(kept) == list(enumerate(seen, start=1))


def test_a_stepwise_jump_is_kept_at_once():
    """B and W: the first point of a new value is not held, so every step up to the ack reads back."""
    c = SeriesCompressor()
    assert _steps(c.add([(1, {"workers": 2.0}), (2, {"workers": 2.0})], NOW)) == [("workers", 1, 2.0)]
    assert _steps(c.add([(3, {"workers": 4.0})], NOW)) == [("workers", 2, 2.0), ("workers", 3, 4.0)]
    c.add([(4, {"workers": 4.0})], NOW)
    assert _steps(c.release(NOW)) == [("workers", 4, 4.0)]
    assert _steps(c.add([(5, {"workers": 1.0})], NOW)) == [("workers", 5, 1.0)]  # right after a release too
    # lr is piecewise but not a step function: its jump waits for the stretch to end
    c.add([(1, {"lr": 0.1}), (2, {"lr": 0.1})], NOW)
    assert _steps(c.add([(3, {"lr": 0.2})], NOW)) == [("lr", 2, 0.1)]


def test_the_epochs_tolerance_lets_a_float_slope_through():
    c = SeriesCompressor()
    epochs = [s / 3 for s in range(1, 10)]  # 1/3 is not exact in binary
    out = c.add([(s, {"epoch": e}) for s, e in enumerate(epochs, start=1)], NOW) + c.release(NOW)
    kept = [(s, v) for _, s, v in _steps(out)]
    assert [s for s, _ in kept] == [1, 9]
    assert [v for _, v in _dense(kept)] == pytest.approx(epochs, rel=1e-12)


def test_a_step_seen_before_is_kept_once():
    c = SeriesCompressor()
    c.add([(s, {"train/loss": 1.0, "samples_seen": 10.0 * s}) for s in range(1, 4)], NOW)
    again = c.add([(s, {"train/loss": 9.0, "samples_seen": 999.0}) for s in range(2, 4)], NOW)  # a replay
    assert again == [] and c.history["train/loss"] == [(1, 1.0), (2, 1.0), (3, 1.0)]
    assert _steps(c.release(NOW)) == [("samples_seen", 3, 30.0)]


def test_a_point_carries_the_time_its_step_ran_also_when_held():
    c = SeriesCompressor()
    out = c.add([(s, {"lr": 0.1, "train/loss": 1.0}, 100.0 + s) for s in range(1, 5)], NOW)
    assert [(k, s, t) for k, s, _, t in out if k == "train/loss"] == [("train/loss", s, 100.0 + s) for s in range(1, 5)]
    out = c.add([(5, {"lr": 0.2})], NOW)  # no time of its own; the held step 4 still has its time
    assert out == [("lr", 4, 0.1, 104.0)]
    assert c.release(NOW + 1) == [("lr", 5, 0.2, NOW + 1)]


def test_only_the_times_a_held_point_may_need_are_kept():
    c = SeriesCompressor()
    c.add([(s, {"lr": 0.1, "train/loss": 1.0}, 100.0 + s) for s in range(1, 11)], NOW)
    assert set(c.held_times()) == {10}  # lr's held point; every older step is written
    c.release(NOW)
    c.add([(11, {"train/loss": 1.0}, 111.0)], NOW)
    assert set(c.held_times()) == {11}  # the newest step's, for the next record's segment


def test_a_restored_history_is_not_kept_again_and_its_series_go_on():
    c = SeriesCompressor()
    c.restore({"workers": [(4, 2.0), (1, 2.0)], "train/loss": [(1, 0.5), (4, 0.5)]})
    assert c.history["workers"] == [(1, 2.0), (4, 2.0)]  # sorted
    assert c.last_step() == 4 and c.last_value("workers") == 2.0 and c.last_value("missing", -1.0) == -1.0
    out = c.add([(s, {"workers": 2.0 if s < 6 else 4.0, "train/loss": 0.5}) for s in range(3, 8)], NOW)
    # the restored segment's anchor (step 4) goes on: 5 is held, 6 jumps (kept at once)
    assert [(s, v) for k, s, v in _steps(out) if k == "workers"] == [(5, 2.0), (6, 4.0)]
    assert [s for k, s, _ in _steps(out) if k == "train/loss"] == [3, 5, 6, 7]  # 3 was not in the store
    assert c.newest_step == 7
