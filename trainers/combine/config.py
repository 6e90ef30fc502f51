"""The ``combine`` section (``CombineConfig``) and what the driver's config check asks of each
``combine.method``: one rules class per method (:class:`MethodRules`), chosen by name (:data:`RULES`).

No torch here: the driver checks a config without importing it.  Each method's class in
``trainers/combine/combinations.py`` derives from its rules class here and from the loop's protocol
(``trainers/combine/base.py`` ``Combination``), so ``combinations.METHODS[name]`` answers the same
checks.  Each check raises ``ValueError`` with one line ``field: problem; fix`` (the driver turns it
into its ``ConfigError``, as it does ``trainers.accel.config.check_precision``'s).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from pydantic import ConfigDict, Field

from trainers.section import Section

__all__ = [
    "RULES",
    "AdasumRules",
    "CombineConfig",
    "CombineMethod",
    "DecentLaMRules",
    "DecentralizedRules",
    "DmSGDRules",
    "LocalSGDRules",
    "MeanRules",
    "MethodRules",
    "OtherSettings",
    "Topology",
    "check_section",
]

CombineMethod = Literal["mean", "adasum", "local_sgd", "dmsgd", "decentlam"]
Topology = Literal["ring", "exponential"]


class CombineConfig(Section):
    """The ``combine`` section: how the workers' gradients (or models) are combined."""

    model_config = ConfigDict(extra="forbid")

    method: CombineMethod = Field(
        default="mean",
        description="mean (DDP average), adasum, local_sgd, or the decentralized dmsgd / decentlam "
        "(each worker its own parameters, mixed with its graph neighbours every step)",
    )
    local_steps: int | None = Field(
        default=None, ge=1, description="local_sgd: H, steps between parameter averages (H=1 averages every step)"
    )
    average_momentum: bool | None = Field(
        default=None,
        description="local_sgd: also average the optimizer's "
        "per-parameter state (momentum buffers) at a sync; unset = true",
    )

    topology: Topology | None = Field(
        default=None,
        description="dmsgd/decentlam: the workers' graph, ring (i +/- 1) or exponential "
        "(i +/- 2^k); unset = exponential",
    )

    @property
    def graph(self) -> str:
        """The decentralized methods' topology (``exponential`` when unset)."""
        return self.topology or "exponential"

    @property
    def H(self) -> int:
        """Steps between syncs (1 for the methods that combine every step)."""
        return self.local_steps or 1

    @property
    def averages_momentum(self) -> bool:
        return True if self.average_momentum is None else self.average_momentum


@dataclass(frozen=True)
class OtherSettings:
    """The settings outside the ``combine`` section that a method is checked against."""

    scaling_rule: str  # schedule.scaling_rule
    batch_policy: str  # batch.policy
    check_every: int  # batch.check_every
    min_workers: int  # scaling.min_workers
    max_workers: int  # scaling.max_workers
    scaling_policy: str  # scaling.policy
    optimizer: str  # optimizer.name
    precision: str  # train.precision


# --------------------------------------------------------------------------- the rules of each method


class MethodRules:
    """What one ``combine.method`` needs of the config and cannot honour in it.  The defaults: no
    DDP, no field of the section its own, nothing refused beyond what :meth:`check` refuses of
    every method without DDP."""

    #: the value of ``combine.method`` that chooses this class
    name: ClassVar[str]
    #: whether DDP wraps the model and averages the gradients in the backward (and so whether the
    #: gradient-noise probe, which hooks into DDP's all-reduce, can measure anything)
    uses_ddp: ClassVar[bool] = False
    #: the ``combine`` fields this method reads, each with the fix that says so when another
    #: method is in force (:func:`check_section` refuses them there)
    fields: ClassVar[dict[str, str]] = {}

    @classmethod
    def check_fields(cls, cfg: CombineConfig) -> None:
        """Raise ``ValueError`` for a field of the ``combine`` section this method needs and lacks
        (the default: it needs none)."""
        return None

    @classmethod
    def check(cls, cfg: CombineConfig, other: OtherSettings) -> None:
        """Raise ``ValueError`` for what the rest of the config asks that this method cannot honour.

        Without DDP two requests are refused whatever the method: ``scaling.policy: goodput`` reads
        the gradient noise scale the probe measures on DDP's all-reduce; and fp16's loss scaler
        skips a step on one rank's inf/NaN gradients, which without a combined gradient need not be
        every rank's (the step would still be combined or counted toward a sync).  A method's own
        refusals (:meth:`refuse`) come between them."""
        if not cls.uses_ddp and other.scaling_policy == "goodput":
            raise ValueError(
                f"scaling.policy: goodput reads the gradient noise scale, which combine.method "
                f"{cls.name} does not measure; use combine.method: mean or scaling.policy: "
                f"workers_for_batch"
            )
        cls.refuse(cfg, other)
        if not cls.uses_ddp and other.precision == "fp16":
            raise ValueError(
                f"train.precision: fp16 cannot be used with combine.method {cls.name}; "
                "use bf16 or fp32, or combine.method: mean"
            )

    @classmethod
    def refuse(cls, cfg: CombineConfig, other: OtherSettings) -> None:
        """Raise ``ValueError`` for what this method alone cannot honour (see :meth:`check`; the
        default: nothing)."""
        return None


class MeanRules(MethodRules):
    """``mean``: DDP's average; nothing in the rest of the config is refused."""

    name = "mean"
    uses_ddp = True


class AdasumRules(MethodRules):
    """``adasum``: a fixed W, no scaling rule, a fixed batch."""

    name = "adasum"

    @classmethod
    def refuse(cls, cfg: CombineConfig, other: OtherSettings) -> None:
        """``schedule.scaling_rule: none``: Adasum adapts between mean and sum itself, so a scaling
        by B/B0 (linear, sqrt) counts twice and ``adascale``'s gain assumes a mean.  ``batch.policy:
        fixed``: ``noise_scale``/``norm_test`` read the noise probe, whose DDP hook measures the
        mean all-reduce Adasum replaces, and a growing batch (``schedule`` too) resizes the group,
        which changes the number of Adasum inputs, the math.  ``scaling.min_workers ==
        scaling.max_workers``: a restart at fewer workers would change it too."""
        if other.scaling_rule != "none":
            raise ValueError(
                f"schedule.scaling_rule: {other.scaling_rule!r} cannot be used with combine.method adasum (it "
                "adapts between mean and sum itself; no scaling by W); set schedule.scaling_rule: none "
                "and tune optimizer.lr at the per-worker batch"
            )
        if other.batch_policy != "fixed":
            raise ValueError(
                f"batch.policy: {other.batch_policy!r} cannot be used with combine.method adasum (a changing "
                "batch resizes the group and changes the number of Adasum inputs; the noise probe "
                "reads the mean all-reduce); set batch.policy: fixed"
            )
        if other.min_workers != other.max_workers:
            raise ValueError(
                f"scaling.min_workers: {other.min_workers} differs from scaling.max_workers "
                f"{other.max_workers}; combine.method adasum needs a fixed worker count (its result "
                "depends on W)"
            )


class LocalSGDRules(MethodRules):
    """``local_sgd``: ``combine.local_steps`` given; no policy that needs the per-step combined gradient."""

    name = "local_sgd"
    fields = {
        "local_steps": "remove local_steps or set combine.method: local_sgd",
        "average_momentum": "remove it or set combine.method: local_sgd",
    }

    @classmethod
    def check_fields(cls, cfg: CombineConfig) -> None:
        if cfg.local_steps is None:
            raise ValueError(
                "combine.local_steps: required by combine.method local_sgd; give H >= 1, "
                "the steps between parameter averages"
            )

    @classmethod
    def refuse(cls, cfg: CombineConfig, other: OtherSettings) -> None:
        """``schedule.scaling_rule: adascale`` and ``batch.policy: noise_scale`` (or ``cbs_warmup``)
        need the per-step combined gradient, which local SGD does not compute (only ``norm_test``
        has a local form).  ``batch.policy: norm_test`` decides at syncs only: ``batch.check_every``
        must be a multiple of ``combine.local_steps``, and it needs ``scaling.max_workers >= 2``."""
        if other.scaling_rule == "adascale":
            raise ValueError(
                "schedule.scaling_rule: 'adascale' cannot be used with combine.method local_sgd (it "
                "needs the per-step combined gradient); choose linear, sqrt or none"
            )
        if other.batch_policy in ("noise_scale", "cbs_warmup"):
            raise ValueError(
                f"batch.policy: {other.batch_policy!r} cannot be used with combine.method local_sgd (it needs "
                "the per-step combined gradient); use batch.policy: norm_test, its local form"
            )
        if other.batch_policy == "norm_test":
            if other.max_workers < 2:
                raise ValueError(
                    "scaling.max_workers: combine.method local_sgd with batch.policy norm_test "
                    "estimates the variance from the workers' gradients and needs at least 2 workers"
                )
            if other.check_every % cfg.H != 0:
                raise ValueError(
                    f"batch.check_every: {other.check_every} is not a multiple of "
                    f"combine.local_steps {cfg.H}; the local norm test runs at syncs only"
                )


class DecentralizedRules(MethodRules):
    """DmSGD and DecentLaM: two workers or more, SGD, a fixed batch, no AdaScale."""

    fields = {"topology": "remove topology or set combine.method: decentlam"}

    @classmethod
    def refuse(cls, cfg: CombineConfig, other: OtherSettings) -> None:
        """``scaling.min_workers >= 2``: at W = 1 there is no graph (the result depends on W and on
        the graph; a resize re-forms it and starts every worker from the saved workers' average).
        ``optimizer.name: sgd``: the recursions are heavy-ball momentum SGD's (DecentLaM's correction
        rides on ``.grad`` into PyTorch's SGD step).  ``batch.policy: fixed`` and a scaling rule other
        than ``adascale``: the noise probe and AdaScale read DDP's mean all-reduce, which is not run."""
        if other.min_workers < 2:
            raise ValueError(
                f"scaling.min_workers: {other.min_workers}; combine.method {cls.name} needs at least 2 "
                "workers (each mixes its parameters with its neighbours'); set scaling.min_workers: 2 "
                "(and max_workers >= 2) or combine.method: mean"
            )
        if other.optimizer != "sgd":
            raise ValueError(
                f"optimizer.name: {other.optimizer!r} cannot be used with combine.method {cls.name} "
                "(its recursion is heavy-ball momentum SGD); set optimizer.name: sgd"
            )
        if other.batch_policy != "fixed":
            raise ValueError(
                f"batch.policy: {other.batch_policy!r} cannot be used with combine.method {cls.name} (the noise "
                "probe reads DDP's mean all-reduce, which it does not run); set batch.policy: fixed"
            )
        if other.scaling_rule == "adascale":
            raise ValueError(
                f"schedule.scaling_rule: 'adascale' cannot be used with combine.method {cls.name} (it "
                "needs the per-step combined gradient); choose linear, sqrt or none"
            )


class DmSGDRules(DecentralizedRules):
    name = "dmsgd"


class DecentLaMRules(DecentralizedRules):
    name = "decentlam"


RULES: dict[str, type[MethodRules]] = {
    rules.name: rules for rules in (MeanRules, AdasumRules, LocalSGDRules, DmSGDRules, DecentLaMRules)
}
"""Every ``combine.method``'s rules by name (the config's ``CombineMethod`` values)."""


def check_section(cfg: CombineConfig) -> None:
    """The ``combine`` section's rules between its own fields: what the chosen method needs
    (:meth:`MethodRules.check_fields`), and no field that only other methods read.  Raises
    ``ValueError`` with one line."""
    chosen = RULES[cfg.method]
    chosen.check_fields(cfg)
    for rules in RULES.values():
        for field, fix in rules.fields.items():
            if field not in chosen.fields and getattr(cfg, field) is not None:
                users = " or ".join(name for name, r in RULES.items() if field in r.fields)
                raise ValueError(
                    f"combine.{field}: only used by combine.method {users}, but method is {cfg.method!r}; {fix}"
                )
