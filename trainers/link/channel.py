"""Rank 0's side of the link to the driver's monitor (orchestrator/run/monitor.py).

Rank 0 buffers ``(step, metrics, time)`` records and events and pushes them about every
``train.push_every_s``; the push answers with the driver's :class:`PushAnswer`, which rank 0
reads at the next flush, so the training loop never waits on the driver.  Other ranks do not
talk to the monitor; the loop broadcasts rank 0's decisions to them (trainers/link/agreement.py).
Records the driver has not yet confirmed it logged ride in each checkpoint (:meth:`Channel.state_dict`),
so a driver killed before logging them gets them again on resume.

A run whose driver judges some metrics (a pruned search trial: ``Runtime.judged_metrics``) gates
on the verdicts: at each push that carries a judged value, rank 0 first waits until the driver has
judged the previous one (``PushAnswer.judged``), so a run the driver condemns at step N stops at the
next judged step at the latest (one evaluation interval), however fast it trains.  See
``docs/architecture.md``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Protocol

from trainers.link.messages import Event, HandoverAnswer, PushAnswer, Record, ResizeAnswer, record_from_list

VERDICT_POLL_S = 0.02  # how often rank 0 asks for a verdict it waits for
VERDICT_WAIT_S = 120.0  # the longest it waits for one (a driver that no longer answers: train on)


class MonitorGone(Exception):
    """The driver's monitor actor is gone: its driver stopped (it kills the monitor last, once it
    stopped waiting for the group) or died.  Nothing will read this group's records again."""


class MonitorCalls(Protocol):
    """How rank 0 reaches the monitor: the one seam between the channel and Ray (a unit test gives
    one that calls a ``MonitorState`` directly)."""

    def send(self, method: str, *args: Any) -> Any:
        """Call the monitor's ``method`` without waiting; what :meth:`answer` takes."""
        ...

    def answer(self, pending: Any) -> Any:
        """Wait for the answer to a call :meth:`send` made; :class:`MonitorGone` when the monitor
        is gone."""
        ...


class RayMonitor:
    """The monitor as a named Ray actor (the product's :class:`MonitorCalls`)."""

    def __init__(self, name: str, namespace: str | None) -> None:
        import ray

        self._ray = ray
        self._actor = ray.get_actor(name, namespace=namespace)

    def send(self, method: str, *args: Any) -> Any:
        return getattr(self._actor, method).remote(*args)

    def answer(self, pending: Any) -> Any:
        try:
            return self._ray.get(pending)
        except self._ray.exceptions.RayActorError as e:  # died, or its node is unreachable
            raise MonitorGone(str(e).splitlines()[0] if str(e) else type(e).__name__) from e


class Channel:
    """Rank 0's buffered channel; on other ranks (or without a monitor) every call is a no-op
    (``flush`` returns False, ``ask_resize`` keeps the group)."""

    def __init__(
        self,
        monitor_name: str | None,
        namespace: str | None,
        enabled: bool,
        judged: Sequence[str] = (),
        monitor: MonitorCalls | None = None,
        system: bool = True,
    ) -> None:
        """Rank 0 (``enabled``) reaches the monitor actor ``monitor_name`` through Ray, or through
        ``monitor`` where one is given; with ``system`` it sends its node's system metrics too
        (False where the driver samples that node itself: :meth:`Runtime.sends_system_metrics`)."""
        self._monitor = monitor
        self._system: Any = None  # the node's system metrics, sent with the records (trainers/link/system.py)
        if monitor is None and enabled and monitor_name:
            from trainers.link.system import SystemSampler

            self._monitor = RayMonitor(monitor_name, namespace)
            self._system = SystemSampler() if system else None
        self._records: list[Record] = []
        # Unconfirmed records (and always the newest one): they ride in each checkpoint.
        self._unacked: list[Record] = []
        self._events: list[Event] = []
        self._pending: Any = None  # the ObjectRef of the push in flight
        self._stop = False
        self._handover = False
        self._handover_to = 0  # the workers of the group that takes over (0: unknown here)
        self._judged_metrics = tuple(judged)  # values the driver judges before the run may go on
        self._awaiting = -1  # the step of the last judged value pushed (its verdict may be out)
        self._judged = -1  # the driver has judged every value up to this step

    # -- records and events -------------------------------------------------------------------

    def log(self, step: int, metrics: dict[str, float], when: float | None = None) -> None:
        """Buffer a step's metrics; ``when`` (default: now) becomes the rows' MLflow timestamp."""
        if self._monitor is not None:
            record = (step, metrics, time.time() if when is None else when)
            self._records.append(record)
            self._unacked.append(record)

    def emit(self, event: Event) -> None:
        """Buffer an event for the next push."""
        if self._monitor is not None:
            self._events.append(event)

    # -- checkpoint state ---------------------------------------------------------------------

    def pending(self) -> list[list]:
        """Unconfirmed records as plain lists ``[step, metrics, time]`` (checkpoint-safe)."""
        return [[s, dict(m), t] for s, m, t in self._unacked]

    def replay(self, records: Sequence[Sequence[Any]]) -> None:
        """Send records restored from a checkpoint again; the driver drops what it already has.
        Records of checkpoints written before records carried their time (``[step, metrics]``)
        get the time of the replay."""
        for row in records:
            self.log(*record_from_list(row))

    def state_dict(self) -> dict[str, Any]:
        """The checkpoint's share of the channel: the records the driver has not confirmed."""
        return {"pending_metrics": self.pending()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.replay(state.get("pending_metrics", []))

    # -- answers --------------------------------------------------------------------------------

    def receive(self, answer: PushAnswer) -> None:
        """Take in the monitor's answer to a push (a stop is never taken back)."""
        self._stop = answer.stop or self._stop
        self._handover, self._handover_to = answer.handover, answer.to
        self._judged = max(self._judged, answer.judged)
        if self._unacked and answer.acked >= 0:
            # The newest record stays even once logged: restored with a checkpoint, it gives the
            # driver's piecewise metrics (orchestrator/record/run_tracker.py) the point where training resumes.
            self._unacked = [r for r in self._unacked if r[0] > answer.acked] or self._unacked[-1:]

    @property
    def handover(self) -> bool:
        """The new group is ready: checkpoint and end this one (an overlapping resize)."""
        return self._handover

    @property
    def handover_to(self) -> int:
        """With :attr:`handover`, the workers of the group that takes over (as the driver said)."""
        return self._handover_to

    def flush(self, wait: bool = False) -> bool:
        """Send what is buffered; return the latest stop decision known to rank 0 (a monitor that
        is gone is a stop: :meth:`_answer`)."""
        monitor = self._monitor
        if monitor is None:
            return self._stop
        if self._pending is not None:
            answer, self._pending = self._answer(self._pending), None
            if answer is None:
                return self._stop
            self.receive(answer)
        if self._system is not None and self._records and self._system.due():
            self._records[-1][1].update(self._system.sample())
        judged = max((s for s, m, _ in self._records if any(k in m for k in self._judged_metrics)), default=-1)
        if self._records or self._events or wait:
            self._pending = monitor.send("push", self._records, self._events)
            self._records, self._events = [], []
            if wait:
                answer, self._pending = self._answer(self._pending), None
                if answer is None:
                    return self._stop
                self.receive(answer)
        if judged >= 0 and not wait:  # (a last push, wait=True, ends the group anyway)
            self._await_verdict()
            self._awaiting = judged
        return self._stop

    def _answer(self, pending: Any, gone: Any = None) -> Any:
        """The answer to ``pending``.  Where the monitor is gone (its driver stopped without waiting
        for this group, or died), rank 0 stops here as the driver would have told it: the channel
        closes (its later calls are no-ops), the loop ends at a checkpoint, and the group returns
        instead of failing (Ray Train would restart a failed group for a driver that is no longer
        there); ``gone`` is returned."""
        monitor = self._monitor
        if monitor is None:
            return gone
        try:
            return monitor.answer(pending)
        except MonitorGone as e:
            print(f"[elastic] the driver's monitor is gone ({e}): this group stops at a checkpoint", flush=True)
            self._monitor, self._system, self._pending, self._stop = None, None, None, True
            self._records, self._events = [], []
            return gone

    def _await_verdict(self) -> None:
        """Called at a push that carries a judged value: wait until the driver has judged the
        previous one (or stopped the run); the push just sent brings its answer first."""
        deadline = time.monotonic() + VERDICT_WAIT_S
        while not self._stop and self._judged < self._awaiting:
            monitor = self._monitor
            if monitor is None:
                return
            if self._pending is None:
                if time.monotonic() > deadline:
                    return
                time.sleep(VERDICT_POLL_S)
                self._pending = monitor.send("push", [], [])
            answer, self._pending = self._answer(self._pending), None
            if answer is not None:
                self.receive(answer)

    # -- resizes ----------------------------------------------------------------------------------

    def ask_resize(
        self,
        step: int,
        batch_size: int,
        workers: int,
        remaining_samples: float | None = None,
        samples_per_s: float | None = None,
        inputs: Any = None,
    ) -> ResizeAnswer:
        """The batch changed (or goodput's periodic question): the workers the driver wants now (0 =
        keep the group), and how; the samples training has left and its measured throughput let the
        driver judge whether a resize pays; ``inputs``: goodput's measurements
        (:class:`~trainers.policies.goodput.GoodputInputs`), whose answer may carry a new batch."""
        self.flush()
        monitor = self._monitor
        if monitor is None:
            return ResizeAnswer()
        return self._answer(
            monitor.send("on_batch_change", step, batch_size, workers, remaining_samples, samples_per_s, inputs),
            ResizeAnswer(),
        )

    def handed_over(self, phase: int, step: int, path: str) -> None:
        """This group (of ``phase``) wrote its last checkpoint, at ``path``, and is ending."""
        monitor = self._monitor
        if monitor is not None:
            self._answer(monitor.send("handed_over", phase, step, path))

    def await_handover(self, phase: int, poll_s: float = 0.02) -> str | None:
        """A new group started early: say it is ready, then wait for the old group's last
        checkpoint; its path, or None when the resize was called off (or the monitor is gone)."""
        monitor = self._monitor
        assert monitor is not None, "a group started early has a monitor"
        self._answer(monitor.send("ready", phase))
        while self._monitor is not None:
            answer: HandoverAnswer | None = self._answer(monitor.send("handover", phase))
            if answer is not None and answer.decided:
                return answer.path
            time.sleep(poll_s)
        return None
