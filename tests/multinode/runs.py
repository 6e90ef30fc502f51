"""What the multi-node tests share: a run of the orchestrator's CLI against the tier's cluster, and
what the test reads of it while it trains (worker counts logged, actors' nodes)."""

from __future__ import annotations

import contextlib
import glob
import os
import subprocess
import sys
import time

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# A braked run (below) trains slowly until the test's events have happened, then its remaining steps
# at full speed: enough steps that a braked run cannot finish before its events, no more (each step
# past them is time a test spends on nothing it proves).
EPOCHS = 10
STEPS = EPOCHS * 30  # ceil(1438 / 48)


def config(tmp, sleep_s: float = 0.0, brake: bool = False, **scaling) -> dict:
    """W=3 (min 2) of 1 CPU; every training micro-batch takes at least ``sleep_s`` (the math is the
    same at any ``sleep_s``: a reference run takes none); with ``brake``, only until the test calls
    :func:`lift_brake` (the run then trains its remaining steps at full speed)."""
    from tests.helpers import migrated_store

    params: dict = {"sleep_s": sleep_s}
    if brake:
        os.makedirs(tmp, exist_ok=True)
        params["brake"] = brake_file(tmp)
        open(params["brake"], "w").close()
    return {
        "data": {"name": "digits", "val_fraction": 0.2},
        "model": {"factory": "tests.byo_workloads:slow_mlp", "params": params},
        "optimizer": {"name": "sgd", "lr": 0.05, "base_batch_size": 48},
        "batch": {"size": 48, "max_local_batch": 16},
        "scaling": {
            "min_workers": 2,
            "max_workers": 3,
            "cpus_per_worker": 1,
            "max_failures": 3,
            "capacity_check_s": 2,  # a node that came back is used within 2 s (a look is one call to the monitor)
            **scaling,
        },
        "train": {"epochs": EPOCHS, "log_every": 5},
        "checkpoint": {"every_steps": 10, "storage_path": f"{tmp}/ray_runs"},
        # a copy of a store MLflow migrated once: a fresh one costs the driver ~1-3 s of migrations
        "tracking": {"uri": migrated_store(f"sqlite:///{os.path.abspath(tmp)}/mlflow.db")},
    }


def brake_file(tmp) -> str:
    """The file whose presence slows the run of ``tmp`` (every node of the tier is on this machine)."""
    return os.path.join(str(tmp), "brake")


def lift_brake(tmp) -> None:
    """The event the test waited for has happened: the run of ``tmp`` trains on without sleeping."""
    with contextlib.suppress(FileNotFoundError):
        os.remove(brake_file(tmp))


def worker_nodes(c, count: int, cpus: int) -> None:
    """Shape the tier's cluster ``c`` (shared by its tests) to ``count`` live worker nodes of ``cpus``
    CPUs each: nodes of another size are removed, missing ones added."""
    for node in [n for n in c.worker_nodes if n._ray_params.num_cpus != cpus]:  # the CPUs it was started with
        c.remove_node(node)
    while len(c.worker_nodes) > count:
        c.remove_node(next(iter(c.worker_nodes)))
    while len(c.worker_nodes) < count:
        c.add_node(num_cpus=cpus)
    c.wait_for_nodes()


def driver(c, tmp, cfg) -> subprocess.Popen:
    os.makedirs(tmp, exist_ok=True)
    path = os.path.join(tmp, "cfg.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(cfg, f)
    env = dict(os.environ, RAY_ADDRESS=c.address, PYTHONPATH=ROOT)
    env.pop("ELASTIC_KEEP_RAY", None)
    return subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "train", path, "--no-progress"],
        cwd=tmp,
        env=env,
        stdout=open(os.path.join(tmp, "out.txt"), "w"),
        stderr=open(os.path.join(tmp, "err.txt"), "w"),
        text=True,
    )


def resume(c, tmp, run_id: str) -> tuple[int, str]:
    """``orchestrator resume RUN`` of the run tracked in ``tmp``'s store, as a driver on ``c`` (another
    process, as after a lost driver); its exit status and output."""
    env = dict(os.environ, RAY_ADDRESS=c.address, PYTHONPATH=ROOT)
    env.pop("ELASTIC_KEEP_RAY", None)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestrator",
            "resume",
            run_id,
            "--tracking-uri",
            f"sqlite:///{tmp}/mlflow.db",
            "--no-progress",
        ],
        cwd=tmp,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return out.returncode, out.stdout + out.stderr


def finish(p: subprocess.Popen, tmp, timeout: float = 600) -> tuple[int, str]:
    p.wait(timeout)
    with open(os.path.join(tmp, "out.txt")) as f, open(os.path.join(tmp, "err.txt")) as g:
        return p.returncode, f.read() + g.read()


def workers_logged(tmp) -> set[int]:
    """The worker counts the run has logged so far (its MLflow store, read while it trains)."""
    import sqlite3

    try:
        with sqlite3.connect(f"{tmp}/mlflow.db") as db:
            return {int(v) for (v,) in db.execute("select value from metrics where key = 'workers'")}
    except sqlite3.Error:
        return set()


def run_id(tmp) -> str:
    folder = glob.glob(f"{tmp}/ray_runs/elastic-*")[0]
    return os.path.basename(folder)[len("elastic-") :].split("-r")[0]


class _Probe:
    """The process that answers questions about one cluster (tests/multinode/probe.py), started at
    the first question and kept for the next ones; a new one if it died."""

    def __init__(self, address: str) -> None:
        env = dict(os.environ, RAY_ADDRESS=address, PYTHONPATH=ROOT)  # joined as the orchestrator joins it
        env.pop("ELASTIC_KEEP_RAY", None)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.multinode.probe"],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert self._read() == "ready"

    def _read(self, timeout: float = 120):
        import json
        import select

        from tests.multinode.probe import PREFIX

        deadline = time.time() + timeout
        while True:
            left = deadline - time.time()
            ready = left > 0 and select.select([self.proc.stdout], [], [], left)[0]
            assert ready, f"the probe: no answer in {timeout} s"
            line = self.proc.stdout.readline()
            assert line, f"the probe ended (status {self.proc.poll()})"
            if line.startswith(PREFIX):  # lines Ray prints as it joins are not answers
                return json.loads(line[len(PREFIX) :])

    def ask(self, question: str):
        self.proc.stdin.write(question + "\n")
        self.proc.stdin.flush()
        out = self._read()
        assert "error" not in out, f"the probe, asked {question!r}: {out['error']}"
        return out["answer"]

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


_PROBES: dict[str, _Probe] = {}


def ask(c, question: str):
    """``question``'s answer about cluster ``c`` (tests/multinode/probe.py), from a process of its
    own joined to it (this test process may already hold another Ray: the integration tier's shared one)."""
    probe = _PROBES.get(c.address)
    if probe is None or probe.proc.poll() is not None:
        probe = _PROBES[c.address] = _Probe(c.address)
    return probe.ask(question)


def close_probes() -> None:
    """End the probes (before their cluster stops)."""
    while _PROBES:
        _PROBES.popitem()[1].close()


def alive_actor_nodes(c, class_name: str) -> set[str]:
    """The nodes of the live actors of ``class_name`` on cluster ``c``."""
    return set(ask(c, f"actor_nodes {class_name}"))


def free_cpus(c) -> float:
    """The CPUs free on cluster ``c`` (its live nodes' less what actors hold)."""
    return float(ask(c, "free_cpus"))


def busy_nodes(c) -> set[str]:
    """The worker nodes of cluster ``c`` whose CPUs are held (a training worker on each of its 1-CPU nodes)."""
    return set(ask(c, "busy_nodes")) & {n.node_id for n in c.worker_nodes}


def refresh_train_view(c) -> None:
    """Make Ray Train count every live node of cluster ``c`` at the next group start.

    Ray Train sizes an elastic group from Ray's AutoscalingCoordinator, a detached actor that
    re-reads the cluster's nodes only every 20 s: a node added just before a run starts is not
    counted yet, and the run starts with fewer workers (then grows at its capacity check).  Ask it
    to re-read now, as the driver does when it sees the nodes change
    (:func:`orchestrator.run.reservations.refresh`); where it cannot be asked, wait out its re-read."""
    if ask(c, "refresh") is not True:
        time.sleep(21)


def wait_for(p: subprocess.Popen, tmp, what: str, ready, timeout: float = 300) -> None:
    """Wait while the run ``p`` trains until ``ready()``; fail with its output if it ends first."""
    deadline = time.time() + timeout
    while not ready():
        assert p.poll() is None, finish(p, tmp)
        assert time.time() < deadline, f"{what}: not in {timeout:.0f} s"
        time.sleep(0.5)


def checkpointed(tmp) -> bool:
    return bool(glob.glob(f"{tmp}/ray_runs/elastic-*/checkpoint_step*"))


def worker_stretches(tmp) -> list[int]:
    """The worker counts the run of ``tmp`` has logged so far, in step order, each stretch once
    (its MLflow store, read while it trains)."""
    import sqlite3

    try:
        with sqlite3.connect(f"{tmp}/mlflow.db") as db:
            rows = db.execute("select step, value from metrics where key = 'workers' order by step").fetchall()
    except sqlite3.Error:
        return []
    return _stretches(v for _, v in rows)


def _stretches(counts) -> list[int]:
    """Worker counts in step order, each run of equal counts once (3, 3, 2, 3 -> 3, 2, 3)."""
    out: list[int] = []
    for v in counts:
        if not out or out[-1] != int(v):
            out.append(int(v))
    return out


def logged_workers(uri: str, run_id: str) -> list[int]:
    """The worker counts of a finished run in step order, each stretch once (3, 2, 3: shrunk, grown back)."""
    from tests.helpers import metric_series

    return _stretches(v for _, v in metric_series(uri, run_id, "workers"))


def drain(c, node_id: str, deadline_s: int) -> None:
    """Give node ``node_id`` of cluster ``c`` a preemption notice: Ray drains it with ``deadline_s``
    seconds left, as the autoscaler does when a cloud warns that it reclaims a spot node (the
    caller kills the node at the deadline, as the cloud would)."""
    ray_cli = os.path.join(os.path.dirname(sys.executable), "ray")
    out = subprocess.run(
        [
            ray_cli,
            "drain-node",
            "--address",
            c.address,
            "--node-id",
            node_id,
            "--reason",
            "DRAIN_NODE_REASON_PREEMPTION",
            "--reason-message",
            "spot node reclaimed (test)",
            "--deadline-remaining-seconds",
            str(deadline_s),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
