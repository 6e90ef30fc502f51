"""What the cluster can hold: a trial's resource needs and the CPUs/GPUs running trials hold.

A trial holds, at its largest, ``scaling.max_workers`` times each worker's CPUs (and GPUs): its run
may resize up to that many workers, so the driver books the maximum before launching it
(``docs/architecture.md``, the search layer).  The driver launches a trial only when
``Capacity.fits`` its needs, and fails a trial on the spot when ``Capacity.never_fits``.
"""

from __future__ import annotations

from collections.abc import Mapping

from orchestrator.config.schema import RootConfig

Resources = dict[str, float]
"""Resource name (``"CPU"``, ``"GPU"``) -> amount, as Ray's ``cluster_resources()`` names them."""

EPS = 1e-9
KINDS = ("CPU", "GPU")


def trial_needs(cfg: RootConfig) -> Resources:
    """What a trial holds at its largest: ``max_workers * cpus_per_worker`` CPUs, and
    ``max_workers * gpus_per_worker`` GPUs when it uses GPUs."""
    return cfg.scaling.at_most()


class Capacity:
    """The cluster's CPUs/GPUs (``total``) and what running trials hold (``used``).

    ``fits(need)`` iff ``used[k] + need[k] <= total[k]`` for every resource ``k`` (within ``EPS``);
    other resources Ray reports (memory, object store, node labels) are ignored.
    """

    def __init__(self, total: Mapping[str, float]) -> None:
        self.total: Resources = {k: float(v) for k, v in total.items() if k in KINDS}
        self.used: Resources = {k: 0.0 for k in self.total}

    def never_fits(self, need: Mapping[str, float]) -> str | None:
        """Why ``need`` exceeds the whole cluster even when idle (``None`` if it does not)."""
        for k, v in need.items():
            if v > self.total.get(k, 0.0) + EPS:
                return f"needs {v:g} {k} but the cluster has {self.total.get(k, 0.0):g}"
        return None

    def fits(self, need: Mapping[str, float]) -> bool:
        """Whether ``need`` fits beside what running trials hold now."""
        return all(self.used.get(k, 0.0) + v <= self.total.get(k, 0.0) + EPS for k, v in need.items())

    def take(self, need: Mapping[str, float]) -> None:
        """Book ``need`` for a trial that starts."""
        for k, v in need.items():
            self.used[k] = self.used.get(k, 0.0) + v

    def give(self, need: Mapping[str, float]) -> None:
        """Release what a finished trial held (never below zero)."""
        for k, v in need.items():
            self.used[k] = max(0.0, self.used.get(k, 0.0) - v)
