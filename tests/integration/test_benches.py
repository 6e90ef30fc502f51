"""Every benchmark in bench/ runs in its short form (``--quick``), so a change that breaks a
benchmark fails CI instead of the next person who measures with it.

One test per ``bench/*.py`` (found at collection time: a new benchmark is covered without
editing this file; ``common.py``, ``fake_cluster.py``, ``gpu_checks.py`` and ``__init__.py`` are not benches).
Each runs as a subprocess
that starts its own local Ray, exits 0, and prints its summary line(s) ``key=<number>`` with a
finite number.  The figures of a quick run are not checked against any aim: on a small
problem and a shared machine they only show that the benchmark still measures something.

They are marked ``bench`` and left out of ``make test`` (13 minutes quiet on a 2-core machine before
the time-sliced quick forms stopped slicing after two pairs (``--pairs 2``), 11.5 nearly quiet after it:
docs/benchmarks.md; one at a time); ``make bench-check`` runs them, and ``.ci/run`` runs both.
"""

from __future__ import annotations

import math
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
# gpu_checks runs the others (gpu.py, whose quick form is here, the train CLI, the GPU tests) in one call on a
# lent GPU machine; its --quick re-runs all of it on CPU (~6 min) and is left to whoever changes it.
HELPERS = {"__init__", "common", "fake_cluster", "gpu_checks"}
BENCHES = sorted(p.stem for p in BENCH.glob("*.py") if p.stem not in HELPERS)

# bench -> the summary keys it prints (a bench not listed here must end with at least one).
SUMMARY = {
    "adaptive": ("steps_ratio", "samples_ratio"),
    "autoscale": ("today_s", "ahead_s", "launch_s", "ratio"),
    "byo": ("map_ratio", "lm_ratio", "lm_plain_ratio"),
    "checkpoint": ("save_ratio", "restore_ratio"),
    "cpu": ("beside_worker",),
    "gpu": ("plain_samples_per_s", "ratio_ray", "ratio"),
    "group_start": ("first_step_ratio", "fit_s"),
    "large_batch": ("runs", "wall_s"),
    "overhead": ("ratio",),
    "recovery": ("cold_start_s", "resume_s", "grow_s", "ratio", "lost_pause_s", "drained_pause_s", "drain_ratio"),
    "resize": ("ratio", "overlap_pause_s", "restart_ratio"),
    "scale": ("cold_start_s", "projected_speedup_64", "strong_speedup_64", "recovery_s_64"),
    "search": ("steps_ratio", "gap_points"),
    "time_to_target": ("steps_ratio", "tokens_ratio", "goodput_wall_ratio", "cost_ratio"),
}
# At least twice each quick form's time here beside a `make test` (2026-11-28): autoscale 240 s before its cuts
# (two fake clusters; 127-162 s under load since they run side by side), byo 330 (four local Rays beside
# time-sliced loops; 100-115 s since they slice two pairs a row, 442 s at load 20), overhead 135, recovery 115
# (a 3-node cluster), the rest under 170 s (quiet: about half).
TIMEOUT_S = {
    "autoscale": 660,
    "checkpoint": 120,
    "byo": 600,
    "recovery": 420,
}
DEFAULT_TIMEOUT_S = 300
# A bench whose quick form is known to fail, with what is missing (kept visible as a skip, not dropped).
BROKEN: dict[str, str] = {}  # bench name -> why its quick form cannot run now (skipped with that reason)
PAIR = re.compile(r"(?<![\w.])([A-Za-z_]\w*)=(\S+)")  # key=value, the key not part of a longer name


def summary_values(stdout: str) -> dict[str, str]:
    """Every ``key=value`` printed on stdout, the last one of each key winning."""
    out: dict[str, str] = {}
    for line in stdout.splitlines():
        for key, value in PAIR.findall(line):
            out[key] = value.rstrip(",;")
    return out


def last_line_keys(stdout: str) -> list[str]:
    lines = [ln for ln in stdout.splitlines() if ln.strip()]
    return [k for k, _ in PAIR.findall(lines[-1])] if lines else []


def finite(value: str) -> float | None:
    try:
        x = float(value)
    except ValueError:
        return None
    return x if math.isfinite(x) else None


def test_summary_parsing():
    out = "table\nrestart (x) ratio=1.06\nsteps_ratio=0.500 gap_points=-0.25\nratio=nan\n"
    values = summary_values(out)
    assert values == {"ratio": "nan", "steps_ratio": "0.500", "gap_points": "-0.25"}
    assert finite(values["gap_points"]) == -0.25 and finite(values["ratio"]) is None
    assert last_line_keys(out) == ["ratio"]
    assert summary_values("restart_ratio=2.0") == {"restart_ratio": "2.0"}  # not "ratio"
    assert summary_values("lr=0.3 and x.ratio=5") == {"lr": "0.3"}


def test_every_bench_is_found():
    assert {
        "overhead",
        "resize",
        "adaptive",
        "search",
        "checkpoint",
        "byo",
        "large_batch",
        "gpu",
        "cpu",
        "scale",
        "time_to_target",
    } <= set(BENCHES)
    assert set(SUMMARY) <= set(BENCHES), f"SUMMARY names a bench that is gone: {set(SUMMARY) - set(BENCHES)}"


def run_bench(cmd: list[str], env: dict[str, str], timeout_s: float) -> tuple[int | None, str, str]:
    """(exit status or None when it ran over ``timeout_s``, stdout, stderr).  A bench that runs
    over gets SIGINT (it shuts its Ray down), then its whole process group SIGKILL."""
    p = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        out, err = p.communicate(timeout=timeout_s)
        return p.returncode, out, err
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGINT)
        try:
            out, err = p.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, err = p.communicate()
        return None, out, err
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)  # anything of its group still there (Ray's processes)
        except ProcessLookupError:
            pass


@pytest.mark.bench
@pytest.mark.parametrize(
    "name", [pytest.param(b, marks=pytest.mark.timeout(TIMEOUT_S.get(b, DEFAULT_TIMEOUT_S) + 60)) for b in BENCHES]
)
def test_bench_runs_quick(name: str):
    if name in BROKEN:
        pytest.skip(BROKEN[name])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env.pop("RAY_ADDRESS", None)  # its own local Ray, never a cluster this shell may point at
    env.pop("ELASTIC_BENCH_KEEP", None)  # its scratch folders are removed at its exit
    limit = TIMEOUT_S.get(name, DEFAULT_TIMEOUT_S)
    rc, out, err = run_bench([sys.executable, str(BENCH / f"{name}.py"), "--quick"], env, limit)
    keep = os.environ.get("ELASTIC_BENCH_LOG_DIR")  # where each bench's stdout is kept (its table, figures)
    if keep:
        os.makedirs(keep, exist_ok=True)
        Path(keep, f"{name}.txt").write_text(out)
    where = f"bench/{name}.py --quick (exit {rc})\nstdout:\n{out[-3000:]}\nstderr:\n{err[-3000:]}"
    assert rc is not None, f"ran over {limit} s: {where}"
    assert rc == 0, where
    values = summary_values(out)
    expected = SUMMARY.get(name) or last_line_keys(out)
    assert expected, f"no summary line (key=<number>) at the end of stdout: {where}"
    for key in expected:
        assert key in values, f"summary {key}=... not printed: {where}"
        assert finite(values[key]) is not None, f"{key}={values[key]} is not a finite number: {where}"
