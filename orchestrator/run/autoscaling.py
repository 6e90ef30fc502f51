"""On an autoscaling cluster: ask for the run's nodes before the run needs them, keep the ones a resize
will use, and let them go when W shrinks and when the run ends.

Left to itself, a run on an autoscaling cluster asks for nothing ahead: a resize's new group is what
asks (its placement group, or Ray Train's requests for an elastic group), so the nodes are launched
only once it starts; an elastic group then starts on the nodes already up, small, and grows by a
second restart once the rest joined; and each restart lets go of the old group's nodes, which the
autoscaler removes as idle and launches again for the new group.

What :class:`NodeSupply` does instead (``scaling.request_ahead``, on by default):

* **The request.**  ``ray.autoscaler.sdk.request_resources(bundles=[worker] * n)`` (Ray's public API) is
  a floor on the cluster's size: the autoscaler launches nodes until ``n`` workers' bundles fit the
  cluster's total resources and removes none that the floor needs, used or idle.  Each call
  *replaces* the previous one, and the cluster has one such slot, which Ray Train's
  AutoscalingCoordinator writes too (every group's controller registers its group with it; it sends
  the groups' needs every 20 s and whenever a controller starts or ends), so the driver always sends
  its whole need (:class:`NodeNeed`), again every :data:`RESEND_S` while a change is under way, and
  withdraws it (``bundles=[]``) when the run ends, however it ends.  Between the coordinator's write and
  the driver's next one (at most :data:`RESEND_S`) the floor is the groups' alone: an idle node the
  run asked for ahead is removed if the autoscaler looks just then and the node has been idle past
  its timeout, so the run asks ahead by at most half the idle timeout.
* **The need.**  The group in force; from a decided resize on, its new group too (``overlap``: both
  at once; ``restart``: the new group alone, which takes over the old group's nodes); from the
  handover on, the new group alone: a smaller one leaves nodes idle, which the autoscaler removes.
* **Ahead of the decision.**  Where the batch plan knows when W grows (a batch that is a function of
  the epoch: ``fixed``, ``schedule``, ``ramp``, ``seesaw``: trainers/policies/plan.py ``workers_ahead``),
  the bigger group's nodes are asked for once the run, at its measured pace, is a node's launch time
  (:meth:`NodeSupply.lead_s`) from the epoch at which B outgrows the group.  A batch that is measured
  (the noise scale's, the norm test's) is known only when it changes: its nodes are asked for at the
  decision.
* **No group started small.**  A group starts once the live nodes have room for it, waiting at most
  ``scaling.node_wait_s`` for the nodes asked for it (a node's launch time plus a margin), then starts
  with what is there; an overlap's old group trains on meanwhile.  The coordinator is asked to re-read
  the nodes just before an elastic group starts (orchestrator/run/reservations.py), so the group is
  sized on the nodes that came.
* **An overlap only where the autoscaler can hold both groups** (:func:`room_to_grow`): the limits
  read in orchestrator/run/cluster_limits.py, less what the cluster has now.

Not done: a search's trials (each its own driver) ask nothing ahead, since one trial's request would
replace another's; a driver killed outright (SIGKILL) leaves its floor in place until another request
replaces it (``resume`` does, and withdraws it at its end).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Mapping
from functools import partial

import ray

from orchestrator.config.schema import ScalingConfig
from orchestrator.record.events import OverlapFellBack, ResizeCalledOff, ResizeHandedOver
from orchestrator.record.listeners import RunListener
from orchestrator.run.cluster_limits import ClusterLimits
from orchestrator.run.resizing import has_room
from trainers.link import metrics as M
from trainers.link.messages import Event, FirstStep, Record, ResizeDecided, ResizeSkipped

log = logging.getLogger(__name__)

# While a change is under way the need goes out again this often: Ray Train's AutoscalingCoordinator
# writes the same slot (every 20 s, and whenever a group's controller starts or ends) with its own
# groups' needs only, and a node the floor no longer covers is removed once idle past the timeout.
RESEND_S = 0.5
LAUNCH_GUESS_S = 120.0  # a node's launch time until one is measured here (cloud VMs: 1-5 min)
LEAD_MARGIN_S = 10.0  # asked this much earlier than a node's launch time
PACE_WINDOW_S = 60.0  # the run's pace (epochs per second) over its records of this last stretch
LOOK_EVERY_S = 2.0  # how often the plan is asked what the run will need a launch time from now


def bundles(per_worker: Mapping[str, float], workers: int) -> list[dict[str, float]]:
    """The bundles of ``workers`` workers of ``per_worker`` resources each."""
    return [dict(per_worker) for _ in range(max(int(workers), 0))]


def request_resources(bundle_list: list[dict[str, float]]) -> None:
    """Ray's public request to the autoscaler (replaces the cluster's previous one; ``[]`` withdraws)."""
    from ray.autoscaler.sdk import request_resources as ask  # Ray's autoscaler SDK: only on an autoscaling cluster

    ask(bundles=bundle_list)


def room_to_grow(max_resources: Mapping[str, float]) -> dict[str, float]:
    """What the autoscaler can still add (its limits less what the cluster has now), per resource."""
    total = ray.cluster_resources()
    return {k: max(0.0, float(v) - float(total.get(k, 0.0))) for k, v in max_resources.items()}


class NodeNeed:
    """How many workers' nodes the run needs now: the group in force (``current``, the workers its
    phase asked for), and a resize's new group (``upcoming``) from its decision (or from when the plan
    foresaw it) until its handover; with ``overlap`` both groups at once."""

    def __init__(self) -> None:
        self.current = 0
        self.upcoming = 0
        self.overlap = False

    @property
    def workers(self) -> int:
        if not self.upcoming:
            return self.current
        return self.current + self.upcoming if self.overlap else self.upcoming

    def start(self, workers: int) -> None:
        """The run's first group asks for ``workers``."""
        self.current, self.upcoming, self.overlap = int(workers), 0, False

    def decided(self, to: int, mode: str) -> None:
        """A resize to ``to`` workers was decided (``overlap`` or ``restart``)."""
        self.upcoming, self.overlap = int(to), mode == "overlap"

    def handed_over(self, to: int) -> None:
        """The new group of ``to`` workers took over: the old group's nodes it does not use may go."""
        self.current, self.upcoming, self.overlap = int(to), 0, False

    def dropped(self) -> None:
        """No new group after all (called off, skipped)."""
        self.upcoming, self.overlap = 0, False


class Pace:
    """The run's pace in epochs per second, from the ``(time, epoch)`` of its records over the last
    :data:`PACE_WINDOW_S`; and the latest epoch and global batch."""

    def __init__(self) -> None:
        self.points: deque[tuple[float, float]] = deque()
        self.epoch: float | None = None
        self.batch: int | None = None

    def observe(self, records: list[Record]) -> None:
        for _step, metrics, t, *_ in records:
            if M.EPOCH in metrics:
                self.epoch = float(metrics[M.EPOCH])
                self.points.append((float(t), self.epoch))
            if M.BATCH_GLOBAL in metrics:
                self.batch = int(metrics[M.BATCH_GLOBAL])
        while len(self.points) > 2 and self.points[-1][0] - self.points[0][0] > PACE_WINDOW_S:
            self.points.popleft()

    def epochs_per_s(self) -> float | None:
        if len(self.points) < 2:
            return None
        (t0, e0), (t1, e1) = self.points[0], self.points[-1]
        return (e1 - e0) / (t1 - t0) if t1 > t0 and e1 > e0 else None


class NodeSupply:
    """The run's requests to the autoscaler and its waits for nodes (see the module docstring).

    ``active`` only on an autoscaling cluster with ``scaling.request_ahead``; inactive, every method
    does what a run did before (no request, the waits of a fixed cluster).  ``scaling``: the run's
    section (a worker's resources, the node wait, the resize mode); ``limits``: what
    orchestrator/run/cluster_limits.py read; ``ahead``: the plan's workers at a later epoch
    (:func:`~trainers.policies.plan.workers_ahead` of the config; ``None``: nothing foreseen);
    ``send``: Ray's request (replaced in tests)."""

    def __init__(
        self,
        scaling: ScalingConfig | None = None,
        limits: ClusterLimits | None = None,
        ahead: Callable[[float, int, int], int | None] | None = None,
        send: Callable[[list[dict[str, float]]], None] = request_resources,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limits = limits or ClusterLimits()
        self.active = bool(scaling is not None and scaling.request_ahead and self.limits.autoscaling)
        self.per_worker = scaling.per_worker() if scaling is not None else {}
        self.wait_s = scaling.node_wait_s if scaling is not None else 0.0
        self.overlap_mode = scaling is not None and scaling.resize_mode == "overlap"
        self.send, self.clock = send, clock
        self.ahead = ahead
        self.need = NodeNeed()
        self.pace = Pace()
        self.launch_s: float | None = None  # a node's launch time, as measured here
        self.sent: int | None = None  # the workers' bundles last sent (None: nothing sent yet)
        self._sent_at = -float("inf")
        self._settled = True  # no change under way: nothing to send again
        self._looked = -float("inf")
        self.foreseen = 0  # workers the plan foresaw (asked for ahead of the decision)

    # -- the request ---------------------------------------------------------------------------------

    def _send(self, force: bool = False) -> None:
        if not self.active:
            return
        n = self.need.workers
        if n == self.sent and not force:
            return
        try:
            self.send(bundles(self.per_worker, n))
        except Exception as e:  # the autoscaler's slot could not be written: the run only waits longer
            log.debug("request_resources of %d workers failed: %s", n, e)
            return
        self.sent, self._sent_at = n, self.clock()

    def starting(self, workers: int) -> None:
        """The run's first group asks for ``workers``: ask for their nodes."""
        self.need.start(workers)
        self._settled = False
        self._send()

    def resend(self) -> None:
        """Every poll: while a change is under way, send the need again every :data:`RESEND_S`;
        and ask the plan whether the run will outgrow its group within a node's launch time."""
        if not self.active:
            return
        now = self.clock()
        if not self._settled and now - self._sent_at >= RESEND_S:
            self._send(force=True)
        if now - self._looked >= LOOK_EVERY_S:
            self._looked = now
            self._foresee()

    def withdraw(self) -> None:
        """The run ended (however): no floor of its own left on the cluster."""
        if self.active and self.sent:
            self.need = NodeNeed()
            self._settled = True
            self._send(force=True)

    # -- what the run said -----------------------------------------------------------------------------

    def on_event(self, ev: Event) -> None:
        if isinstance(ev, ResizeDecided):
            if not ev.mode:  # the group stays as it is
                return
            self.need.decided(ev.workers, ev.mode)
        elif isinstance(ev, ResizeSkipped):
            self.need.dropped()
        elif isinstance(ev, OverlapFellBack):
            self.need.overlap = False
        elif isinstance(ev, ResizeCalledOff):
            self.need.dropped()
        elif isinstance(ev, ResizeHandedOver):
            self.need.handed_over(ev.resize.to)
        elif isinstance(ev, FirstStep):
            if not self.need.upcoming:
                self._settled = True  # the group the need was for trains: its placement holds its nodes
            return
        else:
            return
        self.foreseen = 0
        self._settled = False
        self._send()

    def _foresee(self) -> None:
        """Ask ahead for the nodes of a bigger group the plan foresees within a node's launch time."""
        pace, need = self.pace, self.need
        if self.ahead is None or need.upcoming or pace.epoch is None or pace.batch is None or not need.current:
            return
        rate = pace.epochs_per_s()
        if rate is None:
            return
        try:
            wanted = self.ahead(pace.epoch + rate * self.lead_s(), pace.batch, need.current)
        except Exception as e:  # the forecast is a help only: the decision still asks
            log.debug("could not foresee the workers ahead: %s", e)
            self.ahead = None
            return
        if wanted is None:
            self.ahead = None  # a measured batch or goodput: only the decision tells
            return
        if wanted > need.current and wanted != self.foreseen:
            self.foreseen = wanted
            both = self.overlap_mode and self._room_for_both(need.current, wanted)
            need.decided(wanted, "overlap" if both else "restart")
            self._settled = False
            self._send()

    def _room_for_both(self, current: int, to: int) -> bool:
        limits = self.limits.max_resources
        if not limits:
            return False
        return has_room(limits, self.per_worker, current + to)

    def lead_s(self) -> float:
        """How long before it needs them the run asks for a bigger group's nodes: a node's launch
        time as measured here (or :data:`LAUNCH_GUESS_S`), and :data:`LEAD_MARGIN_S`; but not more
        than half the autoscaler's idle timeout, so a node that came early is not idle past it
        (the floor keeps it, but Ray Train's coordinator replaces the floor now and then)."""
        launch = self.launch_s if self.launch_s is not None else LAUNCH_GUESS_S
        idle = self.limits.idle_timeout_s
        return min(launch + LEAD_MARGIN_S, idle / 2) if idle else launch + LEAD_MARGIN_S

    def launched_in(self, seconds: float) -> None:
        """The nodes asked for took ``seconds`` to come (the first group's, at the run's start)."""
        self.launch_s = seconds if self.launch_s is None else max(self.launch_s, seconds)

    # -- waits -------------------------------------------------------------------------------------------

    def room_wait_s(self, otherwise: float) -> float:
        """How long a new group waits for room: ``scaling.node_wait_s`` for the nodes asked for it, or
        ``otherwise`` (a fixed cluster: the old group's resources being freed)."""
        return max(self.wait_s, otherwise) if self.active else otherwise

    def grow_room(self) -> Callable[[], dict[str, float]] | None:
        """For the monitor (an overlap's room): what the autoscaler can still add; None where it is not
        known or nothing is asked ahead (then an overlap needs the room there now)."""
        if not self.active or not self.limits.max_resources:
            return None
        return partial(room_to_grow, dict(self.limits.max_resources))


class NodeSupplyListener(RunListener):
    """What the run's records and events tell :class:`NodeSupply`; its request is withdrawn when
    the run is over (``close``, whatever the outcome)."""

    def __init__(self, supply: NodeSupply) -> None:
        self.supply = supply

    def on_records(self, records: list[Record]) -> None:
        self.supply.pace.observe(records)

    def on_event(self, event: Event) -> None:
        self.supply.on_event(event)

    def close(self) -> None:
        self.supply.withdraw()
