"""Whether the workload fits the config: a training set that fills every batch, a model that takes
the data's shape, and no step whose every micro-batch puts one sample through BatchNorm.

These build what the config names (a small built-in model on the CPU, a larger one on PyTorch's
``meta`` device) or read the workload probe's report; ``orchestrator/config/preflight.py`` and
``orchestrator/config/prepare.py`` call them.  Torch is imported by the two that build a model,
when they do: a config refused before then never loads it.  Each raises
:class:`~orchestrator.config.schema.ConfigError` with one line ``field: problem; fix``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from orchestrator.config.rules import goodput_chooses_batch, user_set
from orchestrator.config.schema import ConfigError
from trainers import catalog
from trainers.combine.config import RULES
from trainers.data.config import dataset_info
from trainers.data.order import smallest_micro_batch
from trainers.errors import one_line
from trainers.policies.batching import BATCH_POLICIES, noise_probe_runs
from trainers.policies.resize import workers_for_batch

if TYPE_CHECKING:
    from orchestrator.config.schema import RootConfig


# --------------------------------------------------------------------------- samples vs batch


def known_size(cfg: RootConfig) -> int | None:
    """The samples of a built-in training set before the validation split, known without loading
    it (``trainers.catalog``; a generated set's: ``data.size``); None for a factory's or a text's."""
    data = cfg.data
    if data.factory is not None or data.builtin is None:
        return None
    return data.size if data.builtin.generated else data.builtin.train_samples


def train_samples(cfg: RootConfig) -> tuple[int, str]:
    """The training samples after the validation split, as ``trainers.data.datasets.load_data`` cuts them,
    and how that number comes about (for messages); for a dataset of :func:`known_size`."""
    data, n = cfg.data, known_size(cfg)
    if n is None:
        raise ValueError(f"the training set of {data.factory or data.name!r} is known only once loaded")
    if data.val_split == "test":
        return n, f"{data.name} {n}, validated on its test set (data.val_split: test)"
    n_val = max(1, int(round(n * data.val_fraction)))
    total = "data.size" if data.builtin is not None and data.builtin.generated else data.name
    return n - n_val, f"{total} {n} minus {n_val} held out by data.val_fraction {data.val_fraction:g}"


def check_samples(cfg: RootConfig) -> None:
    """The training set must fill every batch the config asks for."""
    n, how = train_samples(cfg)
    split_fix = " or lower data.val_fraction" if user_set(cfg, "data.val_fraction") else ""
    if n < 1:
        raise ConfigError(f"data.val_fraction: {cfg.data.val_fraction:g} leaves no training sample ({how}); lower it")
    batch = cfg.batch
    if batch.size > n:
        raise ConfigError(
            f"batch.size: {batch.size} is above the {n} training samples ({how}); lower batch.size to "
            f"at most {n}{split_fix}"
        )
    for i, (_, size) in enumerate(batch.schedule):
        if size > n:
            raise ConfigError(
                f"batch.schedule[{i}]: batch {size} is above the {n} training samples ({how}) and "
                f"would be cut to {n}; lower it to at most {n}{split_fix}"
            )
    # batch.max_size and batch.max_local_batch above n are caps that never bind (the training set caps B)


def check_token_vocab(cfg: RootConfig) -> None:
    """A built-in language model's embedding holds every id of the token shards (their manifest's
    ``vocab_size``); after ``DataConfig.check_available`` read the manifest and found the shards."""
    d, model = cfg.data, cfg.model
    if d.factory is not None or d.builtin is not catalog.TOKENS or model.factory is not None:
        return
    if not model.language_model:
        return  # an image model on tokens: trainers/workload/build.py model_factory says which to give
    from trainers.data.shards.manifest import BYTE_VOCAB, read_manifest

    vocab = int(model.params.get("vocab_size", BYTE_VOCAB))
    m = read_manifest(str(d.root))
    if m.vocab_size > vocab:
        raise ConfigError(
            f"model.params.vocab_size: {vocab} is below the {m.vocab_size} token ids of the shards at {d.root} "
            f"({m.dtype}, tokenizer {m.tokenizer.get('kind', '?')}); set model.params.vocab_size: {m.vocab_size}"
        )


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

    batch, scaling = cfg.batch, cfg.scaling
    noise_split = noise_probe_runs(
        batch.policy, cfg.schedule.scaling_rule, scaling.policy == "goodput", RULES[cfg.combine.method].uses_ddp
    )
    sizes = [("batch.size", batch.size)] + [
        (f"batch.schedule[{i}]", size) for i, (_, size) in enumerate(batch.schedule)
    ]
    if (batch.policy in ("noise_scale", "norm_test") or goodput_chooses_batch(cfg)) and batch.max_size is not None:
        sizes.append(("batch.max_size", batch.max_size))
    builtin = cfg.model.factory is None
    who = f"model {cfg.model.name}'s BatchNorm" if builtin else "the model's BatchNorm"
    where = f"layer {layers[0]} would see one value per channel" + (
        f", and {len(layers) - 1} more layers" if len(layers) > 1 else ""
    )
    alt = ", or model.norm: group" if builtin else ", or GroupNorm/LayerNorm in model.factory's model"
    for field, size in sizes:
        batch_size = min(size, n)
        workers = workers_for_batch(batch_size, batch.max_local_batch, scaling.min_workers, scaling.max_workers)
        if smallest_micro_batch(batch_size, workers, batch.max_local_batch, noise_split) > 1:
            continue
        mlb, slice_ = batch.max_local_batch, batch_size // workers
        if mlb == 1:
            raise ConfigError(
                f"batch.max_local_batch: 1 puts one sample through the model at a time, and {who} "
                f"cannot train on one sample ({where}); set batch.max_local_batch to at least 2{alt}"
            )
        if slice_ <= 1:
            raise ConfigError(
                f"scaling.min_workers: {workers} workers share a batch of {batch_size} ({field}), so a worker "
                f"trains on one sample, and {who} cannot ({where}); raise {field} to at least "
                f"{2 * workers} or lower scaling.min_workers to at most {max(1, batch_size // 2)}{alt}"
            )
        if noise_split and workers == 1 and slice_ <= min(3, mlb):
            why = (
                f"batch.policy {batch.policy}"
                if BATCH_POLICIES[batch.policy].needs
                else "scaling.policy goodput"
                if scaling.policy == "goodput"
                else "schedule.scaling_rule adascale"
            )
            raise ConfigError(
                f"{field}: {batch_size} on one worker is cut in two halves for the gradient-noise estimate "
                f"({why}), so a micro-batch holds one sample, and {who} cannot train on one "
                f"({where}); raise {field} to at least 4{alt}"
            )
        odd = slice_ if slice_ % 2 else slice_ + 1
        raise ConfigError(
            f"batch.max_local_batch: {mlb} cuts a worker's slice of {odd} samples ({field} {batch_size} "
            f"over {workers} worker{'s' if workers > 1 else ''}) into micro-batches of 2 and 1, and {who} "
            f"cannot train on one sample ({where}); set batch.max_local_batch to at least 3{alt}"
        )
