"""The root config: the trainers' sections plus the driver's own, YAML loading,
``--set`` overrides and validation errors that name the field.

Each field is validated here (its type, its range), before Ray starts or an MLflow run is created;
what relates two or more fields is checked next, in one place (``orchestrator/config/rules.py``,
from ``preflight.check_config``, run by ``orchestrator/config/prepare.py``).  ``ConfigError``
carries one line (``section.key: what is wrong; what to do``).
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable
from typing import Any, Literal

import yaml
from pydantic import BaseModel, Field, ValidationError, field_validator

from orchestrator.config.code import CodeConfig
from trainers.loop.config import LoopConfig
from trainers.section import Section

DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"
MAX_EXPERIMENT_NAME_LENGTH = 500  # MLflow's limit


class ConfigError(ValueError):
    """Bad user input: the message is one line naming the field and the fix."""


class ScalingConfig(Section):
    """The ``scaling`` section: resources only, never the training math."""

    min_workers: int = Field(default=1, gt=0, description="fewest workers a group may restart with after a loss")
    max_workers: int = Field(default=1, gt=0, description="most workers the group may grow to")
    use_gpu: bool = Field(default=False, description="train on GPUs (gpus_per_worker each, NCCL); else CPUs (gloo)")
    cpus_per_worker: float = Field(default=1.0, gt=0, description="CPUs Ray reserves per worker (fractions allowed)")
    gpus_per_worker: float = Field(default=1.0, gt=0, description="used when use_gpu")
    max_failures: int = Field(default=3, ge=0, description="worker-group restarts Ray Train may do")
    policy: Literal["workers_for_batch", "goodput"] = Field(
        default="workers_for_batch",
        description="how many workers train: workers_for_batch: as many as the batch needs "
        "(ceil(B / batch.max_local_batch)), grown only; goodput: Pollux's goodput (throughput from "
        "step times measured per local batch and W, times the statistical efficiency from the "
        "gradient noise scale, which it turns on), asked every batch.check_every steps, may grow or "
        "shrink W within min_workers..max_workers (and, with batch.policy fixed and batch.max_size "
        "above batch.size, grow B up to max_size) when the gain over the remaining samples pays for "
        "the resize (resize_when)",
    )
    resize_mode: Literal["overlap", "restart"] = Field(
        default="overlap",
        description="overlap: start the bigger group while the old one trains on and "
        "hand over at a checkpoint (when the cluster has room for both); "
        "restart: stop the old group, then start the new one",
    )
    resize_when: Literal["pays", "always"] = Field(
        default="pays",
        description="pays: grow the group only when the time it saves over the rest of "
        "training (at the ideal speed-up) is more than its pause (overlap) or a "
        "group's start (restart), both measured on this cluster; always: whenever "
        "the batch needs more workers (goodput: whenever another W predicts a higher "
        "goodput, its cost not counted)",
    )

    placement: Literal["pack", "spread"] = Field(
        default="pack",
        description="pack: crowd the workers onto as few nodes as fit (Ray Train's default; "
        "less traffic between nodes); spread: one per node as far as possible (a lost "
        "node takes fewer workers with it)",
    )
    capacity_check_s: float = Field(
        default=30.0,
        gt=0,
        description="while a group runs smaller than it asked for (a node was lost), how often "
        "the driver looks for capacity that came back; once more workers fit and "
        "the batch wants them, the group grows at its next push (a checkpoint)",
    )
    capacity_timeout_s: float = Field(
        default=600.0,
        gt=0,
        description="after a node is lost, how long the driver waits for room for "
        "scaling.min_workers before it ends the run FAILED (resume it later)",
    )
    request_ahead: bool = Field(
        default=True,
        description="on an autoscaling cluster: ask the autoscaler (Ray's request_resources) for a group's "
        "nodes before the group starts (at a resize's decision; for a batch that follows the epoch, a node's "
        "launch time before it outgrows the group), keep the nodes a resize will use, start a group once "
        "its nodes are up (at most node_wait_s), and withdraw the request when W shrinks and when the run "
        "ends; false: the nodes come from what each group asks once it starts",
    )
    node_wait_s: float = Field(
        default=300.0,
        gt=0,
        description="on an autoscaling cluster with request_ahead: how long a new group waits for the "
        "nodes asked for it before it starts with what is there (a node's launch time plus a margin: "
        "cloud VMs take 1-5 min, Ray's fake local nodes 10-30 s)",
    )

    def per_worker(self) -> dict[str, float]:
        """What Ray reserves for one worker, as Ray names resources (``CPU``, and ``GPU`` with use_gpu)."""
        return {"CPU": self.cpus_per_worker, **({"GPU": self.gpus_per_worker} if self.use_gpu else {})}

    def at_most(self) -> dict[str, float]:
        """What the run's largest group holds: ``max_workers`` workers' resources."""
        return {k: self.max_workers * v for k, v in self.per_worker().items()}


class TrackingConfig(Section):
    """The ``tracking`` section (MLflow)."""

    uri: str | None = Field(
        default=None, description=f"MLflow tracking URI; default $MLFLOW_TRACKING_URI or {DEFAULT_TRACKING_URI}"
    )
    experiment: str = Field(default="elastic-large-batch", description="MLflow experiment name")
    run_name: str | None = Field(default=None, description="MLflow run name (unset: MLflow picks one)")
    outage_timeout_s: float = Field(
        default=300.0,
        gt=0,
        description=(
            "how long training goes on while the tracking server does not answer, its records kept on the driver "
            "and in the checkpoints; a server back within it loses nothing, past it the run stops at a checkpoint "
            "with the resume command"
        ),
    )
    run_key: str | None = Field(
        default=None,
        description="the run's idempotency key (as --run-key KEY; unset: the Ray job's submission id under ray job "
        "submit): a train whose key names an unfinished run resumes it from its newest checkpoint, a finished one "
        "is not trained again (RayJob retries, backoffLimit)",
    )
    register_model: str | None = Field(
        default=None,
        description="register the run's model in MLflow's model registry under this name (as --register NAME; "
        "a new version each run)",
    )
    register_pick: Literal["last", "best"] = Field(
        default="last",
        description="the model registered (--register, tracking.register_model): last = the final model; "
        "best = the run's model (a checkpoint still stored, or the final one) with the lowest val/loss, "
        "found by search_logged_models",
    )

    @field_validator("register_model")
    @classmethod
    def _register_named(cls, v: str | None) -> str | None:
        if v is not None and not v.strip():
            raise ValueError(
                "tracking.register_model: empty; give the name to register the model under, e.g. digits-cnn"
            )
        return v

    @field_validator("experiment")
    @classmethod
    def _mlflow_accepts(cls, v: str) -> str:
        # MLflow refuses an empty name and one over 500 characters (mlflow.utils.validation)
        if not v.strip():
            raise ValueError("tracking.experiment: empty; give a name, e.g. elastic-large-batch")
        if len(v) > MAX_EXPERIMENT_NAME_LENGTH:
            raise ValueError(
                f"tracking.experiment: {len(v)} characters, MLflow allows at most "
                f"{MAX_EXPERIMENT_NAME_LENGTH}; shorten it"
            )
        return v

    def resolved_uri(self) -> str:
        return self.uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI


class RootConfig(LoopConfig):
    """The whole resolved config of one training run."""

    scaling: ScalingConfig = Field(default_factory=ScalingConfig)
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)
    code: CodeConfig = Field(default_factory=CodeConfig)

    def loop_dict(self) -> dict[str, Any]:
        """The sections the workers need (the trainers' own config)."""
        return self.model_dump(mode="json", include=set(LoopConfig.model_fields))


# --------------------------------------------------------------------------- errors


def _loc(loc: tuple[Any, ...]) -> str:
    """``("batch", "schedule", 0, 1)`` -> ``batch.schedule[0][1]``."""
    out = ""
    for p in loc:
        if isinstance(p, str) and p.startswith("function-after"):
            continue
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


def _field_info(model: type[BaseModel], loc: tuple[Any, ...]) -> Any:
    """The pydantic ``FieldInfo`` at ``loc`` (sections only; ``None`` past a list or a mapping)."""
    cur: Any = model
    info = None
    for part in loc:
        if not (isinstance(cur, type) and issubclass(cur, BaseModel)):
            return None
        info = cur.model_fields.get(str(part))
        if info is None:
            return None
        cur = info.annotation
    return info


def _allowed_keys(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    cur: Any = model
    for part in loc[:-1]:
        field = cur.model_fields.get(str(part)) if isinstance(cur, type) and issubclass(cur, BaseModel) else None
        if field is None:
            return []
        cur = field.annotation
    if isinstance(cur, type) and issubclass(cur, BaseModel):
        return list(cur.model_fields)
    return []


def _example(model: type[BaseModel], loc: tuple[Any, ...], fits: Callable[[Any], bool] = lambda v: True) -> str:
    """`` such as <the field's default>`` when the default is a plain value that ``fits``, else ``""``."""
    info = _field_info(model, loc)
    if info is None:
        return ""
    try:
        default = info.get_default(call_default_factory=True)
    except Exception:  # a default that needs arguments: no example
        return ""
    if isinstance(default, bool) or default is None or default == [] or default == {}:
        return ""
    if isinstance(default, (int, float, str, list)) and fits(default):
        shown = yaml.safe_dump(default, default_flow_style=True).strip().removesuffix("...").strip()
        return f" such as {shown}"
    return ""


ALIASES = {
    "learning_rate": "lr",
    "momentum": "mf",
    "beta1": "mf",
    "batch_size": "size",
    "global_batch": "size",
    "micro_batch": "max_local_batch",
    "num_workers": "max_workers",
    "workers": "max_workers",
    "wd": "weight_decay",
    "optimizer": "name",
    "model": "name",
    "dataset": "name",
    "num_epochs": "epochs",
    "lr_schedule": "decay",
    "warmup_type": "warmup",
    "mlflow_uri": "uri",
    "experiment_name": "experiment",
}
"""Names other trainers use for a key, and the key this config calls it (a "did you mean" that
``difflib`` alone would not find: ``optimizer.learning_rate`` -> ``optimizer.lr``)."""

_OPS = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}
_CMP: dict[str, Callable[[float, float], bool]] = {
    ">": float.__gt__,
    ">=": float.__ge__,
    "<": float.__lt__,
    "<=": float.__le__,
}


def format_validation_error(err: ValidationError, model: type[BaseModel] = RootConfig) -> str:
    """One line for the first error: ``field: problem (got X); fix``."""
    e = err.errors(include_url=False)[0]
    loc, kind, got = e["loc"], e["type"], e.get("input")
    field = _loc(loc) or "config"
    if kind == "extra_forbidden":
        allowed = _allowed_keys(model, loc)
        alias = ALIASES.get(str(loc[-1]))
        close = [alias] if alias in allowed else difflib.get_close_matches(str(loc[-1]), allowed, n=1, cutoff=0.6)
        where = _loc(loc[:-1])
        if close:
            return (
                f"{field}: unknown key; did you mean {where + '.' if where else ''}{close[0]}? "
                f"(allowed keys here: {', '.join(allowed)})"
            )
        return f"{field}: unknown key; remove it or use one of the keys allowed here: {', '.join(allowed)}"
    if kind == "literal_error":
        expected = e.get("ctx", {}).get("expected", "")
        expected = expected.replace("'", "").replace(" or ", ", ")
        close = difflib.get_close_matches(str(got), [x.strip() for x in expected.split(",")], n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]}?" if close else ""
        return f"{field}: unknown {got!r}; expected one of {expected}{hint}"
    if kind == "value_error":
        msg = str(e.get("ctx", {}).get("error", e["msg"]))
        # our own validators already name their field
        return msg if ":" in msg.split(" ")[0] else f"{field}: {msg}"
    if kind in _OPS:
        op = _OPS[kind]
        bound = list(e.get("ctx", {}).values())[0]
        example = _example(model, loc, lambda v: isinstance(v, (int, float)) and _CMP[op](float(v), float(bound)))
        return f"{field}: must be {op} {bound} (got {got!r}); set a value {op} {bound}{example}"
    if kind == "missing":
        return f"{field}: required but missing; add it"
    if kind == "finite_number":
        return f"{field}: must be a finite number (got {got!r}); .inf and .nan are not allowed, write a plain number"
    fixes = {
        "int_parsing": "expects a whole number",
        "int_type": "expects a whole number",
        "int_from_float": "expects a whole number",
        "float_parsing": "expects a number",
        "float_type": "expects a number",
        "string_type": "expects text",
        "list_type": "expects a list",
        "tuple_type": "expects a list",
        "dict_type": "expects a mapping",
        "bool_type": "expects true or false",
        "bool_parsing": "expects true or false",
    }
    writes = {
        "int_parsing": "write an integer",
        "int_type": "write an integer",
        "int_from_float": "write an integer",
        "float_parsing": "write a number",
        "float_type": "write a number",
        "string_type": "write text (in quotes if it looks like a number)",
        "list_type": "write a list in brackets, e.g. [a, b]",
        "tuple_type": "write a list in brackets, e.g. [a, b]",
        "dict_type": "write key: value pairs in braces, e.g. {name: value}",
        "bool_type": "write true or false",
        "bool_parsing": "write true or false",
    }
    if kind in fixes:
        example = _example(model, loc) if kind not in ("list_type", "tuple_type", "dict_type") else ""
        return f"{field}: {fixes[kind]} (got {got!r}); {writes[kind]}{example}"
    if kind in ("too_short", "too_long"):
        return f"{field}: {e['msg'].lower()} (got {got!r}); give the number of items it needs"
    return f"{field}: {e['msg'].lower()} (got {got!r}); fix the value"


# --------------------------------------------------------------------------- loading


def parse_override(item: str, value_after: str | None = None) -> tuple[list[str], Any]:
    """``"batch.size=128"`` -> ``(["batch", "size"], 128)`` (the value read as YAML).  ``value_after``:
    the command-line word that followed an item without ``=`` (``--set batch.size 128``), for the hint."""
    if "=" not in item:
        if value_after is not None:
            raise ConfigError(
                f"--set {item} {value_after}: write the key and its value as one word joined by =: "
                f"--set {item}={value_after}"
            )
        raise ConfigError(
            f"--set {item}: expected KEY=VALUE; write --set {item or 'batch.size'}=VALUE, e.g. --set batch.size=128"
        )
    key, raw = item.split("=", 1)
    path = [p for p in key.strip().split(".") if p]
    if not path:
        raise ConfigError(f"--set {item}: empty key; write --set section.key=value, e.g. --set batch.size=128")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return path, value


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    for item in overrides:
        path, value = parse_override(item)
        node = raw
        for part in path[:-1]:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ConfigError(
                    f"--set {item}: {part} is a value, not a section; set {'.'.join(path[: path.index(part) + 1])}"
                    f"=VALUE or a key of a section"
                )
            node = child
        node[path[-1]] = value
    return raw


class DuplicateKeyError(yaml.constructor.ConstructorError):
    """A mapping names the same key twice (``yaml.safe_load`` would keep the last silently)."""

    def __init__(self, key: str, first: yaml.Mark, again: yaml.Mark) -> None:
        super().__init__(None, None, f"duplicate key {key!r}", again)
        self.key, self.first_line, self.line = key, first.line + 1, again.line + 1

    def one_line(self, source: str) -> str:
        return f"{self.key}: given twice in {source} (lines {self.first_line} and {self.line}); keep one of them"


def _refuse_duplicates(node: yaml.Node, path: list[str]) -> None:
    """Walk the composed node tree; the first key given twice in one mapping raises, named by its path."""
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, yaml.Mark] = {}
        for key_node, value_node in node.value:
            key = str(key_node.value) if isinstance(key_node, yaml.ScalarNode) else None
            if key is not None:
                if key in seen:
                    raise DuplicateKeyError(".".join([*path, key]), seen[key], key_node.start_mark)
                seen[key] = key_node.start_mark
            _refuse_duplicates(value_node, [*path, key or "?"])
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _refuse_duplicates(item, [*path[:-1], f"{path[-1]}[{i}]"] if path else [f"[{i}]"])


def load_yaml_text(text: str) -> Any:
    """Parse YAML like ``yaml.safe_load``, but a key given twice in one mapping raises
    :class:`DuplicateKeyError` naming the key's path and both lines."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _refuse_duplicates(node, [])
        return loader.construct_document(node)
    finally:
        loader.dispose()


def read_yaml(path: str, what: str = "config") -> dict[str, Any]:
    """The mapping of sections in the YAML file ``path``.  A missing, unreadable, binary or empty file,
    invalid YAML, a key given twice and anything but a mapping are one-line :class:`ConfigError`s
    that start with ``what``.  An empty file (or one of comments only) is refused: training the
    defaults because a file came out empty is never what was meant (``{}`` asks for them)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
        text = data.decode("utf-8")
    except FileNotFoundError:
        raise ConfigError(
            f"{what}: file {path!r} not found; pass a YAML file such as configs/quickstart.yaml"
        ) from None
    except IsADirectoryError:
        raise ConfigError(f"{what}: {path!r} is a folder; pass a YAML file such as configs/quickstart.yaml") from None
    except OSError as e:
        raise ConfigError(f"{what}: cannot read {path!r} ({e.strerror}); check its permissions") from None
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"{what}: {path!r} is not a text file (byte {e.start} is not UTF-8); pass the YAML "
            f"config, such as configs/quickstart.yaml"
        ) from None
    if "\x00" in text:
        raise ConfigError(
            f"{what}: {path!r} is not a text file (it holds NUL bytes at byte {text.index(chr(0))}); "
            f"pass the YAML config, such as configs/quickstart.yaml"
        )
    try:
        raw = load_yaml_text(text)
    except DuplicateKeyError as e:
        raise ConfigError(e.one_line(repr(path))) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"{what}: {path!r} is not valid YAML{where}; fix the syntax there") from None
    if raw is None:
        raise ConfigError(
            f"{what}: {path!r} is empty (no settings); write the sections to train (data, model, "
            f"batch, ...), e.g. start from configs/quickstart.yaml, or write {{}} for all defaults"
        )
    if not isinstance(raw, dict):
        raise ConfigError(
            f"{what}: {path!r} must be a mapping of sections (data, model, ...), "
            f"got {type(raw).__name__}; write section: {{key: value}} lines"
        )
    return raw


def validate(raw: dict[str, Any]) -> RootConfig:
    try:
        return RootConfig.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(format_validation_error(e)) from None


CHOICES = {"name": "factory", "factory": "name"}  # a section names a built-in or a factory
# what only a built-in workload reads: dropped from the file with its name when --set swaps in a factory
BUILTIN_ONLY = {
    "model": ("hidden", "norm", "zero_init_residual"),
    "data": ("root", "size", "shape", "num_classes", "seed", "val_fraction", "path", "context"),
}


def drop_replaced_choice(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """``--set data.factory=...`` replaces the file's ``data.name`` (and ``name`` the ``factory``), so a
    config's built-in workload can be swapped from the command line; the same file giving both is
    still an error."""
    for item in overrides:
        path, _ = parse_override(item)
        if len(path) == 2 and path[0] in ("data", "model") and path[1] in CHOICES:
            section = raw.get(path[0])
            if isinstance(section, dict):
                section.pop(CHOICES[path[1]], None)
                if path[1] == "factory":
                    for key in BUILTIN_ONLY[path[0]]:
                        section.pop(key, None)
    return raw


def to_yaml(cfg: RootConfig) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
