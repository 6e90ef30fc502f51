"""Helpers shared by the integration tests: build a config, read a run back from MLflow."""

from __future__ import annotations

import glob
import json
import os
import shutil
import sys
from typing import Any

import torch

from orchestrator.config.schema import RootConfig, validate
from orchestrator.run.monitor_link import MonitorLink

_TEMPLATE_STORE: list[str] = []  # this process's empty MLflow SQLite store at MLflow's current schema


def migrated_store(uri: str) -> str:
    """``uri``, a ``sqlite:///PATH`` MLflow store that does not exist yet, made a copy of an empty
    store MLflow created (once per test process) and brought to its current schema.

    MLflow makes a new SQLite store by running every one of its schema migrations (~1.2 s here,
    for each of the suite's many stores); a copy of a store it migrated once is the same empty
    store (its Default experiment, no runs) at once.  Opening a store that does not exist yet is
    still what every CLI test does (their URIs are not passed through here)."""
    path = uri[len("sqlite:///") :] if uri.startswith("sqlite:///") else None
    if path is None or not os.path.isabs(path) or os.path.exists(path):  # a unit test's name only
        return uri
    if not _TEMPLATE_STORE or not os.path.exists(_TEMPLATE_STORE[0]):
        import tempfile

        from mlflow.tracking import MlflowClient

        template = os.path.join(tempfile.mkdtemp(prefix="mlflow-template-"), "mlflow.db")
        MlflowClient(f"sqlite:///{template}").search_experiments()  # creates and migrates it
        _TEMPLATE_STORE[:] = [template]
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    shutil.copyfile(_TEMPLATE_STORE[0], path)
    return uri


def make_config(tmp_path, tracking_uri: str, **sections: dict[str, Any]) -> RootConfig:
    migrated_store(tracking_uri)
    raw: dict[str, Any] = {
        "data": {"name": "digits"},
        "model": {"name": "mlp", "norm": "none", "hidden": 32},
        "optimizer": {"name": "sgd", "lr": 0.05, "mf": 0.9, "base_batch_size": 50},
        "batch": {"size": 50, "max_local_batch": 16},
        # tests of resizes need them on short runs, where a resize cannot pay for itself
        "scaling": {"min_workers": 1, "max_workers": 1, "cpus_per_worker": 0.5, "resize_when": "always"},
        "train": {"epochs": 1, "seed": 0},
        "checkpoint": {"storage_path": str(tmp_path / "ray_runs")},
        "tracking": {"uri": tracking_uri, "experiment": "tests"},
    }
    for name, values in sections.items():
        raw.setdefault(name, {}).update(values)
    return validate(raw)


def braked_mlp(brake, sleep_s: float, **params: Any) -> dict[str, Any]:
    """A config's model section: the built-in mlp's math as ``tests.byo_workloads:slow_mlp``, each
    training micro-batch sleeping ``sleep_s`` while the file ``brake`` exists (a test makes it and
    removes it, so an event it waits for lands mid-run on any machine's speed)."""
    return {
        "name": None,
        "factory": "tests.byo_workloads:slow_mlp",
        "params": {**params, "sleep_s": sleep_s, "brake": str(brake)},
    }


def metric_series(uri: str, run_id: str, key: str) -> list[tuple[int, float]]:
    from mlflow.tracking import MlflowClient

    hist = MlflowClient(uri).get_metric_history(run_id, key)
    return sorted((m.step, m.value) for m in hist)


def dense_series(uri: str, run_id: str, key: str) -> list[tuple[int, float]]:
    """A piecewise metric (logged where its per-step series bends: orchestrator/record/run_tracker.py) at
    every step from its first to its last point, read off the lines between its logged points."""
    import numpy as np

    pts = metric_series(uri, run_id, key)
    steps = list(range(pts[0][0], pts[-1][0] + 1))
    return list(zip(steps, np.interp(steps, [s for s, _ in pts], [v for _, v in pts]).tolist()))


def final_model(uri: str, run_id: str, dst) -> dict[str, torch.Tensor]:
    from mlflow.tracking import MlflowClient

    path = MlflowClient(uri).download_artifacts(run_id, "model/model.pt", str(dst))
    return torch.load(path, weights_only=True)


def read_sample_log(folder: str) -> list[dict]:
    rows = []
    for path in glob.glob(os.path.join(folder, "*.jsonl")):
        with open(path) as f:
            rows += [json.loads(line) for line in f if line.strip()]
    return rows


def spawn_gloo(fn, world: int, *args) -> dict:
    """Run ``fn(rank, world, out, *args)`` on ``world`` processes joined in one gloo group and
    return what the ranks put in ``out``. ``fn`` must be a module-level function (it is pickled)."""
    import torch.multiprocessing as mp

    with mp.Manager() as m:
        out = m.dict()
        mp.spawn(_gloo_rank, args=(fn, world, free_port(), out, args), nprocs=world, join=True)
        return dict(out)


def _gloo_rank(rank: int, fn, world: int, port: int, out, args: tuple) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        fn(rank, world, out, *args)
        dist.barrier()  # no rank tears the group down while another still talks to it
    finally:
        dist.destroy_process_group()
    # Leave without the interpreter's teardown: on a loaded machine gloo's threads, torn down with
    # the C++ statics at exit, now and then aborted a rank that had finished its work (SIGABRT,
    # "terminate called without an active exception", CI of 2026-11-23). `out` is already written.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (a gloo rendezvous, a Ray head)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def printed_command(text: str, before: str, after: str) -> list[str]:
    """The command a message printed between ``before`` and ``after`` (e.g. ``"with: "`` and
    ``" resume"``), split as a shell would, after checking that it runs this interpreter (or this
    package's console script), not whatever ``python`` the PATH holds."""
    import re
    import shlex
    import shutil

    m = re.search(re.escape(before) + r"(.+?)" + re.escape(after), text)
    assert m, text
    argv = shlex.split(m.group(1))
    exe = os.path.expanduser(argv[0])
    found = exe if os.sep in exe else shutil.which(exe)
    assert found is not None, argv
    if argv[1:3] == ["-m", "orchestrator"] or argv[1:3] == ["-m", "search"]:
        assert os.path.abspath(found) == os.path.abspath(sys.executable), (argv, sys.executable)
    else:
        assert os.path.basename(found) in ("elb-train", "elb-search"), argv
    return argv


class StateLink(MonitorLink):
    """The driver's link to a :class:`~orchestrator.run.monitor.MonitorState` in this process: the
    monitor actor's own logic, called directly (no Ray)."""

    def __init__(self, state: Any, judged_metrics: tuple[str, ...] = ()) -> None:
        super().__init__(judged_metrics)
        self.actor = state

    def create(self, *args: Any, **kwargs: Any) -> None:  # the state is there from the start
        pass

    def kill(self) -> None:
        self.actor = None

    def _tell(self, method: str, *args: Any, **kwargs: Any) -> None:
        if self.actor is not None:
            getattr(self.actor, method)(*args, **kwargs)

    def _ask(self, method: str, *args: Any, timeout: float | None = None) -> Any:
        return getattr(self.actor, method)(*args)
