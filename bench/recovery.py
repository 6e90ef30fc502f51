"""Recovery from a lost node on a real multi-node Ray cluster here: the time from the loss to training
again against the run's cold start to its first step, and from the node's return to the full W again.

The cluster is ``ray.cluster_utils.Cluster`` (as tests/multinode): a head without CPUs (the driver,
Ray Train's controller and the run's monitor) and ``--nodes`` worker nodes of 1 CPU, with Ray's
health check shortened as the README's "On a cluster" advises (period 1 s, 3 misses).  Each repeat
runs ``python -m orchestrator train`` (W = ``--nodes``, min one less) on a digits MLP, then:

* **cold start**: the command launched to its first optimizer step;
* **resume after a lost node**: once the run has a checkpoint, a worker node is killed (its raylet and
  every process under it); the time until the group Ray Train restarts with the workers left trains
  past the step the lost group had reached (Ray noticing the loss, the restart, the checkpoint's
  restore, the steps since that checkpoint again: checkpoints every ``--checkpoint-every`` steps);
* **grow back**: a node is added; the time to a step at the full W again (the driver's look
  every ``--capacity-check-s``, the hand-over at the next push, the new group's start);
* **a node drained with a notice**: Ray drains a worker node with ``--notice-s`` seconds left (what
  the autoscaler does with a cloud's warning that it reclaims a spot node: ``ray drain-node --reason
  DRAIN_NODE_REASON_PREEMPTION``), and the node is killed at that deadline; the run leaves it first
  by a planned resize (orchestrator/run/drains.py).

For the lost node and the drained node alike, the **pause** runs from the last step trained at W
before the event to the first step at W-1 beyond every step reached before it (training stood still
that long, steps trained again included), and **redone** counts the steps trained again (the lost
group's steps since its last checkpoint; none after a notice).

Step times are the workers' own clocks, as the run's MLflow store holds them (one machine, one
clock); the run is stopped once the figures are in.  Summary lines: ``cold_start_s=``,
``resume_s=``, ``grow_s=`` (medians over the repeats), ``ratio=`` (resume / cold start; the aim
is at most 1.2) and ``lost_pause_s= drained_pause_s= lost_redone= drained_redone=``
``drain_ratio=`` (drained pause / lost pause).

    .venv/bin/python bench/recovery.py [--nodes 3] [--repeats 2] [--checkpoint-every 5]
        [--capacity-check-s 2] [--notice-s 30] [--quick]

``--quick`` (CI): one repeat on 2 worker nodes (W = 2, min 1), a 10 s notice.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.common import median, parse_args, scratch_dir, table  # noqa: E402

HEALTH = {
    "health_check_initial_delay_ms": 1000,
    "health_check_period_ms": 1000,
    "health_check_timeout_ms": 1000,
    "health_check_failure_threshold": 3,
}
WAIT_S = 600  # for each thing the bench waits on (a cold start took 262 s at a load average of 60 on 2 cores)


def run_config(tmp: str, workers: int, every: int, check_s: float) -> dict:
    """A run long enough to outlast the measurements (it is stopped once they are in)."""
    return {
        "data": {"name": "digits", "val_fraction": 0.2},
        "model": {"name": "mlp", "norm": "none"},
        "optimizer": {"name": "sgd", "lr": 0.05, "base_batch_size": 16 * workers},
        "batch": {"size": 16 * workers, "max_local_batch": 16},
        "scaling": {
            "min_workers": workers - 1,
            "max_workers": workers,
            "cpus_per_worker": 1,
            "max_failures": 3,
            "capacity_check_s": check_s,
        },
        "train": {"epochs": 10000, "log_every": 5, "sample_log_dir": f"{tmp}/samples"},
        "checkpoint": {"every_steps": every, "storage_path": f"{tmp}/ray_runs"},
        "tracking": {"uri": f"sqlite:///{tmp}/mlflow.db"},
    }


def steps(tmp: str, key: str) -> list[tuple[int, float, float]]:
    """``(step, value, time)`` of a metric as the run's MLflow store holds it now (time: the step's own)."""
    try:
        with sqlite3.connect(f"{tmp}/mlflow.db") as db:
            rows = db.execute("select step, value, timestamp from metrics where key = ? order by step", (key,))
            return [(int(s), float(v), t / 1000.0) for s, v, t in rows]
    except sqlite3.Error:  # not created yet
        return []


def wait(p: subprocess.Popen, what: str, ready):
    """Poll ``ready()`` until it gives something; fail with the run's output if it ends first."""
    deadline = time.time() + WAIT_S
    while True:
        got = ready()
        if got:
            return got
        if p.poll() is not None or time.time() > deadline:
            how = "the run ended" if p.poll() is not None else f"not in {WAIT_S} s"
            p.kill()
            sys.exit(f"bench/recovery.py: {what}: not seen ({how}; its output: driver.txt in the scratch folder)")
        time.sleep(0.2)


def pause(tmp: str, workers: int, event: float, reached: int) -> tuple[float, int] | None:
    """Once a step beyond ``reached`` (the last step logged before ``event``) was made at W=``workers``:
    the seconds from the last step at the old W before ``event`` to it, and the steps trained again
    (the new group's first step is the restored checkpoint's step + 1, read from its sample log)."""
    logged = steps(tmp, "workers")
    first = next(((s, t) for s, w, t in logged if int(w) == workers and s > reached), None)
    if first is None:
        return None
    last = max((t for s, w, t in logged if t < first[1] and int(w) != workers), default=event)
    restored = min(
        (
            json.loads(line)["step"] - 1
            for f in glob.glob(f"{tmp}/samples/*-rank0-*.jsonl")
            for line in open(f)
            if json.loads(line)["attempt"] > event
        ),
        default=reached,
    )
    return first[1] - last, max(0, reached - restored)


def drain(cluster, node_id: str, notice_s: int) -> None:
    """Ray's drain of a node with ``notice_s`` seconds left (a spot node's notice), as a person gives it."""
    ray_cli = os.path.join(os.path.dirname(sys.executable), "ray")
    subprocess.run(
        [
            ray_cli,
            "drain-node",
            "--address",
            cluster.address,
            "--node-id",
            node_id,
            "--reason",
            "DRAIN_NODE_REASON_PREEMPTION",
            "--reason-message",
            "spot node reclaimed (bench)",
            "--deadline-remaining-seconds",
            str(notice_s),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )


def first_at(tmp: str, workers: int, after: float) -> float | None:
    """The time of the first step after ``after`` made by a group of ``workers``."""
    return next((t for _, w, t in steps(tmp, "workers") if int(w) == workers and t > after), None)


def measure(cluster, nodes: list, tmp: str, a: argparse.Namespace, again: bool = True) -> tuple:
    """One run: its cold start, its resume after a lost node, its return to the full W (seconds),
    the lost node's pause and steps redone, and the drained node's pause and steps redone.  ``again``:
    a node is added back at the end for the next repeat."""
    workers = a.nodes
    path = os.path.join(tmp, "cfg.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(run_config(tmp, workers, a.checkpoint_every, a.capacity_check_s), f)
    env = dict(os.environ, RAY_ADDRESS=cluster.address, PYTHONPATH=ROOT)
    env.pop("ELASTIC_KEEP_RAY", None)
    log = open(os.path.join(tmp, "driver.txt"), "w")
    launched = time.time()
    p = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "train", path, "--no-progress"],
        cwd=tmp,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        first = wait(p, "the first step", lambda: next((t for s, _, t in steps(tmp, "train/loss") if s == 1), None))
        wait(
            p,
            "a checkpoint",
            lambda: any(
                f.startswith("checkpoint_step")
                for d in os.listdir(f"{tmp}/ray_runs")
                for f in os.listdir(f"{tmp}/ray_runs/{d}")
            ),
        )
        reached = max(s for s, _, _ in steps(tmp, "workers"))
        lost = time.time()
        cluster.remove_node(nodes.pop(), allow_graceful=False)  # its raylet and every process under it
        resumed = wait(p, f"a step at W={workers - 1}", lambda: first_at(tmp, workers - 1, lost))
        lost_pause = wait(p, f"a new step at W={workers - 1}", lambda: pause(tmp, workers - 1, lost, reached))
        back = time.time()
        nodes.append(cluster.add_node(num_cpus=1))
        grown = wait(p, f"a step at W={workers} again", lambda: first_at(tmp, workers, back))
        time.sleep(2)  # a push or two at W, so the notice finds the group training
        victim = nodes.pop(0)
        reached = max(s for s, _, _ in steps(tmp, "workers"))
        noticed = time.time()
        drain(cluster, victim.node_id, a.notice_s)
        drained = wait(
            p, f"a new step at W={workers - 1} after the notice", lambda: pause(tmp, workers - 1, noticed, reached)
        )
        if time.time() > noticed + a.notice_s:
            print(f"warning: the run left the drained node only after its {a.notice_s} s deadline", file=sys.stderr)
        time.sleep(max(0.0, noticed + a.notice_s - time.time()))
        cluster.remove_node(victim, allow_graceful=False)  # the cloud takes the node at the deadline
        if again:
            nodes.append(cluster.add_node(num_cpus=1))  # the next repeat's W
        return (first - launched, resumed - lost, grown - back, *lost_pause, *drained)
    finally:
        p.send_signal(signal.SIGTERM)  # the run stops at its next push (KILLED in MLflow)
        try:
            p.wait(60)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        log.close()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=3, help="worker nodes of 1 CPU (W of the run; min W-1)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--checkpoint-every", type=int, default=5, help="checkpoint.every_steps")
    ap.add_argument("--capacity-check-s", type=float, default=2.0, help="scaling.capacity_check_s")
    ap.add_argument("--notice-s", type=int, default=30, help="the drained node's deadline (a spot node's notice)")
    a = parse_args(ap, quick={"repeats": 1, "nodes": 2, "notice_s": 10}, argv=argv)
    for name, low in (("nodes", 2), ("repeats", 1), ("checkpoint_every", 1), ("notice_s", 5)):
        if getattr(a, name) < low:
            print(
                f"--{name.replace('_', '-')}: {getattr(a, name)} is below {low}; give at least {low}", file=sys.stderr
            )
            sys.exit(2)
    if a.capacity_check_s <= 0:
        print(f"--capacity-check-s: {a.capacity_check_s} must be positive", file=sys.stderr)
        sys.exit(2)

    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "_system_config": HEALTH})
    rows = []
    try:
        nodes = [cluster.add_node(num_cpus=1) for _ in range(a.nodes)]
        cluster.wait_for_nodes()
        for i in range(a.repeats):
            rows.append(measure(cluster, nodes, scratch_dir(), a, again=i + 1 < a.repeats))
            cold, resume, grow, lp, lr, dp, dr = rows[-1]
            print(
                f"repeat {i + 1}: cold start {cold:.1f} s, resume after a lost node {resume:.1f} s, "
                f"W={a.nodes} again {grow:.1f} s after the node came back; pause after a lost node {lp:.1f} s "
                f"({lr} steps redone), after a notice {dp:.1f} s ({dr} redone)",
                flush=True,
            )
    finally:
        cluster.shutdown()  # its own processes only (never `ray stop`)
    cold, resume, grow, lost_pause, lost_redone, drained_pause, drained_redone = (
        median([r[k] for r in rows]) for k in range(7)
    )
    print()
    print(
        table(
            [
                (f"{i + 1}", f"{c:.1f}", f"{r:.1f}", f"{g:.1f}", f"{r / c:.2f}", f"{lp:.1f}", lr, f"{dp:.1f}", dr)
                for i, (c, r, g, lp, lr, dp, dr) in enumerate(rows)
            ],
            (
                "repeat",
                "cold start to step 1 (s)",
                "lost node to a step at W-1 (s)",
                "node back to a step at W (s)",
                "resume / cold",
                "lost: pause (s)",
                "redone",
                "drained: pause (s)",
                "redone",
            ),
        )
    )
    print(
        f"\nhealth check {HEALTH['health_check_period_ms']} ms x {HEALTH['health_check_failure_threshold']}; "
        f"W={a.nodes} on 1-CPU nodes; checkpoints every {a.checkpoint_every} steps; "
        f"scaling.capacity_check_s {a.capacity_check_s:g}"
    )
    print(f"cold_start_s={cold:.2f} resume_s={resume:.2f} grow_s={grow:.2f}")
    print(f"ratio={resume / cold:.2f} (resume after a lost node / cold start to the first step; aim <= 1.2)")
    print(
        f"lost_pause_s={lost_pause:.2f} drained_pause_s={drained_pause:.2f} lost_redone={lost_redone:g} "
        f"drained_redone={drained_redone:g} drain_ratio={drained_pause / lost_pause:.2f} (a node drained with a "
        f"{a.notice_s} s notice / a node lost without one: the pause from the last step at W to a new step at W-1)"
    )


if __name__ == "__main__":
    main()
