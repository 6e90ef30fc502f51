"""The batch plan: where a run stands (step, epoch, cursor, B, W) and what its next optimizer step
runs with, advanced one step at a time from the policies' decisions.

One object, three users: the worker loop (``trainers/loop/trainer.py``) steps it with what it
measures, ``plan`` (``orchestrator/preview.py``) steps it with nothing measured, and every worker
count is asked of the same :class:`~trainers.policies.resize.WorkerCount` it asks (the driver's
monitor included).  So the preview is the run by construction.  One step reads::

    change = plan.next_batch()          the batch policy's B for the step about to run (None: same B)
    if change: ... plan.decide_workers() (a run asks the driver, which asks the same WorkerCount)
    s = plan.step_settings()            lr, mf, B, W, local slice, micro-batches, samples
    ... the step runs with s ...
    plan.advance(loss, trained)         step, cursor, samples seen, epoch end, the auto warmup's check

The counters live in :class:`TrainState` (checkpoint entry ``train``); B and the batch policy's
bookkeeping in the entry ``batch``; an auto warmup's history in ``auto_warmup``
(:meth:`BatchPlan.components`), the layout checkpoints always had.  W is not checkpointed: it
is the group's size, a resource (``docs/architecture.md``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from trainers.policies.batching import BatchStats, build_batch_policy
from trainers.policies.decisions import NoopDecision, ResizeDecision
from trainers.policies.noise import GradientNoiseScale
from trainers.policies.policy_set import PolicySet, StepSettings
from trainers.policies.resize import WorkerCount
from trainers.policies.schedules import AutoDecision

__all__ = ["Advanced", "BatchPlan", "NewBatch", "TrainState", "workers_ahead"]

END_EPS = 1e-12  # a run ends at the first step boundary with epoch_float >= epochs - END_EPS

# Keys that format-1 checkpoints carry and nothing reads any more: ``restarts`` (never read)
# and ``extra`` (the policies' state, now entries of their own; see trainers/loop/checkpoint.py).
_RETIRED = frozenset({"restarts", "extra"})


@dataclass
class TrainState:
    """Counters that survive phases and restarts.  ``step`` is the global optimizer step;
    ``cursor`` the samples of ``epoch``'s permutation already consumed; ``finished``: this
    state is the planned end (set by the loop when it saves there)."""

    step: int = 0
    epoch: int = 0
    cursor: int = 0
    samples_seen: int = 0
    finished: bool = False

    def state_dict(self) -> dict[str, Any]:
        """Plain ints and a bool (loads with ``weights_only=True``)."""
        return asdict(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore in place; retired keys of old checkpoints are ignored, unknown ones refused."""
        names = {f.name for f in fields(self)}
        unknown = set(state) - names - _RETIRED
        if unknown:
            raise KeyError(f"TrainState has no {sorted(unknown)}")
        fresh = TrainState()
        for name in names:
            setattr(self, name, type(getattr(fresh, name))(state.get(name, getattr(fresh, name))))


@dataclass(frozen=True)
class NewBatch:
    """The global batch changes from ``old`` to ``new`` for the step after ``step``; ``reason``
    is the batch policy's."""

    step: int
    old: int
    new: int
    reason: str


@dataclass(frozen=True)
class Advanced:
    """What a step boundary brought: the epoch ended; an auto warmup ended there (its decision)."""

    epoch_ended: bool
    warmup_end: AutoDecision | None = None


_WITHIN_EPOCH = Advanced(False)  # the common answer, not rebuilt every step


class _BatchEntry:
    """The checkpoint entry ``batch``: ``{"size": B, "policy": the batch policy's bookkeeping}``."""

    def __init__(self, plan: BatchPlan) -> None:
        self._plan = plan

    def state_dict(self) -> dict[str, Any]:
        return {"size": self._plan.batch, "policy": self._plan.policies.batch_policy.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._plan.batch = int(state["size"])
        self._plan.policies.batch_policy.load_state_dict(state["policy"])


class BatchPlan:
    """Where a run stands and what its next step runs with; see the module docstring for a step.

    ``policies``: the run's :class:`~trainers.policies.policy_set.PolicySet` (its ``epochs`` is the
    planned end, its ``dataset_size`` the samples per epoch); ``workers``: W, the group's size
    (a run's world size; in ``plan``, what the worker-count decisions gave).  What a run
    measures: ``noise``, the gradient-noise estimator (AdaScale's gain, the adaptive batch
    policies' statistics); ``batch_stats``, statistics measured elsewhere that the batch policy
    reads instead (local SGD's own norm test).  ``plan`` gives neither.
    """

    def __init__(
        self,
        policies: PolicySet,
        workers: int,
        noise: GradientNoiseScale | None = None,
        batch_stats: Callable[[], BatchStats] | None = None,
    ) -> None:
        self.policies = policies
        self.n = policies.dataset_size
        self.state = TrainState()
        self.batch = policies.batch_cfg.size  # B in force
        self.workers = int(workers)  # W
        self.current: StepSettings | None = None  # what the step under way (or the last one) runs with
        self._noise, self._batch_stats = noise, batch_stats

    @classmethod
    def from_config(cls, cfg: Any, dataset_size: int) -> BatchPlan:
        """A plan of ``cfg`` starting at step 0 on the workers its first batch needs."""
        policies = PolicySet.from_config(cfg, dataset_size=dataset_size)
        return cls(policies, policies.workers.initial(policies.batch_cfg.size))

    # -- where the run stands ---------------------------------------------------------------------

    @property
    def epoch_float(self) -> float:
        """Fractional epochs completed before the next step."""
        return self.state.epoch + self.state.cursor / self.n

    @property
    def done(self) -> bool:
        """The planned end is reached (``train.epochs``, fractional epochs allowed)."""
        return self.epoch_float >= self.policies.epochs - END_EPS

    @property
    def remaining_samples(self) -> float:
        """Samples left to the planned end."""
        return (self.policies.epochs - self.epoch_float) * self.n

    # -- before a step: the batch and the workers ---------------------------------------------------

    def next_batch(self, agree: Callable[[int], int] | None = None) -> NewBatch | None:
        """Ask the batch policy for the step about to run and apply its answer; ``agree`` turns
        this process's answer into the one every rank applies (rank 0's, broadcast).  None when
        B stays."""
        if not self.policies.adapts_batch:
            return None
        stats = self._batch_stats() if self._batch_stats is not None else None
        d = self.policies.decide_batch(self.state.step, self.epoch_float, self.batch, self._noise, stats=stats)
        new = d.size if d else self.batch
        if agree is not None:
            new = agree(new)
        if new == self.batch:
            return None
        change = NewBatch(self.state.step, self.batch, new, d.reason if d else "rank 0's decision")
        self.batch = new
        return change

    def adopt(self, new: int, reason: str) -> NewBatch | None:
        """Take a global batch decided elsewhere (goodput's choice, the same on every rank) from the
        step about to run; the LR follows it through the scaling rule like any batch change.  None
        when B stays."""
        if new <= 0:
            raise ValueError(f"adopt: a global batch must be > 0, got {new}")
        if new == self.batch:
            return None
        change = NewBatch(self.state.step, self.batch, int(new), reason)
        self.batch = int(new)
        return change

    def decide_workers(self, current: int | None = None) -> ResizeDecision | NoopDecision:
        """The worker count for B now (the policy within the ``scaling`` bounds), the group
        having asked for ``current`` workers (default: W)."""
        return self.policies.workers.decide(self.batch, self.workers if current is None else current)

    # -- the step ------------------------------------------------------------------------------------

    def step_settings(self, samples: int | None = None, lr_factor: float = 1.0) -> StepSettings:
        """What the next step runs with (kept as ``current``): the policies' settings at this
        position, B and W; ``samples``: the step's sample count (default: the next global batch
        of the data order, short at an epoch's end); ``lr_factor``: a run's rollbacks
        (``trainers/loop/rollback.py``)."""
        n = min(self.batch, self.n - self.state.cursor) if samples is None else samples
        s = self.policies.settings(self.epoch_float, self.batch, self.workers, self._noise, samples=n)
        if lr_factor != 1.0:
            s = replace(s, lr=s.lr * lr_factor)
        self.current = s
        return s

    def advance(self, loss: float | None = None, trained: int | None = None) -> Advanced:
        """The step run with ``current`` is done: feed an auto warmup its LR and the rank-averaged
        ``loss`` (None in a preview: its LR grows on), move the counters (``trained``: the samples
        that counted, fewer than the step's when fp16 skipped it; default all), and at an epoch's
        end let an auto warmup check whether the loss stopped falling."""
        s, st = self.current, self.state
        self.policies.after_step(s.lr, loss)
        st.step += 1
        st.cursor += s.samples
        st.samples_seen += s.samples if trained is None else trained
        if st.cursor < self.n:
            return _WITHIN_EPOCH
        st.epoch, st.cursor = st.epoch + 1, 0
        d = self.policies.at_epoch_end(self.epoch_float, self.batch)
        return Advanced(True, d if d is not None and d.stopped_now else None)

    # -- checkpoint ----------------------------------------------------------------------------------

    def components(self) -> dict[str, Any]:
        """The checkpoint entries the plan fills, by name: ``train``, ``batch`` and, with an auto
        warmup, ``auto_warmup``; each with ``state_dict``/``load_state_dict``."""
        out: dict[str, Any] = {"train": self.state, "batch": _BatchEntry(self)}
        if self.policies.auto is not None:
            out["auto_warmup"] = self.policies.auto
        return out

    def state_dict(self) -> dict[str, Any]:
        """``{name: entry}`` of :meth:`components`: plain types (``weights_only=True`` loads it)."""
        return {name: part.state_dict() for name, part in self.components().items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the entries ``state`` has; the others keep their fresh state."""
        for name, part in self.components().items():
            if name in state:
                part.load_state_dict(state[name])


def workers_ahead(cfg: Any, epoch: float, batch: int, workers: int) -> int | None:
    """The workers the plan of ``cfg`` (the driver's config: ``scaling`` included) needs at ``epoch``
    for a run at global batch ``batch`` on ``workers`` now: what the batch policy gives then, asked of
    the run's :class:`~trainers.policies.resize.WorkerCount` (never fewer than ``workers``: the
    worker count of a batch only grows).  ``None`` where only the run can tell: a batch policy that
    measures (noise scale, norm test, critical-batch warmup) or ``scaling.policy: goodput``.

    The driver asks it with the epoch its run will have reached a node's launch time from now, so
    the nodes a bigger group needs are on their way before the batch outgrows the group
    (orchestrator/run/autoscaling.py)."""
    policy = build_batch_policy(cfg.batch, schedule=cfg.schedule)  # fresh: its bookkeeping is not the run's
    count = WorkerCount.from_config(cfg)
    if not policy.by_epoch or count.measures:
        return None
    d = policy.decide(0, float(epoch), int(batch), BatchStats())
    grown = count.decide(d.size if d else int(batch), int(workers))
    return grown.workers if grown else int(workers)
