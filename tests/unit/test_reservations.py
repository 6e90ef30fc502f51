"""The record of a run's Ray Train groups that ``resume`` uses to drop a killed driver's
reservations (orchestrator/run/reservations.py); the drop itself runs against a real Ray in
tests/integration/test_resilience.py."""

from types import SimpleNamespace

from orchestrator.run.reservations import KEEP, ray_train_run_id, recorded, release


def test_the_newest_ids_are_kept_newest_last_without_repeats():
    value = ""
    for i in range(KEEP + 2):
        value = recorded(value, f"id{i}")
    assert value.split() == [f"id{i}" for i in range(2, KEEP + 2)]
    assert recorded("a b c", "b").split() == ["a", "c", "b"]  # a group started again moves to the end
    assert recorded(None, "x") == "x"


def test_the_id_is_read_from_the_trainers_run_context():
    assert ray_train_run_id(SimpleNamespace(train_run_context=SimpleNamespace(run_id="abc"))) == "abc"
    assert ray_train_run_id(object()) is None  # a Ray Train without it: nothing recorded, nothing dropped


def test_nothing_to_release_asks_nothing_of_ray():
    assert release(None) == 0 and release("  ") == 0


def _stopped_runner(tmp_path, monkeypatch, returns: bool):
    """A driver (orchestrator/run/phases.py, a fake group in place of Ray Train's) stopped by Ctrl-C
    or SIGTERM at its first poll; its group either ends at once or is still in its ``fit()`` (Ray
    Train's controller shutting down) when the driver gives up waiting; the ids the driver drops."""
    import threading

    import pytest

    from orchestrator.record.progress_bar import Progress
    from orchestrator.run import phases
    from orchestrator.run.monitor import MonitorState
    from orchestrator.run.run_books import GroupPlan, RunStart
    from tests.helpers import StateLink, make_config
    from tests.unit.test_phases import FakeTracker
    from trainers.policies.resize import WorkerCount, WorkersForBatch

    cfg = make_config(tmp_path, "mem://", scaling={"min_workers": 1, "max_workers": 2, "cpus_per_worker": 0.5})
    state = MonitorState(WorkerCount(WorkersForBatch(), 50, 1, 2), available=lambda: {"CPU": 2.0})
    plan = GroupPlan.from_config(cfg, None)
    runner = phases.PhaseRunner(
        plan, FakeTracker(), RunStart(), Progress(0, enabled=False), poll_s=0.01, link=StateLink(state)
    )
    gone = threading.Event()

    class Trainer:  # what the driver reads of a TorchTrainer: its Ray Train run id, and fit()
        train_run_context = SimpleNamespace(run_id="rt-1")

        def fit(self):
            if not returns:
                gone.wait(60)  # the controller still shutting down when the driver leaves

    dropped: list = []
    monkeypatch.setattr(runner, "_trainer", lambda workers, phase, handover: Trainer())
    monkeypatch.setattr(phases, "release_unfinished", lambda ids: dropped.append(ids))
    monkeypatch.setattr(phases, "STOP_WAIT_S", 0.0)
    monkeypatch.setattr(phases.ray, "available_resources", lambda: {"CPU": 2.0})
    poll = runner.poll

    def interrupted(ph):
        poll(ph)
        if returns:
            ph.thread.join()  # its fit() has returned when the stop comes
        # a Ctrl-C that interrupts the driver's join of the thread marks it stopped while fit() runs
        # on (CPython's join): is_alive() then says False
        monkeypatch.setattr(ph.thread, "is_alive", lambda: False)
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "poll", interrupted)
    with pytest.raises(KeyboardInterrupt):
        runner.run()
    gone.set()
    return dropped


def test_a_driver_that_leaves_before_its_group_ends_drops_that_groups_reservation(tmp_path, monkeypatch):
    """Its controller dies with the driver before it can drop its own reservation, which would hold
    the cluster's resources for Ray's expiry (180 s): the next run on the cluster, with room, waited
    ~100 s for its group (tests/multinode/test_token_shards_nodes.py after test_placement.py's stops)."""
    assert _stopped_runner(tmp_path, monkeypatch, returns=False) == [["rt-1"]]


def test_a_group_that_ended_has_dropped_its_own_reservation(tmp_path, monkeypatch):
    assert _stopped_runner(tmp_path, monkeypatch, returns=True) == [[]]  # nothing asked of Ray


def test_the_unfinished_groups_are_dropped_again_as_the_driver_leaves_ray(monkeypatch):
    """A controller still shutting down renews its reservation every 20 s: the ids are dropped once
    more just before the driver disconnects (orchestrator/run/ray_env.py ``stop_ray``), then forgotten."""
    from orchestrator.run import reservations

    asked: list = []
    monkeypatch.setattr(reservations, "release", lambda ids: asked.append(ids) or len(ids.split()))
    monkeypatch.setattr(reservations, "_unfinished", [])
    assert reservations.release_unfinished(["a", "b"]) == 2 and reservations.release_unfinished(["b"]) == 1
    assert reservations.release_before_disconnect() == 2
    assert reservations.release_before_disconnect() == 0
    assert asked == ["a b", "b", "a b", ""]


def test_a_failed_worker_has_the_nodes_re_read_before_the_restart_is_sized_and_tells_the_monitor(monkeypatch):
    """Ray Train's controller runs the run's FailureNotice as it sees a worker fail, before it sizes
    the restarted group: the coordinator is asked (without a wait) to re-read the nodes, and then the
    monitor is told; without a coordinator nothing is asked and the monitor is still told."""
    from orchestrator.run import failures, reservations

    calls = []

    class Method:
        def __init__(self, name):
            self.name = name

        def remote(self, *args, **kwargs):
            calls.append((self.name, args, kwargs))

    class Actor:
        def __getattr__(self, name):
            return Method(name)

    coordinator = [Actor()]
    monkeypatch.setattr(reservations, "_coordinator", lambda: coordinator[0])
    monkeypatch.setattr(failures.ray, "is_initialized", lambda: True)
    monkeypatch.setattr(failures.ray, "get_actor", lambda name, namespace=None: Actor())
    notice = failures.FailureNotice("monitor", "ns", phase=2)
    notice.after_exception(None, {0: RuntimeError("Connection closed by peer")})
    assert calls == [
        ("get_reserved_resources", ("elastic-refresh",), {"recompute": True}),
        ("group_failed", (2, "RuntimeError: Connection closed by peer"), {}),
    ]
    calls.clear()
    coordinator[0] = None  # no elastic group on this cluster yet
    notice.after_exception(None, {0: RuntimeError("boom")})
    assert [c[0] for c in calls] == ["group_failed"]
