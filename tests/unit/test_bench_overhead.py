"""bench/overhead.py's arithmetic (no processes): which step gaps count, and slice rates and pairs.
The slicer itself, on real process trees, is tested in tests/integration/test_bench_slicer.py."""

import os

import numpy as np
import pytest

from bench.overhead import Slices, label, paired, slice_rate, step_gaps


def test_step_gaps_leave_out_epoch_ends_and_the_steps_after_them():
    # 10 samples, batch 4: epochs of 3 steps (4, 4, 2 samples); 9 steps ending at t = 1..9
    end, start, size = step_gaps([float(t) for t in range(1, 10)], n_train=10, batch=4)
    assert end.tolist() == [2.0, 5.0, 8.0] and start.tolist() == [1.0, 4.0, 7.0] and size.tolist() == [4, 4, 4]


def test_slice_rates_and_pairs():
    # a: 1000 samples/s in its slices, b: 2000 samples/s (batch 10), slices of 1 s alternating a, b, a, b
    slices = [("a", 0.0, 1.0), ("b", 1.0, 2.0), ("a", 2.0, 3.0), ("b", 3.0, 4.0)]

    def times(rate, spans):
        return [t for lo, hi in spans for t in np.arange(lo + 0.001, hi, 10 / rate)]

    a_gaps = step_gaps(times(1000, [(0, 1), (2, 3)]), n_train=10**6, batch=10)
    b_gaps = step_gaps(times(2000, [(1, 2), (3, 4)]), n_train=10**6, batch=10)
    samples, secs = slice_rate(a_gaps, 2.0, 3.0)
    assert samples / secs == pytest.approx(1000)
    assert slice_rate(a_gaps, 1.0, 2.0) is None  # a did not run then

    class Run:
        pass

    run = Run()
    run.side_shares = lambda: [("ray::MonitorActor", 0.02)]
    run.slices = slices
    run.cpu = [("a", 100, 90), ("b", 100, 100), ("a", 100, 90), ("b", 100, 100)]
    r = paired(run, a_gaps, b_gaps)
    assert r["a"] == pytest.approx(1000) and r["b"] == pytest.approx(2000)
    assert r["median"] == pytest.approx(0.5) and r["pairs"] == 2
    assert r["beside"] == pytest.approx(10 / (os.sysconf("SC_CLK_TCK") * os.cpu_count()))  # 10 ticks in 1 s
    assert r["side"] == [("ray::MonitorActor", 0.02)]


def test_the_processes_beside_the_loop_are_summed_by_what_they_are(monkeypatch):
    """Each slice of the loop under test adds the CPU ticks of every process of its tree but the
    busiest (the loop) to that process; the table sums them by label as a share of one core."""
    import bench.overhead as overhead

    run = object.__new__(Slices)  # the accounting alone: no processes started
    run.side, run.labels, run.a_running_s = {}, {}, 0.0
    names = {1: "ray::RayTrainWorker", 2: "python -m orchestrator", 3: "raylet", 4: "raylet"}
    monkeypatch.setattr(overhead, "label", names.get)
    tck = os.sysconf("SC_CLK_TCK")
    before = (0, {"a": [1, 2, 3, 4]}, {1: 0, 2: 0, 3: 0, 4: 0})
    after = (0, {"a": [1, 2, 3, 4]}, {1: 2 * tck, 2: tck // 10, 3: tck // 20, 4: tck // 20})
    run._count_side(before, after, 2.0)
    shares = dict(run.side_shares())
    assert "ray::RayTrainWorker" not in shares  # the loop itself
    assert shares["python -m orchestrator"] == pytest.approx(0.05, abs=0.01)
    assert shares["raylet"] == pytest.approx(0.05, abs=0.01)  # two raylets' ticks together


def test_a_process_is_labelled_by_its_command():
    assert label(os.getpid()).startswith("python")  # this pytest process
    assert label(2**22 + 7) == "?"  # no such process
