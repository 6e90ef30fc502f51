"""The global batch: its size, and the policies that grow it during training.

``size`` is the global batch B at the start, the training math
(``docs/architecture.md``); ``max_local_batch`` is the largest micro-batch one worker runs at once
(the rest is gradient accumulation).  A **batch policy** may raise B during
training:

* ``fixed``: never changes B.
* ``schedule``: B by epoch, "increase the batch instead of decaying the LR" (Smith,
  Kindermans, Ying, Le 2018).  The listed batch applies from the first step whose
  starting epoch is >= the listed epoch.
* ``noise_scale``: B follows ``c * B_simple`` (McCandlish et al. 2018), the critical
  batch estimated by :class:`trainers.policies.noise.GradientNoiseScale`.
* ``norm_test``: B grows to what the norm test asks for (Byrd et al. 2012; Lau, Liu,
  Kolar 2024), see :func:`trainers.policies.noise.norm_test`.

Rules shared by the adaptive policies (``noise_scale``, ``norm_test``), in order:
look only on steps with ``step % check_every == 0``; round the wanted size up to
a multiple of ``round_to``; grow only if that is at least ``min_growth`` times the
current B (no thrashing on noisy estimates); clamp to ``max_size`` (and to the
training-set size when known), so a policy that wants far more than the cap moves
straight to the cap even if the cap is less than ``min_growth`` above B; never
shrink.  B never shrinks because worker resizing is grow-only too
(``trainers/policies/resize.py``) and because a smaller batch after a larger one buys
nothing the LR schedule cannot.

Each policy is an object with one decision method, :meth:`BatchPolicy.decide`,
answering a :class:`BatchDecision` (change B, with the reason) or a
:class:`NoopDecision` (keep B, with the reason; falsy, so ``if decision:`` reads
"if B changes"), both from ``trainers/policies/decisions.py``.  Policies are deterministic
functions of their inputs plus the small state they return from ``state_dict``
(plain types, for checkpoints).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from pydantic import ConfigDict, Field, model_validator
from trainers.section import Section

from trainers.policies.decisions import BatchDecision, NoopDecision

BatchPolicyName = Literal["fixed", "schedule", "noise_scale", "norm_test"]

EPOCH_EPS = 1e-9  # tolerance when comparing a step's starting epoch to a listed epoch


class BatchConfig(Section):
    """The ``batch`` section.  ``size`` is the global batch B: the training math."""

    model_config = ConfigDict(extra="forbid")

    size: int = Field(default=64, gt=0, description="global batch B, summed over all workers (the starting B)")
    max_local_batch: int = Field(default=64, gt=0, description="largest micro-batch one worker runs at once")
    policy: BatchPolicyName = Field(default="fixed", description="how B changes during training")
    max_size: int | None = Field(default=None, gt=0, description="largest B a policy may choose; "
                                 "none = no cap but the training-set size")
    check_every: int = Field(default=20, gt=0, description="steps between decisions (noise_scale, norm_test)")
    min_growth: float = Field(default=1.25, ge=1.0, description="grow only to at least this times the current B")
    schedule: list[tuple[float, int]] = Field(default_factory=list,
                                              description="[epoch, batch] pairs for policy schedule")
    noise_scale_factor: float = Field(default=1.0, gt=0.0, description="c in B = c * B_simple (noise_scale)")
    norm_test_eta: float = Field(default=0.5, gt=0.0, lt=1.0,
                                 description="eta in Var/B <= eta^2 |g|^2 (norm_test); in expectation the test "
                                             "asks for B >= B_simple (1/eta^2 - 1), so eta must be < 1")
    round_to: int = Field(default=8, gt=0, description="new sizes from adaptive policies are multiples of this")
    ema: float = Field(default=0.95, ge=0.0, lt=1.0, description="EMA decay of the gradient-noise estimates")

    @model_validator(mode="after")
    def _cross_checks(self) -> "BatchConfig":
        if self.max_size is not None and self.max_size < self.size:
            raise ValueError(f"batch.max_size: {self.max_size} is below batch.size {self.size}; raise it to at "
                             f"least {self.size} or remove it")
        prev_epoch, prev_batch = -math.inf, self.size
        for i, (epoch, batch) in enumerate(self.schedule):
            where = f"batch.schedule[{i}]"
            if not math.isfinite(epoch) or epoch < 0:
                raise ValueError(f"{where}: epoch {epoch} must be a finite number >= 0; write [epoch, batch] with "
                                 f"an epoch from 0 on, e.g. [3, 256]")
            if epoch <= prev_epoch:
                raise ValueError(f"{where}: epoch {epoch} is not after the previous entry's {prev_epoch}; "
                                 "list [epoch, batch] pairs in increasing epoch order")
            if batch <= 0:
                raise ValueError(f"{where}: batch {batch} must be > 0; give a positive global batch, e.g. [3, 256]")
            if batch < prev_batch:
                before = "batch.size" if i == 0 else "the previous entry's batch"
                raise ValueError(f"{where}: batch {batch} is below {before} {prev_batch}; the batch only grows, "
                                 "so list non-decreasing sizes")
            if self.max_size is not None and batch > self.max_size:
                raise ValueError(f"{where}: batch {batch} is above batch.max_size {self.max_size}; "
                                 "raise max_size or lower the entry")
            prev_epoch, prev_batch = epoch, batch
        if self.policy == "schedule" and not self.schedule:
            raise ValueError("batch.schedule: required by batch.policy schedule; give [epoch, batch] pairs, "
                             "e.g. [[0, 64], [3, 256]]")
        if self.policy != "schedule" and self.schedule:
            raise ValueError(f"batch.schedule: given but batch.policy is {self.policy!r}; set batch.policy: "
                             "schedule or remove the schedule")
        return self


# --------------------------------------------------------------------------- decisions


@dataclass(frozen=True)
class BatchStats:
    """What the loop measured, for the adaptive policies (``None`` = not known yet).

    ``b_simple``: the smoothed ``B_simple`` of :class:`trainers.policies.noise.GradientNoiseScale`.
    ``norm_test``: the batch the norm test suggests (``NormTestResult.suggested``).
    """

    b_simple: float | None = None
    norm_test: int | None = None


Decision = BatchDecision | NoopDecision


def round_up(x: float, multiple: int) -> int:
    """Smallest multiple of ``multiple`` that is >= ``x`` (at least ``multiple``); float noise tolerated."""
    return max(multiple, multiple * math.ceil(x / multiple - 1e-9))


def batch_at_epoch_for_schedule(schedule: Sequence[tuple[float, int]], initial: int, epoch: float) -> int:
    """The scheduled batch for a step starting at ``epoch``: the last entry with listed epoch <= ``epoch``.

    Before the first entry the batch is ``initial`` (``batch.size``).  Useful for
    previews and plots: ``[batch_at_epoch_for_schedule(s, 64, e) for e in grid]``.
    """
    out = initial
    for e, b in schedule:
        if epoch + EPOCH_EPS >= e:
            out = b
        else:
            break
    return out


class BatchPolicy(ABC):
    """How the global batch changes.  Subclasses implement :meth:`decide` only.

    :meth:`decide` is called by every rank before each optimizer step with the same
    inputs, so every rank takes the same decision:

    * ``step``: optimizer steps already taken (``TrainState.step``), so the first
      call sees 0;
    * ``epoch``: the fractional epoch at which this step starts
      (``TrainState.epoch + cursor / num_train``);
    * ``current``: the global batch in force now;
    * ``stats``: the latest measurements (:class:`BatchStats`).

    A :class:`BatchDecision` takes effect from this step on.
    """

    name: ClassVar[str] = ""
    #: which entries of ``BatchStats`` this policy reads; the loop may skip measuring the others
    needs: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, cfg: BatchConfig, dataset_size: int | None = None):
        self.cfg = cfg
        caps = [c for c in (cfg.max_size, dataset_size) if c is not None]
        self.max_size: int | None = min(caps) if caps else None
        self.changes = 0
        self.last_change_step: int | None = None

    @abstractmethod
    def decide(self, step: int, epoch: float, current: int, stats: BatchStats) -> Decision:
        """The batch for the step about to run (see the class docstring for the arguments)."""

    # -- helpers for subclasses ---------------------------------------------------------------

    def _clamp(self, size: int) -> int:
        return size if self.max_size is None else min(size, self.max_size)

    def _grow(self, step: int, current: int, wanted: float, source: str) -> Decision:
        """Apply the adaptive rules (round, min_growth, clamp, grow-only) to a wanted size."""
        if not math.isfinite(wanted) or wanted <= 0:
            return NoopDecision(f"{source} gives no usable size ({wanted})")
        rounded = round_up(wanted, self.cfg.round_to)
        if rounded < current * self.cfg.min_growth:
            return NoopDecision(f"{source} wants {rounded}, below min_growth {self.cfg.min_growth:g} x {current}")
        new = self._clamp(rounded)
        if new <= current:
            why = f"the cap {self.max_size} is reached" if new < rounded else f"not above {current}"
            return NoopDecision(f"{source} wants {rounded}, {why}")
        return self._record(step, new, f"{source} wants {rounded}" + (f", clamped to {new}" if new != rounded
                                                                      else ""))

    def _record(self, step: int, new: int, reason: str) -> BatchDecision:
        self.changes += 1
        self.last_change_step = step
        return BatchDecision(new, reason)

    def _is_check_step(self, step: int) -> bool:
        return step > 0 and step % self.cfg.check_every == 0

    # -- checkpoint -----------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Plain types only.  Decisions depend on the inputs; this is bookkeeping for logs."""
        return {"name": self.name, "changes": self.changes,
                "last_change_step": -1 if self.last_change_step is None else self.last_change_step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("name") != self.name:
            raise ValueError(f"checkpoint holds batch policy {state.get('name')!r}, this run uses {self.name!r}")
        self.changes = int(state["changes"])
        last = int(state["last_change_step"])
        self.last_change_step = None if last < 0 else last


class FixedBatch(BatchPolicy):
    """B stays ``batch.size``."""

    name = "fixed"

    def decide(self, step: int, epoch: float, current: int, stats: BatchStats) -> Decision:
        return NoopDecision("fixed batch")


class ScheduleBatch(BatchPolicy):
    """B by epoch from ``batch.schedule`` (Smith et al. 2018, "Don't decay the learning rate, increase the batch size").

    Applies at every step, not only on ``check_every`` steps: the entry ``[e, B]``
    takes effect at the first step whose starting epoch is >= ``e``.  The listed
    sizes are used as given (no rounding, no ``min_growth``), clamped only to the
    training-set size.  Grow-only: a resumed run already past a larger B keeps it.
    """

    name = "schedule"

    def decide(self, step: int, epoch: float, current: int, stats: BatchStats) -> Decision:
        wanted = self._clamp(batch_at_epoch_for_schedule(self.cfg.schedule, self.cfg.size, epoch))
        if wanted <= current:
            return NoopDecision(f"schedule gives {wanted} at epoch {epoch:.4g}")
        return self._record(step, wanted, f"schedule gives {wanted} from epoch {epoch:.4g}")


class NoiseScaleBatch(BatchPolicy):
    """B follows ``c * B_simple`` (McCandlish et al. 2018: the critical batch is about ``B_simple``)."""

    name = "noise_scale"
    needs = frozenset({"b_simple"})

    def decide(self, step: int, epoch: float, current: int, stats: BatchStats) -> Decision:
        if not self._is_check_step(step):
            return NoopDecision("not a check step")
        if stats.b_simple is None:
            return NoopDecision("no noise-scale estimate yet")
        c = self.cfg.noise_scale_factor
        return self._grow(step, current, c * stats.b_simple, f"noise scale {c:g} x B_simple {stats.b_simple:.4g}")


class NormTestBatch(BatchPolicy):
    """B grows to the norm test's ``ceil(Var / (eta^2 |g|^2))`` when the test fails (Byrd et al. 2012)."""

    name = "norm_test"
    needs = frozenset({"norm_test"})

    def decide(self, step: int, epoch: float, current: int, stats: BatchStats) -> Decision:
        if not self._is_check_step(step):
            return NoopDecision("not a check step")
        if stats.norm_test is None:
            return NoopDecision("no norm-test result yet")
        if stats.norm_test <= current:
            return NoopDecision(f"norm test passes at {current}")
        return self._grow(step, current, float(stats.norm_test), "norm test")


BATCH_POLICIES: dict[str, type[BatchPolicy]] = {
    "fixed": FixedBatch,
    "schedule": ScheduleBatch,
    "noise_scale": NoiseScaleBatch,
    "norm_test": NormTestBatch,
}


def build_batch_policy(cfg: BatchConfig, dataset_size: int | None = None) -> BatchPolicy:
    """The policy ``cfg.policy`` names; ``dataset_size`` (training samples) caps B besides ``max_size``."""
    return BATCH_POLICIES[cfg.policy](cfg, dataset_size=dataset_size)
