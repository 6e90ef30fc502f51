"""The checks of a validated config before anything starts, as one call per stage of the pipeline.

Every check raises :class:`~orchestrator.config.schema.ConfigError` with one line ``field: problem;
fix`` (the CLI prints ``error: ...`` and exits 2).  ``orchestrator.config.prepare`` calls them, for
every entry point:

- :func:`check_config` is pure (no filesystem, no Ray, no MLflow): fields that cannot go together
  (``orchestrator/config/rules.py`` :data:`~orchestrator.config.rules.COMBINATIONS`: a policy and
  the fields it needs, the GPU fast path against the resources, what a gradient-combination method
  cannot honour, ...), settings the user gave that have no effect in combination with others
  (:data:`IGNORED_UNLESS`, here), a batch that the training set cannot fill, and an input shape the
  model cannot take (``orchestrator/config/workload_checks.py``);
- :func:`check_data_files` and :func:`check_workload` (the factories probed on two samples), then
  ``workload_checks.check_single_samples`` (BatchNorm fed micro-batches of one);
- ``orchestrator/config/environment.py`` ``check_environment`` reads the filesystem and an existing
  tracking store, never creating anything.  ``prepare`` runs it last, for every command that trains.

"The user gave" is pydantic's ``model_fields_set`` of each section, and a value other than the
field's default: a field left at its default, or written out at its default, is never reported.
So these checks belong on the driver, on the config validated from the user's own YAML; a worker
re-validates a full dump in which every field looks set (and checks only each field there).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from orchestrator.config.rules import check_combinations, goodput_chooses_batch, user_set
from orchestrator.config.schema import ConfigError
from orchestrator.config.workload_checks import check_model_input, check_samples, check_token_vocab, known_size
from trainers import catalog

if TYPE_CHECKING:
    from orchestrator.config.schema import RootConfig


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
_SHARD_DATASETS = (catalog.TOKENS.name,)


_ADAPTIVE = ("noise_scale", "norm_test")


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
    *(
        Needs(
            f"data.{f}",
            _dataset(*_SHARD_DATASETS),
            f"data.name is {' or '.join(_SHARD_DATASETS)}",
            f"data.name: {_SHARD_DATASETS[0]}",
        )
        for f in ("shard_block", "cache_bytes")
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


def _differs_from_default(cfg: RootConfig, dotted: str) -> bool:
    section, key = dotted.split(".", 1)
    sec = getattr(cfg, section)
    return getattr(sec, key) != type(sec).model_fields[key].get_default(call_default_factory=True)


def check_ignored(cfg: RootConfig) -> None:
    """Refuse a field the user set, to a value other than its default, that :data:`IGNORED_UNLESS`
    says has no effect here.  A default written out (a full dump such as the ``config.yaml`` a run
    logs, or ``search show --full``) is not refused: it changes nothing either way."""
    for rule in IGNORED_UNLESS:
        if user_set(cfg, rule.field) and _differs_from_default(cfg, rule.field) and not rule.holds(cfg):
            raise ConfigError(f"{rule.field}: has no effect unless {rule.unless}; remove it or set {rule.fix}")


# --------------------------------------------------------------------------- data files and the workload


def check_data_files(cfg: RootConfig) -> None:
    """The data the config names is there (reads the filesystem; still before Ray starts)."""
    try:
        cfg.data.check_available()
    except ValueError as e:
        raise ConfigError(str(e)) from None
    check_token_vocab(cfg)  # the shards' vocabulary against the model's embedding (their manifest is read)


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
