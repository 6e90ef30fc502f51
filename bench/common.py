"""Shared bits of the benchmarks: throw-away folders (an MLflow store, Ray Train storage), a
config, figures as a table, the ``--quick`` form every benchmark accepts."""

from __future__ import annotations

import argparse
import atexit
import os
import shutil
import statistics
import sys
import tempfile
from typing import Any

from orchestrator.config.prepare import validated
from orchestrator.config.schema import RootConfig


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
