"""Ray Train's view of the cluster, kept true: a killed driver's reservations dropped when its run
resumes, the nodes re-read when they change, a placement that cannot happen given up in 10 s.

An elastic group (``min_workers < max_workers``) reserves its resources through Ray's
AutoscalingCoordinator, a detached actor shared by every run on the cluster: the reservation is
renewed every 20 s while the group's Ray Train controller lives and dropped when the controller
ends.  A driver killed outright (SIGKILL, an OOM kill, a lost head process) takes its controller
with it before the controller can drop it, and the reservation stays for Ray's expiry, 180 s.  A
``resume`` started meanwhile finds the cluster reserved to a run that no longer exists and waits
("ready resources for 0 workers") for up to three minutes.

So every group's Ray Train run id is recorded on the MLflow run (tag ``elastic.ray_train_runs``), and ``resume`` drops
the reservations of those ids before its first group starts.

A driver that stops (Ctrl-C, SIGTERM, a drain of its own node, an error) leaves before its groups'
controllers have shut down, and they die with it: each reservation stayed for those 180 s, and the
next run on the cluster, with room, waited for it (~100 s seen in the suite after a stopped run).
So the driver drops the reservations of its groups whose ``fit()`` had not returned
(:func:`release_unfinished`), and once more as it leaves Ray (:func:`release_before_disconnect`):
a controller still shutting down renews its reservation every 20 s.

The coordinator also sizes a restarted group: it re-reads the cluster's nodes every 20 s, so right
after a node is lost Ray Train may size the new group for the lost node too and wait for a
placement that cannot happen.  Ray Train's controller asks it to re-read the nodes as it sees a
worker fail (:func:`refresh` without a wait, from the run's ``FailureNotice``), before it sizes the
new group; the driver asks again (:func:`refresh`) as soon as it sees the set of live nodes change
(a node declared dead only after the restart was sized), and Ray Train gives up on such a placement after
:data:`PLACEMENT_WAIT_S` (its own default, 60 s, is the pause a lost node cost) to size it anew.

The coordinator is Ray's own (it has no public API); where it cannot be reached, runs only wait as
they would have.
"""

from __future__ import annotations

import logging
from typing import Any

KEEP = 4  # an overlap resize has two groups alive at once; a few more cost nothing
_COORDINATOR = ("AutoscalingCoordinator", "AutoscalingCoordinator")  # Ray's actor name and namespace
# Ray Train's wait for a group's placement group (resources that are there are placed at once);
# a user's RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S wins (orchestrator/run/ray_env.py)
PLACEMENT_WAIT_S = 10

log = logging.getLogger(__name__)


def ray_train_run_id(trainer: Any) -> str | None:
    """The run id Ray Train gives the group of ``trainer`` (a TorchTrainer, before ``fit()``)."""
    ctx = getattr(trainer, "train_run_context", None)
    return getattr(ctx, "run_id", None)


def recorded(earlier: str | None, new: str) -> str:
    """The tag's value once ``new`` joins the ids recorded before (``earlier``), newest last."""
    ids = [i for i in (earlier or "").split() if i != new] + [new]
    return " ".join(ids[-KEEP:])


def _coordinator() -> Any:
    import ray

    try:
        return ray.get_actor(_COORDINATOR[0], namespace=_COORDINATOR[1])
    except ValueError:  # no elastic group has run on this cluster since it started: nothing reserved
        return None


def refresh(timeout_s: float | None = 5.0) -> bool:
    """Have the coordinator re-read the cluster's live nodes now; whether its view is current (also
    when there is no coordinator yet: it reads the nodes when it is made).  ``timeout_s=None``: ask
    without waiting (Ray Train's controller, as it sees a worker fail: calls from one process to the
    coordinator, a threaded actor, run in order, so the controller's own ask for the restarted
    group's size comes after the re-read; a node Ray has declared dead by then is not counted)."""
    import ray

    if not ray.is_initialized():
        return False
    if (coordinator := _coordinator()) is None:
        return True
    try:
        asked = coordinator.get_reserved_resources.remote("elastic-refresh", recompute=True)
        if timeout_s is not None:
            ray.get(asked, timeout=timeout_s)
    except Exception as e:  # Ray's private actor changed or is slow: it re-reads within 20 s anyway
        log.debug("could not refresh Ray's view of the nodes: %s", e)
        return False
    return True


def release(tag_value: str | None, timeout_s: float = 10.0) -> int:
    """Drop the coordinator's reservations of the Ray Train runs in ``tag_value``; how many ids
    were asked for (0 without ids, without Ray or without a coordinator on this cluster)."""
    ids = (tag_value or "").split()
    if not ids:
        return 0
    import ray

    if not ray.is_initialized() or (coordinator := _coordinator()) is None:
        return 0
    try:
        ray.get([coordinator.cancel_request.remote(requester_id=f"train-{i}") for i in ids], timeout=timeout_s)
    except Exception as e:  # Ray's private actor changed or is slow: the reservations expire anyway
        log.debug("could not drop the reservations of %s: %s", ids, e)
        return 0
    return len(ids)


_unfinished: list[str] = []  # this process's groups whose fit() had not returned when their run ended


def release_unfinished(ids: list[str]) -> int:
    """Drop now the reservations of ``ids``, groups of this driver whose ``fit()`` had not returned
    when its run ended, and remember them for :func:`release_before_disconnect`."""
    _unfinished.extend(i for i in ids if i not in _unfinished)
    return release(" ".join(ids))


def release_before_disconnect() -> int:
    """Drop again the reservations of :func:`release_unfinished`'s groups, the driver about to leave
    Ray (their controllers end with it): one renewed since is not left behind."""
    ids = " ".join(_unfinished)
    _unfinished.clear()
    return release(ids)
