"""A growing batch on a real autoscaling cluster here: asking the autoscaler ahead against today's path.

The cluster is Ray's fake multi-node provider (bench/fake_cluster.py): a head without CPUs whose
autoscaler launches 1-CPU worker nodes on demand (at most 2) and removes nodes idle for 6 s.  Each
run is the quickstart (configs/quickstart.yaml) at 1 CPU per worker on a fresh cluster, long enough
to get to W = 2 whichever way (it is stopped once a group of 2 has trained a few steps):

* **today** (``scaling.request_ahead: false``): nothing asks for a resize's nodes before its group
  starts: the group starts at once on the node that is up (1 of 2: the live nodes cannot hold 2, so
  the driver does not wait for room; until 2026-11-29 it waited up to 60 s for room nothing asked
  the autoscaler for), grows by a second restart at the driver's capacity check, and each restart
  lets the old group's node go idle (removed, launched again);
* **ahead** (the default): the new group's nodes are asked for at the decision (the noise-scale
  batch is known only when it changes), kept through the handover, and the group starts once they
  are up (orchestrator/run/autoscaling.py);
* **ahead-schedule** (full form only): a batch that follows the epoch (``batch.policy: schedule``):
  the plan foresees W = 2, and the node is asked for a node's launch time before the decision.

Figures per run: the seconds from the decision to grow to the first step at W = 2, the nodes the
autoscaler launched, the handovers it took, and a node's launch time here (the autoscaler's "Queue"
to the node up, from its log).  Summary: ``today_s=``, ``ahead_s=`` (medians), ``launch_s=`` (a node's
launch, median), ``nodes_today=``, ``nodes_ahead=`` (medians) and ``ratio=`` (ahead / today).  The aim:
``ahead_s`` within a node's launch time + 10 s plus a group's start (~15 s on this machine).

    .venv/bin/python bench/autoscale.py [--repeats 2] [--kinds today,ahead] [--capacity-check-s 5]
        [--run-limit-s 420] [--stop-when-short] [--idle-wait-s 60] [--side-by-side] [--quick]

``--quick`` (CI): one repeat, today and ahead only, the driver looking for capacity that came back every 5 s
(``scaling.capacity_check_s``; the quickstart's is 30 s: today's path grows by such looks, one per restart
that came up short), each run stopped after 150 s, and ``--stop-when-short``: a run is stopped once a group
that started short of the workers its batch wants has trained (today's path: the restart at W 1 of 2),
so today's path reports the time it took so far (a lower bound) without waiting for the capacity
check's second restart; no wait at a run's end for its idle nodes to
go (``--idle-wait-s 0``: the table's last column then says whether they were gone already); and the two
runs side by side (``--side-by-side``: each on its own cluster, its driver a process of its own).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from typing import Any

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
# The fake clusters ask for Ray's token (as `ray start --head` has it); Ray reads the mode once, when imported.
os.environ["RAY_AUTH_MODE"] = "token"

from bench.common import median, parse_args, scratch_dir, table  # noqa: E402
from bench.fake_cluster import FakeAutoscalingCluster  # noqa: E402
from orchestrator.config.prepare import validated  # noqa: E402
from trainers.link import metrics as M  # noqa: E402
from trainers.link.messages import Record  # noqa: E402

RUN_LIMIT_S = 420  # a run that never gets to W = 2 is stopped (today's path took ~200 s in the issue)
IDLE_WAIT_S = 60.0  # at a run's end, for the autoscaler to remove the idle nodes
AFTER_W2_STEPS = 20  # steps a group of 2 trains before the run is stopped
_UP = re.compile(r"^(\S+ \S+),(\d{3}).*NodeLauncher\d+: Launching (\d+) nodes")
_QUEUED = re.compile(r"^(\S+ \S+),(\d{3}).*Queue (\d+) new nodes for launch")

KINDS = {
    "today": {"scaling": {"request_ahead": False}},
    "ahead": {},
    "ahead-schedule": {
        "batch": {"policy": "schedule", "schedule": [[200, 128]]},  # W 1 -> 2 at epoch 200 (~30 s in here)
    },
}


def run_config(tmp: str, kind: str, capacity_check_s: float | None = None) -> dict[str, Any]:
    with open(os.path.join(ROOT, "configs", "quickstart.yaml")) as f:
        raw = yaml.safe_load(f)
    raw["scaling"]["cpus_per_worker"] = 1
    if capacity_check_s is not None:
        raw["scaling"]["capacity_check_s"] = capacity_check_s
    raw["train"]["epochs"] = 5000  # outlasts the measurement: the run is stopped once W = 2 trained
    raw["checkpoint"]["storage_path"] = os.path.join(tmp, "ray_runs")
    raw["tracking"] = {"uri": f"sqlite:///{tmp}/mlflow.db", "experiment": "bench-autoscale"}
    for section, values in KINDS[kind].items():
        raw[section].update(values)
    return raw


def _stamp(date: str, ms: str) -> float:
    return time.mktime(time.strptime(date, "%Y-%m-%d %H:%M:%S")) + int(ms) / 1000


def launch_times(log: str) -> list[float]:
    """Each node's launch here: from the autoscaler's decision ("Queue N new nodes") to the node up
    (the launcher's "Launching N nodes", logged once the fake node's processes are up)."""
    queued, up = [], []
    for line in log.splitlines():
        if m := _QUEUED.match(line):
            queued += [_stamp(m.group(1), m.group(2))] * int(m.group(3))
        elif m := _UP.match(line):
            up += [_stamp(m.group(1), m.group(2))] * int(m.group(3))
    return [u - q for q, u in zip(queued, up)]


def short_of_workers(metrics: dict[str, float], max_local_batch: int) -> bool:
    """Whether a record comes from a group smaller than its batch wants (a grow decided, the group
    restarted with fewer workers: it accumulates what the missing workers would take)."""
    workers = metrics.get(M.WORKERS)
    batch = metrics.get(M.BATCH_GLOBAL)
    return workers is not None and batch is not None and batch > workers * max_local_batch


def measure(
    kind: str,
    capacity_check_s: float | None = None,
    limit_s: float = RUN_LIMIT_S,
    stop_when_short: bool = False,
    idle_wait_s: float = IDLE_WAIT_S,
) -> dict[str, Any]:
    """One run of ``kind`` on a fresh cluster, stopped after ``limit_s`` if it has not trained at W = 2 by
    then (``stop_when_short``: also once a group short of the workers its batch wants has trained); the
    driver is this process (joined as a user's driver joins a cluster).  ``capacity_check_s``: the run's
    ``scaling.capacity_check_s`` (None: the quickstart's); ``idle_wait_s``: how long to wait at the end for
    the autoscaler to remove the idle nodes."""
    from orchestrator.run.runner import run_training

    head = FakeAutoscalingCluster(max_nodes=2, cpus_per_node=1, idle_timeout_minutes=0.1).start()
    saved = {"RAY_ADDRESS": os.environ.get("RAY_ADDRESS")}
    os.environ["RAY_ADDRESS"] = head.address
    tmp = scratch_dir()
    box: dict[str, Any] = {"w2": None}
    t0 = time.time()

    def on_records(records: list[Record]) -> None:
        box["trained"] = time.time()  # the run trains until its last records
        for step, metrics, _t, *_ in records:
            if metrics.get(M.WORKERS, 0) >= 2 and box["w2"] is None:
                box["w2"] = step
        w2 = box["w2"]
        short = stop_when_short and any(short_of_workers(r[1], cfg.batch.max_local_batch) for r in records)
        if (w2 is not None and records[-1][0] >= w2 + AFTER_W2_STEPS) or short or time.time() - t0 > limit_s:
            box["runner"].request_stop()

    try:
        cfg = validated(run_config(tmp, kind, capacity_check_s))
        s = run_training(cfg, progress=False, on_start=lambda r: box.update(runner=r), on_records=on_records)
        ended = time.time()
        launched, alive = head.worker_nodes(wait_gone_s=idle_wait_s)  # the idle nodes removed (or still up)
        queued = [t for t, k, n in head.node_events() for _ in range(n) if k == "launched"]
        to2 = [r for r in s.resizes if r["to"] >= 2]
        reached = box["w2"] is not None and bool(to2)
        # a run stopped before W = 2 (limit_s): the time it waited, a lower bound
        first_w2 = to2[-1]["time"] + to2[-1]["latency_s"] if reached else ended
        return {
            "kind": kind,
            "reached": reached,
            "to_w2_s": first_w2 - to2[0]["decided"] if to2 else float("nan"),
            "handovers": len(s.resizes),
            # the last resize's pause: old group's teardown, new group's start (fit() to its loop), loop setup
            "parts": tuple(to2[-1].get(k, float("nan")) for k in ("teardown_s", "start_s", "setup_s"))
            if reached
            else (float("nan"),) * 3,
            "launched": launched,
            # > 0: the second node was asked for before the decision (the plan foresaw it)
            "second_node_lead_s": to2[0]["decided"] - queued[1] if to2 and len(queued) > 1 else float("nan"),
            "terminated_while_training": sum(
                1 for t, k, _ in head.node_events() if k == "terminated" and t < box.get("trained", ended)
            ),
            "idle_removed": alive == 0,
            "launch_s": launch_times(head.monitor_log()),
        }
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        head.stop()


def measure_side_by_side(kinds: list[str], a: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """One run of each of ``kinds`` at the same time, each by a process of its own (a driver joins one
    cluster: :func:`measure` in a child of this bench); its output goes to this one's stderr."""
    folder = tempfile.mkdtemp(prefix="elastic-autoscale-")
    procs = {}
    for kind in kinds:
        cmd = [sys.executable, os.path.abspath(__file__), "--child-kind", kind, "--child-out", f"{folder}/{kind}.json"]
        cmd += ["--run-limit-s", str(a.run_limit_s), "--idle-wait-s", str(a.idle_wait_s)]
        cmd += ["--capacity-check-s", str(a.capacity_check_s)] if a.capacity_check_s is not None else []
        cmd += ["--stop-when-short"] if a.stop_when_short else []
        procs[kind] = subprocess.Popen(cmd, stdout=sys.stderr)
    failed = [k for k, p in procs.items() if p.wait() != 0]
    if failed:
        sys.exit(f"bench/autoscale.py: the {', '.join(failed)} run(s) failed (their output is above, on stderr)")
    out = {}
    for kind in kinds:
        with open(f"{folder}/{kind}.json") as f:
            out[kind] = json.load(f)
        os.remove(f"{folder}/{kind}.json")
    os.rmdir(folder)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--kinds", default=",".join(KINDS), help="comma-separated, of: " + ", ".join(KINDS))
    ap.add_argument(
        "--capacity-check-s",
        type=float,
        default=None,
        help="the runs' scaling.capacity_check_s (default: the quickstart's)",
    )
    ap.add_argument(
        "--run-limit-s",
        type=float,
        default=RUN_LIMIT_S,
        help="a run not at W = 2 by then is stopped (its figure is then the time it waited, a lower bound)",
    )
    ap.add_argument(
        "--stop-when-short",
        action="store_true",
        help="stop a run once a group that started short of the workers its batch wants has trained (its "
        "figure is then the time it waited so far, a lower bound)",
    )
    ap.add_argument(
        "--idle-wait-s",
        type=float,
        default=IDLE_WAIT_S,
        help="at a run's end, how long to wait for the autoscaler to remove the idle nodes (0: no wait)",
    )
    ap.add_argument(
        "--side-by-side",
        action="store_true",
        help="the kinds of a repeat run at the same time, each on its own cluster, each driver a process of "
        "its own (their figures then share the machine)",
    )
    ap.add_argument("--child-kind", choices=tuple(KINDS), help=argparse.SUPPRESS)
    ap.add_argument("--child-out", help=argparse.SUPPRESS)
    a = parse_args(
        ap,
        quick={
            "repeats": 1,
            "kinds": "today,ahead",
            "capacity_check_s": 5.0,
            "run_limit_s": 150.0,
            "stop_when_short": True,
            "idle_wait_s": 0.0,
            "side_by_side": True,
        },
        argv=argv,
    )
    kinds = [k.strip() for k in a.kinds.split(",") if k.strip()]
    bad = [k for k in kinds if k not in KINDS]
    problems = [f"--kinds: unknown {bad}; expected {', '.join(KINDS)}"] if bad else []
    problems += ["--repeats: at least 1"] if a.repeats < 1 else []
    problems += (
        ["--capacity-check-s: must be positive"] if a.capacity_check_s is not None and a.capacity_check_s <= 0 else []
    )
    problems += ["--run-limit-s: must be positive"] if a.run_limit_s <= 0 else []
    problems += ["--idle-wait-s: must be 0 or more"] if a.idle_wait_s < 0 else []
    if problems:
        print("; ".join(problems), file=sys.stderr)
        sys.exit(2)
    os.environ.pop("ELASTIC_KEEP_RAY", None)  # each run's driver leaves its cluster when it ends
    if a.child_kind:  # one run of --side-by-side
        r = measure(a.child_kind, a.capacity_check_s, a.run_limit_s, a.stop_when_short, a.idle_wait_s)
        with open(a.child_out, "w") as f:
            json.dump(r, f)
        return
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in kinds}
    for i in range(a.repeats):  # interleaved, so drift on a shared machine hits every kind
        together = measure_side_by_side(kinds, a) if a.side_by_side else {}
        for kind in kinds:
            r = together.get(kind) or measure(kind, a.capacity_check_s, a.run_limit_s, a.stop_when_short, a.idle_wait_s)
            runs[kind].append(r)
            print(
                f"repeat {i + 1}, {kind}: decision -> first step at W=2 {r['to_w2_s']:.1f} s"
                f"{'' if r['reached'] else ' (not reached: stopped)'}, "
                f"{r['launched']} nodes launched, {r['handovers']} handovers",
                flush=True,
            )
    rows = []
    for kind, rs in runs.items():
        for i, r in enumerate(rs):
            rows.append(
                (
                    kind,
                    f"{i + 1}",
                    f"{r['to_w2_s']:.1f}" + ("" if r["reached"] else " (W=2 not reached)"),
                    " / ".join(f"{x:.1f}" for x in r["parts"]),
                    r["handovers"],
                    r["launched"],
                    f"{r['second_node_lead_s']:+.1f}",
                    r["terminated_while_training"],
                    "yes" if r["idle_removed"] else "no",
                )
            )
    print()
    print(
        table(
            rows,
            (
                "path",
                "repeat",
                "decision -> first step at W=2 (s)",
                "last restart: teardown / start / setup (s)",
                "handovers",
                "nodes launched",
                "2nd node queued before the decision (s)",
                "removed while training",
                "idle nodes removed at the end",
            ),
        )
    )
    launches = [x for rs in runs.values() for r in rs for x in r["launch_s"]]
    launch = median(launches)

    def med(kind: str, key: str) -> float:
        return median([r[key] for r in runs.get(kind, [])]) if runs.get(kind) else float("nan")

    today, ahead = med("today", "to_w2_s"), med("ahead", "to_w2_s")
    print(
        f"\nfake multi-node autoscaler, nodes of 1 CPU (at most 2), idle_timeout 0.1 min, update every 1 s; "
        f"a node's launch here (queued -> up): median {launch:.1f} s over {len(launches)}"
        + (f"; the driver's capacity check every {a.capacity_check_s:g} s" if a.capacity_check_s else "")
    )
    print(
        f"today_s={today:.1f} ahead_s={ahead:.1f} launch_s={launch:.1f} "
        f"nodes_today={med('today', 'launched'):g} nodes_ahead={med('ahead', 'launched'):g}"
    )
    print(f"ratio={ahead / today:.3f} (decision to the first step at W=2, ahead / today)")


if __name__ == "__main__":
    main()
