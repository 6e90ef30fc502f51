"""What the live nodes hold, and the bounded wait for capacity after a loss (no Ray: node lists
as ``ray.nodes()`` gives them, and a fake clock)."""

from orchestrator.run.nodes import CapacityWait, workers_that_fit


def node(cpus, alive=True, gpus=0):
    res = {"CPU": float(cpus)}
    if gpus:
        res["GPU"] = float(gpus)
    return {"Alive": alive, "Resources": res}


def test_workers_are_counted_node_by_node_never_across_nodes():
    # 3 nodes of 1.5 CPUs hold 3 workers of 1 CPU, not the 4 their 4.5 CPUs would suggest
    assert workers_that_fit([node(1.5)] * 3, {"CPU": 1.0}) == 3
    assert workers_that_fit([node(2), node(1)], {"CPU": 0.5}) == 6


def test_dead_nodes_and_missing_resources_hold_nothing():
    assert workers_that_fit([node(4, alive=False), node(1)], {"CPU": 1.0}) == 1
    assert workers_that_fit([node(4)], {"CPU": 1.0, "GPU": 1.0}) == 0
    assert workers_that_fit([node(4, gpus=2)], {"CPU": 1.0, "GPU": 1.0}) == 2


def test_the_wait_starts_when_min_workers_do_not_fit_and_ends_when_they_do():
    now = [100.0]
    wait = CapacityWait(min_workers=2, timeout_s=60, clock=lambda: now[0])
    assert wait.update(3) is None and not wait.expired()
    status = wait.update(1)
    assert status.startswith("waiting for capacity: 1 of scaling.min_workers 2 workers fit")
    now[0] += 59
    assert not wait.expired()
    now[0] += 1
    assert wait.expired()
    msg = wait.message("python -m orchestrator resume abc")
    assert "only 1 of scaling.min_workers 2" in msg and "for 60 s" in msg
    assert msg.endswith("with: python -m orchestrator resume abc")
    assert wait.update(2) is None and not wait.expired() and wait.waited_s() == 0.0


def test_the_watch_looks_at_its_pace_and_says_so_now_and_then():
    from orchestrator.run.nodes import CapacityWatch

    now, looks = [0.0], []

    def nodes():
        looks.append(now[0])
        return [node(0.5)]

    w = CapacityWatch(min_workers=1, timeout_s=100, every_s=2.0, say_every_s=15.0, nodes=nodes, clock=lambda: now[0])
    said = []
    for _ in range(20):  # 20 polls, one a second
        said.append(w.poll_live_nodes({"CPU": 1.0}))
        now[0] += 1.0
    assert looks == [float(t) for t in range(0, 20, 2)]
    assert [i for i, s in enumerate(said) if s] == [0, 16]
    now[0] += 2.0
    assert w.poll_live_nodes({"CPU": 0.5}) is None and w.wait.since is None
    assert CapacityWatch(1, 10, nodes=lambda: None).poll_live_nodes({"CPU": 1.0}) is None  # no Ray: nothing to say


def test_a_node_lost_or_joined_has_ray_trains_view_refreshed_once():
    from orchestrator.run.nodes import CapacityWatch

    now, listing, changes = [0.0], [[{"NodeID": "a", "Alive": True}, {"NodeID": "b", "Alive": True}]], []
    w = CapacityWatch(
        1, 100, every_s=1.0, nodes=lambda: listing[0], clock=lambda: now[0], on_change=lambda: changes.append(now[0])
    )

    def look(at: float, nodes: list | None = None) -> None:
        now[0] = at
        if nodes is not None:
            listing[0] = nodes
        w.poll_live_nodes({"CPU": 0.0})

    look(0.0)
    look(1.0)
    assert changes == [], "the first look and an unchanged cluster ask nothing"
    look(2.0, [{"NodeID": "a", "Alive": True}, {"NodeID": "b", "Alive": False}])  # b lost
    look(3.0)
    look(4.0, [{"NodeID": "a", "Alive": True}, {"NodeID": "c", "Alive": True}])  # c joins
    assert changes == [2.0, 4.0]
