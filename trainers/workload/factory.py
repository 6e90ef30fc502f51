"""A user's workload from ``"package.module:function"`` strings, checked before anything starts.

The plain contract (docs/architecture.md, "workloads") imports nothing from this project:

* a **data factory** is called with ``data.params`` as keyword arguments and returns
  ``(train, val)``: two map-style datasets with ``__len__`` and ``__getitem__(i) -> (input,
  target)`` (optionally a batched ``__getitems__(indices)``, see :mod:`trainers.data.sampler`);
* a **model factory** is called with ``model.params`` as keyword arguments and returns a
  ``torch.nn.Module``;
* a **loss** maps ``(output, target)`` of a micro-batch of ``b`` samples to a tensor of shape
  ``[b]``, one value per sample.  The loop sums it, so the global-batch math (the gradient of
  ``sum / B``) and the noise-scale estimator (which needs per-micro-batch sums) stay right.

Neither factory is told the rank or the world size: the data order is ours.

Every failure is a :class:`FactoryError` (a ``ValueError``) whose one-line message starts with
the config field (``model.factory: ...``), so the CLI can print it and exit with status 2 before
Ray starts.  :func:`probe` runs the whole contract once on the driver: build, forward and loss on
two samples, backward, and a state-dict round trip through ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import io
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
FORM_HINT = "write it as package.module:function, e.g. my_project.models:build"
PATH_HINT = "put its folder on PYTHONPATH, install it with `pip install -e <project>`, or list it in code.py_modules"


class FactoryError(ValueError):
    """A one-line, user-facing error about a workload field (the message starts with the field)."""


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _is_missing_module(exc: ModuleNotFoundError, module: str) -> bool:
    """Whether ``exc`` says ``module`` itself (or a parent package of it) is missing, not a dependency."""
    name = exc.name or ""
    return bool(name) and (module == name or module.startswith(name + "."))


def resolve(spec: str | Callable[..., Any], field: str) -> Callable[..., Any]:
    """The callable that ``spec`` (``"package.module:function"``, or a callable) names.

    ``function`` may be dotted (``module:Class.method``).  Raises :class:`FactoryError` for a
    path without ``:``, a module that cannot be found (with how to put it on the path), a module
    that raises while imported (naming the exception), a missing attribute (suggesting the
    nearest name, by ``difflib.get_close_matches``) and an attribute that is not callable.
    """
    if callable(spec):
        return spec
    if not isinstance(spec, str) or ":" not in spec:
        raise FactoryError(f"{field}: {spec!r} is not of the form 'package.module:function'; {FORM_HINT}")
    module_name, _, attr = spec.partition(":")
    module_name, attr = module_name.strip(), attr.strip()
    if not module_name or not attr:
        raise FactoryError(f"{field}: {spec!r} is not of the form 'package.module:function'; {FORM_HINT}")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if _is_missing_module(exc, module_name):
            raise FactoryError(
                f"{field}: cannot import {module_name!r}: no module named {exc.name!r} on this "
                f"Python's path; {PATH_HINT}"
            ) from None
        raise FactoryError(
            f"{field}: importing {module_name!r} raised {_one_line(exc)}; install what it imports or fix that import"
        ) from None
    except (Exception, SystemExit) as exc:  # the user's module failed while running
        raise FactoryError(
            f"{field}: importing {module_name!r} raised {_one_line(exc)}; fix the module so that "
            f"it imports cleanly (python -c 'import {module_name}')"
        ) from None
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            names = [n for n in dir(obj) if not n.startswith("_")]
            close = difflib.get_close_matches(part, names, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; name a function defined in {module_name}"
            raise FactoryError(f"{field}: {module_name!r} has no attribute {part!r}{hint}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise FactoryError(
            f"{field}: {spec!r} is a {type(obj).__name__}, not a callable; name the function (or class) that builds it"
        )
    return obj


def qualified_name(fn: Callable[..., Any]) -> str | None:
    """``"module:qualname"`` of an importable function, or ``None`` (a lambda, a local, ``__main__``).

    The run records this string so that ``resume`` can rebuild the workload from the CLI.
    """
    module, qual = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if not module or module == "__main__" or "<" in qual:
        return None
    try:
        found = resolve(f"{module}:{qual}", "factory")
    except FactoryError:
        return None
    return f"{module}:{qual}" if found is fn else None


def params_problem(fn: Callable[..., Any], params: Mapping[str, Any], params_field: str) -> str | None:
    """Why ``fn(**params)`` cannot bind (a keyword ``fn`` does not take, one it needs and lacks), as
    one line naming ``params_field`` and the fix; ``None`` when it binds or the signature is unknown."""

    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    kinds = inspect.Parameter
    takes = [p.name for p in sig.parameters.values() if p.kind in (kinds.POSITIONAL_OR_KEYWORD, kinds.KEYWORD_ONLY)]
    name = getattr(fn, "__name__", type(fn).__name__)
    if not any(p.kind is kinds.VAR_KEYWORD for p in sig.parameters.values()):
        for key in params:
            if key not in takes:
                close = difflib.get_close_matches(str(key), takes, n=1)
                fix = f"did you mean {close[0]}?" if close else f"remove it from {params_field}"
                return (
                    f"{params_field}: {name}() takes no argument {key!r}; {fix} (it takes "
                    f"{', '.join(takes) or 'no arguments'})"
                )
    for p in sig.parameters.values():
        if (
            p.kind in (kinds.POSITIONAL_OR_KEYWORD, kinds.KEYWORD_ONLY)
            and p.default is kinds.empty
            and p.name not in params
        ):
            return (
                f"{params_field}: {name}() needs the argument {p.name!r}; add it to {params_field}, e.g. "
                f"{{{p.name}: ...}}"
            )
    return None


def _call(fn: Callable[..., Any], params: Mapping[str, Any] | None, field: str) -> Any:
    params_field = f"{field.split('.')[0]}.params"
    problem = params_problem(fn, dict(params or {}), params_field)
    if problem:
        raise FactoryError(problem)
    try:
        return fn(**dict(params or {}))
    except TypeError as exc:
        raise FactoryError(
            f"{params_field}: calling {field.split('.', 1)[-1]} {getattr(fn, '__name__', '')} with "
            f"{sorted(params or {})} failed: {_one_line(exc)}; fix {params_field} (or the "
            f"factory)"
        ) from None
    except Exception as exc:
        raise FactoryError(
            f"{field}: the factory raised {_one_line(exc)}; fix the factory or the values in {params_field}"
        ) from None


def _is_map_style(ds: Any) -> bool:
    return hasattr(ds, "__len__") and hasattr(ds, "__getitem__")


def check_datasets(result: Any, field: str = "data.factory") -> tuple[Any, Any]:
    """``result`` as ``(train, val)`` map-style datasets, or a :class:`FactoryError` saying what was expected."""
    expected = "a (train, val) pair of map-style datasets with __len__ and __getitem__(i) -> (input, target)"
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        raise FactoryError(f"{field}: returned {type(result).__name__}, expected {expected}; return (train, val)")
    for name, ds in zip(("train", "val"), result):
        if not _is_map_style(ds):
            raise FactoryError(
                f"{field}: {name} is a {type(ds).__name__} without __len__/__getitem__, "
                f"expected {expected}; return map-style datasets (torch.utils.data.Dataset)"
            )
        if len(ds) == 0:
            raise FactoryError(
                f"{field}: the {name} dataset is empty; check what the factory reads (and {field.split('.')[0]}.params)"
            )
    sample = result[0][0]
    if not isinstance(sample, (tuple, list)) or len(sample) != 2:
        raise FactoryError(
            f"{field}: train[0] is a {type(sample).__name__}, expected an (input, target) pair; "
            f"make __getitem__ return (input, target)"
        )
    return result[0], result[1]


def check_model(result: Any, field: str = "model.factory") -> nn.Module:
    """``result`` if it is a ``torch.nn.Module``, else a :class:`FactoryError`."""
    if not isinstance(result, nn.Module):
        raise FactoryError(
            f"{field}: returned {type(result).__name__}, expected a torch.nn.Module; return the model itself"
        )
    return result


def check_dataset_size(train: Any, global_batch: int, field: str = "data.factory") -> None:
    """A training set smaller than the global batch cannot fill one step: :class:`FactoryError`."""
    if len(train) < global_batch:
        raise FactoryError(
            f"{field}: the training set has {len(train)} samples, fewer than the global batch "
            f"of {global_batch} (batch.size / the largest batch the policy reaches); lower "
            f"batch.size (and batch.max_size) to at most {len(train)}, or give more data"
        )


def build_datasets(
    spec: str | Callable[..., Any], params: Mapping[str, Any] | None = None, field: str = "data.factory"
) -> tuple[Any, Any]:
    """Resolve and call a data factory; return its checked ``(train, val)``."""
    return check_datasets(_call(resolve(spec, field), params, field), field)


def build_model(
    spec: str | Callable[..., Any], params: Mapping[str, Any] | None = None, field: str = "model.factory"
) -> nn.Module:
    """Resolve and call a model factory; return its checked module."""
    return check_model(_call(resolve(spec, field), params, field), field)


# --------------------------------------------------------------------------- losses


def cross_entropy(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Per-sample cross-entropy of logits ``[b, C]`` against integer classes ``[b]``: shape ``[b]``."""
    return F.cross_entropy(output, target, reduction="none")


def token_cross_entropy(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Per-sequence mean token cross-entropy: logits ``[b, T, V]``, targets ``[b, T]`` -> ``[b]``.

    ``loss_i = (1/T) sum_t CE(output[i, t], target[i, t])``; ``exp`` of its mean over a set is the
    per-token perplexity (every sequence has the same T).
    """
    b, t, v = output.shape
    per_token = F.cross_entropy(output.reshape(b * t, v), target.reshape(b * t), reduction="none")
    return per_token.view(b, t).mean(dim=1)


LOSSES: dict[str, LossFn] = {"cross_entropy": cross_entropy, "token_cross_entropy": token_cross_entropy}


def resolve_loss(spec: str | LossFn | None, field: str = "model.loss") -> LossFn:
    """A built-in loss by name (default ``cross_entropy``), or a user's ``"module:function"``."""
    if spec is None:
        return cross_entropy
    if isinstance(spec, str) and spec in LOSSES:
        return LOSSES[spec]
    if isinstance(spec, str) and ":" not in spec:
        raise FactoryError(
            f"{field}: {spec!r} is neither one of {sorted(LOSSES)} nor a 'package.module:function'; "
            f"use one of those names or {FORM_HINT}"
        )
    return resolve(spec, field)


def check_loss_output(loss: Any, batch: int, field: str = "model.loss") -> torch.Tensor:
    """The loss of a micro-batch of ``batch`` samples must be a tensor of shape ``[batch]``."""
    if not isinstance(loss, torch.Tensor):
        raise FactoryError(
            f"{field}: returned {type(loss).__name__}, expected a tensor of shape [{batch}] "
            "(one loss per sample); return the per-sample losses (reduction='none')"
        )
    if tuple(loss.shape) != (batch,):
        raise FactoryError(
            f"{field}: returned shape {list(loss.shape)} for {batch} samples, expected "
            f"[{batch}] (one loss per sample, not a mean; use reduction='none')"
        )
    return loss


# --------------------------------------------------------------------------- probe


BATCHNORM_WARNING = (
    "model.factory: the model has BatchNorm layers; their statistics are computed per "
    "micro-batch on each worker, so they change with batch.max_local_batch and the worker "
    "count (use GroupNorm/LayerNorm or SyncBatchNorm for results independent of W)"
)


def has_batchnorm(model: nn.Module) -> bool:
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())


@dataclass(frozen=True)
class ProbeReport:
    """What :func:`probe_report` learned: the BatchNorm warning (or ``None``), the training set's
    size, and the batch-statistics layers that cannot train on a micro-batch of one sample
    (:func:`trainers.workload.batchnorm.single_sample_layers`)."""

    warning: str | None
    train_size: int
    single_sample_layers: tuple[str, ...] = ()


def probe(
    model_fn: str | Callable[..., Any],
    data_fn: str | Callable[..., Any],
    loss_fn: str | LossFn | None = None,
    *,
    model_params: Mapping[str, Any] | None = None,
    data_params: Mapping[str, Any] | None = None,
    global_batch: int | None = None,
    model_field: str = "model.factory",
    data_field: str = "data.factory",
    loss_field: str = "model.loss",
) -> str | None:
    """Run the workload contract once on two samples; return a warning or ``None``, raise :class:`FactoryError`
    (:func:`probe_report`, its warning only)."""
    return probe_report(
        model_fn,
        data_fn,
        loss_fn,
        model_params=model_params,
        data_params=data_params,
        global_batch=global_batch,
        model_field=model_field,
        data_field=data_field,
        loss_field=loss_field,
    ).warning


def probe_report(
    model_fn: str | Callable[..., Any],
    data_fn: str | Callable[..., Any],
    loss_fn: str | LossFn | None = None,
    *,
    model_params: Mapping[str, Any] | None = None,
    data_params: Mapping[str, Any] | None = None,
    global_batch: int | None = None,
    model_field: str = "model.factory",
    data_field: str = "data.factory",
    loss_field: str = "model.loss",
) -> ProbeReport:
    """Run the workload contract once on two samples; raise :class:`FactoryError` or report what it saw.

    Steps: build the datasets and check them (and ``len(train) >= global_batch`` when given);
    build the model; fetch ``train[0:2]`` (batched via ``__getitems__`` when present); forward and
    loss in training mode (the loss must have shape ``[2]``); backward of its sum (every
    parameter that requires a gradient may get one); save the state dict and load it back with
    ``torch.load(weights_only=True)`` into a fresh model from the same factory
    (``load_state_dict(strict=True)``).  A model with BatchNorm gets the warning, and a forward of
    ``train[0]`` alone names the layers that cannot train on one sample.
    """
    from trainers.data.sampler import fetch
    from trainers.workload.batchnorm import single_sample_layers

    train, _ = build_datasets(data_fn, data_params, data_field)
    if global_batch is not None:
        check_dataset_size(train, global_batch, data_field)
    model = build_model(model_fn, model_params, model_field)
    loss = resolve_loss(loss_fn, loss_field)
    idx = [0, 1] if len(train) >= 2 else [0, 0]
    try:
        x, y = fetch(train, idx)
    except Exception as exc:
        raise FactoryError(
            f"{data_field}: loading train[{idx}] and collating failed: {_one_line(exc)}; make "
            f"__getitem__ return (input, target) tensors of one shape"
        ) from None
    model.train()
    try:
        out = model(x)
    except Exception as exc:
        raise FactoryError(
            f"{model_field}: forward on two training samples failed: {_one_line(exc)}; make the "
            f"model take a batch of the dataset's inputs"
        ) from None
    try:
        value = loss(out, y)
    except Exception as exc:
        raise FactoryError(
            f"{loss_field}: failed on the model's output for two samples: {_one_line(exc)}; make "
            f"it take (output, target) of a batch"
        ) from None
    value = check_loss_output(value, len(idx), loss_field)
    try:
        value.sum().backward()
    except Exception as exc:
        raise FactoryError(
            f"{model_field}: backward through the loss failed: {_one_line(exc)}; keep the "
            f"loss differentiable in the model's parameters"
        ) from None
    buf = io.BytesIO()
    try:
        torch.save(model.state_dict(), buf)
        buf.seek(0)
        state = torch.load(buf, weights_only=True)
        build_model(model_fn, model_params, model_field).load_state_dict(state, strict=True)
    except FactoryError:
        raise
    except Exception as exc:
        raise FactoryError(
            f"{model_field}: the state dict does not survive torch.save/torch.load(weights_only=True) "
            f"into a fresh model: {_one_line(exc)}; keep only tensors in the state dict and build "
            f"the same parameters on every call"
        ) from None
    if not has_batchnorm(model):
        return ProbeReport(None, len(train))
    one, _ = fetch(train, [0])
    return ProbeReport(BATCHNORM_WARNING, len(train), tuple(single_sample_layers(model, one)))
