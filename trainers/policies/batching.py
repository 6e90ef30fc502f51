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
* ``ramp``: B grows linearly in samples from ``size`` to ``ramp_to`` over ``ramp_epochs``, in
  increments of ``round_to`` (the Megatron-LM ``rampup_batch_size`` and OLMo batch ramps)::

      n = (ramp_to - size) / round_to        increments
      B(e) = min(ramp_to, size + round_to * floor(e * n / ramp_epochs))

* ``seesaw``: at each of ``schedule.milestones``, B x ``1 / schedule.decay_factor``, with
  ``schedule.decay: seesaw`` cutting the LR by ``sqrt(decay_factor)`` at the same steps
  (Meterez et al. 2025; ``trainers/policies/schedules.py``)::

      B(e) = round(size / decay_factor ** m(e)),  m(e) = milestones passed at e

* ``cbs_warmup``: batch-size warmup from the measured critical batch (Merrill et al. 2025,
  "Critical batch size revisited": the critical batch starts near 0, rises, then plateaus, so
  B can start small and grow with it).  The critical batch is ``c * B_simple`` (McCandlish et
  al.), smoothed over the last ``cbs_window`` check steps; B grows by whole factors of
  ``cbs_growth`` (doubling by default, as Merrill et al. do) while it stays at or below it::

      B_crit = c * mean(last cbs_window estimates of B_simple)
      j      = floor(log(B_crit / B) / log(cbs_growth))     grow when j >= 1
      B'     = round_up(B * cbs_growth ** j, round_to), clamped to the cap

Rules shared by the adaptive policies (``noise_scale``, ``norm_test``), in order:
look only on steps with ``step % check_every == 0``; round the wanted size up to
a multiple of ``round_to``; grow only if that is at least ``min_growth`` times the
current B (no thrashing on noisy estimates); clamp to ``max_size`` (and to the
training-set size when known), so a policy that wants far more than the cap moves
straight to the cap even if the cap is less than ``min_growth`` above B; never
shrink.  ``cbs_warmup`` looks on the same check steps and rounds and clamps the same way, but
grows by powers of ``cbs_growth`` instead of the ``min_growth`` threshold.  ``ramp`` and
``seesaw`` are, like ``schedule``, pure functions of the epoch and the config: ``plan`` shows
exactly what a run does.  B never shrinks because worker resizing is grow-only too
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

from pydantic import Field, field_validator

from trainers.policies.decisions import BatchDecision, NoopDecision
from trainers.policies.schedules import ScheduleConfig, milestones_passed
from trainers.section import Section

BatchPolicyName = Literal["fixed", "schedule", "noise_scale", "norm_test", "ramp", "seesaw", "cbs_warmup"]

EPOCH_EPS = 1e-9  # tolerance when comparing a step's starting epoch to a listed epoch


class BatchConfig(Section):
    """The ``batch`` section.  ``size`` is the global batch B: the training math."""

    size: int = Field(default=64, gt=0, description="global batch B, summed over all workers (the starting B)")
    max_local_batch: int = Field(default=64, gt=0, description="largest micro-batch one worker runs at once")
    policy: BatchPolicyName = Field(default="fixed", description="how B changes during training")
    max_size: int | None = Field(
        default=None, gt=0, description="largest B a policy may choose; none = no cap but the training-set size"
    )
    check_every: int = Field(
        default=20, gt=0, description="steps between decisions (noise_scale, norm_test, cbs_warmup)"
    )
    min_growth: float = Field(default=1.25, ge=1.0, description="grow only to at least this times the current B")
    schedule: list[tuple[float, int]] = Field(
        default_factory=list, description="[epoch, batch] pairs for policy schedule"
    )
    noise_scale_factor: float = Field(
        default=1.0, gt=0.0, description="c in B = c * B_simple (noise_scale; cbs_warmup's critical batch)"
    )
    norm_test_eta: float = Field(
        default=0.5,
        gt=0.0,
        lt=1.0,
        description="eta in Var/B <= eta^2 |g|^2 (norm_test); in expectation the test "
        "asks for B >= B_simple (1/eta^2 - 1), so eta must be < 1",
    )
    round_to: int = Field(
        default=8, gt=0, description="new sizes from adaptive policies are multiples of this; the increment of ramp"
    )
    ema: float = Field(default=0.95, ge=0.0, lt=1.0, description="EMA decay of the gradient-noise estimates")
    ramp_to: int | None = Field(default=None, gt=0, description="ramp: the batch the linear ramp ends at")
    ramp_epochs: float | None = Field(
        default=None, gt=0.0, description="ramp: epochs (of samples) over which B grows from size to ramp_to"
    )
    cbs_window: int = Field(
        default=3,
        ge=1,
        description="cbs_warmup: check steps whose B_simple estimates are averaged into the critical batch",
    )
    cbs_growth: float = Field(
        default=2.0,
        gt=1.0,
        description="cbs_warmup: B grows by whole powers of this factor, staying at or below the critical batch",
    )

    @field_validator("schedule")
    @classmethod
    def _pairs_in_order(cls, v: list[tuple[float, int]]) -> list[tuple[float, int]]:
        # each entry and its predecessor; against batch.size and batch.max_size: orchestrator/config/rules.py
        prev_epoch = -math.inf
        for i, (epoch, batch) in enumerate(v):
            where = f"batch.schedule[{i}]"
            if not math.isfinite(epoch) or epoch < 0:
                raise ValueError(
                    f"{where}: epoch {epoch} must be a finite number >= 0; write [epoch, batch] with "
                    f"an epoch from 0 on, e.g. [3, 256]"
                )
            if epoch <= prev_epoch:
                raise ValueError(
                    f"{where}: epoch {epoch} is not after the previous entry's {prev_epoch}; "
                    "list [epoch, batch] pairs in increasing epoch order"
                )
            if batch <= 0:
                raise ValueError(f"{where}: batch {batch} must be > 0; give a positive global batch, e.g. [3, 256]")
            if i > 0 and batch < v[i - 1][1]:
                raise ValueError(
                    f"{where}: batch {batch} is below the previous entry's batch {v[i - 1][1]}; the "
                    "batch only grows, so list non-decreasing sizes"
                )
            prev_epoch = epoch
        return v


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
    #: B is a function of the epoch alone (what ``plan`` shows is the run; the driver asks ahead for
    #: the nodes a later epoch's batch needs: trainers/policies/plan.py ``workers_ahead``)
    by_epoch: ClassVar[bool] = False

    def __init__(self, cfg: BatchConfig, dataset_size: int | None = None, schedule: ScheduleConfig | None = None):
        self.cfg = cfg
        self.schedule_cfg = schedule
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
        return self._record(step, new, f"{source} wants {rounded}" + (f", clamped to {new}" if new != rounded else ""))

    def _record(self, step: int, new: int, reason: str) -> BatchDecision:
        self.changes += 1
        self.last_change_step = step
        return BatchDecision(new, reason)

    def _is_check_step(self, step: int) -> bool:
        return step > 0 and step % self.cfg.check_every == 0

    # -- checkpoint -----------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Plain types only.  Decisions depend on the inputs; this is bookkeeping for logs."""
        return {
            "name": self.name,
            "changes": self.changes,
            "last_change_step": -1 if self.last_change_step is None else self.last_change_step,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("name") != self.name:
            raise ValueError(f"checkpoint holds batch policy {state.get('name')!r}, this run uses {self.name!r}")
        self.changes = int(state["changes"])
        last = int(state["last_change_step"])
        self.last_change_step = None if last < 0 else last


class FixedBatch(BatchPolicy):
    """B stays ``batch.size``."""

    name = "fixed"
    by_epoch = True

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
    by_epoch = True

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


def ramp_batch(size: int, ramp_to: int, ramp_epochs: float, increment: int, epoch: float) -> int:
    """The linear ramp's batch for the step starting at ``epoch`` (Megatron-LM's ``rampup_batch_size``).

    ``n = (ramp_to - size) / increment`` increments spread evenly over ``ramp_epochs`` of samples:
    ``min(ramp_to, size + increment * floor(epoch * n / ramp_epochs))``."""
    n = (ramp_to - size) // increment
    done = math.floor(max(epoch, 0.0) * n / ramp_epochs + EPOCH_EPS)
    return min(ramp_to, size + increment * done)


def seesaw_batch(size: int, milestones: Sequence[float], decay_factor: float, epoch: float) -> int:
    """Seesaw's batch for the step starting at ``epoch``: ``round(size / decay_factor ** m)``, ``m`` the
    milestones passed (:func:`trainers.policies.schedules.milestones_passed`, the LR's own count)."""
    return int(round(size / decay_factor ** milestones_passed(list(milestones), epoch)))


def cbs_warmup_batch(current: int, critical: float, growth: float, round_to: int) -> int | None:
    """The grown batch of ``cbs_warmup``: ``round_up(B * growth ** j, round_to)`` for the largest whole
    ``j`` with ``B * growth ** j <= critical``; None when ``j < 1`` (the critical batch is not yet
    ``growth`` times B)."""
    if not (math.isfinite(critical) and critical > 0):
        return None
    j = math.floor(math.log(critical / current) / math.log(growth) + 1e-9)
    if j < 1:
        return None
    return round_up(current * growth**j, round_to)


class RampBatch(BatchPolicy):
    """B grows linearly in samples from ``size`` to ``ramp_to`` over ``ramp_epochs`` (:func:`ramp_batch`).

    Megatron-LM's ``--rampup-batch-size <start> <increment> <samples>`` and OLMo's batch ramps, with
    ``round_to`` as the increment and the length in epochs of samples.  Applies at every step; clamped
    to the training-set size; grow-only."""

    name = "ramp"
    by_epoch = True

    def decide(self, step: int, epoch: float, current: int, stats: BatchStats) -> Decision:
        cfg = self.cfg
        assert cfg.ramp_to is not None and cfg.ramp_epochs is not None  # BatchConfig checks it
        wanted = self._clamp(ramp_batch(cfg.size, cfg.ramp_to, cfg.ramp_epochs, cfg.round_to, epoch))
        if wanted <= current:
            return NoopDecision(f"ramp gives {wanted} at epoch {epoch:.4g}")
        return self._record(
            step, wanted, f"ramp gives {wanted} at epoch {epoch:.4g} (to {cfg.ramp_to} at epoch {cfg.ramp_epochs:g})"
        )


class SeesawBatch(BatchPolicy):
    """B x ``1 / schedule.decay_factor`` at each of ``schedule.milestones`` (Meterez et al. 2025, Seesaw).

    Reads the ``schedule`` section, so the batch grows at exactly the steps where ``decay: seesaw``
    cuts the LR (:func:`seesaw_batch`).  Clamped to ``max_size`` and the training-set size: a batch
    that cannot grow leaves the LR with the step schedule's full cut (the sqrt scaling rule reads
    the B in force).  Grow-only."""

    name = "seesaw"
    by_epoch = True

    def __init__(self, cfg: BatchConfig, dataset_size: int | None = None, schedule: ScheduleConfig | None = None):
        super().__init__(cfg, dataset_size=dataset_size, schedule=schedule)
        if schedule is None or not schedule.milestones:
            raise ValueError(
                "batch.policy: seesaw reads schedule.milestones and schedule.decay_factor; give the "
                "schedule section with decay: seesaw and milestones"
            )

    def decide(self, step: int, epoch: float, current: int, stats: BatchStats) -> Decision:
        s = self.schedule_cfg
        assert s is not None
        wanted = self._clamp(seesaw_batch(self.cfg.size, s.milestones, s.decay_factor, epoch))
        if wanted <= current:
            return NoopDecision(f"seesaw gives {wanted} at epoch {epoch:.4g}")
        m = milestones_passed(s.milestones, epoch)
        return self._record(
            step,
            wanted,
            f"seesaw: milestone {m} of {len(s.milestones)} at epoch {epoch:.4g}, "
            f"B x {1 / s.decay_factor:g}, LR x {math.sqrt(s.decay_factor):.4g}",
        )


class CbsWarmupBatch(BatchPolicy):
    """Batch-size warmup that follows the measured critical batch (Merrill et al. 2025), see
    :func:`cbs_warmup_batch`.

    On each check step the latest ``B_simple`` joins a window of the last ``cbs_window``
    estimates; once the window is full, the critical batch is ``c * mean(window)`` and B grows by
    the largest whole power of ``cbs_growth`` that keeps it at or below that (rounded up to
    ``round_to``, clamped to the cap).  The window is checkpointed, so a resumed run decides as
    the uninterrupted one."""

    name = "cbs_warmup"
    needs = frozenset({"b_simple"})

    def __init__(self, cfg: BatchConfig, dataset_size: int | None = None, schedule: ScheduleConfig | None = None):
        super().__init__(cfg, dataset_size=dataset_size, schedule=schedule)
        self.window: list[float] = []

    def decide(self, step: int, epoch: float, current: int, stats: BatchStats) -> Decision:
        if not self._is_check_step(step):
            return NoopDecision("not a check step")
        if stats.b_simple is None or not math.isfinite(stats.b_simple):
            return NoopDecision("no noise-scale estimate yet")
        self.window = (self.window + [float(stats.b_simple)])[-self.cfg.cbs_window :]
        if len(self.window) < self.cfg.cbs_window:
            return NoopDecision(f"critical batch window {len(self.window)}/{self.cfg.cbs_window}")
        c = self.cfg.noise_scale_factor
        critical = c * sum(self.window) / len(self.window)
        grown = cbs_warmup_batch(current, critical, self.cfg.cbs_growth, self.cfg.round_to)
        source = f"critical batch {c:g} x mean B_simple {critical / c:.4g} over {len(self.window)} checks"
        if grown is None:
            return NoopDecision(f"{source} is below {self.cfg.cbs_growth:g} x {current}")
        new = self._clamp(grown)
        if new <= current:
            return NoopDecision(f"{source} wants {grown}, the cap {self.max_size} is reached")
        return self._record(step, new, f"{source} allows {grown}" + (f", clamped to {new}" if new != grown else ""))

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "window": list(self.window)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.window = [float(x) for x in state.get("window", [])]


BATCH_POLICIES: dict[str, type[BatchPolicy]] = {
    "fixed": FixedBatch,
    "schedule": ScheduleBatch,
    "noise_scale": NoiseScaleBatch,
    "norm_test": NormTestBatch,
    "ramp": RampBatch,
    "seesaw": SeesawBatch,
    "cbs_warmup": CbsWarmupBatch,
}


def noise_probe_runs(batch_policy: str, scaling_rule: str, goodput: bool, uses_ddp: bool) -> bool:
    """Whether the gradient-noise probe runs (and so, at W = 1, splits a step's one micro-batch in
    two: trainers/data/order.py ``smallest_micro_batch``): a policy reads the noise statistics (an
    adaptive batch policy's, AdaScale's gain, goodput's statistical efficiency) and the method
    averages gradients with DDP, whose hook measures them.  The worker, the config checks and the
    logged params ask this one function."""
    reads = bool(BATCH_POLICIES[batch_policy].needs) or scaling_rule == "adascale" or goodput
    return reads and uses_ddp


def build_batch_policy(
    cfg: BatchConfig, dataset_size: int | None = None, schedule: ScheduleConfig | None = None
) -> BatchPolicy:
    """The policy ``cfg.policy`` names; ``dataset_size`` (training samples) caps B besides ``max_size``;
    ``schedule`` is the LR schedule's section, which ``seesaw`` reads its milestones from."""
    return BATCH_POLICIES[cfg.policy](cfg, dataset_size=dataset_size, schedule=schedule)
