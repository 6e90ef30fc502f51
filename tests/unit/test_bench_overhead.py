"""bench/overhead.py's arithmetic (no processes): which step gaps count, and slice rates and pairs.
The slicer itself, on real process trees, is tested in tests/integration/test_bench_slicer.py."""

import os

import numpy as np
import pytest

from bench.overhead import paired, slice_rate, step_gaps


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
    run.slices = slices
    run.cpu = [("a", 100, 90), ("b", 100, 100), ("a", 100, 90), ("b", 100, 100)]
    r = paired(run, a_gaps, b_gaps)
    assert r["a"] == pytest.approx(1000) and r["b"] == pytest.approx(2000)
    assert r["median"] == pytest.approx(0.5) and r["pairs"] == 2
    assert r["beside"] == pytest.approx(10 / (os.sysconf("SC_CLK_TCK") * os.cpu_count()))  # 10 ticks in 1 s
