"""Checks of a validated config that need more than one field, before anything starts.

Two groups, both raising :class:`~orchestrator.config.ConfigError` with one line
``field: problem; fix`` (the CLI prints ``error: ...`` and exits 2):

- :func:`check_config` is pure (no filesystem, no Ray, no MLflow): settings the user gave that
  have no effect in combination with others (:data:`IGNORED_UNLESS`), a batch that the training
  set cannot fill, and an input shape the model cannot take (a forward pass on the ``meta``
  device: shapes only, no memory, no compute).  ``orchestrator.pipeline.prepare`` runs it, and
  :func:`check_single_samples` after the workload probe (BatchNorm fed micro-batches of one).
- :func:`check_environment` reads the filesystem and an existing tracking store, never creating
  anything: the checkpoint folder and the tracking store's folder must be creatable and
  writable, and the experiment must not be a deleted one.  ``prepare`` runs it last, for every
  command that trains.

"The user gave" is pydantic's ``model_fields_set`` of each section, and a value other than the
field's default: a field left at its default, or written out at its default, is never reported.  So these checks belong on the driver, on the config validated from the
user's own YAML; a worker re-validates a full dump in which every field looks set.
"""

from __future__ import annotations

import glob
import os
import sqlite3
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from orchestrator.config import ConfigError
from trainers.errors import one_line

if TYPE_CHECKING:
    from orchestrator.config import RootConfig

# --------------------------------------------------------------------------- silently ignored settings


@dataclass(frozen=True)
class Needs:
    """``field`` (``section.key``) only acts when ``holds(cfg)``; ``unless`` says when, ``fix`` what to set."""

    field: str
    holds: Callable[["RootConfig"], bool]
    unless: str
    fix: str


def _decay(*names: str) -> Callable[["RootConfig"], bool]:
    return lambda c: c.schedule.decay in names


def _warmup(*names: str) -> Callable[["RootConfig"], bool]:
    return lambda c: c.schedule.warmup in names


def _policy(*names: str) -> Callable[["RootConfig"], bool]:
    return lambda c: c.batch.policy in names


def _optimizer(*names: str) -> Callable[["RootConfig"], bool]:
    return lambda c: c.optimizer.name in names


def _dataset(*names: str) -> Callable[["RootConfig"], bool]:
    return lambda c: c.data.name in names


_ADAPTIVE = ("noise_scale", "norm_test")


def goodput_chooses_batch(c: "RootConfig") -> bool:
    """``scaling.policy: goodput`` chooses B too: the batch policy is fixed and ``batch.max_size`` is
    above ``batch.size`` (trainers/loop/trainer.py ``goodput_max_batch``)."""
    b = c.batch
    return c.scaling.policy == "goodput" and b.policy == "fixed" and b.max_size is not None and b.max_size > b.size
_AUTO_FIELDS = ("auto_init_lr", "auto_growth", "auto_max_lr", "auto_patience", "auto_confidence",
                "auto_min_steps", "auto_max_points", "auto_seed")

IGNORED_UNLESS: tuple[Needs, ...] = (
    # schedule (trainers/policies/schedules.py: DECAYS, WARMUPS, AutoWarmup)
    Needs("schedule.milestones", _decay("step", "seesaw"), "schedule.decay is step or seesaw",
          "schedule.decay: step"),
    Needs("schedule.decay_factor", _decay("step", "seesaw"), "schedule.decay is step or seesaw",
          "schedule.decay: step"),
    Needs("schedule.poly_power", _decay("poly"), "schedule.decay is poly", "schedule.decay: poly"),
    Needs("schedule.min_lr", lambda c: c.schedule.decay != "none", "schedule.decay is not none",
          "schedule.decay: cosine (or step, poly, linear)"),
    Needs("schedule.warmup_epochs", _warmup("constant", "gradual", "linear", "legw"),
          "schedule.warmup is constant, gradual, linear or legw (auto finds its own length)",
          "schedule.warmup: gradual"),
    *(Needs(f"schedule.{f}", _warmup("auto"), "schedule.warmup is auto", "schedule.warmup: auto")
      for f in _AUTO_FIELDS),
    # batch (trainers/policies/batching.py: the policies)
    # batch.max_size is a cap: under the fixed policy it never binds, which changes nothing (not refused)
    Needs("batch.noise_scale_factor", _policy("noise_scale", "cbs_warmup"),
          "batch.policy is noise_scale or cbs_warmup", "batch.policy: noise_scale (or cbs_warmup)"),
    Needs("batch.norm_test_eta", _policy("norm_test"), "batch.policy is norm_test", "batch.policy: norm_test"),
    Needs("batch.check_every", lambda c: _policy(*_ADAPTIVE, "cbs_warmup")(c) or c.scaling.policy == "goodput",
          "batch.policy is noise_scale, norm_test or cbs_warmup, or scaling.policy is goodput",
          "batch.policy: noise_scale (or norm_test, cbs_warmup, or scaling.policy: goodput)"),
    Needs("batch.min_growth", _policy(*_ADAPTIVE), "batch.policy is noise_scale or norm_test (cbs_warmup grows "
          "by cbs_growth)", "batch.policy: noise_scale (or norm_test)"),
    Needs("batch.round_to", lambda c: _policy(*_ADAPTIVE, "cbs_warmup", "ramp")(c) or goodput_chooses_batch(c),
          "batch.policy is noise_scale, norm_test, cbs_warmup or ramp, or scaling.policy goodput chooses B "
          "(batch.policy fixed with batch.max_size)", "batch.policy: noise_scale (or norm_test, cbs_warmup, ramp)"),
    *(Needs(f"batch.{f}", _policy("cbs_warmup"), "batch.policy is cbs_warmup", "batch.policy: cbs_warmup")
      for f in ("cbs_window", "cbs_growth")),
    # optimizer (trainers/policies/optim.py: OPTIMIZERS, MF rules)
    Needs("optimizer.mf_ref_batch", lambda c: c.optimizer.mf_rule == "per_worker_batch",
          "optimizer.mf_rule is per_worker_batch", "optimizer.mf_rule: per_worker_batch"),
    Needs("optimizer.trust_coefficient", _optimizer("lars"), "optimizer.name is lars", "optimizer.name: lars"),
    Needs("optimizer.beta2", _optimizer("adam", "adamw", "lamb"), "optimizer.name is adam, adamw or lamb",
          "optimizer.name: adamw"),
    Needs("optimizer.eps", _optimizer("adam", "adamw", "lamb"), "optimizer.name is adam, adamw or lamb",
          "optimizer.name: adamw"),
    # model (trainers/workload/models.py: MODELS)
    Needs("model.hidden", lambda c: c.model.name in ("mlp", "cnn"), "model.name is mlp or cnn",
          "model.name: cnn"),
    Needs("model.zero_init_residual", lambda c: c.model.name.startswith("resnet") and c.model.norm == "batch",
          "model.name is a resnet with model.norm: batch", "model.name: resnet18 and model.norm: batch"),
    Needs("model.sync_bn", lambda c: c.model.norm == "batch", "model.norm is batch", "model.norm: batch"),
    # factories' keyword arguments (trainers/workload/build.py: model_factory, data_factory)
    Needs("model.params", lambda c: c.model.factory is not None or c.model.language_model,
          "model.factory is given or model.name is gpt or lstm (the built-in image models take no params)",
          "model.factory: package.module:function"),
    Needs("data.params", lambda c: c.data.factory is not None, "data.factory is given (the built-in datasets "
          "take their own keys)", "data.factory: package.module:function"),
    # data (trainers/data/datasets.py: the loaders)
    Needs("data.root", _dataset("cifar10"), "data.name is cifar10 (the others need no files)",
          "data.name: cifar10"),
    *(Needs(f"data.{f}", _dataset("synthetic"), "data.name is synthetic", "data.name: synthetic")
      for f in ("size", "shape", "num_classes")),
    Needs("data.val_fraction", lambda c: c.data.val_split == "fraction",
          "data.val_split is fraction (test validates on the official test set)", "data.val_split: fraction"),
    Needs("data.crop_padding", lambda c: "random_crop" in c.data.augment, "data.augment lists random_crop",
          "data.augment: [random_crop, hflip]"),
    # train (trainers/accel/precision.py, trainers/accel/device.py)
    *(Needs(f"train.{f}", lambda c: c.train.precision == "fp16", "train.precision is fp16",
            "train.precision: fp16") for f in ("loss_scale_init", "loss_scale_growth_interval")),
    Needs("train.compile_backend", lambda c: c.train.compile, "train.compile is true", "train.compile: true"),
    # scaling (orchestrator/runner.py: ScalingConfig -> Ray Train)
    Needs("scaling.gpus_per_worker", lambda c: c.scaling.use_gpu, "scaling.use_gpu is true",
          "scaling.use_gpu: true"),
)
"""Every field that silently does nothing unless another field has some value.  Refused (not
warned) when the user set it: a setting that does not act is a mistake about what runs."""


def _user_set(cfg: "RootConfig", dotted: str) -> bool:
    section, key = dotted.split(".", 1)
    return section in cfg.model_fields_set and key in getattr(cfg, section).model_fields_set


def _differs_from_default(cfg: "RootConfig", dotted: str) -> bool:
    section, key = dotted.split(".", 1)
    sec = getattr(cfg, section)
    return getattr(sec, key) != type(sec).model_fields[key].get_default(call_default_factory=True)


def check_ignored(cfg: "RootConfig") -> None:
    """Refuse a field the user set, to a value other than its default, that :data:`IGNORED_UNLESS`
    says has no effect here.  A default written out (a full dump such as the ``config.yaml`` a run
    logs, or ``search show --full``) is not refused: it changes nothing either way."""
    for rule in IGNORED_UNLESS:
        if _user_set(cfg, rule.field) and _differs_from_default(cfg, rule.field) and not rule.holds(cfg):
            raise ConfigError(f"{rule.field}: has no effect unless {rule.unless}; remove it or set {rule.fix}")


# --------------------------------------------------------------------------- samples vs batch

DATASET_SIZES = {"digits": 1797, "cifar10": 50000}
"""Samples of the fixed datasets (scikit-learn's digits; CIFAR-10's training batches)."""


def train_samples(cfg: "RootConfig") -> tuple[int, str]:
    """The training samples after the validation split, as ``trainers.data.datasets.load_data`` cuts them,
    and how that number comes about (for messages)."""
    d = cfg.data
    n = d.size if d.name == "synthetic" else DATASET_SIZES[d.name]
    if d.val_split == "test":
        return n, f"{d.name} {n}, validated on its test set (data.val_split: test)"
    n_val = max(1, int(round(n * d.val_fraction)))
    total = "data.size" if d.name == "synthetic" else d.name
    return n - n_val, f"{total} {n} minus {n_val} held out by data.val_fraction {d.val_fraction:g}"


def check_samples(cfg: "RootConfig") -> None:
    """The training set must fill every batch the config asks for."""
    n, how = train_samples(cfg)
    split_fix = " or lower data.val_fraction" if _user_set(cfg, "data.val_fraction") else ""
    if n < 1:
        raise ConfigError(f"data.val_fraction: {cfg.data.val_fraction:g} leaves no training sample ({how}); "
                          f"lower it")
    b = cfg.batch
    if b.size > n:
        raise ConfigError(f"batch.size: {b.size} is above the {n} training samples ({how}); lower batch.size to "
                          f"at most {n}{split_fix}")
    for i, (_, size) in enumerate(b.schedule):
        if size > n:
            raise ConfigError(f"batch.schedule[{i}]: batch {size} is above the {n} training samples ({how}) and "
                              f"would be cut to {n}; lower it to at most {n}{split_fix}")
    # batch.max_size and batch.max_local_batch above n are caps that never bind (the training set caps B)


# --------------------------------------------------------------------------- model input


SMALL_MODELS = ("mlp", "cnn")  # built and run on the CPU in milliseconds


def check_model_input(cfg: "RootConfig") -> None:
    """Build the model and run two samples through it.  The small built-in models run on the CPU
    (milliseconds); the others on PyTorch's ``meta`` device, which checks the shapes without
    allocating weights or computing anything but costs ~1.5 s of imports on its first use (a
    resnet50's real weights would cost more)."""
    import torch

    from trainers.data.datasets import dataset_info
    from trainers.workload.models import build_model

    info = dataset_info(cfg.data)
    try:
        with torch.device("cpu" if cfg.model.name in SMALL_MODELS else "meta"), torch.no_grad():
            model = build_model(info, cfg.model.model_copy(update={"sync_bn": False})).eval()
            out = model(torch.zeros((2, *info.shape)))
        if tuple(out.shape) != (2, info.num_classes):
            raise RuntimeError(f"output shape {tuple(out.shape)}, expected (2, {info.num_classes})")
    except Exception as e:  # noqa: BLE001 - any failure here is a shape the model cannot take
        field = "data.shape" if cfg.data.name == "synthetic" else "model.name"
        hint = ("cnn and resnet* take [channels, height, width], e.g. [1, 8, 8]; mlp takes any shape"
                if cfg.model.name != "mlp" else "give a shape of positive sizes")
        raise ConfigError(f"{field}: model {cfg.model.name} cannot take inputs of shape {list(info.shape)} "
                          f"({one_line(e, 160, name=False)}); {hint}") from None


def check_config(cfg: "RootConfig", ignored: bool = True) -> None:
    """The pure cross-field checks, in the order a user fixes them.  ``ignored``: refuse settings that
    have no effect (:func:`check_ignored`; not for a search's base, whose trials change other fields)."""
    if ignored:
        check_ignored(cfg)
    builtin_data = cfg.data.factory is None and (cfg.data.name == "synthetic" or cfg.data.name in DATASET_SIZES)
    if builtin_data:  # a factory's or a text corpus's size is checked by the workload probe
        check_samples(cfg)
    if builtin_data and cfg.model.factory is None and cfg.model.name in ("mlp", "cnn", "resnet18", "resnet50"):
        check_model_input(cfg)


# --------------------------------------------------------------------------- micro-batches of one sample


def single_sample_facts(cfg: "RootConfig", report: Any = None) -> tuple[int | None, tuple[str, ...]]:
    """The training samples per epoch and the model's batch-statistics layers that cannot train on a
    single sample (``trainers/workload/batchnorm.py``).  From the workload probe's ``report`` when
    there was one (a factory, text); for a built-in workload from the dataset's size and the model
    built on the CPU (small models) or PyTorch's ``meta`` device (shapes only)."""
    if report is not None:
        return report.train_size, tuple(report.single_sample_layers)
    if cfg.model.norm != "batch" or cfg.model.factory is not None or cfg.model.name not in MODELS_IN_MEMORY:
        return None, ()
    if cfg.data.factory is not None or (cfg.data.name != "synthetic" and cfg.data.name not in DATASET_SIZES):
        return None, ()
    import torch

    from trainers.data.datasets import dataset_info
    from trainers.workload.batchnorm import single_sample_layers
    from trainers.workload.models import build_model

    info = dataset_info(cfg.data)
    device = "cpu" if cfg.model.name in SMALL_MODELS else "meta"
    with torch.device(device):
        model = build_model(info, cfg.model.model_copy(update={"sync_bn": False}))
        layers = single_sample_layers(model, torch.zeros((1, *info.shape)))
    return train_samples(cfg)[0], tuple(layers)


MODELS_IN_MEMORY = ("mlp", "cnn", "resnet18", "resnet50")  # the built-in models of the in-memory image sets


def check_single_samples(cfg: "RootConfig", n: int | None, layers: tuple[str, ...]) -> None:
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
    noise_split = cfg.combine.method == "mean" and (bool(BATCH_POLICIES[b.policy].needs)
                                                    or cfg.schedule.scaling_rule == "adascale"
                                                    or s.policy == "goodput")
    sizes = [("batch.size", b.size)] + [(f"batch.schedule[{i}]", size) for i, (_, size) in enumerate(b.schedule)]
    if (b.policy in ("noise_scale", "norm_test") or goodput_chooses_batch(cfg)) and b.max_size is not None:
        sizes.append(("batch.max_size", b.max_size))
    builtin = cfg.model.factory is None
    who = f"model {cfg.model.name}'s BatchNorm" if builtin else "the model's BatchNorm"
    where = f"layer {layers[0]} would see one value per channel" + (f", and {len(layers) - 1} more layers"
                                                                    if len(layers) > 1 else "")
    alt = ", or model.norm: group" if builtin else ", or GroupNorm/LayerNorm in model.factory's model"
    for field, size in sizes:
        batch = min(size, n)
        w = workers_for_batch(batch, b.max_local_batch, s.min_workers, s.max_workers)
        if smallest_micro_batch(batch, w, b.max_local_batch, noise_split) > 1:
            continue
        mlb, slice_ = b.max_local_batch, batch // w
        if mlb == 1:
            raise ConfigError(f"batch.max_local_batch: 1 puts one sample through the model at a time, and {who} "
                              f"cannot train on one sample ({where}); set batch.max_local_batch to at least 2{alt}")
        if slice_ <= 1:
            raise ConfigError(f"scaling.min_workers: {w} workers share a batch of {batch} ({field}), so a worker "
                              f"trains on one sample, and {who} cannot ({where}); raise {field} to at least "
                              f"{2 * w} or lower scaling.min_workers to at most {max(1, batch // 2)}{alt}")
        if noise_split and w == 1 and slice_ <= min(3, mlb):
            why = (f"batch.policy {b.policy}" if BATCH_POLICIES[b.policy].needs else "scaling.policy goodput"
                   if s.policy == "goodput" else "schedule.scaling_rule adascale")
            raise ConfigError(f"{field}: {batch} on one worker is cut in two halves for the gradient-noise estimate "
                              f"({why}), so a micro-batch holds one sample, and {who} cannot train on one "
                              f"({where}); raise {field} to at least 4{alt}")
        odd = slice_ if slice_ % 2 else slice_ + 1
        raise ConfigError(f"batch.max_local_batch: {mlb} cuts a worker's slice of {odd} samples ({field} {batch} "
                          f"over {w} worker{'s' if w > 1 else ''}) into micro-batches of 2 and 1, and {who} "
                          f"cannot train on one sample ({where}); set batch.max_local_batch to at least 3{alt}")


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
        return "sqlite", uri[len("sqlite:///"):]
    if uri.startswith("sqlite://"):
        return None  # in-memory
    if uri.startswith("file://"):
        return "file", uri[len("file://"):]
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
        raise ConfigError(f"checkpoint.storage_path: {why}; give a folder you can write (on a cluster: a shared "
                          f"mount or a bucket URI such as s3://bucket/runs), e.g. ray_runs")


def check_environment(cfg: "RootConfig") -> None:
    """Filesystem and tracking-store checks (reads only): run before Ray starts."""
    check_checkpoint_storage(cfg.checkpoint.storage_path)
    uri = cfg.tracking.resolved_uri()
    why = store_problem(uri)
    if why is not None:
        raise ConfigError(f"tracking.uri: {why}; create the folder or point tracking.uri (--tracking-uri) at a "
                          f"writable place")
    name = cfg.tracking.experiment
    if deleted_experiment(uri, name):
        raise ConfigError(f"tracking.experiment: {name!r} was deleted in {uri} and MLflow will not log to it; "
                          f"choose another name or restore it (mlflow experiments restore)")
