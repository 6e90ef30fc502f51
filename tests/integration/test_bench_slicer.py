"""bench/overhead.py's time slicing (no Ray): the two process trees never run at the same time,
and a slice's rate counts only the steps that ran wholly inside it."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from bench.overhead import Slices, orchestrator_cmd

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# A "loop" whose steps are 2 ms sleeps: it records when each step ended, in a child process of its
# own (as the bench's loops do); with an argument it runs that many steps, else until SIGTERM.
LOOP = """
import json, signal, sys, time
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
times, steps = [], int(sys.argv[2])
while not stop and (steps == 0 or len(times) < steps):
    time.sleep(0.002)
    times.append(time.time())
json.dump(times, open(sys.argv[1], "w"))
"""


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="the slicer needs Linux (/proc, SIGSTOP)")
def test_the_two_loops_never_run_together(tmp_path):
    a_out, b_out = str(tmp_path / "a.json"), str(tmp_path / "b.json")
    # a runs in a child of a shell: the slicer must stop the whole tree, not only the top process
    a = ["/bin/sh", "-c", f"\"{sys.executable}\" -c '{LOOP}' {a_out} 400; true"]
    run = Slices(a, [sys.executable, "-c", LOOP, b_out, "0"], 0.3, str(tmp_path / "log")).run()
    a_t, b_t = np.array(json.load(open(a_out))), np.array(json.load(open(b_out)))
    assert len(a_t) == 400 and len(b_t) > 50
    assert [w for w, _, _ in run.slices[:4]] == ["a", "b", "a", "b"]
    for who, lo, hi in run.slices:
        other = b_t if who == "a" else a_t
        # a step of the stopped loop may end just after the switch (the signal lands mid-sleep)
        assert ((other > lo + 0.05) & (other < hi - 0.01)).sum() == 0, (who, lo, hi)
    assert run.ran_for(run.slices[-1][2]) == pytest.approx(sum(hi - lo for w, lo, hi in run.slices if w == "a"))
    (_, lo1, hi1), (_, _, hi2) = run.slices[:2]
    assert run.ran_for(hi2) == pytest.approx(hi1 - lo1)  # b's slice does not count as a's time
    assert 0 < run.ran_for(a_t[0]) < a_t[0] - lo1 or a_t[0] < hi1


def test_set_overrides_reach_the_orchestrator_row(tmp_path):
    """``--set`` is passed to the ``train`` CLI (a bad key there stops it before Ray starts)."""
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("data: {name: digits}\n")
    cmd = orchestrator_cmd(str(cfg), ["train.epochs=1", "scaling.no_such_key=1"])
    assert cmd[-4:] == ["--set", "train.epochs=1", "--set", "scaling.no_such_key=1"]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 2 and "scaling.no_such_key" in out.stderr, out.stderr


def test_a_bad_set_stops_the_bench_before_any_loop_runs():
    out = subprocess.run(
        [sys.executable, "bench/overhead.py", "--rows", "plain", "--set", "scaling.no_such_key=1"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip().splitlines()[-1].startswith("error: --set: ") and "scaling.no_such_key" in out.stderr
    assert "slices" not in out.stderr  # no row started
