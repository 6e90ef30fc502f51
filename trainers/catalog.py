"""The built-in models and datasets: one entry each, with every attribute the code decides by.

``model.name`` and ``data.name`` take these names (their ``Literal`` types read them here), and the
config checks (``orchestrator/config/rules.py``, ``preflight.py``), the loaders (``trainers/data/``) and the
builders (``trainers/workload/``) ask an entry what they need instead of listing names.  A new
built-in is one entry here plus its builder (``trainers/workload/models.py`` ``MODELS`` or
``trainers/workload/lm_models.py`` ``LM_MODELS``) or its loader (``trainers/data/datasets.py``
``load_data``, ``trainers/data/text.py``); ``tests/unit/test_catalog.py`` checks that each entry
matches what they build.  Standard library only, so every layer of the code can import it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

ModelInputs = Literal["any", "image", "tokens"]
"""What a model takes: ``any`` shape (flattened first), ``image`` batches ``[N, C, H, W]`` through
Conv2d layers, or the ``tokens`` ids of a language model."""

DatasetInputs = Literal["image", "tensor", "tokens"]
"""What a dataset's samples are: ``image`` ``[C, H, W]``, a ``tensor`` of the shape the config
gives, or ``tokens``: windows of token ids."""


@dataclass(frozen=True)
class BuiltinModel:
    """A built-in model (``model.name``)."""

    name: str
    inputs: ModelInputs
    small: bool
    """Built and run on the CPU in milliseconds: the config checks build it there (the others on
    PyTorch's ``meta`` device, shapes only)."""
    uses_hidden: bool
    """Reads ``model.hidden`` (its width or channels)."""
    residual: bool
    """Has residual blocks whose last BatchNorm ``model.zero_init_residual`` starts at zero."""
    uses_context: bool
    """Its context length defaults to ``data.context`` (a model with position embeddings)."""

    @property
    def image(self) -> bool:
        """Has Conv2d layers over ``[C, H, W]`` inputs (what ``model.channels_last`` acts on)."""
        return self.inputs == "image"

    @property
    def language_model(self) -> bool:
        """Takes token ids and predicts the next token (trains on the ``tokens`` datasets)."""
        return self.inputs == "tokens"


@dataclass(frozen=True)
class BuiltinDataset:
    """A built-in dataset (``data.name``)."""

    name: str
    inputs: DatasetInputs
    shape: tuple[int, ...] | None
    """One input's shape; None where the config gives it (``data.shape``, ``data.context``)."""
    num_classes: int | None
    """Classes of the labels; None where the config gives it (``data.num_classes``) or there are none."""
    train_samples: int | None
    """Samples of the training set before the validation split; None where the config gives it
    (``data.size``) or it is known only once loaded."""
    test_samples: int | None
    """Samples of the official test set (what ``data.val_split: test`` validates on); None: no test set."""
    in_memory: bool
    """Held as tensors and indexed directly; the others go through a DataLoader."""
    generated: bool
    """Drawn from the config's ``data.size``, ``data.shape``, ``data.num_classes`` and ``data.seed``."""
    needs_root: bool
    """Read from the files under ``data.root``."""


MLP = BuiltinModel("mlp", "any", small=True, uses_hidden=True, residual=False, uses_context=False)
CNN = BuiltinModel("cnn", "image", small=True, uses_hidden=True, residual=False, uses_context=False)
RESNET18 = BuiltinModel("resnet18", "image", small=False, uses_hidden=False, residual=True, uses_context=False)
RESNET50 = BuiltinModel("resnet50", "image", small=False, uses_hidden=False, residual=True, uses_context=False)
GPT = BuiltinModel("gpt", "tokens", small=False, uses_hidden=False, residual=False, uses_context=True)
LSTM = BuiltinModel("lstm", "tokens", small=False, uses_hidden=False, residual=False, uses_context=False)

DIGITS = BuiltinDataset(
    "digits",
    "image",
    shape=(1, 8, 8),
    num_classes=10,
    train_samples=1797,
    test_samples=None,
    in_memory=True,
    generated=False,
    needs_root=False,
)
SYNTHETIC = BuiltinDataset(
    "synthetic",
    "tensor",
    shape=None,
    num_classes=None,
    train_samples=None,
    test_samples=None,
    in_memory=True,
    generated=True,
    needs_root=False,
)
CIFAR10 = BuiltinDataset(
    "cifar10",
    "image",
    shape=(3, 32, 32),
    num_classes=10,
    train_samples=50000,
    test_samples=10000,
    in_memory=True,
    generated=False,
    needs_root=True,
)
TEXT = BuiltinDataset(
    "text",
    "tokens",
    shape=None,
    num_classes=None,
    train_samples=None,
    test_samples=None,
    in_memory=False,
    generated=False,
    needs_root=False,
)
TOKENS = BuiltinDataset(
    "token_shards",
    "tokens",
    shape=None,
    num_classes=None,
    train_samples=None,
    test_samples=None,
    in_memory=False,
    generated=False,
    needs_root=True,
)
"""Token shards and their manifest under ``data.root`` (a folder or an object-store prefix):
trainers/data/shards/."""

BUILTIN_MODELS: dict[str, BuiltinModel] = {m.name: m for m in (MLP, CNN, RESNET18, RESNET50, GPT, LSTM)}
"""Every built-in model by name, in the order the config's messages list them."""
BUILTIN_DATASETS: dict[str, BuiltinDataset] = {d.name: d for d in (DIGITS, SYNTHETIC, CIFAR10, TEXT, TOKENS)}
"""Every built-in dataset by name, in the order the config's messages list them."""

MODEL_NAMES = tuple(BUILTIN_MODELS)
DATASET_NAMES = tuple(BUILTIN_DATASETS)
DEFAULT_MODEL = CNN.name
"""``model.name`` when neither a name nor a factory is given."""
DEFAULT_DATASET = DIGITS.name
"""``data.name`` when neither a name nor a factory is given."""


def model_names(where: Callable[[BuiltinModel], bool]) -> tuple[str, ...]:
    """The built-in models ``where`` holds for, in the registry's order."""
    return tuple(m.name for m in BUILTIN_MODELS.values() if where(m))


def dataset_names(where: Callable[[BuiltinDataset], bool]) -> tuple[str, ...]:
    """The built-in datasets ``where`` holds for, in the registry's order."""
    return tuple(d.name for d in BUILTIN_DATASETS.values() if where(d))
