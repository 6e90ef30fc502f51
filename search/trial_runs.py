"""Where a search's trials run: the one seam between the search driver and Ray.

The driver (``search.driver``) decides which trial runs when; ``TrialRuns`` starts a trial's run,
waits for runs to return, relays the running trials' progress and the pruner's verdicts, and reaps a
run's result.  ``RayTrialRuns`` does it on Ray: each trial on a pooled ``TrialActor``
(``search.pool.ActorPool``), the cluster's capacity read from Ray and the autoscaler's limits.  No
other module of the search driver calls Ray, so its unit tests hand the driver a fake ``TrialRuns``
instead of patching Ray (``tests/unit/test_search_driver.py``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import ray

from orchestrator.config.feasibility import capacity
from orchestrator.run.cluster_limits import read_limits
from orchestrator.run.ray_env import ensure_ray, stop_ray
from search.capacity import Capacity
from search.pool import ActorPool
from search.records import PendingTrial, RunningTrial
from search.trial import TrialResult, short_error

if TYPE_CHECKING:
    from search.pruning import Verdict

POLL_TIMEOUT_S = 30  # how long the driver waits for one trial actor's poll; an actor that died never answers


class TrialRuns(Protocol):
    """What the search driver asks of the place its trials run."""

    def connect(self, verbose: bool, runtime_env: dict[str, Any] | None) -> None:
        """Reach the cluster (start a local one if there is none); the trials' code is ``runtime_env``."""

    def capacity(self) -> Capacity:
        """What the cluster can ever hold (an autoscaling cluster counts what it can grow to)."""

    def start(self, p: PendingTrial, parent_run_id: str | None, tags: dict[str, str], watch: RunWatch) -> RunningTrial:
        """Start pending trial ``p``'s run as a child of MLflow run ``parent_run_id``."""

    def wait(self, running: Mapping[int, RunningTrial], timeout_s: float) -> set[int]:
        """Wait up to ``timeout_s`` for the runs of ``running``; the numbers of those that returned."""

    def poll(self, running: Mapping[int, RunningTrial]) -> dict[int, dict[str, Any]]:
        """What each running trial's run has to say since the last poll (``TrialActor.poll``); a trial
        whose actor does not answer is left out (its run's return reports it)."""

    def send_verdict(self, r: RunningTrial, verdict: Verdict) -> None:
        """Hand the pruner's verdict on ``r``'s values to its run."""

    def reap(self, r: RunningTrial) -> TrialResult:
        """The returned run's result; its actor is free again (one that died gives a FAILED result)."""

    def close(self) -> None:
        """End every trial's run still going (the driver is ending)."""

    def disconnect(self) -> None:
        """Leave the cluster ``connect`` reached (shut down a local one it started)."""


@dataclass(frozen=True)
class RunWatch:
    """What a trial's run is asked to watch: the ``metrics`` whose values it relays at each step,
    the ``judged`` ones it waits for the pruner's verdict on, and whether it ``keep_checkpoints``."""

    metrics: list[str]
    judged: list[str]
    keep_checkpoints: bool


class RayTrialRuns:
    """``TrialRuns`` on Ray: one pooled ``TrialActor`` per running trial, on the driver's node."""

    def __init__(self) -> None:
        self.pool = ActorPool()
        self.started_ray = False

    def connect(self, verbose: bool, runtime_env: dict[str, Any] | None) -> None:
        self.started_ray = ensure_ray(verbose, runtime_env=runtime_env)

    def capacity(self) -> Capacity:
        # what the cluster can ever hold: an autoscaling cluster may start with no workers at all
        return Capacity(capacity(ray.cluster_resources(), read_limits().max_resources))

    def start(self, p: PendingTrial, parent_run_id: str | None, tags: dict[str, str], watch: RunWatch) -> RunningTrial:
        actor = self.pool.get()
        ref = actor.run.remote(
            p.trial.number,
            p.cfg.model_dump(mode="json"),
            parent_run_id,
            tags,
            watch.metrics,
            watch.keep_checkpoints,
            watch.judged,
        )
        return RunningTrial.launched(p, actor, ref, time.time())

    def wait(self, running: Mapping[int, RunningTrial], timeout_s: float) -> set[int]:
        refs = [r.ref for r in running.values()]
        done, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        return {n for n, r in running.items() if r.ref in done}

    def poll(self, running: Mapping[int, RunningTrial]) -> dict[int, dict[str, Any]]:
        refs = {n: r.actor.poll.remote(n) for n, r in running.items()}
        answers: dict[int, dict[str, Any]] = {}
        for n, ref in refs.items():
            try:
                answers[n] = ray.get(ref, timeout=POLL_TIMEOUT_S)
            except Exception:
                continue  # the actor died: its run's ref reports it
        return answers

    def send_verdict(self, r: RunningTrial, verdict: Verdict) -> None:
        r.actor.verdict.remote(r.trial.number, verdict.step, verdict.stop)

    def reap(self, r: RunningTrial) -> TrialResult:
        try:
            result = TrialResult(**ray.get(r.ref))
        except Exception as e:  # the actor process died: it is killed, never reused
            self.pool.put(r.actor, healthy=False)
            return TrialResult(
                run_id=r.run_id,
                status="FAILED",
                stopped=False,
                steps=0,
                wall_s=time.time() - r.t0,
                worker_seconds=0.0,
                error=f"trial actor died: {short_error(e)}",
            )
        self.pool.put(r.actor)
        return result

    def close(self) -> None:
        self.pool.close()

    def disconnect(self) -> None:
        if self.started_ray:
            stop_ray()
