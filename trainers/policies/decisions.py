"""The decisions the policies answer: change the batch, resize the group, or do nothing.

Each policy method returns one of these small frozen records, with the reason to log.
:class:`NoopDecision` is falsy and the others truthy, so ``if decision:`` reads "if
something changes".  They live here, beside nothing else, so that the batch policies
(``trainers/policies/batching.py``), the worker-count policy (``trainers/policies/resize.py``) and the
policy set that composes them (``trainers/policies/policy_set.py``) share one vocabulary; see
``docs/architecture.md`` for where each is asked.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BatchDecision", "NoopDecision", "ResizeDecision"]


@dataclass(frozen=True)
class NoopDecision:
    """Keep the current batch or worker group (falsy); ``reason`` says why, for the log."""

    reason: str

    def __bool__(self) -> bool:
        return False


@dataclass(frozen=True)
class BatchDecision:
    """Change the global batch to ``size`` from the next step on."""

    size: int
    reason: str

    def __bool__(self) -> bool:
        return True


@dataclass(frozen=True)
class ResizeDecision:
    """End this phase and start the next one with ``workers`` workers."""

    workers: int
    reason: str

    def __bool__(self) -> bool:
        return True
