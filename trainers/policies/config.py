"""The ``optimizer`` section (``OptimizerConfig``): the optimizer, its LR and MF at the batch they
were tuned at, and the MF and weight-decay rules.

No torch here: the driver validates a config without importing it.  The optimizers and the rules
are in ``trainers/policies/optim.py``; the ``batch`` and ``schedule`` sections stay beside their
policies (``batching.py``, ``schedules.py``), which import no torch either.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from trainers.section import Section

__all__ = ["MFRuleName", "OptimizerConfig", "OptimizerName", "WDRuleName"]

OptimizerName = Literal["sgd", "nesterov", "adam", "adamw", "lars", "lamb"]
MFRuleName = Literal["fixed", "per_worker_batch"]
WDRuleName = Literal["none", "timescale"]


class OptimizerConfig(Section):
    """The ``optimizer`` section."""

    name: OptimizerName = Field(default="sgd", description="sgd, nesterov, adam, adamw, lars or lamb")
    lr: float = Field(default=0.1, gt=0.0, description="learning rate tuned at base_batch_size")
    base_batch_size: int = Field(default=64, gt=0, description="the batch at which lr was tuned (B0)")
    mf: float = Field(
        default=0.9, ge=0.0, lt=1.0, description="momentum (sgd/nesterov/lars) or beta1 (adam/adamw/lamb)"
    )
    mf_rule: MFRuleName = Field(default="fixed", description="fixed, or per_worker_batch: mf ** (b / mf_ref_batch)")
    mf_ref_batch: int | None = Field(
        default=None, gt=0, description="per-worker batch at which mf was tuned; unset = base_batch_size"
    )
    weight_decay: float = Field(default=0.0, ge=0.0, description="weight decay (decoupled for adamw and lamb)")
    beta2: float = Field(default=0.999, gt=0.0, lt=1.0, description="adam/adamw/lamb: second-moment decay")
    eps: float = Field(default=1e-8, gt=0.0, description="adam/adamw/lamb: added to the denominator")
    trust_coefficient: float = Field(default=0.001, gt=0.0, description="LARS eta_tc")
    wd_rule: WDRuleName = Field(
        default="none",
        description="none, or timescale (adamw): weight_decay x (B/B0) / "
        "s(B/B0), s the scaling rule, keeps tau = B / (lr x wd x "
        "D) at its tuned value as B and its LR change",
    )
