"""Checks of a validated config that need more than one field, before anything starts.

Every rule that relates two or more fields of a config lives here (each section's pydantic class
checks only its own fields, one at a time), and every check raises
:class:`~orchestrator.config.schema.ConfigError` with one line ``field: problem; fix`` (the CLI prints
``error: ...`` and exits 2).  ``orchestrator.config.prepare`` calls them, for every entry point:

- :func:`check_config` is pure (no filesystem, no Ray, no MLflow): fields that cannot go together
  (:data:`COMBINATIONS`: a policy and the fields it needs, the GPU fast path against the
  resources, what a gradient-combination method cannot honour, ...), settings the user gave that
  have no effect in combination with others (:data:`IGNORED_UNLESS`), a batch that the training
  set cannot fill, and an input shape the model cannot take (a forward pass on the ``meta``
  device: shapes only, no memory, no compute);
- :func:`check_data_files` and :func:`check_workload` (the factories probed on two samples), then
  :func:`check_single_samples` (BatchNorm fed micro-batches of one);
- :func:`check_environment` reads the filesystem and an existing tracking store, never creating
  anything: the checkpoint folder and the tracking store's folder must be creatable and
  writable, and the experiment must not be a deleted one.  ``prepare`` runs it last, for every
  command that trains.

"The user gave" is pydantic's ``model_fields_set`` of each section, and a value other than the
field's default: a field left at its default, or written out at its default, is never reported.
So these checks belong on the driver, on the config validated from the user's own YAML; a worker
re-validates a full dump in which every field looks set (and checks only each field there).
"""

from __future__ import annotations

import glob
import os
import sqlite3
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from orchestrator.config.schema import ConfigError
from trainers import catalog
from trainers.accel.precision import check_precision
from trainers.combine.base import OtherSettings
from trainers.combine.combinations import METHODS, check_section
from trainers.errors import one_line

if TYPE_CHECKING:
    from orchestrator.config.schema import RootConfig

# --------------------------------------------------------------------------- fields that cannot go together
#
# Every rule that relates two or more fields, within a section or across sections.  Each section's
# pydantic class checks its own fields one at a time (type, range, one list's order); what depends
# on another field is here, so a worker's re-validation of the driver's dump stays cheap and every
# entry point gets the same rules from one call (check_config).


def _choice(cfg: RootConfig) -> None:
    """A ``data``/``model`` section names a built-in or a factory, never both; ``data.val_split:
    test`` needs a dataset with an official test set."""
    for section in ("data", "model"):
        s = getattr(cfg, section)
        if s.name is not None and s.factory is not None:
            raise ConfigError(
                f"{section}.factory: give either {section}.name ({s.name!r}) or {section}.factory "
                f"({s.factory!r}), not both; remove one of them"
            )
        if section == "data" and s.val_split == "test" and (s.builtin is None or s.builtin.test_samples is None):
            with_test_set = ", ".join(catalog.dataset_names(lambda d: d.test_samples is not None))
            raise ConfigError(
                f"data.val_split: test needs a dataset with an official test set ({with_test_set}), "
                f"not {s.factory or s.name!r}; set data.val_split: fraction"
            )


def _weight_decay_rule(cfg: RootConfig) -> None:
    """``optimizer.wd_rule: timescale`` is AdamW's, with a weight decay to scale."""
    o = cfg.optimizer
    if o.wd_rule == "timescale":
        if o.name != "adamw":
            raise ConfigError(
                f"optimizer.wd_rule: timescale is defined for AdamW's decoupled weight decay, got "
                f"optimizer.name '{o.name}'; set optimizer.name: adamw or wd_rule: none"
            )
        if o.weight_decay <= 0:
            raise ConfigError(
                "optimizer.weight_decay: wd_rule timescale scales it with B, so it must be > 0; "
                "set the value tuned at base_batch_size, e.g. 0.1"
            )


def _batch_sizes(cfg: RootConfig) -> None:
    """``batch.max_size`` caps ``batch.size`` and the schedule's entries; the schedule starts at or
    above ``batch.size`` (each entry against the one before: ``BatchConfig``'s own validator)."""
    b = cfg.batch
    if b.max_size is not None and b.max_size < b.size:
        raise ConfigError(
            f"batch.max_size: {b.max_size} is below batch.size {b.size}; raise it to at least {b.size} or remove it"
        )
    for i, (_, batch) in enumerate(b.schedule):
        where = f"batch.schedule[{i}]"
        if i == 0 and batch < b.size:
            raise ConfigError(
                f"{where}: batch {batch} is below batch.size {b.size}; the batch only grows, "
                "so list non-decreasing sizes"
            )
        if b.max_size is not None and batch > b.max_size:
            raise ConfigError(
                f"{where}: batch {batch} is above batch.max_size {b.max_size}; raise max_size or lower the entry"
            )


def _batch_policy_fields(cfg: RootConfig) -> None:
    """``batch.schedule`` with the schedule policy only; ``ramp_to`` and ``ramp_epochs`` with the ramp
    only, the ramp growing B in whole ``round_to`` steps up to at most ``max_size``."""
    from trainers.policies.batching import round_up

    b = cfg.batch
    if b.policy == "schedule" and not b.schedule:
        raise ConfigError(
            "batch.schedule: required by batch.policy schedule; give [epoch, batch] pairs, e.g. [[0, 64], [3, 256]]"
        )
    if b.policy != "schedule" and b.schedule:
        raise ConfigError(
            f"batch.schedule: given but batch.policy is {b.policy!r}; set batch.policy: schedule or remove the schedule"
        )
    if b.policy != "ramp":
        for name in ("ramp_to", "ramp_epochs"):
            if getattr(b, name) is not None:
                raise ConfigError(
                    f"batch.{name}: given but batch.policy is {b.policy!r}; set batch.policy: ramp or remove {name}"
                )
        return
    if b.ramp_to is None or b.ramp_epochs is None:
        missing = "ramp_to" if b.ramp_to is None else "ramp_epochs"
        raise ConfigError(
            f"batch.{missing}: required by batch.policy ramp; give both, e.g. ramp_to: 512 and ramp_epochs: 2"
        )
    if b.ramp_to <= b.size:
        raise ConfigError(
            f"batch.ramp_to: {b.ramp_to} is not above batch.size {b.size}; the ramp grows B, so set it above {b.size}"
        )
    if (b.ramp_to - b.size) % b.round_to:
        raise ConfigError(
            f"batch.ramp_to: {b.ramp_to} - batch.size {b.size} is not a multiple of "
            f"batch.round_to {b.round_to} (the ramp's increment); use ramp_to "
            f"{b.size + round_up(b.ramp_to - b.size, b.round_to)} or another round_to"
        )
    if b.max_size is not None and b.ramp_to > b.max_size:
        raise ConfigError(
            f"batch.ramp_to: {b.ramp_to} is above batch.max_size {b.max_size}; raise max_size or lower ramp_to"
        )


def _warmup_and_decay(cfg: RootConfig) -> None:
    """The ``schedule`` section's warmup, decay and scaling rule that only work together."""
    s = cfg.schedule
    if s.warmup not in ("none", "auto") and s.warmup_epochs <= 0:
        raise ConfigError(f"schedule.warmup_epochs: must be > 0 when schedule.warmup is '{s.warmup}'; set it, e.g. 5")
    if s.warmup == "legw" and s.scaling_rule != "sqrt":
        raise ConfigError(
            f"schedule.scaling_rule: warmup 'legw' is defined with sqrt scaling (You et al.), "
            f"got '{s.scaling_rule}'; set schedule.scaling_rule: sqrt"
        )
    if s.warmup == "auto" and s.decay == "none":
        raise ConfigError(
            "schedule.decay: warmup 'auto' decays from the LR it finds (Kim et al. use cosine); "
            "set schedule.decay: cosine"
        )
    if s.decay in ("step", "seesaw") and not s.milestones:
        raise ConfigError(f"schedule.milestones: required when schedule.decay is '{s.decay}'; e.g. [30, 60, 80]")
    if s.decay == "seesaw" and s.scaling_rule != "sqrt":
        raise ConfigError(
            f"schedule.scaling_rule: decay 'seesaw' keeps lr / sqrt(B) as the step schedule would "
            f"(Meterez et al. 2025), got '{s.scaling_rule}'; set schedule.scaling_rule: sqrt"
        )
    if s.decay == "seesaw" and s.decay_factor >= 1.0:
        raise ConfigError(
            "schedule.decay_factor: 1 makes seesaw neither cut the LR nor grow the batch; set it below 1, e.g. 0.5"
        )
    if s.auto_max_lr <= s.auto_init_lr:
        raise ConfigError(
            f"schedule.auto_max_lr: {s.auto_max_lr} must be above schedule.auto_init_lr "
            f"{s.auto_init_lr}; raise auto_max_lr or lower auto_init_lr"
        )


def _combine_section(cfg: RootConfig) -> None:
    """The ``combine`` section's fields against its method (``trainers.combine.combinations.check_section``):
    what the chosen method needs, and no field only other methods read."""
    try:
        check_section(cfg.combine)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def _worker_range(cfg: RootConfig) -> None:
    s = cfg.scaling
    if s.min_workers > s.max_workers:
        raise ConfigError(
            f"scaling.min_workers: {s.min_workers} is above scaling.max_workers "
            f"{s.max_workers}; lower min_workers or raise max_workers"
        )


def _within_training(cfg: RootConfig) -> None:
    """What a schedule or a batch policy does must fit in ``train.epochs``."""
    s, total = cfg.schedule, cfg.train.epochs
    if s.warmup in ("constant", "gradual", "linear") and s.warmup_epochs >= total:
        raise ConfigError(
            f"schedule.warmup_epochs: {s.warmup_epochs} leaves no epoch after warmup "
            f"(train.epochs is {total}); lower it"
        )
    late = [m for m in s.milestones if m >= total]
    if s.decay in ("step", "seesaw") and late:
        raise ConfigError(f"schedule.milestones: {late} at or after train.epochs {total} never apply; remove them")


def _batch_with_schedule(cfg: RootConfig) -> None:
    """The seesaw batch policy and the seesaw decay go together; a ramp ends before training does."""
    b, s, total = cfg.batch, cfg.schedule, cfg.train.epochs
    if b.policy == "seesaw" and s.decay != "seesaw":
        raise ConfigError(
            f"schedule.decay: batch.policy seesaw grows B where the LR schedule's milestones "
            f"cut the LR, got decay '{s.decay}'; set schedule.decay: seesaw (with "
            f"milestones and scaling_rule: sqrt)"
        )
    if s.decay == "seesaw" and b.policy != "seesaw":
        raise ConfigError(
            f"batch.policy: schedule.decay seesaw cuts the LR by only sqrt(decay_factor) because "
            f"the batch grows at the same milestones, got batch.policy '{b.policy}'; set "
            f"batch.policy: seesaw (or schedule.decay: step)"
        )
    if b.policy == "ramp" and b.ramp_epochs is not None and b.ramp_epochs >= total:
        raise ConfigError(
            f"batch.ramp_epochs: {b.ramp_epochs:g} is not below train.epochs "
            f"{total:g}, so B never reaches ramp_to {b.ramp_to}; lower it"
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
    d = cfg.data
    return d.factory is None and d.builtin is not None and d.builtin.inputs == "tokens"


def check_fast_path(cfg: RootConfig) -> None:
    """The GPU fast path's options against the resources (``trainers/accel/``): fp16 and data on the
    accelerator need GPUs; channels_last and augmentation need an image model and image inputs
    (known here for built-in data and models; a factory's model is checked once built, by
    ``trainers.accel.device.to_channels_last`` on the worker)."""
    from trainers.data.datasets import dataset_info

    d, m, use_gpu = cfg.data, cfg.model, cfg.scaling.use_gpu
    try:  # the precision's own rule, which the worker also applies to the device it got
        check_precision(cfg.train.precision, "cuda" if use_gpu else "cpu")
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if d.device == "accelerator" and not use_gpu:
        raise ConfigError(
            "data.device: accelerator keeps the dataset on the GPU and needs scaling.use_gpu: true; "
            "set data.device: host to train on CPUs"
        )
    if m.channels_last and m.builtin is not None and not m.builtin.image:
        raise ConfigError(
            f"model.channels_last: {m.name} has no Conv2d layer (not a 4-D image model); set "
            f"model.channels_last: false, or use {'/'.join(catalog.model_names(lambda b: b.image))}"
        )
    if d.in_memory:
        shape = list(dataset_info(d).shape)
    elif _token_data(cfg):
        shape = [d.context]
    else:
        return
    if m.channels_last and len(shape) != 3:
        raise ConfigError(
            f"model.channels_last: needs 4-D image batches (inputs shaped [C, H, W]); this "
            f"dataset's inputs are shaped {shape}; set model.channels_last: false"
        )
    if d.augment and len(shape) != 3:
        raise ConfigError(
            f"data.augment: {', '.join(d.augment)} need image inputs shaped [C, H, W]; this "
            f"dataset's inputs are shaped {shape}; remove data.augment"
        )


def check_combine(cfg: RootConfig) -> None:
    """What the rest of the config asks that ``combine.method`` cannot honour: the chosen method's
    own check (``Combination.check``, ``trainers/combine/combinations.py``), one line."""
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
        METHODS[cfg.combine.method].check(cfg.combine, other)
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


# --------------------------------------------------------------------------- silently ignored settings


@dataclass(frozen=True)
class Needs:
    """``field`` (``section.key``) only acts when ``holds(cfg)``; ``unless`` says when, ``fix`` what to set."""

    field: str
    holds: Callable[[RootConfig], bool]
    unless: str
    fix: str


def _decay(*names: str) -> Callable[[RootConfig], bool]:
    return lambda c: c.schedule.decay in names


def _warmup(*names: str) -> Callable[[RootConfig], bool]:
    return lambda c: c.schedule.warmup in names


def _policy(*names: str) -> Callable[[RootConfig], bool]:
    return lambda c: c.batch.policy in names


def _optimizer(*names: str) -> Callable[[RootConfig], bool]:
    return lambda c: c.optimizer.name in names


def _model(*names: str) -> Callable[[RootConfig], bool]:
    return lambda c: c.model.name in names


def _dataset(*names: str) -> Callable[[RootConfig], bool]:
    return lambda c: c.data.name in names


_HIDDEN_MODELS = catalog.model_names(lambda m: m.uses_hidden)
_RESIDUAL_MODELS = catalog.model_names(lambda m: m.residual)
_LANGUAGE_MODELS = catalog.model_names(lambda m: m.language_model)
_ROOT_DATASETS = catalog.dataset_names(lambda d: d.needs_root)
_GENERATED_DATASETS = catalog.dataset_names(lambda d: d.generated)


_ADAPTIVE = ("noise_scale", "norm_test")


def goodput_chooses_batch(c: RootConfig) -> bool:
    """``scaling.policy: goodput`` chooses B too: the batch policy is fixed and ``batch.max_size`` is
    above ``batch.size`` (trainers/loop/trainer.py ``goodput_max_batch``)."""
    b = c.batch
    return c.scaling.policy == "goodput" and b.policy == "fixed" and b.max_size is not None and b.max_size > b.size


_AUTO_FIELDS = (
    "auto_init_lr",
    "auto_growth",
    "auto_max_lr",
    "auto_patience",
    "auto_confidence",
    "auto_min_steps",
    "auto_max_points",
    "auto_seed",
)

IGNORED_UNLESS: tuple[Needs, ...] = (
    # schedule (trainers/policies/schedules.py: DECAYS, WARMUPS, AutoWarmup)
    Needs("schedule.milestones", _decay("step", "seesaw"), "schedule.decay is step or seesaw", "schedule.decay: step"),
    Needs(
        "schedule.decay_factor", _decay("step", "seesaw"), "schedule.decay is step or seesaw", "schedule.decay: step"
    ),
    Needs("schedule.poly_power", _decay("poly"), "schedule.decay is poly", "schedule.decay: poly"),
    Needs(
        "schedule.min_lr",
        lambda c: c.schedule.decay != "none",
        "schedule.decay is not none",
        "schedule.decay: cosine (or step, poly, linear)",
    ),
    Needs(
        "schedule.warmup_epochs",
        _warmup("constant", "gradual", "linear", "legw"),
        "schedule.warmup is constant, gradual, linear or legw (auto finds its own length)",
        "schedule.warmup: gradual",
    ),
    *(
        Needs(f"schedule.{f}", _warmup("auto"), "schedule.warmup is auto", "schedule.warmup: auto")
        for f in _AUTO_FIELDS
    ),
    # batch (trainers/policies/batching.py: the policies)
    # batch.max_size is a cap: under the fixed policy it never binds, which changes nothing (not refused)
    Needs(
        "batch.noise_scale_factor",
        _policy("noise_scale", "cbs_warmup"),
        "batch.policy is noise_scale or cbs_warmup",
        "batch.policy: noise_scale (or cbs_warmup)",
    ),
    Needs("batch.norm_test_eta", _policy("norm_test"), "batch.policy is norm_test", "batch.policy: norm_test"),
    Needs(
        "batch.check_every",
        lambda c: _policy(*_ADAPTIVE, "cbs_warmup")(c) or c.scaling.policy == "goodput",
        "batch.policy is noise_scale, norm_test or cbs_warmup, or scaling.policy is goodput",
        "batch.policy: noise_scale (or norm_test, cbs_warmup, or scaling.policy: goodput)",
    ),
    Needs(
        "batch.min_growth",
        _policy(*_ADAPTIVE),
        "batch.policy is noise_scale or norm_test (cbs_warmup grows by cbs_growth)",
        "batch.policy: noise_scale (or norm_test)",
    ),
    Needs(
        "batch.round_to",
        lambda c: _policy(*_ADAPTIVE, "cbs_warmup", "ramp")(c) or goodput_chooses_batch(c),
        "batch.policy is noise_scale, norm_test, cbs_warmup or ramp, or scaling.policy goodput chooses B "
        "(batch.policy fixed with batch.max_size)",
        "batch.policy: noise_scale (or norm_test, cbs_warmup, ramp)",
    ),
    *(
        Needs(f"batch.{f}", _policy("cbs_warmup"), "batch.policy is cbs_warmup", "batch.policy: cbs_warmup")
        for f in ("cbs_window", "cbs_growth")
    ),
    # optimizer (trainers/policies/optim.py: OPTIMIZERS, MF rules)
    Needs(
        "optimizer.mf_ref_batch",
        lambda c: c.optimizer.mf_rule == "per_worker_batch",
        "optimizer.mf_rule is per_worker_batch",
        "optimizer.mf_rule: per_worker_batch",
    ),
    Needs("optimizer.trust_coefficient", _optimizer("lars"), "optimizer.name is lars", "optimizer.name: lars"),
    Needs(
        "optimizer.beta2",
        _optimizer("adam", "adamw", "lamb"),
        "optimizer.name is adam, adamw or lamb",
        "optimizer.name: adamw",
    ),
    Needs(
        "optimizer.eps",
        _optimizer("adam", "adamw", "lamb"),
        "optimizer.name is adam, adamw or lamb",
        "optimizer.name: adamw",
    ),
    # model (trainers/catalog.py: what each built-in model reads; trainers/workload/models.py: MODELS)
    Needs("model.hidden", _model(*_HIDDEN_MODELS), f"model.name is {' or '.join(_HIDDEN_MODELS)}", "model.name: cnn"),
    Needs(
        "model.zero_init_residual",
        lambda c: c.model.name in _RESIDUAL_MODELS and c.model.norm == "batch",
        "model.name is a resnet with model.norm: batch",
        "model.name: resnet18 and model.norm: batch",
    ),
    Needs("model.sync_bn", lambda c: c.model.norm == "batch", "model.norm is batch", "model.norm: batch"),
    # factories' keyword arguments (trainers/workload/build.py: model_factory, data_factory)
    Needs(
        "model.params",
        lambda c: c.model.factory is not None or c.model.language_model,
        f"model.factory is given or model.name is {' or '.join(_LANGUAGE_MODELS)} (the built-in image models "
        "take no params)",
        "model.factory: package.module:function",
    ),
    Needs(
        "data.params",
        lambda c: c.data.factory is not None,
        "data.factory is given (the built-in datasets take their own keys)",
        "data.factory: package.module:function",
    ),
    # data (trainers/data/datasets.py: the loaders)
    Needs(
        "data.root",
        _dataset(*_ROOT_DATASETS),
        f"data.name is {' or '.join(_ROOT_DATASETS)} (the others need no files)",
        "data.name: cifar10",
    ),
    *(
        Needs(
            f"data.{f}",
            _dataset(*_GENERATED_DATASETS),
            f"data.name is {' or '.join(_GENERATED_DATASETS)}",
            "data.name: synthetic",
        )
        for f in ("size", "shape", "num_classes")
    ),
    Needs(
        "data.val_fraction",
        lambda c: c.data.val_split == "fraction",
        "data.val_split is fraction (test validates on the official test set)",
        "data.val_split: fraction",
    ),
    Needs(
        "data.crop_padding",
        lambda c: "random_crop" in c.data.augment,
        "data.augment lists random_crop",
        "data.augment: [random_crop, hflip]",
    ),
    # train (trainers/accel/precision.py, trainers/accel/device.py)
    *(
        Needs(f"train.{f}", lambda c: c.train.precision == "fp16", "train.precision is fp16", "train.precision: fp16")
        for f in ("loss_scale_init", "loss_scale_growth_interval")
    ),
    Needs("train.compile_backend", lambda c: c.train.compile, "train.compile is true", "train.compile: true"),
    # scaling (orchestrator/run/runner.py: ScalingConfig -> Ray Train)
    Needs("scaling.gpus_per_worker", lambda c: c.scaling.use_gpu, "scaling.use_gpu is true", "scaling.use_gpu: true"),
)
"""Every field that silently does nothing unless another field has some value.  Refused (not
warned) when the user set it: a setting that does not act is a mistake about what runs."""


def _user_set(cfg: RootConfig, dotted: str) -> bool:
    section, key = dotted.split(".", 1)
    return section in cfg.model_fields_set and key in getattr(cfg, section).model_fields_set


def _differs_from_default(cfg: RootConfig, dotted: str) -> bool:
    section, key = dotted.split(".", 1)
    sec = getattr(cfg, section)
    return getattr(sec, key) != type(sec).model_fields[key].get_default(call_default_factory=True)


def check_ignored(cfg: RootConfig) -> None:
    """Refuse a field the user set, to a value other than its default, that :data:`IGNORED_UNLESS`
    says has no effect here.  A default written out (a full dump such as the ``config.yaml`` a run
    logs, or ``search show --full``) is not refused: it changes nothing either way."""
    for rule in IGNORED_UNLESS:
        if _user_set(cfg, rule.field) and _differs_from_default(cfg, rule.field) and not rule.holds(cfg):
            raise ConfigError(f"{rule.field}: has no effect unless {rule.unless}; remove it or set {rule.fix}")


# --------------------------------------------------------------------------- samples vs batch


def known_size(cfg: RootConfig) -> int | None:
    """The samples of a built-in training set before the validation split, known without loading
    it (``trainers.catalog``; a generated set's: ``data.size``); None for a factory's or a text's."""
    d = cfg.data
    if d.factory is not None or d.builtin is None:
        return None
    return d.size if d.builtin.generated else d.builtin.train_samples


def train_samples(cfg: RootConfig) -> tuple[int, str]:
    """The training samples after the validation split, as ``trainers.data.datasets.load_data`` cuts them,
    and how that number comes about (for messages); for a dataset of :func:`known_size`."""
    d, n = cfg.data, known_size(cfg)
    if n is None:
        raise ValueError(f"the training set of {d.factory or d.name!r} is known only once loaded")
    if d.val_split == "test":
        return n, f"{d.name} {n}, validated on its test set (data.val_split: test)"
    n_val = max(1, int(round(n * d.val_fraction)))
    total = "data.size" if d.builtin is not None and d.builtin.generated else d.name
    return n - n_val, f"{total} {n} minus {n_val} held out by data.val_fraction {d.val_fraction:g}"


def check_samples(cfg: RootConfig) -> None:
    """The training set must fill every batch the config asks for."""
    n, how = train_samples(cfg)
    split_fix = " or lower data.val_fraction" if _user_set(cfg, "data.val_fraction") else ""
    if n < 1:
        raise ConfigError(f"data.val_fraction: {cfg.data.val_fraction:g} leaves no training sample ({how}); lower it")
    b = cfg.batch
    if b.size > n:
        raise ConfigError(
            f"batch.size: {b.size} is above the {n} training samples ({how}); lower batch.size to "
            f"at most {n}{split_fix}"
        )
    for i, (_, size) in enumerate(b.schedule):
        if size > n:
            raise ConfigError(
                f"batch.schedule[{i}]: batch {size} is above the {n} training samples ({how}) and "
                f"would be cut to {n}; lower it to at most {n}{split_fix}"
            )
    # batch.max_size and batch.max_local_batch above n are caps that never bind (the training set caps B)


# --------------------------------------------------------------------------- model input


def _check_device(cfg: RootConfig) -> str:
    """Where the config checks build a built-in model: the CPU for a small one (milliseconds), else
    PyTorch's ``meta`` device (shapes only)."""
    return "cpu" if cfg.model.builtin is not None and cfg.model.builtin.small else "meta"


def check_model_input(cfg: RootConfig) -> None:
    """Build the model and run two samples through it.  The small built-in models run on the CPU
    (milliseconds); the others on PyTorch's ``meta`` device, which checks the shapes without
    allocating weights or computing anything but costs ~1.5 s of imports on its first use (a
    resnet50's real weights would cost more)."""
    import torch

    from trainers.data.datasets import dataset_info
    from trainers.workload.models import build_model

    info = dataset_info(cfg.data)
    try:
        with torch.device(_check_device(cfg)), torch.no_grad():
            model = build_model(info, cfg.model.model_copy(update={"sync_bn": False})).eval()
            out = model(torch.zeros((2, *info.shape)))
        if tuple(out.shape) != (2, info.num_classes):
            raise RuntimeError(f"output shape {tuple(out.shape)}, expected (2, {info.num_classes})")
    except Exception as e:  # any failure here is a shape the model cannot take
        generated = cfg.data.builtin is not None and cfg.data.builtin.generated
        field = "data.shape" if generated else "model.name"
        hint = (
            "cnn and resnet* take [channels, height, width], e.g. [1, 8, 8]; mlp takes any shape"
            if cfg.model.builtin is None or cfg.model.builtin.inputs != "any"
            else "give a shape of positive sizes"
        )
        raise ConfigError(
            f"{field}: model {cfg.model.name} cannot take inputs of shape {list(info.shape)} "
            f"({one_line(e, 160, name=False)}); {hint}"
        ) from None


def check_config(cfg: RootConfig, ignored: bool = True, model_input: bool = True) -> None:
    """Every pure cross-field check, in the order a user fixes them: fields that cannot go together
    (:func:`check_combinations`), settings that have no effect (``ignored``: :func:`check_ignored`;
    not for a search's base or trial, whose parameters change other fields), a batch the training
    set cannot fill, and (``model_input``) an input shape the model cannot take, which builds the
    model (left out where many configs are checked at once: a search's trials)."""
    check_combinations(cfg)
    if ignored:
        check_ignored(cfg)
    builtin_data = known_size(cfg) is not None
    if builtin_data:  # a factory's or a text corpus's size is checked by the workload probe
        check_samples(cfg)
    if model_input and builtin_data and cfg.model.factory is None and not cfg.model.language_model:
        check_model_input(cfg)


# --------------------------------------------------------------------------- data files and the workload


def check_data_files(cfg: RootConfig) -> None:
    """The data the config names is there (reads the filesystem; still before Ray starts)."""
    try:
        cfg.data.check_available()
    except ValueError as e:
        raise ConfigError(str(e)) from None


def check_workload(cfg: RootConfig, functions: Mapping[str, Callable[..., Any]] | None = None) -> Any:
    """Probe a workload that is not all built-in (trainers/workload/build.py :func:`probe_config`): build,
    forward and loss on two samples, backward, state-dict round trip, and a training set that holds
    the global batch.  Returns the probe's report (``trainers.workload.factory.ProbeReport``: its
    BatchNorm warning, the training set's size, the layers that cannot train on one sample), or
    None for an all built-in workload; a failure is a ConfigError."""
    from trainers.workload.build import probe_config
    from trainers.workload.factory import FactoryError

    try:
        return probe_config(cfg, functions)
    except (FactoryError, FileNotFoundError) as e:
        raise ConfigError(str(e)) from None


# --------------------------------------------------------------------------- micro-batches of one sample


def single_sample_facts(cfg: RootConfig, report: Any = None) -> tuple[int | None, tuple[str, ...]]:
    """The training samples per epoch and the model's batch-statistics layers that cannot train on a
    single sample (``trainers/workload/batchnorm.py``).  From the workload probe's ``report`` when
    there was one (a factory, text); for a built-in workload from the dataset's size and the model
    built on the CPU (small models) or PyTorch's ``meta`` device (shapes only)."""
    if report is not None:
        return report.train_size, tuple(report.single_sample_layers)
    if cfg.model.norm != "batch" or cfg.model.factory is not None or cfg.model.language_model:
        return None, ()
    if known_size(cfg) is None:
        return None, ()
    import torch

    from trainers.data.datasets import dataset_info
    from trainers.workload.batchnorm import single_sample_layers
    from trainers.workload.models import build_model

    info = dataset_info(cfg.data)
    with torch.device(_check_device(cfg)):
        model = build_model(info, cfg.model.model_copy(update={"sync_bn": False}))
        layers = single_sample_layers(model, torch.zeros((1, *info.shape)))
    return train_samples(cfg)[0], tuple(layers)


def check_single_samples(cfg: RootConfig, n: int | None, layers: tuple[str, ...]) -> None:
    """Refuse a config whose every step would put a micro-batch of one sample through a
    batch-statistics layer that cannot train on one (``layers``, from :func:`single_sample_facts`).

    Checked: each global batch the config names (``batch.size``, the ``batch.schedule`` sizes, the
    cap ``batch.max_size`` of an adaptive policy, each at most the ``n`` training samples) on the
    workers the run gives it (``workers_for_batch``), cut as the loop cuts it
    (``trainers.data.order.smallest_micro_batch``, with the noise probe's halving at one worker).
    What only some steps meet (an epoch's short last batch split over W workers, a group that a
    lost worker left smaller) is not refused: there the layer uses its running statistics for
    that forward (``trainers.workload.batchnorm.guard_single_samples``), since no batch size avoids
    every such tail of an adaptive batch."""
    if not layers or n is None:
        return
    from trainers.data.order import smallest_micro_batch
    from trainers.policies.batching import BATCH_POLICIES
    from trainers.policies.resize import workers_for_batch

    b, s = cfg.batch, cfg.scaling
    noise_split = METHODS[cfg.combine.method].uses_ddp and (
        bool(BATCH_POLICIES[b.policy].needs) or cfg.schedule.scaling_rule == "adascale" or s.policy == "goodput"
    )
    sizes = [("batch.size", b.size)] + [(f"batch.schedule[{i}]", size) for i, (_, size) in enumerate(b.schedule)]
    if (b.policy in ("noise_scale", "norm_test") or goodput_chooses_batch(cfg)) and b.max_size is not None:
        sizes.append(("batch.max_size", b.max_size))
    builtin = cfg.model.factory is None
    who = f"model {cfg.model.name}'s BatchNorm" if builtin else "the model's BatchNorm"
    where = f"layer {layers[0]} would see one value per channel" + (
        f", and {len(layers) - 1} more layers" if len(layers) > 1 else ""
    )
    alt = ", or model.norm: group" if builtin else ", or GroupNorm/LayerNorm in model.factory's model"
    for field, size in sizes:
        batch = min(size, n)
        w = workers_for_batch(batch, b.max_local_batch, s.min_workers, s.max_workers)
        if smallest_micro_batch(batch, w, b.max_local_batch, noise_split) > 1:
            continue
        mlb, slice_ = b.max_local_batch, batch // w
        if mlb == 1:
            raise ConfigError(
                f"batch.max_local_batch: 1 puts one sample through the model at a time, and {who} "
                f"cannot train on one sample ({where}); set batch.max_local_batch to at least 2{alt}"
            )
        if slice_ <= 1:
            raise ConfigError(
                f"scaling.min_workers: {w} workers share a batch of {batch} ({field}), so a worker "
                f"trains on one sample, and {who} cannot ({where}); raise {field} to at least "
                f"{2 * w} or lower scaling.min_workers to at most {max(1, batch // 2)}{alt}"
            )
        if noise_split and w == 1 and slice_ <= min(3, mlb):
            why = (
                f"batch.policy {b.policy}"
                if BATCH_POLICIES[b.policy].needs
                else "scaling.policy goodput"
                if s.policy == "goodput"
                else "schedule.scaling_rule adascale"
            )
            raise ConfigError(
                f"{field}: {batch} on one worker is cut in two halves for the gradient-noise estimate "
                f"({why}), so a micro-batch holds one sample, and {who} cannot train on one "
                f"({where}); raise {field} to at least 4{alt}"
            )
        odd = slice_ if slice_ % 2 else slice_ + 1
        raise ConfigError(
            f"batch.max_local_batch: {mlb} cuts a worker's slice of {odd} samples ({field} {batch} "
            f"over {w} worker{'s' if w > 1 else ''}) into micro-batches of 2 and 1, and {who} "
            f"cannot train on one sample ({where}); set batch.max_local_batch to at least 3{alt}"
        )


# --------------------------------------------------------------------------- filesystem and tracking store


def _nearest_existing(path: str) -> str:
    cur = path
    while not os.path.exists(cur):
        parent = os.path.dirname(cur)
        if parent == cur:
            break
        cur = parent
    return cur


def folder_problem(path: str, create: bool = True) -> str | None:
    """Why the folder ``path`` cannot be used for writing (``None`` if it can), touching nothing.

    ``create``: the folder may be missing and made later (its nearest existing ancestor must then be
    a writable folder); otherwise it must exist.
    """
    if not path.strip():
        return "is empty"
    full = os.path.abspath(os.path.expanduser(path))
    if os.path.exists(full):
        if not os.path.isdir(full):
            return f"{full!r} is a file, not a folder"
        base = full
    else:
        if not create:
            return f"folder {full!r} does not exist"
        base = _nearest_existing(full)
        if not os.path.isdir(base):
            return f"{full!r} is under the file {base!r}"
    if not os.access(base, os.W_OK | os.X_OK):
        return f"cannot write in {base!r}"
    return None


def local_store(uri: str) -> tuple[str, str] | None:
    """``(kind, path)`` of a local tracking store: ``("sqlite", file)`` or ``("file", folder)``;
    ``None`` for a tracking server or a database server."""
    if uri.startswith("sqlite:///"):
        return "sqlite", uri[len("sqlite:///") :]
    if uri.startswith("sqlite://"):
        return None  # in-memory
    if uri.startswith("file://"):
        return "file", uri[len("file://") :]
    if "://" in uri or uri.startswith("databricks"):
        return None
    return "file", uri


def store_problem(uri: str) -> str | None:
    """Why MLflow cannot write the local tracking store ``uri`` (``None`` if it can)."""
    store = local_store(uri)
    if store is None:
        return None
    kind, path = store
    if kind == "file":
        why = folder_problem(path)
        return None if why is None else f"{uri}: {why}"
    full = os.path.abspath(os.path.expanduser(path))
    if os.path.isdir(full):
        return f"{uri}: {full!r} is a folder, not a database file"
    if os.path.exists(full):
        return None if os.access(full, os.R_OK | os.W_OK) else f"{uri}: cannot write {full!r}"
    why = folder_problem(os.path.dirname(full), create=False)
    return None if why is None else f"{uri}: {why}"


def deleted_experiment(uri: str, name: str) -> bool:
    """Whether the local tracking store ``uri`` holds a deleted experiment called ``name``.

    Read only when the store already exists (an sqlite file opened read-only, or a file store's
    ``.trash``); nothing is created.  A store this cannot read counts as not holding one.
    """
    store = local_store(uri)
    if store is None:
        return False
    kind, path = store
    full = os.path.abspath(os.path.expanduser(path))
    if kind == "sqlite":
        if not os.path.isfile(full):
            return False
        try:
            con = sqlite3.connect(f"file:{full}?mode=ro", uri=True)
            try:
                row = con.execute("SELECT lifecycle_stage FROM experiments WHERE name = ?", (name,)).fetchone()
            finally:
                con.close()
        except sqlite3.Error:
            return False
        return row is not None and row[0] == "deleted"
    import yaml

    for meta in glob.glob(os.path.join(full, ".trash", "*", "meta.yaml")):
        try:
            with open(meta) as f:
                if (yaml.safe_load(f) or {}).get("name") == name:
                    return True
        except (OSError, yaml.YAMLError, AttributeError):
            continue
    return False


def check_checkpoint_storage(path: str) -> None:
    """``checkpoint.storage_path`` can hold checkpoints, reading only: a local folder that can be
    created and written, or an object store whose bucket exists and answers to the credentials in
    the environment (one request for the bucket, one listing of the prefix: a missing bucket, bad
    credentials or an unreachable endpoint is one line here, before Ray starts)."""
    from trainers.loop.storage import is_uri, reach_problem, resolve

    if is_uri(resolve(path)):
        why = reach_problem(path)
        if why is not None:
            raise ConfigError(f"checkpoint.storage_path: {why}")
        return
    why = folder_problem(path)
    if why is not None:
        raise ConfigError(
            f"checkpoint.storage_path: {why}; give a folder you can write (on a cluster: a shared "
            f"mount or a bucket URI such as s3://bucket/runs), e.g. ray_runs"
        )


def check_environment(cfg: RootConfig) -> None:
    """Filesystem and tracking-store checks (reads only): run before Ray starts."""
    check_checkpoint_storage(cfg.checkpoint.storage_path)
    uri = cfg.tracking.resolved_uri()
    why = store_problem(uri)
    if why is not None:
        raise ConfigError(
            f"tracking.uri: {why}; create the folder or point tracking.uri (--tracking-uri) at a writable place"
        )
    name = cfg.tracking.experiment
    if deleted_experiment(uri, name):
        raise ConfigError(
            f"tracking.experiment: {name!r} was deleted in {uri} and MLflow will not log to it; "
            f"choose another name or restore it (mlflow experiments restore)"
        )
