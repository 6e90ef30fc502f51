"""Shared fixtures and the test tiers.

Four tiers, one folder each (docs/architecture.md), run in this order:

* ``tests/unit``: no processes, no Ray; seconds.  ``make test-fast`` runs these.
* ``tests/distributed``: the loop's numerics in a few gloo processes (no Ray).
* ``tests/integration``: a real local Ray (one, shared), real MLflow stores, real CLI processes.
* ``tests/multinode``: a real Ray cluster of several nodes on this machine (one, for the tier).

Each test gets its tier's marker from its folder, and a default time limit (pytest-timeout):
a hung collective or a Ray that never places a group fails the test instead of the CI run.
"""

from __future__ import annotations

import os

import pytest

TIERS = {"unit": 60, "distributed": 300, "integration": 900, "multinode": 900}  # tier -> default seconds per test

os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
os.environ.setdefault("ELASTIC_KEEP_RAY", "1")  # runs inside tests must not stop the shared Ray
# Ray Train's controller looks at its workers every RAY_TRAIN_HEALTH_CHECK_INTERVAL_S (default 2 s):
# a group that finished, failed or was told to stop is seen that much later, at every phase end of
# every run here.  Ray Train hands the variable on to its controllers (this process's runs, the CLI
# drivers the tests start, the multinode tier's nodes); a poll that takes longer is only waited on
# longer (a worker counts as hung after RAY_TRAIN_WORKER_HEALTH_CHECK_TIMEOUT_S, 600 s).
os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.5")


# Every Ray the tests start (the shared local one, the multinode tier's clusters) runs workers that
# import the suite's own factories (``tests.byo_workloads``), also for a CLI driver that joins it: a
# joining driver relies on the cluster's environment (orchestrator/config/code.py), so the project's root is
# on the ``PYTHONPATH`` that Ray's processes inherit from this process.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [_ROOT, os.environ.get("PYTHONPATH")]))


@pytest.fixture(scope="session")
def s3_server():
    """A real S3-compatible server (moto's, on 127.0.0.1 at a free port: tests/s3_server.py) for
    the session, with its endpoint and test credentials in the standard environment variables.
    The shared Ray starts after it (``ray_cluster`` asks for it), so Ray's processes, the Train
    controller and the workers, reach the bucket through the same variables as the driver does,
    as the nodes of a real cluster would be configured."""
    from tests.s3_server import S3Server

    server = S3Server().start()
    saved = {k: os.environ.get(k) for k in server.env}
    os.environ.update(server.env)
    yield server
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    server.stop()


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory, s3_server):
    """A real local Ray with 2 CPUs (this machine's size); workers use fractional CPUs."""
    import ray

    from orchestrator.run.runner import ensure_ray

    ensure_ray(verbose=False, num_cpus=2)
    yield ray
    ray.shutdown()


@pytest.fixture(autouse=True)
def _unit_environment_restored(request):
    """A unit test leaves ``os.environ`` as it found it.  Code under test sets variables itself
    (``orchestrator.config.uris.mlflow_uri`` moves a URI's user and password to MLflow's credential
    variables), which ``monkeypatch.delenv(..., raising=False)`` of an absent variable does not undo;
    the unit tier runs first, and the shared Ray started after it hands this process's environment
    to every worker (a trial actor then sent a unit test's password to the credentials test's server)."""
    if _tier(request.node) != "unit":
        yield
        return
    saved = dict(os.environ)
    yield
    if os.environ != saved:
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture()
def tracking_uri(tmp_path):
    from tests.helpers import migrated_store

    return migrated_store(f"sqlite:///{tmp_path}/mlflow.db")


ORDER = ("unit", "distributed", "integration", "multinode")  # cheap first; the tiers with Ray last


def _tier(item) -> str | None:
    return next((t for t in TIERS if t in item.path.parts[-2:-1]), None)


def end_orphan_cleaners() -> int:
    """End the Ray Train ``PlacementGroupCleaner`` actors of drivers that are gone; how many.

    Every Ray Train run starts one (detached: it outlives its driver), which ends once it sees its
    controller dead through Ray's State API.  On a Ray without a dashboard (the shared one here, as
    ``ensure_ray`` starts it) that API never answers, so the cleaner of a driver a test killed polls
    on for good (1.5-1.8% of a core each; seven took half a core late in one suite run).  A dead
    job's placement groups are removed by Ray with the job, so its cleaner has nothing left to do.
    The orchestrator's own groups start without one where no dashboard answers
    (orchestrator/run/ray_env.py ``dashboard_running``); the tests' bare Ray Train runs still start
    one.  Read from the GCS (no dashboard needed); the processes are this machine's."""
    import signal
    import sys

    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return 0
    from ray._private import state

    try:
        dead_jobs = {job["JobID"] for job in state.jobs() if job.get("IsDead")}
        actors = state.actors().values()
    except Exception:  # noqa: BLE001 - a Ray going down: nothing to end
        return 0
    ended = 0
    for actor in actors:
        orphan = actor.get("JobID") in dead_jobs and actor.get("State") == "ALIVE"
        if orphan and actor.get("ActorClassName") == "PlacementGroupCleaner" and actor.get("Pid"):
            try:
                os.kill(int(actor["Pid"]), signal.SIGKILL)
                ended += 1
            except (ProcessLookupError, PermissionError):
                pass
    return ended


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    """After each test of the tiers with Ray, the cleaners its killed drivers left are ended
    (:func:`end_orphan_cleaners`).  The integration tier's shared Ray stops after its last test (the
    tiers are contiguous), not at the session's end: its processes would otherwise run on beside
    the multinode tier."""
    if _tier(item) in ("integration", "multinode"):
        end_orphan_cleaners()
    if _tier(item) == "integration" and (nextitem is None or _tier(nextitem) != "integration"):
        import sys

        ray = sys.modules.get("ray")
        if ray is not None and ray.is_initialized():
            ray.shutdown()


def pytest_collection_modifyitems(config, items):
    # The tiers run in ORDER, each contiguous (a stable sort: files and tests keep their order within
    # a tier): the unit tier first, before any Ray or cluster of the later tiers is up beside it
    # (their processes slowed it by half when it ran last), and the multinode tier last.
    items.sort(key=lambda item: ORDER.index(_tier(item)) if _tier(item) else -1)
    for item in items:
        tier = _tier(item)
        if tier is None:
            continue
        item.add_marker(getattr(pytest.mark, tier))
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(TIERS[tier]))
