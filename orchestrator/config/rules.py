"""The rules between fields of a validated config: fields that cannot go together (:data:`COMBINATIONS`).

Each section's pydantic class checks its own fields one at a time (type, range, one list's order);
every rule that relates two or more fields, within a section or across sections, is here, so a
worker's re-validation of the driver's dump stays cheap and every entry point gets the same rules
from one call (``orchestrator/config/preflight.py`` ``check_config``).  Each raises
:class:`~orchestrator.config.schema.ConfigError` with one line ``field: problem; fix``; what a
gradient-combination method cannot honour is the method's own check
(``trainers/combine/config.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from orchestrator.config.schema import ConfigError
from trainers import catalog
from trainers.accel.config import check_precision
from trainers.combine.config import RULES, OtherSettings, check_section
from trainers.data.config import dataset_info
from trainers.policies.batching import round_up

if TYPE_CHECKING:
    from orchestrator.config.schema import RootConfig


def _choice(cfg: RootConfig) -> None:
    """A ``data``/``model`` section names a built-in or a factory, never both; ``data.val_split:
    test`` needs a dataset with an official test set."""
    for section in ("data", "model"):
        part = getattr(cfg, section)
        if part.name is not None and part.factory is not None:
            raise ConfigError(
                f"{section}.factory: give either {section}.name ({part.name!r}) or {section}.factory "
                f"({part.factory!r}), not both; remove one of them"
            )
        if (
            section == "data"
            and part.val_split == "test"
            and (part.builtin is None or part.builtin.test_samples is None)
        ):
            with_test_set = ", ".join(catalog.dataset_names(lambda d: d.test_samples is not None))
            raise ConfigError(
                f"data.val_split: test needs a dataset with an official test set ({with_test_set}), "
                f"not {part.factory or part.name!r}; set data.val_split: fraction"
            )


def _weight_decay_rule(cfg: RootConfig) -> None:
    """``optimizer.wd_rule: timescale`` is AdamW's, with a weight decay to scale."""
    opt = cfg.optimizer
    if opt.wd_rule == "timescale":
        if opt.name != "adamw":
            raise ConfigError(
                f"optimizer.wd_rule: timescale is defined for AdamW's decoupled weight decay, got "
                f"optimizer.name '{opt.name}'; set optimizer.name: adamw or wd_rule: none"
            )
        if opt.weight_decay <= 0:
            raise ConfigError(
                "optimizer.weight_decay: wd_rule timescale scales it with B, so it must be > 0; "
                "set the value tuned at base_batch_size, e.g. 0.1"
            )


def _batch_sizes(cfg: RootConfig) -> None:
    """``batch.max_size`` caps ``batch.size`` and the schedule's entries; the schedule starts at or
    above ``batch.size`` (each entry against the one before: ``BatchConfig``'s own validator)."""
    batch = cfg.batch
    if batch.max_size is not None and batch.max_size < batch.size:
        raise ConfigError(
            f"batch.max_size: {batch.max_size} is below batch.size {batch.size}; "
            f"raise it to at least {batch.size} or remove it"
        )
    for i, (_, entry) in enumerate(batch.schedule):
        where = f"batch.schedule[{i}]"
        if i == 0 and entry < batch.size:
            raise ConfigError(
                f"{where}: batch {entry} is below batch.size {batch.size}; the batch only grows, "
                "so list non-decreasing sizes"
            )
        if batch.max_size is not None and entry > batch.max_size:
            raise ConfigError(
                f"{where}: batch {entry} is above batch.max_size {batch.max_size}; raise max_size or lower the entry"
            )


def _batch_policy_fields(cfg: RootConfig) -> None:
    """``batch.schedule`` with the schedule policy only; ``ramp_to`` and ``ramp_epochs`` with the ramp
    only, the ramp growing B in whole ``round_to`` steps up to at most ``max_size``."""
    batch = cfg.batch
    if batch.policy == "schedule" and not batch.schedule:
        raise ConfigError(
            "batch.schedule: required by batch.policy schedule; give [epoch, batch] pairs, e.g. [[0, 64], [3, 256]]"
        )
    if batch.policy != "schedule" and batch.schedule:
        raise ConfigError(
            f"batch.schedule: given but batch.policy is {batch.policy!r}; "
            "set batch.policy: schedule or remove the schedule"
        )
    if batch.policy != "ramp":
        for name in ("ramp_to", "ramp_epochs"):
            if getattr(batch, name) is not None:
                raise ConfigError(
                    f"batch.{name}: given but batch.policy is {batch.policy!r}; set batch.policy: ramp or remove {name}"
                )
        return
    if batch.ramp_to is None or batch.ramp_epochs is None:
        missing = "ramp_to" if batch.ramp_to is None else "ramp_epochs"
        raise ConfigError(
            f"batch.{missing}: required by batch.policy ramp; give both, e.g. ramp_to: 512 and ramp_epochs: 2"
        )
    if batch.ramp_to <= batch.size:
        raise ConfigError(
            f"batch.ramp_to: {batch.ramp_to} is not above batch.size {batch.size}; "
            f"the ramp grows B, so set it above {batch.size}"
        )
    if (batch.ramp_to - batch.size) % batch.round_to:
        raise ConfigError(
            f"batch.ramp_to: {batch.ramp_to} - batch.size {batch.size} is not a multiple of "
            f"batch.round_to {batch.round_to} (the ramp's increment); use ramp_to "
            f"{batch.size + round_up(batch.ramp_to - batch.size, batch.round_to)} or another round_to"
        )
    if batch.max_size is not None and batch.ramp_to > batch.max_size:
        raise ConfigError(
            f"batch.ramp_to: {batch.ramp_to} is above batch.max_size {batch.max_size}; raise max_size or lower ramp_to"
        )


def _warmup_and_decay(cfg: RootConfig) -> None:
    """The ``schedule`` section's warmup, decay and scaling rule that only work together."""
    schedule = cfg.schedule
    if schedule.warmup not in ("none", "auto") and schedule.warmup_epochs <= 0:
        raise ConfigError(
            f"schedule.warmup_epochs: must be > 0 when schedule.warmup is '{schedule.warmup}'; set it, e.g. 5"
        )
    if schedule.warmup == "legw" and schedule.scaling_rule != "sqrt":
        raise ConfigError(
            f"schedule.scaling_rule: warmup 'legw' is defined with sqrt scaling (You et al.), "
            f"got '{schedule.scaling_rule}'; set schedule.scaling_rule: sqrt"
        )
    if schedule.warmup == "auto" and schedule.decay == "none":
        raise ConfigError(
            "schedule.decay: warmup 'auto' decays from the LR it finds (Kim et al. use cosine); "
            "set schedule.decay: cosine"
        )
    if schedule.decay in ("step", "seesaw") and not schedule.milestones:
        raise ConfigError(f"schedule.milestones: required when schedule.decay is '{schedule.decay}'; e.g. [30, 60, 80]")
    if schedule.decay == "seesaw" and schedule.scaling_rule != "sqrt":
        raise ConfigError(
            f"schedule.scaling_rule: decay 'seesaw' keeps lr / sqrt(B) as the step schedule would "
            f"(Meterez et al. 2025), got '{schedule.scaling_rule}'; set schedule.scaling_rule: sqrt"
        )
    if schedule.decay == "seesaw" and schedule.decay_factor >= 1.0:
        raise ConfigError(
            "schedule.decay_factor: 1 makes seesaw neither cut the LR nor grow the batch; set it below 1, e.g. 0.5"
        )
    if schedule.auto_max_lr <= schedule.auto_init_lr:
        raise ConfigError(
            f"schedule.auto_max_lr: {schedule.auto_max_lr} must be above schedule.auto_init_lr "
            f"{schedule.auto_init_lr}; raise auto_max_lr or lower auto_init_lr"
        )


def _combine_section(cfg: RootConfig) -> None:
    """The ``combine`` section's fields against its method (``trainers.combine.config.check_section``):
    what the chosen method needs, and no field only other methods read."""
    try:
        check_section(cfg.combine)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def _worker_range(cfg: RootConfig) -> None:
    scaling = cfg.scaling
    if scaling.min_workers > scaling.max_workers:
        raise ConfigError(
            f"scaling.min_workers: {scaling.min_workers} is above scaling.max_workers "
            f"{scaling.max_workers}; lower min_workers or raise max_workers"
        )


def _within_training(cfg: RootConfig) -> None:
    """What a schedule or a batch policy does must fit in ``train.epochs``."""
    schedule, total = cfg.schedule, cfg.train.epochs
    if schedule.warmup in ("constant", "gradual", "linear") and schedule.warmup_epochs >= total:
        raise ConfigError(
            f"schedule.warmup_epochs: {schedule.warmup_epochs} leaves no epoch after warmup "
            f"(train.epochs is {total}); lower it"
        )
    late = [m for m in schedule.milestones if m >= total]
    if schedule.decay in ("step", "seesaw") and late:
        raise ConfigError(f"schedule.milestones: {late} at or after train.epochs {total} never apply; remove them")


def _batch_with_schedule(cfg: RootConfig) -> None:
    """The seesaw batch policy and the seesaw decay go together; a ramp ends before training does."""
    batch, schedule, total = cfg.batch, cfg.schedule, cfg.train.epochs
    if batch.policy == "seesaw" and schedule.decay != "seesaw":
        raise ConfigError(
            f"schedule.decay: batch.policy seesaw grows B where the LR schedule's milestones "
            f"cut the LR, got decay '{schedule.decay}'; set schedule.decay: seesaw (with "
            f"milestones and scaling_rule: sqrt)"
        )
    if schedule.decay == "seesaw" and batch.policy != "seesaw":
        raise ConfigError(
            f"batch.policy: schedule.decay seesaw cuts the LR by only sqrt(decay_factor) because "
            f"the batch grows at the same milestones, got batch.policy '{batch.policy}'; set "
            f"batch.policy: seesaw (or schedule.decay: step)"
        )
    if batch.policy == "ramp" and batch.ramp_epochs is not None and batch.ramp_epochs >= total:
        raise ConfigError(
            f"batch.ramp_epochs: {batch.ramp_epochs:g} is not below train.epochs "
            f"{total:g}, so B never reaches ramp_to {batch.ramp_to}; lower it"
        )


def _weight_decay_with_scaling(cfg: RootConfig) -> None:
    """``optimizer.wd_rule: timescale`` needs the LR a batch gets ahead of time."""
    if cfg.optimizer.wd_rule == "timescale" and cfg.schedule.scaling_rule == "adascale":
        raise ConfigError(
            "optimizer.wd_rule: timescale needs the LR a batch gets ahead of time, but adascale's "
            "gain is measured at run time; use schedule.scaling_rule linear, sqrt or none"
        )


def _sync_bn(cfg: RootConfig) -> None:
    if cfg.model.sync_bn and not cfg.scaling.use_gpu:
        raise ConfigError(
            "model.sync_bn: PyTorch's SyncBatchNorm runs on GPUs only; set scaling.use_gpu: true "
            "or model.sync_bn: false (per-worker BatchNorm)"
        )


def _token_data(cfg: RootConfig) -> bool:
    """Whether the data are a built-in set of token ids (a language model's inputs)."""
    data = cfg.data
    return data.factory is None and data.builtin is not None and data.builtin.inputs == "tokens"


def check_fast_path(cfg: RootConfig) -> None:
    """The GPU fast path's options against the resources (``trainers/accel/``): fp16 and data on the
    accelerator need GPUs; channels_last and augmentation need an image model and image inputs
    (known here for built-in data and models; a factory's model is checked once built, by
    ``trainers.accel.device.to_channels_last`` on the worker)."""
    data, model, use_gpu = cfg.data, cfg.model, cfg.scaling.use_gpu
    try:  # the precision's own rule, which the worker also applies to the device it got
        check_precision(cfg.train.precision, "cuda" if use_gpu else "cpu")
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if data.device == "accelerator" and not use_gpu:
        raise ConfigError(
            "data.device: accelerator keeps the dataset on the GPU and needs scaling.use_gpu: true; "
            "set data.device: host to train on CPUs"
        )
    if model.channels_last and model.builtin is not None and not model.builtin.image:
        raise ConfigError(
            f"model.channels_last: {model.name} has no Conv2d layer (not a 4-D image model); set "
            f"model.channels_last: false, or use {'/'.join(catalog.model_names(lambda b: b.image))}"
        )
    if data.in_memory:
        shape = list(dataset_info(data).shape)
    elif _token_data(cfg):
        shape = [data.context]
    else:
        return
    if model.channels_last and len(shape) != 3:
        raise ConfigError(
            f"model.channels_last: needs 4-D image batches (inputs shaped [C, H, W]); this "
            f"dataset's inputs are shaped {shape}; set model.channels_last: false"
        )
    if data.augment and len(shape) != 3:
        raise ConfigError(
            f"data.augment: {', '.join(data.augment)} need image inputs shaped [C, H, W]; this "
            f"dataset's inputs are shaped {shape}; remove data.augment"
        )


def check_combine(cfg: RootConfig) -> None:
    """What the rest of the config asks that ``combine.method`` cannot honour: the chosen method's
    own check (``MethodRules.check``, ``trainers/combine/config.py``), one line."""
    other = OtherSettings(
        scaling_rule=cfg.schedule.scaling_rule,
        batch_policy=cfg.batch.policy,
        check_every=cfg.batch.check_every,
        min_workers=cfg.scaling.min_workers,
        max_workers=cfg.scaling.max_workers,
        scaling_policy=cfg.scaling.policy,
        optimizer=cfg.optimizer.name,
        precision=cfg.train.precision,
    )
    try:
        RULES[cfg.combine.method].check(cfg.combine, other)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def check_adversarial(cfg: RootConfig) -> None:
    """``train.adversarial`` (trainers/loop/adversarial.py) perturbs the model's input along its
    gradient: the text LM's input is token ids, which have none, so it is refused there (the
    embeddings are not perturbed instead: that would be another method than the paper's)."""
    a = cfg.train.adversarial
    if a.method == "none":
        return
    if _token_data(cfg) or cfg.model.language_model:
        raise ConfigError(
            f"train.adversarial.method: {a.method} perturbs the model input along its gradient, and the "
            f"language model's input is token ids (no gradient); set train.adversarial.method: none"
        )
    if a.epsilon == 0:
        raise ConfigError(
            f"train.adversarial.epsilon: 0 perturbs nothing (method {a.method} would only train twice on "
            "each batch); give epsilon > 0 (e.g. 0.03), or train.adversarial.method: none"
        )


COMBINATIONS: tuple[Callable[[RootConfig], None], ...] = (
    # within a section, in the sections' order
    _choice,
    _weight_decay_rule,
    _batch_sizes,
    _batch_policy_fields,
    _warmup_and_decay,
    _combine_section,
    _worker_range,
    # across sections
    _within_training,
    _batch_with_schedule,
    _weight_decay_with_scaling,
    _sync_bn,
    check_fast_path,
    check_combine,
    check_adversarial,
)
"""Every rule between fields, in the order a user fixes them (a section's own first)."""


def check_combinations(cfg: RootConfig) -> None:
    """Refuse fields that cannot go together (:data:`COMBINATIONS`): the first broken rule, one line."""
    for rule in COMBINATIONS:
        rule(cfg)


# --------------------------------------------------------------------------- what the user gave


def user_set(cfg: RootConfig, dotted: str) -> bool:
    """Whether the user gave ``dotted`` (``section.key``): pydantic's ``model_fields_set`` of the root
    and of the section (see ``orchestrator/config/preflight.py``)."""
    section, key = dotted.split(".", 1)
    return section in cfg.model_fields_set and key in getattr(cfg, section).model_fields_set


def goodput_chooses_batch(c: RootConfig) -> bool:
    """``scaling.policy: goodput`` chooses B too: the batch policy is fixed and ``batch.max_size`` is
    above ``batch.size`` (trainers/loop/trainer.py ``goodput_max_batch``)."""
    b = c.batch
    return c.scaling.policy == "goodput" and b.policy == "fixed" and b.max_size is not None and b.max_size > b.size
