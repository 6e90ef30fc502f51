"""Learning-rate policy: scaling rule x warmup, then decay.  One pure entry point.

Notation (``docs/architecture.md``): ``eta0`` is ``optimizer.lr``, tuned at the base batch
``B0 = optimizer.base_batch_size``; ``B`` is the current global batch, ``k = B / B0``;
``e`` is the fractional epoch completed before the optimizer step being taken
(``epoch + cursor / n``); ``E`` is ``train.epochs``.

Scaling rules (the LR a batch B deserves once warm), registry ``SCALING_RULES``::

    linear  eta(B) = eta0 * k            Goyal et al. 2017, "Accurate, Large Minibatch SGD"
    sqrt    eta(B) = eta0 * sqrt(k)      Krizhevsky 2014, "One weird trick"; You et al. (LEGW)
    none    eta(B) = eta0

Each rule returns the factor ``s(k)`` and receives an optional noise signal (``var``,
``sqr``: EMAs of tr(Sigma) and |G|^2) so that AdaScale, ``s = (var + sqr) / (var / k + sqr)``
(Johnson et al. 2020), can be registered later without touching the callers.

Warmup (``E_w`` = ``warmup_epochs``, ``eta_peak = eta0 * s(k)``), registry ``WARMUPS``::

    none      no warmup: E_end = 0
    constant  eta = eta0 (the unscaled base LR) for e < E_w           Goyal et al. 2017
    gradual   eta = eta0 + (eta_peak - eta0) * e / E_w for e < E_w     Goyal et al. 2017 (E_w = 5)
    linear    eta = eta_peak * e / E_w for e < E_w (from zero: the      Vaswani et al. 2017; GPT-2
              first step's LR is 0; Adam's moments still start)        (the usual warmup of Adam-type
                                                                        transformer training)
    legw      as gradual, with sqrt scaling and E_end = E_w * k        You et al. 2019/2020,
              ("linear-epoch gradual warmup": the warmup length in      "Large-batch training for
              epochs grows linearly with the batch)                    LSTM and beyond" (LEGW)
    auto      eta_t = init * growth^t per optimizer step until a        Kim et al. 2021, "Automated
              Gaussian-process smoother says the training loss has      learning rate scheduler for
              stopped falling; the peak is the LR at the smoothed       large-batch training"
              minimum (see ``AutoWarmup``)

Decay after warmup, registry ``DECAYS``; ``p = (e - E_end) / (E - E_end)`` clipped to
[0, 1] is the progress in epochs from the warmup's end to the end of training::

    cosine  min_lr + (eta_peak - min_lr) * (1 + cos(pi * p)) / 2     Loshchilov & Hutter 2017
    poly    min_lr + (eta_peak - min_lr) * (1 - p)^poly_power        Chen et al. (DeepLab); You et al. (LARS)
    linear  min_lr + (eta_peak - min_lr) * (1 - p)
    step    max(min_lr, eta_peak * decay_factor^m), m = #milestones <= e   Goyal et al. (30, 60, 80)
    seesaw  as step; with ``batch.policy: seesaw`` B grows x 1/decay_factor   Meterez et al. 2025
            at the same milestones, and the sqrt scaling rule it requires      ("Seesaw")
            gives the net cut: eta x sqrt(decay_factor) (x 1/sqrt(2) for 0.5)
    none    eta_peak

Milestones are absolute epochs (as in Goyal et al.: warmup 5, then x0.1 at 30, 60, 80); a
milestone ``m`` has passed for the step starting at ``e`` when ``e >= m``
(:func:`milestones_passed`, shared with the seesaw batch policy so that B and the LR change at
the same step).

Seesaw (Meterez et al. 2025, "Seesaw: accelerating training by balancing learning rate and
batch size scheduling"): where a step schedule would cut the LR by ``a = 1/decay_factor``,
cut it by ``sqrt(a)`` and multiply B by ``a`` instead.  The two keep ``eta / sqrt(B)`` equal,
which is what the sqrt scaling rule keeps equal too: so ``decay: seesaw`` is the step decay's
formula on ``eta0 * sqrt(B / B0)`` at the current B.  With ``decay_factor: 0.5`` each milestone
gives LR x 1/sqrt(2) and B x 2.  When the batch cannot grow (``batch.max_size``, the data) the
LR takes the cut the batch could not: the schedule reads the B actually in force.

Because ``Schedule.lr`` is a pure function of (epoch, batch, auto-warmup state), a
resize or a batch change just recomputes it; the checkpoint needs only the training
counters plus ``AutoWarmup.state_dict()`` when ``warmup: auto``.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import numpy as np
from pydantic import Field, field_validator

from trainers.section import Section

ScalingRuleName = Literal["linear", "sqrt", "none", "adascale"]
WarmupName = Literal["none", "constant", "gradual", "linear", "legw", "auto"]
DecayName = Literal["cosine", "step", "seesaw", "poly", "linear", "none"]


class ScheduleConfig(Section):
    """The ``schedule`` section."""

    scaling_rule: ScalingRuleName = Field(default="linear", description="eta at batch B from eta0 at base_batch_size")
    warmup: WarmupName = Field(
        default="none",
        description="how the LR reaches its scaled value: none, constant, gradual, linear (from zero), legw or auto",
    )
    warmup_epochs: float = Field(default=0.0, ge=0.0, description="E_w; for legw, the warmup length at k = 1")
    decay: DecayName = Field(
        default="none",
        description="after warmup: cosine, step (milestones), seesaw (step "
        "milestones with batch.policy seesaw), poly, linear or none",
    )
    milestones: list[float] = Field(default_factory=list, description="absolute epochs, for step and seesaw decay")
    decay_factor: float = Field(
        default=0.1,
        gt=0.0,
        le=1.0,
        description="gamma of step decay; for seesaw, B grows x 1/gamma and the LR "
        "falls x sqrt(gamma) at each milestone",
    )
    poly_power: float = Field(default=2.0, gt=0.0, description="exponent of poly decay")
    min_lr: float = Field(default=0.0, ge=0.0, description="floor the decay ends at")
    # -- warmup: auto (Kim et al. 2021) --------------------------------------------------
    auto_init_lr: float = Field(default=1e-5, gt=0.0, description="LR of the first warmup step")
    auto_growth: float = Field(default=1.02, gt=1.0, description="LR multiplier per optimizer step while warming")
    auto_max_lr: float = Field(default=10.0, gt=0.0, description="reaching it ends the warmup")
    auto_patience: int = Field(default=2, ge=1, description="consecutive checks that must see the loss stop falling")
    auto_confidence: float = Field(
        default=0.95, gt=0.5, lt=1.0, description="posterior P(smoothed loss now > its minimum) needed by a check"
    )
    auto_min_steps: int = Field(default=20, ge=3, description="warmup steps recorded before any check may decide")
    auto_max_points: int = Field(default=200, ge=10, description="the loss history is binned to this many GP points")
    auto_seed: int = Field(default=0, description="random_state of the GP fit (same on every rank)")

    @field_validator("milestones")
    @classmethod
    def _epochs_in_order(cls, v: list[float]) -> list[float]:
        # against schedule.decay and train.epochs: orchestrator/config/rules.py
        if any(m < 0 for m in v):
            raise ValueError(
                f"schedule.milestones: epochs must be >= 0 (got {v}); list epochs from 0 on, e.g. [30, 60, 80]"
            )
        if any(b <= a for a, b in zip(v, v[1:])):
            raise ValueError(
                f"schedule.milestones: must be strictly increasing (got {v}); list each "
                f"epoch once, in order, e.g. [30, 60, 80]"
            )
        return v


# --------------------------------------------------------------------------- scaling rules


class NoiseSignal(Protocol):
    """What a noise-aware rule (AdaScale) reads: ``var`` = EMA(tr(Sigma)) / B0 (the gradient
    variance at the base batch) and ``sqr`` = EMA(|G|^2)."""

    @property
    def var(self) -> float: ...

    @property
    def sqr(self) -> float: ...


ScalingRule = Callable[[float, "NoiseSignal | None"], float]
"""``rule(k, noise) -> s``: the LR multiplier at ``k = B / B0`` (``s(1) = 1``)."""


def _linear(k: float, noise: NoiseSignal | None = None) -> float:
    return k


def _sqrt(k: float, noise: NoiseSignal | None = None) -> float:
    return math.sqrt(k)


def _no_scaling(k: float, noise: NoiseSignal | None = None) -> float:
    return 1.0


def _adascale(k: float, noise: NoiseSignal | None = None) -> float:
    """AdaScale gain r = (var + sqr) / (var / k + sqr) (Johnson et al. 2020), with ``var`` the
    gradient variance at the base batch (tr(Sigma) / B0) and ``sqr`` = |G|^2.  Until the
    noise-scale estimator has an estimate, r = 1 (no scaling: the safe side)."""
    if noise is None:
        return 1.0
    var, sqr = max(noise.var, 0.0), max(noise.sqr, 0.0)
    if var + sqr <= 0:
        return 1.0
    return (var + sqr) / (var / k + sqr)


SCALING_RULES: dict[str, ScalingRule] = {"linear": _linear, "sqrt": _sqrt, "none": _no_scaling, "adascale": _adascale}


# --------------------------------------------------------------------------- warmups


@dataclass(frozen=True)
class WarmupRule:
    """A fixed-length warmup: its length in epochs and its LR inside it.

    ``length(E_w, k)`` is the epoch the warmup ends at; ``ramp(f, eta0, eta_peak)`` the LR at
    fraction ``f`` in [0, 1) of it.
    """

    length: Callable[[float, float], float]
    ramp: Callable[[float, float, float], float]


def _linear_ramp(f: float, eta0: float, peak: float) -> float:
    return eta0 + (peak - eta0) * f


WARMUPS: dict[str, WarmupRule] = {
    "none": WarmupRule(length=lambda ew, k: 0.0, ramp=lambda f, eta0, peak: peak),
    "constant": WarmupRule(length=lambda ew, k: ew, ramp=lambda f, eta0, peak: eta0),
    "gradual": WarmupRule(length=lambda ew, k: ew, ramp=_linear_ramp),
    "linear": WarmupRule(length=lambda ew, k: ew, ramp=lambda f, eta0, peak: peak * f),
    "legw": WarmupRule(length=lambda ew, k: ew * k, ramp=_linear_ramp),
}
"""Fixed-length warmups; ``auto`` has a state of its own (``AutoWarmup``)."""


# --------------------------------------------------------------------------- decays

Decay = Callable[[ScheduleConfig, float, float, float, float], float]
"""``decay(cfg, eta_peak, epoch, start, end) -> eta`` for ``start <= epoch``."""


def _progress(epoch: float, start: float, end: float) -> float:
    if end <= start:
        return 1.0 if epoch >= end else 0.0
    return min(1.0, max(0.0, (epoch - start) / (end - start)))


def _cosine(cfg: ScheduleConfig, peak: float, epoch: float, start: float, end: float) -> float:
    p = _progress(epoch, start, end)
    return cfg.min_lr + (peak - cfg.min_lr) * 0.5 * (1.0 + math.cos(math.pi * p))


def _poly(cfg: ScheduleConfig, peak: float, epoch: float, start: float, end: float) -> float:
    p = _progress(epoch, start, end)
    return cfg.min_lr + (peak - cfg.min_lr) * (1.0 - p) ** cfg.poly_power


def _linear_decay(cfg: ScheduleConfig, peak: float, epoch: float, start: float, end: float) -> float:
    p = _progress(epoch, start, end)
    return cfg.min_lr + (peak - cfg.min_lr) * (1.0 - p)


def milestones_passed(milestones: list[float], epoch: float) -> int:
    """How many of ``milestones`` the step starting at ``epoch`` has passed (``epoch >= m``).

    The one comparison both the step/seesaw decay and the seesaw batch policy
    (``trainers/policies/batching.py``) use, so the LR cut and the batch growth fall on the same step."""
    return sum(1 for m in milestones if epoch >= m)


def _step(cfg: ScheduleConfig, peak: float, epoch: float, start: float, end: float) -> float:
    return max(cfg.min_lr, peak * cfg.decay_factor ** milestones_passed(cfg.milestones, epoch))


def _no_decay(cfg: ScheduleConfig, peak: float, epoch: float, start: float, end: float) -> float:
    return peak


DECAYS: dict[str, Decay] = {
    "cosine": _cosine,
    "poly": _poly,
    "linear": _linear_decay,
    "step": _step,
    "seesaw": _step,
    "none": _no_decay,
}
"""``seesaw`` is the step formula: its batch growth comes from ``batch.policy: seesaw`` and its
smaller LR cut from the sqrt scaling rule at the grown batch (see the module docstring)."""


# --------------------------------------------------------------------------- auto warmup


@dataclass(frozen=True)
class AutoDecision:
    """What one ``AutoWarmup.check`` concluded, with the reason (for logging)."""

    done: bool  # the warmup is over (now or earlier)
    stopped_now: bool  # this check ended it
    prob_rising: float  # posterior P(f(last) > f(argmin)); nan when not computed
    streak: int  # consecutive checks that saw the loss stop falling
    peak_lr: float | None
    reason: str


class AutoWarmup:
    """Kim et al. 2021's adaptive warmup: grow the LR until the training loss stops falling.

    While warming, the LR of optimizer step ``t`` (0-based, counted in ``record`` calls) is
    ``min(auto_max_lr, auto_init_lr * auto_growth^t)``.

    Calls, in the same order on every rank (losses must already be averaged across ranks):

    - ``record(lr, loss)`` after every optimizer step: appends (log lr, loss) to the history
      and advances the growth while warming; a no-op once the warmup is over.
    - ``check(epoch, batch_size)`` at every epoch end (or every N steps, see below): fits a
      Gaussian process ``loss(t) = f(t) + noise`` to the whole warmup history (binned into at
      most ``auto_max_points`` means of consecutive steps; kernel C*RBF + White, fixed
      ``random_state``: a deterministic function of the history, so every rank decides the
      same) and computes ``P = P(f(t_last) > f(t_min))`` from the joint posterior of the
      latent ``f`` at the last point and at the argmin of the posterior mean.  A check with
      ``P >= auto_confidence`` extends the streak, any other resets it; after
      ``auto_patience`` consecutive such checks the warmup ends, with peak LR = the LR at the
      smoothed minimum (geometric mean LR of that bin).  It also ends at once when the LR has
      reached ``auto_max_lr`` (peak = the smoothed-minimum LR) or a loss was not finite.

    Check frequency: ``auto_patience`` counts checks, not epochs.  Checking every N steps
    is fine (each check refits the whole history, ~10-100 ms); a check with no step
    recorded since the previous one is ignored and does not move the streak; checks
    before ``auto_min_steps`` steps are recorded never decide.  With more frequent checks
    raise ``auto_patience`` so that patience * N steps is still long enough to see a trend.

    After the warmup the schedule decays from ``peak_lr`` (rescaled by the scaling rule if
    the batch changes: ``peak_lr * s(B) / s(B_peak)``) to ``min_lr`` with ``schedule.decay``
    between ``end_epoch`` and the last epoch.
    """

    def __init__(self, cfg: ScheduleConfig):
        self.cfg = cfg
        self.steps = 0
        self.log_lrs: list[float] = []
        self.losses: list[float] = []
        self.nonfinite = 0
        self.streak = 0
        self.checks = 0
        self.checked_at_steps = 0
        self.done = False
        self.peak_lr: float | None = None
        self.peak_batch: int | None = None
        self.end_epoch: float | None = None
        self.reason = ""

    # -- per step -------------------------------------------------------------------------

    def current_lr(self) -> float:
        """The LR of the next optimizer step while warming."""
        c = self.cfg
        return min(c.auto_max_lr, c.auto_init_lr * c.auto_growth**self.steps)

    def record(self, lr: float, loss: float | None) -> None:
        """Feed the LR used by the step just taken and its (rank-averaged) training loss.

        ``loss=None`` (a preview such as ``plan``, which has no loss) only advances the
        growth: the LR goes on growing as in a run whose check has not ended the warmup.
        """
        if self.done:
            return
        self.steps += 1
        if loss is None:
            return
        if not math.isfinite(loss):
            self.nonfinite += 1
            return
        self.log_lrs.append(math.log(lr))
        self.losses.append(float(loss))

    # -- at epoch end (or every N steps) ------------------------------------------------------

    def check(self, epoch: float, batch_size: int) -> AutoDecision:
        """Decide whether the warmup ends now; ``epoch`` is the fractional epoch reached."""
        if self.done:
            return self._decision(False, math.nan)
        if self.steps == self.checked_at_steps:
            return self._decision(False, math.nan, "no new step since the last check")
        self.checked_at_steps = self.steps
        self.checks += 1
        if self.nonfinite:
            return self._stop(epoch, batch_size, math.nan, "a training loss was not finite")
        if len(self.losses) < self.cfg.auto_min_steps:
            return self._decision(False, math.nan, f"{len(self.losses)} of {self.cfg.auto_min_steps} steps recorded")
        smooth = _smooth(self.losses, self.log_lrs, self.cfg.auto_max_points, self.cfg.auto_seed)
        if self.current_lr() >= self.cfg.auto_max_lr:
            return self._stop(epoch, batch_size, smooth.prob_rising, "reached auto_max_lr", smooth.argmin_lr)
        if smooth.prob_rising >= self.cfg.auto_confidence:
            self.streak += 1
        else:
            self.streak = 0
        if self.streak >= self.cfg.auto_patience:
            return self._stop(
                epoch,
                batch_size,
                smooth.prob_rising,
                f"loss stopped falling for {self.streak} checks",
                smooth.argmin_lr,
            )
        return self._decision(
            False,
            smooth.prob_rising,
            "loss still falling"
            if self.streak == 0
            else f"loss stopped falling ({self.streak} of {self.cfg.auto_patience} checks)",
        )

    def _stop(self, epoch: float, batch_size: int, prob: float, reason: str, peak: float | None = None) -> AutoDecision:
        if peak is None:  # no smoother: the last LR whose loss was finite, else the first LR
            peak = math.exp(self.log_lrs[-1]) if self.log_lrs else self.cfg.auto_init_lr
        self.done, self.peak_lr, self.peak_batch, self.end_epoch = True, float(peak), int(batch_size), float(epoch)
        self.reason = reason
        return self._decision(True, prob)

    def _decision(self, stopped_now: bool, prob: float, reason: str | None = None) -> AutoDecision:
        return AutoDecision(
            done=self.done,
            stopped_now=stopped_now,
            prob_rising=prob,
            streak=self.streak,
            peak_lr=self.peak_lr,
            reason=self.reason if reason is None else reason,
        )

    # -- checkpoint ---------------------------------------------------------------------------

    _FIELDS = (
        "steps",
        "log_lrs",
        "losses",
        "nonfinite",
        "streak",
        "checks",
        "checked_at_steps",
        "done",
        "peak_lr",
        "peak_batch",
        "end_epoch",
        "reason",
    )

    def state_dict(self) -> dict[str, Any]:
        """Plain ints, floats, bools, strings, lists and None: loads with ``weights_only=True``."""
        out = {name: getattr(self, name) for name in self._FIELDS}
        out["log_lrs"], out["losses"] = list(self.log_lrs), list(self.losses)
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        missing = [name for name in self._FIELDS if name not in state]
        if missing:
            raise ValueError(f"AutoWarmup state misses {missing}")
        for name in self._FIELDS:
            setattr(self, name, state[name])
        self.log_lrs = [float(x) for x in state["log_lrs"]]
        self.losses = [float(x) for x in state["losses"]]


@dataclass(frozen=True)
class _Smoothed:
    prob_rising: float
    argmin_lr: float


def _bins(values: np.ndarray, count: int) -> np.ndarray:
    """Means of ``count`` runs of consecutive values (all of them if there are fewer)."""
    if len(values) <= count:
        return values.astype(np.float64)
    return np.array([chunk.mean() for chunk in np.array_split(values, count)])


def _smooth(losses: list[float], log_lrs: list[float], max_points: int, seed: int) -> _Smoothed:
    """GP posterior of the latent loss curve: P(f(last) > f(argmin)) and the LR at the argmin."""
    # only the CBS warmup fits a Gaussian process: scipy and scikit-learn load here
    from scipy.linalg import solve_triangular
    from scipy.stats import norm
    from sklearn.exceptions import (
        ConvergenceWarning,
    )
    from sklearn.gaussian_process import (
        GaussianProcessRegressor,
    )
    from sklearn.gaussian_process.kernels import (
        RBF,
        ConstantKernel,
        WhiteKernel,
    )
    from threadpoolctl import threadpool_limits

    n = len(losses)
    x = _bins(np.arange(n, dtype=np.float64), max_points) / max(n - 1, 1)
    y = _bins(np.asarray(losses, dtype=np.float64), max_points)
    lr = _bins(np.asarray(log_lrs, dtype=np.float64), max_points)
    mean, std = float(y.mean()), float(y.std()) or 1.0
    z = (y - mean) / std
    kernel = ConstantKernel(1.0, (1e-3, 1e3)) * RBF(length_scale=0.2, length_scale_bounds=(0.03, 10.0)) + WhiteKernel(
        noise_level=0.1, noise_level_bounds=(1e-6, 10.0)
    )
    gp = GaussianProcessRegressor(kernel=kernel, normalize_y=False, random_state=seed, n_restarts_optimizer=0)
    # One BLAS thread: fast for a few hundred points, and the same float reductions on every rank.
    with warnings.catch_warnings(), threadpool_limits(limits=1):
        warnings.simplefilter("ignore", ConvergenceWarning)
        gp.fit(x[:, None], z)
    signal = gp.kernel_.k1  # the latent f's kernel, without the white noise
    k_star = signal(x[:, None], x[:, None])
    f_mean = k_star @ gp.alpha_
    i_min, i_last = int(np.argmin(f_mean)), len(x) - 1
    if i_min == i_last:
        return _Smoothed(prob_rising=0.0, argmin_lr=math.exp(lr[i_min]))
    pts = x[[i_min, i_last], None]
    v = solve_triangular(gp.L_, signal(x[:, None], pts), lower=True)
    cov = signal(pts) - v.T @ v
    diff = f_mean[i_last] - f_mean[i_min]
    var = max(cov[0, 0] + cov[1, 1] - 2.0 * cov[0, 1], 1e-12)
    return _Smoothed(prob_rising=float(norm.cdf(diff / math.sqrt(var))), argmin_lr=math.exp(lr[i_min]))


# --------------------------------------------------------------------------- the schedule


class Schedule:
    """The LR of every optimizer step: ``lr(epoch, batch_size, auto)``.  Stateless.

    ``base_lr`` is eta0 (``optimizer.lr``), ``base_batch`` B0 (``optimizer.base_batch_size``),
    ``total_epochs`` E (``train.epochs``).  The training loop and the ``plan`` preview call
    the same method, so the preview is the schedule.
    """

    def __init__(self, cfg: ScheduleConfig, base_lr: float, base_batch: int, total_epochs: float):
        if base_lr <= 0:
            raise ValueError(f"optimizer.lr: must be > 0 (got {base_lr})")
        if base_batch <= 0:
            raise ValueError(f"optimizer.base_batch_size: must be > 0 (got {base_batch})")
        if total_epochs <= 0:
            raise ValueError(f"train.epochs: must be > 0 (got {total_epochs})")
        self.cfg, self.base_lr, self.base_batch, self.total_epochs = cfg, base_lr, base_batch, total_epochs
        self.rule: ScalingRule = SCALING_RULES[cfg.scaling_rule]
        self.decay: Decay = DECAYS[cfg.decay]

    def new_auto(self) -> AutoWarmup | None:
        """The auto-warmup state the loop must keep (and checkpoint), or None if not ``auto``."""
        return AutoWarmup(self.cfg) if self.cfg.warmup == "auto" else None

    def scale(self, batch_size: int, noise: NoiseSignal | None = None) -> float:
        """``s(k)``, k = B / B0: the scaling rule's LR multiplier."""
        return self.rule(batch_size / self.base_batch, noise)

    def peak_lr(self, batch_size: int, auto: AutoWarmup | None = None, noise: NoiseSignal | None = None) -> float:
        """The LR the decay starts from: eta0 * s(k), or the auto warmup's peak rescaled to B."""
        if self.cfg.warmup != "auto":
            return self.base_lr * self.scale(batch_size, noise)
        auto = self._need_auto(auto)
        if not auto.done or auto.peak_lr is None or auto.peak_batch is None:
            raise ValueError("the auto warmup has not ended yet: no peak LR")
        return auto.peak_lr * self.scale(batch_size, noise) / self.scale(auto.peak_batch, noise)

    def warmup_end(self, batch_size: int, auto: AutoWarmup | None = None) -> float | None:
        """The epoch the warmup ends at for batch B; None while an auto warmup is running."""
        if self.cfg.warmup == "auto":
            auto = self._need_auto(auto)
            return auto.end_epoch if auto.done else None
        return WARMUPS[self.cfg.warmup].length(self.cfg.warmup_epochs, batch_size / self.base_batch)

    def lr(
        self, epoch: float, batch_size: int, auto: AutoWarmup | None = None, noise: NoiseSignal | None = None
    ) -> float:
        """The LR for the optimizer step taken after ``epoch`` (fractional) epochs at global batch B."""
        if batch_size <= 0:
            raise ValueError(f"batch_size: must be > 0 (got {batch_size})")
        end = self.warmup_end(batch_size, auto)
        if end is None:  # auto warmup still growing
            return self._need_auto(auto).current_lr()
        peak = self.peak_lr(batch_size, auto, noise)
        if epoch < end:
            return WARMUPS[self.cfg.warmup].ramp(epoch / end, self.base_lr, peak)
        return self.decay(self.cfg, peak, epoch, end, self.total_epochs)

    def _need_auto(self, auto: AutoWarmup | None) -> AutoWarmup:
        if auto is None:
            raise ValueError("schedule.warmup is 'auto': pass the AutoWarmup state (Schedule.new_auto())")
        return auto
