"""A worker node lost mid-run: on a real 4-node Ray cluster (a head without CPUs for the driver,
three 1-CPU worker nodes), a run of W=3 (min 2) loses the node that holds Ray Train's preemption
watcher (a driver-side helper Ray places on a worker node) and a worker, goes on at W=2 from its
newest checkpoint, and ends FINISHED with the losses of an uninterrupted run (up to float reduction
order), no step logged twice, and the run's monitor on the driver's node all along."""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import time

import numpy as np
import pytest
import yaml

from tests.helpers import dense_series, metric_series

pytestmark = [pytest.mark.multinode, pytest.mark.timeout(900)]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EPOCHS = 30
STEPS = EPOCHS * 30  # ceil(1438 / 48)


def _config(tmp, **scaling) -> dict:
    return {"data": {"name": "digits", "val_fraction": 0.2}, "model": {"name": "mlp", "norm": "none"},
            "optimizer": {"name": "sgd", "lr": 0.05, "base_batch_size": 48},
            "batch": {"size": 48, "max_local_batch": 16},
            "scaling": {"min_workers": 2, "max_workers": 3, "cpus_per_worker": 1, "max_failures": 3,
                        "capacity_check_s": 5, **scaling},
            "train": {"epochs": EPOCHS, "log_every": 5},
            "checkpoint": {"every_steps": 10, "storage_path": f"{tmp}/ray_runs"},
            "tracking": {"uri": f"sqlite:///{tmp}/mlflow.db"}}


def _driver(c, tmp, cfg) -> subprocess.Popen:
    os.makedirs(tmp, exist_ok=True)
    path = os.path.join(tmp, "cfg.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(cfg, f)
    env = dict(os.environ, RAY_ADDRESS=c.address, PYTHONPATH=ROOT)
    env.pop("ELASTIC_KEEP_RAY", None)
    return subprocess.Popen([sys.executable, "-m", "orchestrator", "train", path, "--no-progress"], cwd=tmp,
                            env=env, stdout=open(os.path.join(tmp, "out.txt"), "w"),
                            stderr=open(os.path.join(tmp, "err.txt"), "w"), text=True)


def _finish(p: subprocess.Popen, tmp, timeout: float = 600) -> tuple[int, str]:
    p.wait(timeout)
    with open(os.path.join(tmp, "out.txt")) as f, open(os.path.join(tmp, "err.txt")) as g:
        return p.returncode, f.read() + g.read()


def _workers_logged(tmp) -> set[int]:
    """The worker counts the run has logged so far (its MLflow store, read while it trains)."""
    import sqlite3

    try:
        with sqlite3.connect(f"{tmp}/mlflow.db") as db:
            return {int(v) for (v,) in db.execute("select value from metrics where key = 'workers'")}
    except sqlite3.Error:
        return set()


def _run_id(tmp) -> str:
    folder = glob.glob(f"{tmp}/ray_runs/elastic-*")[0]
    return os.path.basename(folder)[len("elastic-"):].split("-r")[0]


def _alive_actor_nodes(c, class_name: str) -> set[str]:
    """The nodes of the live actors of ``class_name`` on cluster ``c``, asked from a process of its
    own (this test process may already hold another Ray: the integration tier's shared one)."""
    code = ("import sys; from orchestrator.ray_env import ensure_ray; ensure_ray(); "
            "from ray.util.state import list_actors; "
            "print(' '.join(a['node_id'] for a in list_actors(filters=[('class_name', '=', sys.argv[1]), "
            "('state', '=', 'ALIVE')])))")
    env = dict(os.environ, RAY_ADDRESS=c.address, PYTHONPATH=ROOT)  # joined as the orchestrator joins it
    out = subprocess.run([sys.executable, "-c", code, class_name], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return set(out.stdout.split())


def test_a_lost_worker_node_is_a_capacity_change(cluster, tmp_path):
    nodes = [cluster.add_node(num_cpus=1) for _ in range(3)]
    cluster.wait_for_nodes()
    # the uninterrupted reference, on the same cluster
    ref = _driver(cluster, str(tmp_path / "ref"), _config(tmp_path / "ref"))
    rc, text = _finish(ref, tmp_path / "ref")
    assert rc == 0, text
    ref_uri, ref_id = f"sqlite:///{tmp_path}/ref/mlflow.db", _run_id(tmp_path / "ref")

    tmp = tmp_path / "lost"
    os.makedirs(tmp)
    driver = _driver(cluster, str(tmp), _config(tmp))
    deadline = time.time() + 300
    while not glob.glob(f"{tmp}/ray_runs/elastic-*/checkpoint_step*"):
        assert driver.poll() is None, _finish(driver, tmp)
        assert time.time() < deadline, "no checkpoint in 300 s"
        time.sleep(0.3)
    head = cluster.head_node.node_id
    assert _alive_actor_nodes(cluster, "MonitorState") == {head}, "the run's monitor must live on the driver's node"
    watcher = _alive_actor_nodes(cluster, "PreemptionWatcher")
    victim = next((n for n in nodes if n.node_id in watcher), nodes[-1])
    cluster.remove_node(victim, allow_graceful=False)  # its raylet and every process under it
    deadline = time.time() + 300
    while 2 not in _workers_logged(tmp):  # the group went on with the two nodes left
        assert driver.poll() is None, _finish(driver, tmp)
        assert time.time() < deadline, "the run never went on at W=2"
        time.sleep(0.5)
    rc, text = _finish(driver, tmp)
    assert rc == 0, text
    assert "Traceback" not in text, text

    from mlflow.tracking import MlflowClient

    uri, run_id = f"sqlite:///{tmp}/mlflow.db", _run_id(tmp)
    run = MlflowClient(uri).get_run(run_id)
    assert run.info.status == "FINISHED"
    losses, want = metric_series(uri, run_id, "train/loss"), metric_series(ref_uri, ref_id, "train/loss")
    assert [s for s, _ in losses] == list(range(1, STEPS + 1)), "no step lost or logged twice"
    # W changes the order of the gradients' sums: float noise, ~1e-6 on losses that fall to ~1e-4
    np.testing.assert_allclose([v for _, v in losses], [v for _, v in want], rtol=1e-4, atol=1e-5)
    assert metric_series(uri, run_id, "val/loss")[-1][1] == pytest.approx(
        metric_series(ref_uri, ref_id, "val/loss")[-1][1], rel=1e-4)
    workers = [int(v) for _, v in dense_series(uri, run_id, "workers")]
    assert workers[0] == 3 and workers[-1] == 2, "W goes 3 -> 2"
    assert _alive_actor_nodes(cluster, "MonitorState") == set(), "the run's monitor ends with the run"
