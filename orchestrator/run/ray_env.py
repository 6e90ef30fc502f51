"""Starting (or joining) Ray for a training run or a search.

Ray's own noise and background CPU are kept down (this machine's cores are the training's), and a local Ray reachable
from this machine only: its processes listen on 127.0.0.1, and it asks for Ray's token."""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import socket
from collections.abc import Callable, Iterator
from typing import Any

from orchestrator import interrupts
from orchestrator.run.reservations import PLACEMENT_WAIT_S
from trainers.errors import first_line

CONTROLLER_POLL_S = 0.5  # Ray Train's controller's poll of its workers (its default: 2 s)

_local_address = ""  # the GCS address of the local Ray this process started last (ensure_ray): one node


def quiet_ray_env(verbose: bool) -> None:
    """Set before Ray is imported/started: keep Ray's own log noise off the terminal."""
    os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
    if not verbose:
        os.environ.setdefault("RAY_DEDUP_LOGS", "1")
        os.environ.setdefault("RAY_TRAIN_ENABLE_STATE_TRACKING", "0")
        os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
        os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
        os.environ.setdefault("PYTHONWARNINGS", "ignore::DeprecationWarning,ignore::FutureWarning")


def quiet_libraries(verbose: bool) -> None:
    """Library chatter (MLflow's INFO lines: its database setup, its system-metrics monitor; its
    progress bars when the driver reads a run's artifacts back on resume; alembic's migrations; Ray's
    INFO lines) only when asked (``verbose``): the CLI and ``fit()`` call it."""
    if verbose:
        return
    # MLflow sets its loggers' level from this when it is imported (if after this call)
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # read at each download
    for name in ("mlflow", "alembic", "ray"):
        logging.getLogger(name).setLevel(logging.WARNING)


RAY_SINGLE_MACHINE_SWITCH = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
"""Ray's switch between its multi-node mode and its single-machine one (the default on macOS and
Windows), where the node's address is 127.0.0.1 and so every Ray server binds loopback only."""


def _is_loopback(address: str) -> bool:
    """Whether a Ray address (``host:port``) names this machine's loopback interface."""
    host = address.rsplit(":", 1)[0].strip("[]") if ":" in address and "://" not in address else ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@contextlib.contextmanager
def _single_machine_ray(active: bool = True) -> Iterator[None]:
    """Within this block a Ray started with ``ray.init`` is a single-machine one: the node address
    is 127.0.0.1, and the GCS, the raylet, Ray's agents and every worker process listen there only
    (in multi-node mode Ray turns even ``_node_ip_address="127.0.0.1"`` into the machine's network
    address, and its servers listen on all interfaces).  A driver that joins such a Ray
    (``RAY_ADDRESS=127.0.0.1:PORT``) needs the same mode, or Ray turns that address into the
    machine's network one, where nothing answers.

    Ray reads the switch (:data:`RAY_SINGLE_MACHINE_SWITCH`) when it is imported, which here is
    usually earlier (orchestrator.run.monitor imports ``ray`` at its top): the processes ``ray.init``
    starts get it from the environment (and hand it on to the workers they start), this process
    through Ray's constant; both are put back afterwards, so a later ``ray start`` from this
    process is not changed.  A value the user set is left alone."""
    if not active or os.environ.get(RAY_SINGLE_MACHINE_SWITCH) is not None:
        yield
        return
    try:
        from ray._private import ray_constants
    except ImportError:  # a Ray that moved its constants: the environment alone (read by the processes it starts)
        ray_constants = None
    has = ray_constants is not None and hasattr(ray_constants, "ENABLE_RAY_CLUSTER")
    old = ray_constants.ENABLE_RAY_CLUSTER if has else True
    os.environ[RAY_SINGLE_MACHINE_SWITCH] = "0"
    if has:
        ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        os.environ.pop(RAY_SINGLE_MACHINE_SWITCH, None)
        if has:
            ray_constants.ENABLE_RAY_CLUSTER = old


def _token_auth() -> None:
    """Ray's token authentication for a cluster started here (``RAY_AUTH_MODE=token``, what the
    cluster files start their nodes with), unless ``RAY_AUTH_MODE`` is set already.  Ray caches
    the mode when it is imported: it is read again here, as Ray does when it turns the token on by
    itself (Ray 2.60 does for a new local cluster; this keeps it on whatever a version's default)."""
    if os.environ.get("RAY_AUTH_MODE") is not None:
        return
    os.environ["RAY_AUTH_MODE"] = "token"
    try:
        from ray._raylet import Config

        Config.initialize("")
    except (ImportError, AttributeError):  # a Ray without that cache: its own default applies
        del os.environ["RAY_AUTH_MODE"]


def on_own_local_ray() -> bool:
    """Whether the Ray this process uses is a local one it started itself: one node (this machine's,
    the driver's), which no autoscaler grows, no provider drains and no other node's loss shrinks."""
    import ray

    return bool(_local_address) and ray.is_initialized() and ray.get_runtime_context().gcs_address == _local_address


def stop_ray() -> None:
    """Shut down the Ray this process started (not when ``ELASTIC_KEEP_RAY`` says to keep it: the tests' shared one)."""
    if not os.environ.get("ELASTIC_KEEP_RAY"):
        import ray

        from orchestrator.run.reservations import release_before_disconnect

        release_before_disconnect()  # a stopped run's groups end with this driver (orchestrator/run/reservations.py)
        ray.shutdown()


WORKER_POOL_ALARM = "PYTHON worker processes have been started on node"
"""Ray's warning that a node starts more worker processes at once than it has CPUs: a head without
CPUs (the driver's node) raises it for the driver-side actors of a search's parallel trials (each
trial's actor, Ray Train controller and monitor live there), which hold no CPU: not shown."""


def first_line_only(show: Callable[[dict, bool], Any]) -> Callable[[dict, bool], Any]:
    """``show`` (Ray's printer of what the cluster pushes to a driver) cut to the first line of each
    message of Ray's own processes: a lost node otherwise prints the dead raylet's last 20 log lines,
    and the driver says what it means for the run itself (a worker failed, the group restarts).
    Ray's alarm about a node's worker processes (:data:`WORKER_POOL_ALARM`) is not shown."""

    def short(data: dict, ignore_prefix: bool) -> Any:
        if data.get("pid") == "raylet":
            line = first_line("\n".join(str(text) for text in data.get("lines", [])), 200)
            if WORKER_POOL_ALARM in line:
                return None
            data = dict(data, lines=[line] if line else [])
        return show(data, ignore_prefix)

    short.first_line_only = True  # type: ignore[attr-defined]
    return short


def _quiet_cluster_errors() -> None:
    """Ray's driver prints each error message of the cluster in full from a thread of its own (it
    calls ``ray._private.worker.print_to_stdstream``, which has no setting): cut each to one line."""
    try:
        from ray._private import worker
    except ImportError:
        return
    if not hasattr(worker, "print_to_stdstream"):  # a Ray that moved its printer shows its messages whole
        return
    if not getattr(worker.print_to_stdstream, "first_line_only", False):
        worker.print_to_stdstream = first_line_only(worker.print_to_stdstream)


def ensure_ray(verbose: bool = False, num_cpus: int | None = None, runtime_env: dict[str, Any] | None = None) -> bool:
    """Join the cluster in ``RAY_ADDRESS`` (e.g. under ``ray job submit``) or start a local one.

    ``runtime_env`` (the user's code, orchestrator/config/code.py) becomes the job's runtime environment
    of a local cluster started here, so every actor (a search's trial actors too) inherits it.
    Returns True when this call started Ray (so the caller should shut it down).

    A local cluster is always a new one of this process (never a ``ray start`` cluster that happens
    to run on the machine: that one is named with ``RAY_ADDRESS``), on 127.0.0.1 only
    (:func:`_single_machine_ray`), with Ray's token authentication (``RAY_AUTH_MODE=token``, as the
    cluster files start their nodes; the token is ``~/.ray/auth_token``, made if missing) unless
    ``RAY_AUTH_MODE`` says otherwise."""
    quiet_ray_env(verbose)
    import ray

    if ray.is_initialized():
        return False
    level = logging.INFO if verbose else logging.ERROR
    kwargs: dict[str, Any] = dict(logging_level=level, log_to_driver=verbose, configure_logging=True)
    # Ray Train waits this long for a group's placement, then sizes the group anew from what the
    # cluster holds: its 60 s default is the pause a lost node costs when the restarted group was
    # first sized from a view of the cluster from before the loss (orchestrator/run/reservations.py)
    os.environ.setdefault("RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S", str(PLACEMENT_WAIT_S))
    # Ray Train's controller looks at its workers every RAY_TRAIN_HEALTH_CHECK_INTERVAL_S (2 s by
    # default): a group that ended (a resize's checkpoint, the planned end, a stop) is seen that much
    # later, at every phase end; a poll is one small call to each worker
    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", str(CONTROLLER_POLL_S))
    # Ray Train's preemption watcher (an actor per group, polling the nodes' drains every 5 s) only
    # feeds ray.train.get_preemption_info(), which the loop does not read: the driver watches the
    # drains itself and leaves a drained node by a planned resize (orchestrator/run/drains.py).  Off
    # on every cluster, joined or local (~10% of training throughput on 2 cores); a user's own train
    # function that reads it sets RAY_TRAIN_ENABLE_PREEMPTION_WATCHER=1.
    os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")
    address = os.environ.get("RAY_ADDRESS")
    if address:
        with _single_machine_ray(active=_is_loopback(address)), interrupts.through_ray_init():
            ray.init(**kwargs)  # a local Ray started as below: _single_machine_ray
    else:
        # Without a dashboard nothing reads Ray's own metrics: their collection is CPU for nothing.
        os.environ.setdefault("RAY_enable_metrics_collection", "0")
        if not verbose:
            # Ray's log monitor re-lists the session's log folder ten times a second; each fit()
            # adds ~18 files, so its CPU grows run after run (a search on one Ray: 1% of this
            # machine after 6 runs).  Worker logs are not streamed to us here: list every 5 s.
            os.environ.setdefault("RAY_LOG_MONITOR_MANY_FILES_THRESHOLD", "0")
            os.environ.setdefault("LOG_NAME_UPDATE_INTERVAL_S", "5")
        if runtime_env:
            kwargs["runtime_env"] = runtime_env
        _token_auth()
        with _single_machine_ray(), interrupts.through_ray_init():
            ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, **kwargs)
        global _local_address
        _local_address = ray.get_runtime_context().gcs_address
    if not verbose:
        _quiet_cluster_errors()
        for name in ("ray", "ray.train", "ray.tune", "ray.data"):
            logging.getLogger(name).setLevel(logging.ERROR)
    return True


def dashboard_running() -> bool:
    """Whether Ray Train's ``PlacementGroupCleaner`` asks this Ray about the group's controller.  The
    cleaner, a detached actor that each group starts, asks Ray's State API (served by a dashboard)
    every second whether the controller still lives, and removes the group's placement group when the
    answer is no.  It finds its cluster as any process of the machine without ``RAY_ADDRESS`` does: the
    newest Ray started on the machine (``/tmp/ray/ray_current_cluster``), then that Ray's dashboard
    address.  Without a dashboard (``ray.init(..., include_dashboard=False)``, the orchestrator's own
    local Ray) every ask fails and it never cleans; where another Ray answers (a second Ray on the
    machine, or another Ray's dashboard on this one's port, also one started after the group) the
    controller is unknown there, and it removes the placement group of a group that is training
    ("placement group was removed").  True only where the machine's newest Ray is this one and its
    dashboard knows this node; False wherever that cannot be told (an ask that timed out under load,
    an address Ray no longer keeps): without the cleaner, a killed driver's placement groups still end
    with its job (Ray scopes them to it)."""
    try:
        import ray
        from ray._private import ray_constants  # Ray's private names of the dashboard's GCS entry
        from ray._private.services import find_bootstrap_address
        from ray.experimental.internal_kv import _internal_kv_get
        from ray.util.state import get_node

        if not ray.is_initialized():
            return False
        context = ray.get_runtime_context()
        if find_bootstrap_address(None) != context.gcs_address:
            return False  # the cleaner would ask another Ray
        url = _internal_kv_get(ray_constants.DASHBOARD_ADDRESS, namespace=ray_constants.KV_NAMESPACE_DASHBOARD)
        host, _, port = url.decode().rpartition(":")
        with socket.create_connection((host.strip("[]"), int(port)), timeout=1.0):
            pass
        return get_node(context.get_node_id(), address=context.gcs_address, timeout=5) is not None
    except Exception as e:  # nothing listens, a timeout, a Ray that moved its entry: not known to be ours
        logging.getLogger(__name__).debug("could not tell whether Ray's dashboard answers: %s", e)
        return False
