"""orchestrator/run/ray_env.py: the switches a local Ray is started with (no Ray started here;
tests/integration/test_local_ray_loopback.py starts one)."""

import os

import pytest

from orchestrator.run import ray_env


@pytest.mark.parametrize(
    "address, loopback",
    [
        ("127.0.0.1:6379", True),
        ("localhost:6379", True),
        ("[::1]:6379", True),
        ("192.0.2.2:6379", False),
        ("auto", False),
        ("ray://127.0.0.1:10001", False),
    ],
)
def test_a_driver_joining_a_loopback_address_is_told_apart(address, loopback):
    assert ray_env._is_loopback(address) is loopback


def test_single_machine_mode_holds_for_ray_init_only_and_leaves_a_users_choice(monkeypatch):
    from ray._private import ray_constants

    switch = ray_env.RAY_SINGLE_MACHINE_SWITCH
    monkeypatch.delenv(switch, raising=False)
    before = ray_constants.ENABLE_RAY_CLUSTER
    with ray_env._single_machine_ray():
        # what ray.init and the processes it starts read: the node address is 127.0.0.1
        assert os.environ[switch] == "0" and ray_constants.ENABLE_RAY_CLUSTER is False
    assert switch not in os.environ and ray_constants.ENABLE_RAY_CLUSTER is before
    monkeypatch.setenv(switch, "1")
    with ray_env._single_machine_ray():
        assert os.environ[switch] == "1" and ray_constants.ENABLE_RAY_CLUSTER is before


def test_a_ray_that_moved_its_private_names_still_gets_the_switch_and_keeps_its_printer(monkeypatch):
    """The two Ray-internal names this module sets are guarded: a Ray without the single-machine
    constant still gets the environment switch (what the processes it starts read), and one without
    the driver's printer keeps showing its messages whole, neither an import error."""
    from ray._private import ray_constants, worker

    switch = ray_env.RAY_SINGLE_MACHINE_SWITCH
    monkeypatch.delenv(switch, raising=False)
    monkeypatch.delattr(ray_constants, "ENABLE_RAY_CLUSTER")
    with ray_env._single_machine_ray():
        assert os.environ[switch] == "0" and not hasattr(ray_constants, "ENABLE_RAY_CLUSTER")
    assert switch not in os.environ
    monkeypatch.delattr(worker, "print_to_stdstream")
    ray_env._quiet_cluster_errors()
    assert not hasattr(worker, "print_to_stdstream")


def test_what_ray_pushes_to_the_driver_is_one_line_a_message_and_a_users_print_is_untouched():
    from orchestrator.run.ray_env import first_line_only

    shown = []
    show = first_line_only(lambda data, ignore_prefix: shown.append(data["lines"]))
    dead = (
        "Raylet is terminated. Termination is unexpected. Possible reasons include: (1) SIGKILL\n"
        "    [2026-11-25 15:04:47,076 I 2875 2875] (raylet) worker_pool.cc:564: Started worker process\n" * 20
    )
    show({"lines": [dead], "pid": "raylet", "is_err": False}, False)
    show({"lines": ["epoch 1\nepoch 2"], "pid": 1234, "is_err": False}, False)  # a worker's own output
    show({"lines": [""], "pid": "raylet", "is_err": False}, False)
    alarm = (
        "WARNING: 5 PYTHON worker processes have been started on node: 2c87 with address: 192.0.2.2, "
        "which is 5x the maximum expected startup concurrency (1)"
    )
    show({"lines": [alarm], "pid": "raylet", "is_err": False}, False)  # a head without CPUs: not shown
    assert shown == [
        ["Raylet is terminated. Termination is unexpected. Possible reasons include: (1) SIGKILL"],
        ["epoch 1\nepoch 2"],
        [],
    ]
    assert first_line_only(show).first_line_only


def test_only_the_local_ray_this_process_started_counts_as_its_own(monkeypatch):
    """On its own local Ray (one node) the driver looks at nodes and drains once; a Ray it joined,
    or another Ray started after its own, is looked at as a cluster."""
    import math
    from types import SimpleNamespace

    import ray

    from orchestrator.run import ray_env
    from orchestrator.run.drains import DrainWatch

    address = {"now": "127.0.0.1:6100"}
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray, "get_runtime_context", lambda: SimpleNamespace(gcs_address=address["now"]))
    monkeypatch.setattr(ray_env, "_local_address", "")
    assert not ray_env.on_own_local_ray()  # joined (RAY_ADDRESS): never started here
    monkeypatch.setattr(ray_env, "_local_address", "127.0.0.1:6100")
    assert ray_env.on_own_local_ray()
    address["now"] = "10.0.0.5:6379"  # a cluster joined after the local one was shut down
    assert not ray_env.on_own_local_ray()
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    address["now"] = "127.0.0.1:6100"
    assert not ray_env.on_own_local_ray()

    clock, looks = [0.0], []
    once = DrainWatch(every_s=math.inf, source=lambda: looks.append(1) or {}, clock=lambda: clock[0])
    for t in (0.0, 5.0, 3600.0):
        clock[0] = t
        once.poll_drain_notices()
    assert looks == [1]  # the local Ray's drains: looked at once


def test_ray_trains_placement_group_cleaner_is_left_out_only_where_the_dashboard_does_not_answer(monkeypatch):
    """Ray Train's PlacementGroupCleaner asks Ray's State API (the dashboard of the machine's newest
    Ray) every second: where nothing listens at the dashboard's address it can never clean, and where
    another Ray answers it would remove a training group's placement group, so a group starts
    without it; only where this Ray is the machine's newest and its dashboard answers for this node
    does Ray Train's default stay.  Where that cannot be told (an ask that times out on a loaded
    machine: the cause of the suite's "placement group was removed" flakes), it is left out."""
    import socket

    import ray
    import ray._private.services as services
    import ray.experimental.internal_kv as kv
    import ray.util.state as state
    from ray.train import ScalingConfig

    from orchestrator.run import phases, ray_env

    class Context:  # the driver's view of its Ray (no Ray here)
        gcs_address = "127.0.0.1:6379"

        def get_node_id(self) -> str:
            return "our-node"

    monkeypatch.setattr(ray, "get_runtime_context", Context)
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    newest = ["127.0.0.1:6379"]  # the Ray a process of this machine without RAY_ADDRESS finds: this one
    monkeypatch.setattr(services, "find_bootstrap_address", lambda temp_dir: newest[0])
    known: set[str] = set()  # the nodes the dashboard that answers knows
    monkeypatch.setattr(state, "get_node", lambda node, **k: {"node_id": node} if node in known else None)
    listening = socket.create_server(("127.0.0.1", 0))
    free = socket.create_server(("127.0.0.1", 0))
    free_port = free.getsockname()[1]
    free.close()  # nothing listens there now
    try:
        for port, nodes, expected in (
            (listening.getsockname()[1], {"our-node"}, True),  # this Ray's dashboard
            (listening.getsockname()[1], {"another-ray's-node"}, False),  # another Ray's, on the same port
            (free_port, {"our-node"}, False),  # none
        ):
            known.clear()
            known.update(nodes)
            monkeypatch.setattr(kv, "_internal_kv_get", lambda *a, port=port, **k: f"127.0.0.1:{port}".encode())
            assert ray_env.dashboard_running() is expected
        ours = listening.getsockname()[1]
        monkeypatch.setattr(kv, "_internal_kv_get", lambda *a, **k: f"127.0.0.1:{ours}".encode())
        known.add("our-node")
        assert ray_env.dashboard_running() is True
        # this Ray's dashboard answers, but the cleaner would ask the Ray started after it on the machine
        newest[0] = "192.0.2.2:6379"
        assert ray_env.dashboard_running() is False
        newest[0] = "127.0.0.1:6379"

        def slow(node, **k):
            raise TimeoutError("the dashboard did not answer in 5 s")

        monkeypatch.setattr(state, "get_node", slow)
        assert ray_env.dashboard_running() is False
    finally:
        listening.close()

    def unreadable(*a, **k):
        raise RuntimeError("not connected")

    monkeypatch.setattr(kv, "_internal_kv_get", unreadable)
    assert ray_env.dashboard_running() is False

    def names(up: bool) -> list[str]:
        monkeypatch.setattr(phases, "dashboard_running", lambda: up)
        trainer = phases.GroupTrainer(lambda c: None, scaling_config=ScalingConfig(num_workers=1))
        return [type(c).__name__ for c in trainer._create_default_callbacks()]

    assert "PlacementGroupCleanerCallback" in names(True)
    assert "PlacementGroupCleanerCallback" not in names(False)
    assert "BackendSetupCallback" in names(False)


def test_ray_trains_preemption_watcher_is_off_on_a_joined_cluster_too(monkeypatch):
    """The driver watches drains itself (orchestrator/run/drains.py); Ray Train's preemption watcher
    (an actor per group) only feeds get_preemption_info(), which the loop does not read: off whether
    the driver joins a cluster (RAY_ADDRESS, as under ``ray job submit``) or starts one, unless the
    user set it."""
    import ray

    from orchestrator.run import ray_env

    joined: list[dict] = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kw: joined.append(kw))
    monkeypatch.setenv("RAY_ADDRESS", "10.1.2.3:6379")
    monkeypatch.delenv("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", raising=False)
    ray_env.ensure_ray()
    assert len(joined) == 1 and os.environ["RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"] == "0"
    monkeypatch.setenv("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "1")  # the user's word stands
    ray_env.ensure_ray()
    assert os.environ["RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"] == "1"
