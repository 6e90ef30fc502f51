"""Shared bits of the benchmarks: throw-away folders (an MLflow store, Ray Train storage), a
config, figures as a table, the ``--quick`` form every benchmark accepts."""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import statistics
import sys
import tempfile
from typing import Any

from orchestrator.config.prepare import validated
from orchestrator.config.schema import RootConfig

PACE_STEPS = 8  # a quick form's sliced rows: each loop runs alone this many steps first (its pace: :func:`pace`)


def scratch_dir(prefix: str = "elastic-bench-") -> str:
    """A temporary folder removed when the benchmark exits (kept, and named on stderr, with
    ``ELASTIC_BENCH_KEEP=1``)."""
    path = tempfile.mkdtemp(prefix=prefix)
    if os.environ.get("ELASTIC_BENCH_KEEP"):
        print(f"keeping {path}", file=sys.stderr)
    else:
        atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def temp_config(**sections) -> tuple[RootConfig, str]:
    tmp = scratch_dir()
    raw = {
        "checkpoint": {"storage_path": os.path.join(tmp, "ray_runs")},
        "tracking": {"uri": f"sqlite:///{tmp}/mlflow.db", "experiment": "bench"},
    }
    for name, values in sections.items():
        raw.setdefault(name, {}).update(values)
    return validated(raw), tmp


def table(rows: list[tuple], header: tuple) -> str:
    cells = [tuple(str(c) for c in header)] + [tuple(str(c) for c in r) for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def parse_args(ap: argparse.ArgumentParser, quick: dict[str, Any], argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the benchmark's arguments, adding ``--quick``: the same code path on a small problem
    (seconds to a minute on a 2-core machine), for CI (tests/integration/test_benches.py);
    ``argv``: the arguments (default: the command line's).

    ``quick`` maps argument names (``dest``) to the values ``--quick`` gives them; an argument
    given on the command line keeps its value either way.  The full form is the one whose
    figures are worth quoting; the quick form's only show the benchmark still runs."""
    unknown = sorted(set(quick) - {a.dest for a in ap._actions})
    if unknown:
        raise ValueError(f"quick: no argument named {unknown}")
    shown = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in quick.items())
    ap.add_argument(
        "--quick", action="store_true", help=f"short form for CI, the same code path on a small problem: {shown}"
    )
    args = ap.parse_args(argv)
    if args.quick:
        ap.set_defaults(**quick)
        args = ap.parse_args(argv)
    return args


# -- a quick form's time-sliced rows (bench/overhead.py Slices.run): each loop's pace after its start


def started_file(out: str) -> str:
    """The file a child loop writing its step times to ``out`` writes its pace to after its first
    :data:`PACE_STEPS` steps (a quick form's rows: :meth:`bench.overhead.Slices.run`)."""
    return out + ".started"


def pace(times: list[float]) -> float:
    """Seconds a step: the median gap between the step end times ``times`` (the first step's warm-up
    is not a gap; one slow step, a push or a busy moment of the machine, does not set the pace)."""
    return statistics.median(b - a for a, b in zip(times, times[1:]))


def write_pace(path: str, times: list[float]) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(pace(times), f)
    os.replace(path + ".tmp", path)  # whole or not there


def read_pace(path: str) -> float | None:
    """The pace a child loop wrote to ``path`` (:func:`write_pace`), None before it has."""
    try:
        with open(path) as f:
            return float(json.load(f))
    except (OSError, ValueError):
        return None


def slices_text(a: argparse.Namespace) -> str:
    """How long the slices are, for a bench's header line (``--pairs``: from the loops' pace)."""
    return "slices from the loops' pace" if a.pairs else f"{a.slice:g} s slices"
