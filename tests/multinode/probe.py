"""A process that answers the multi-node tests' questions about their cluster (``python -m
tests.multinode.probe``, joined to the cluster in ``RAY_ADDRESS``; tests/multinode/runs.py starts one
per cluster and keeps it).

Each question is a line on stdin (``free_cpus``, ``actor_nodes CLASS``, ``busy_nodes``, ``refresh``,
``refresh_once_dead NODE``),
each answer one line on stdout, ``PROBE `` and JSON.  One process joined once, instead of a new
Python joining the cluster for each question (1.5-2 s each here, some asked in a loop).  The test
process itself joins no cluster: the integration tier's shared Ray may be up in it."""

from __future__ import annotations

import json
import sys
import time

PREFIX = "PROBE "


def answer(question: str):
    import ray

    name, _, arg = question.partition(" ")
    if name == "free_cpus":  # the CPUs free on the live nodes (less what actors hold)
        return ray.available_resources().get("CPU", 0.0)
    if name == "actor_nodes":  # the nodes of the live actors of class ``arg``
        from ray.util.state import list_actors

        actors = list_actors(filters=[("class_name", "=", arg), ("state", "=", "ALIVE")])
        return sorted({a["node_id"] for a in actors})
    if name == "busy_nodes":  # the nodes whose CPUs are held (a training worker on each: 1-CPU nodes)
        from ray._private.state import available_resources_per_node

        return sorted(n for n, r in available_resources_per_node().items() if r.get("CPU", 0.0) < 0.5)
    if name == "refresh":  # Ray Train's view of the nodes re-read now (orchestrator/run/reservations.py)
        from orchestrator.run.reservations import refresh

        return refresh()
    if name == "refresh_once_dead":  # the same as soon as Ray has declared node ``arg`` dead
        from orchestrator.run.reservations import refresh

        deadline = time.time() + 60
        while any(n["NodeID"] == arg and n["Alive"] for n in ray.nodes()):
            if time.time() > deadline:
                raise TimeoutError(f"node {arg} still alive after 60 s")
            time.sleep(0.05)
        return refresh()
    raise ValueError(f"unknown question {question!r}")


def main() -> None:
    from orchestrator.run.ray_env import ensure_ray

    ensure_ray()
    print(PREFIX + json.dumps("ready"), flush=True)
    for line in sys.stdin:
        try:
            out = {"answer": answer(line.strip())}
        except Exception as e:  # noqa: BLE001 - the test reads the error as a failed question
            out = {"error": f"{type(e).__name__}: {e}"}
        print(PREFIX + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
