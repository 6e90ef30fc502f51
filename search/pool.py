"""The trial actors of one search invocation, reused across trials.

Each trial still gets a fresh orchestrator run (``search.trial.TrialActor.run``); reusing the
actor only saves its process start.  An actor whose process died is killed, never reused.
"""

from __future__ import annotations

from typing import Any


class ActorPool:
    """Idle and busy ``TrialActor`` handles: ``get`` one for a trial, ``put`` it back when the trial
    ends, ``close`` them all when the driver ends."""

    def __init__(self) -> None:
        self.idle: list[Any] = []
        self.busy: list[Any] = []

    def get(self) -> Any:
        """An idle actor, or a new one when none is idle."""
        from search.trial import TrialActor

        actor = self.idle.pop() if self.idle else TrialActor.remote()
        self.busy.append(actor)
        return actor

    def put(self, actor: Any, healthy: bool = True) -> None:
        """Give ``actor`` back after its trial: idle again if ``healthy``, else killed."""
        import ray

        if actor in self.busy:
            self.busy.remove(actor)
        if healthy:
            self.idle.append(actor)
        else:
            ray.kill(actor, no_restart=True)

    def close(self) -> None:
        """Kill every actor (idle or busy); errors are ignored (the actor may be gone already)."""
        import ray

        for a in self.idle + self.busy:
            try:
                ray.kill(a, no_restart=True)
            except Exception:
                pass
        self.idle, self.busy = [], []
