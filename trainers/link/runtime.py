"""What the driver tells every worker of a phase besides the config (``train_loop_config["runtime"]``):
where the monitor actor is, which phase this is, where checkpoints go.

See ``docs/architecture.md`` (the driver <-> worker link)."""

from __future__ import annotations

from pydantic import BaseModel


class Runtime(BaseModel):
    """What the driver tells the workers besides the config."""

    monitor_name: str | None = None  # the run's monitor actor (orchestrator/run/monitor.py); None: no driver
    namespace: str | None = None
    phase: int = 0
    workers: int = 1  # what the phase asked for (Ray may run fewer after a failure)
    handover: bool = False  # started early (an overlapping resize): restore the old group's last checkpoint
    storage: str = ""  # checkpoint storage and the training run's folder prefix there (all phases)
    run_prefix: str = ""
    run_name: str = ""  # this phase's Ray Train run (a folder under ``storage``)
    # Metrics the driver judges before the run may go far past them (a pruned search trial's
    # objective): rank 0 pushes a record that carries one at once, and at the next such record
    # waits for the verdict on the previous one (trainers/link/channel.py), so a condemned run
    # stops within one evaluation interval of the step it was judged at.
    judged_metrics: list[str] = []
    # ``scaling.policy: goodput`` (a driver's section the workers' config lacks): the loop measures
    # step times and the noise scale and asks the driver every batch.check_every steps.
    goodput: bool = False
    # Which nodes the driver samples itself (orchestrator/record/system_metrics.py): its own machine
    # (MLflow's monitor, ``system/<metric>``) on ``driver_node``, and with ``nodes_sampled`` every node
    # of the group (``system/<host>-<node id>/<metric>``).  Rank 0 sends its node's figures only
    # where neither does (a search trial on a node of its own), so each node is logged once.
    driver_node: str = ""
    nodes_sampled: bool = False

    def sends_system_metrics(self, node: str) -> bool:
        """Whether rank 0, on Ray node ``node``, sends its node's system metrics (no one else logs them)."""
        return not self.nodes_sampled and node != self.driver_node

    def judges(self, metrics: dict[str, float]) -> bool:
        """Whether a step's ``metrics`` carry a value the driver judges (the same on every rank)."""
        return any(k in metrics for k in self.judged_metrics)
