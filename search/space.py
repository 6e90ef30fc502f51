"""The search space file: which training config to start from, what to optimize, how to sample
and prune, and which config fields to explore.

```yaml
base: quickstart.yaml            # a training config (path relative to this file) or an inline mapping
overrides: {train.epochs: 2}     # optional dotted overrides of the base
objective: {metric: val/accuracy, direction: maximize}   # or a list of two for a multi-objective study
sampler: tpe                     # or {name: tpe, seed: 0, n_startup_trials: 4}; gp, cmaes, random, grid, nsgaii
pruner: median                   # or {name: median, n_warmup_steps: 20}; hyperband, percentile, threshold, none
params:
  optimizer.lr: {low: 0.01, high: 1.0, log: true}
  batch.size: {choices: [32, 64, 128]}
  schedule.warmup: {choices: [none, gradual]}
  schedule.warmup_epochs: {low: 0.5, high: 2.0, when: "schedule.warmup != none"}
```

A parameter is any field of the training config by its dotted path: a range (``low``/``high``,
optional ``log`` or ``step``; int or float follows the field's type) or ``choices`` (any YAML
values: a list value such as a ``batch.schedule`` is fine).  ``when`` makes it conditional: it is
sampled only when the condition holds on the config built so far (base plus the parameters
sampled before it; a parameter named in a condition is sampled first).  Forms: a mapping
``{schedule.warmup: [gradual, legw]}`` (the field's value is one of these; several keys all must
hold), or a string ``"PATH == V"``, ``"PATH != V"``, ``"PATH in [A, B]"``, ``"PATH not in [A, B]"``,
joined with `` and ``.

Two switches: ``keep_checkpoints`` (default false: a trial's checkpoints are deleted when its run
ends; its final model is in MLflow anyway) and ``skip_duplicates`` (default true: a trial that
draws exactly the config of a COMPLETE trial takes that trial's value without training again; the
runs are deterministic for a given seed).  ``report_against`` (default ``samples``): pruning
compares trials at equal samples seen (tokens for a language model), counted in steps of the base
config's batch; ``steps`` compares them at equal global steps, which favours large batches
(``search.records.ReportUnit``).

Everything is checked here, before a study, Ray or an MLflow run exists: each error is one line
naming the field (``params.optimizer.lr.low: ...``).  Beyond the shape of the file, each value a
parameter can take (``low``, ``high``, every choice) must give a valid training config for at
least one setting of the other parameters; combinations that are invalid together (``warmup:
legw`` needs ``scaling_rule: sqrt``) are left to the trials, which record FAIL with the message.
"""

from __future__ import annotations

import copy
import json
import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import yaml

from orchestrator.config.prepare import prepare, validated
from orchestrator.config.schema import (
    ConfigError,
    DuplicateKeyError,
    RootConfig,
    load_yaml_text,
    parse_override,
    read_yaml,
)
from search.config_paths import config_field, field_kind, get_path, set_path
from search.registry import DEFAULT_PRUNER, DEFAULT_SAMPLER, PRUNERS, SAMPLERS, AlgorithmSpec, Grid, check_options
from trainers.link.metrics import STEP_METRICS as _STEP_METRICS


class SpaceError(ConfigError):
    """A bad search space file: one line naming the field and the fix."""


TOP_KEYS = (
    "base",
    "overrides",
    "objective",
    "sampler",
    "pruner",
    "params",
    "keep_checkpoints",
    "skip_duplicates",
    "report_against",
)
REPORT_AGAINST = ("samples", "steps")
DEFAULT_TRIALS = 10  # the trials one `search run` evaluates without --trials
PARAM_KEYS = ("low", "high", "log", "step", "choices", "when")

# Metrics the training run reports as it goes (intermediate values for pruning come from these),
# and figures of the whole run (known only at its end, so never pruned on).
STEP_METRICS = _STEP_METRICS  # trainers/link/metrics.py
RUN_METRICS = ("steps", "samples", "wall_s", "worker_seconds")
Direction = Literal["maximize", "minimize"]


# --------------------------------------------------------------------------- conditions


_COND = re.compile(r"^\s*([A-Za-z_][\w.]*)\s*(==|!=|not\s+in|in)\s*(.+?)\s*$")


@dataclass(frozen=True)
class Condition:
    """``path``'s value is (or with ``negate``, is not) one of ``values``."""

    path: str
    values: tuple[Any, ...]
    negate: bool = False

    def holds(self, config: dict[str, Any]) -> bool:
        return (get_path(config, self.path) in self.values) != self.negate

    def admits(self, value: Any) -> bool:
        return (value in self.values) != self.negate

    def describe(self) -> str:
        op = "not in" if self.negate else "in"
        if len(self.values) == 1:
            op = "!=" if self.negate else "=="
            return f"{self.path} {op} {_show(self.values[0])}"
        return f"{self.path} {op} [{', '.join(_show(v) for v in self.values)}]"


def _show(v: Any) -> str:
    return "null" if v is None else str(v)


def parse_when(raw: Any, where: str) -> tuple[Condition, ...]:
    """A ``when`` entry: a mapping ``{path: value | [values]}``, a string, or a list of strings."""
    if isinstance(raw, dict):
        if not raw:
            raise SpaceError(f"{where}: empty; give e.g. {{schedule.warmup: [gradual, legw]}}")
        out = []
        for path, vals in raw.items():
            vals = tuple(vals) if isinstance(vals, (list, tuple)) else (vals,)
            if not vals:
                raise SpaceError(f"{where}.{path}: empty list of values; the parameter would never be sampled")
            out.append(Condition(str(path), vals))
        return tuple(out)
    if isinstance(raw, str):
        parts = re.split(r"\s+and\s+", raw.strip())
        return tuple(_parse_expr(p, where) for p in parts)
    if isinstance(raw, list) and raw and all(isinstance(r, str) for r in raw):
        return tuple(c for r in raw for c in parse_when(r, where))
    raise SpaceError(
        f"{where}: expected a mapping like {{schedule.warmup: [gradual, legw]}} or a string like "
        f'"schedule.warmup != none" (got {raw!r})'
    )


def _parse_expr(text: str, where: str) -> Condition:
    m = _COND.match(text)
    if not m:
        raise SpaceError(
            f"{where}: cannot read {text!r}; write PATH == V, PATH != V, PATH in [A, B] or PATH not in [A, B]"
        )
    path, op, rhs = m.group(1), " ".join(m.group(2).split()), m.group(3)
    try:
        value = yaml.safe_load(rhs)
    except yaml.YAMLError:
        value = rhs
    if op in ("in", "not in"):
        if not isinstance(value, list) or not value:
            raise SpaceError(f"{where}: {op!r} needs a non-empty list, e.g. {path} {op} [a, b] (got {rhs!r})")
        return Condition(path, tuple(value), negate=op == "not in")
    return Condition(path, (value,), negate=op == "!=")


# --------------------------------------------------------------------------- parameters


def _is_scalar(v: Any) -> bool:
    return v is None or isinstance(v, (bool, int, float, str))


@dataclass(frozen=True)
class Param:
    """One searched config field: a range (``int``/``float``) or ``categorical`` choices."""

    path: str
    kind: Literal["int", "float", "categorical"]
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None
    choices: tuple[Any, ...] = ()
    when: tuple[Condition, ...] = ()

    @property
    def encoded(self) -> bool:
        """Optuna's choices must be scalars: other values (lists, mappings) go by their JSON text."""
        return not all(_is_scalar(c) for c in self.choices)

    def labels(self) -> list[Any]:
        return [json.dumps(c, sort_keys=True) for c in self.choices] if self.encoded else list(self.choices)

    def decode(self, label: Any) -> Any:
        return json.loads(label) if self.encoded else label

    def suggest(self, trial: Any) -> Any:
        """Ask the trial for a value (Optuna records it under the dotted path)."""
        if self.kind == "categorical":
            return self.decode(trial.suggest_categorical(self.path, self.labels()))
        if self.kind == "int":
            return trial.suggest_int(self.path, int(self.low), int(self.high), step=int(self.step or 1), log=self.log)
        return trial.suggest_float(self.path, float(self.low), float(self.high), step=self.step, log=self.log)

    def candidates(self) -> list[tuple[str, Any]]:
        """The values checked before the search starts, each with the key that names it."""
        if self.kind == "categorical":
            return [(f"choices[{i}]", c) for i, c in enumerate(self.choices)]
        cast = int if self.kind == "int" else float
        return [("low", cast(self.low)), ("high", cast(self.high))]

    def grid_values(self) -> list[Any] | None:
        """Every value this parameter takes on a grid, or ``None`` if it is continuous."""
        if self.kind == "categorical":
            return self.labels()
        if self.kind == "int":
            return list(range(int(self.low), int(self.high) + 1, int(self.step or 1)))
        if self.step is None:
            return None
        n = int(math.floor((self.high - self.low) / self.step + 1e-9))
        return [round(self.low + i * self.step, 12) for i in range(n + 1)]

    def active(self, config: dict[str, Any]) -> bool:
        return all(c.holds(config) for c in self.when)

    def describe(self) -> str:
        if self.kind == "categorical":
            text = "one of [" + ", ".join(_show(c) for c in self.choices) + "]"
        else:
            text = (
                f"{self.kind} in [{self.low:g}, {self.high:g}]"
                + (" log" if self.log else "")
                + (f" step {self.step:g}" if self.step else "")
            )
        if self.when:
            text += " when " + " and ".join(c.describe() for c in self.when)
        return text


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def parse_param(path: str, raw: Any) -> Param:
    where = f"params.{path}"
    if path.split(".")[0] == "tracking":
        raise SpaceError(f"{where}: tracking is where results go, not a training parameter; set it in the base")
    try:
        info = config_field(path)
    except ValueError as e:
        raise SpaceError(f"{where}: {e}") from None
    assert info is not None
    if not isinstance(raw, dict):
        raise SpaceError(
            f"{where}: expected a mapping like {{low: 0.01, high: 1.0, log: true}} or {{choices: [a, b]}} (got {raw!r})"
        )
    unknown = [k for k in raw if k not in PARAM_KEYS]
    if unknown:
        raise SpaceError(f"{where}.{unknown[0]}: unknown key; allowed keys: {', '.join(PARAM_KEYS)}")
    when = parse_when(raw["when"], f"{where}.when") if raw.get("when") is not None else ()
    kind, literals = field_kind(info.annotation)
    if "choices" in raw:
        extra = [k for k in ("low", "high", "log", "step") if k in raw]
        if extra:
            raise SpaceError(f"{where}.{extra[0]}: give either choices or a range (low/high), not both")
        choices = raw["choices"]
        if not isinstance(choices, list):
            raise SpaceError(f"{where}.choices: expected a list (got {choices!r})")
        if not choices:
            raise SpaceError(f"{where}.choices: empty; list at least one value")
        return Param(path, "categorical", choices=tuple(choices), when=when)
    if "low" not in raw or "high" not in raw:
        missing = "low" if "low" not in raw else "high"
        hint = f"choices: [{', '.join(map(str, literals))}]" if literals else "choices: [...]"
        if kind == "choice":
            raise SpaceError(f"{where}: {path} takes one of a set of values; give {hint}")
        raise SpaceError(f"{where}.{missing}: required for a range (or give choices: [...])")
    if kind == "choice":
        hint = f" ({', '.join(map(str, literals))})" if literals else ""
        raise SpaceError(f"{where}: {path} is not a number{hint}; give choices: [...] instead of low/high")
    low, high, log, step = raw["low"], raw["high"], raw.get("log", False), raw.get("step")
    for key, v in (("low", low), ("high", high)):
        if not _number(v):
            raise SpaceError(f"{where}.{key}: must be a number (got {v!r})")
        if kind == "int" and not isinstance(v, int):
            raise SpaceError(f"{where}.{key}: {path} is an integer field; give an integer (got {v!r})")
    if not isinstance(log, bool):
        raise SpaceError(f"{where}.log: must be true or false (got {log!r})")
    if low > high:
        raise SpaceError(f"{where}.low: {low} is above high {high}; swap them")
    if low == high:
        raise SpaceError(f"{where}: empty range (low = high = {low}); widen it, or fix the value in overrides")
    if log and low <= 0:
        raise SpaceError(f"{where}.low: a log range needs low > 0 (got {low}); raise it or drop log")
    if step is not None:
        if log:
            raise SpaceError(
                f"{where}.step: cannot be combined with log (Optuna samples a log range continuously); drop one"
            )
        if not _number(step) or step <= 0 or (kind == "int" and not isinstance(step, int)):
            raise SpaceError(
                f"{where}.step: must be a positive {'integer' if kind == 'int' else 'number'} (got {step!r})"
            )
        if step > high - low:
            raise SpaceError(
                f"{where}.step: {step} is wider than the range [{low}, {high}]; the range would hold one value"
            )
    return Param(path, kind, low=low, high=high, log=log, step=step, when=when)


# --------------------------------------------------------------------------- objectives


@dataclass(frozen=True)
class Objective:
    """What a trial is scored on: a metric's last value in the run, or a figure of the run."""

    metric: str
    direction: Direction

    @property
    def per_step(self) -> bool:
        """Reported during the run (so it can feed the pruner)."""
        return self.metric in STEP_METRICS


def parse_objectives(raw: Any) -> tuple[Objective, ...]:
    if raw is None:
        return (Objective("val/accuracy", "maximize"),)
    items = raw if isinstance(raw, list) else [raw]
    if not items:
        raise SpaceError("objective: empty list; give {metric: val/accuracy, direction: maximize}")
    out = []
    for i, item in enumerate(items):
        where = f"objective[{i}]" if isinstance(raw, list) else "objective"
        if isinstance(item, str):
            item = {"metric": item}
        if not isinstance(item, dict):
            raise SpaceError(f"{where}: expected {{metric: val/accuracy, direction: maximize}} (got {item!r})")
        unknown = [k for k in item if k not in ("metric", "direction")]
        if unknown:
            raise SpaceError(f"{where}.{unknown[0]}: unknown key; allowed keys: metric, direction")
        metric = item.get("metric")
        known = STEP_METRICS + RUN_METRICS
        if metric not in known:
            raise SpaceError(f"{where}.metric: unknown {metric!r}; expected one of {', '.join(known)}")
        direction = item.get("direction", "maximize" if metric == "val/accuracy" else "minimize")
        if direction not in ("maximize", "minimize"):
            raise SpaceError(f"{where}.direction: unknown {direction!r}; expected one of maximize, minimize")
        out.append(Objective(metric, direction))
    if len({o.metric for o in out}) < len(out):
        raise SpaceError("objective: the same metric twice; give distinct metrics")
    return tuple(out)


def parse_algorithm(kind: str, raw: Any, default: str, registry: dict[str, Any]) -> AlgorithmSpec:
    if raw is None:
        return AlgorithmSpec(kind, default)
    if isinstance(raw, str):
        name, options = raw, {}
    elif isinstance(raw, dict):
        options = dict(raw)
        name = options.pop("name", default)
    else:
        raise SpaceError(f"{kind}: expected a name or {{name: ..., option: value}} (got {raw!r})")
    if name not in registry:
        raise SpaceError(f"{kind}: unknown {name!r}; expected one of {', '.join(registry)}")
    return AlgorithmSpec(kind, name, options)


# --------------------------------------------------------------------------- the space


@dataclass
class SearchSpace:
    """A parsed, checked search space.  ``base`` is the training config (raw, overrides applied)."""

    source: str
    text: str
    base: dict[str, Any]
    objectives: tuple[Objective, ...]
    sampler: AlgorithmSpec
    pruner: AlgorithmSpec
    params: tuple[Param, ...]
    keep_checkpoints: bool = False
    skip_duplicates: bool = True
    report_against: str = "samples"  # where intermediate values go: samples seen (in base steps) or global steps
    _full: dict[str, Any] = field(default_factory=dict, repr=False)  # base with every default filled in

    @property
    def directions(self) -> list[str]:
        return [o.direction for o in self.objectives]

    @property
    def multi_objective(self) -> bool:
        return len(self.objectives) > 1

    @property
    def prunes(self) -> bool:
        return self.pruner.name != "none" and not self.multi_objective and self.objectives[0].per_step

    def param(self, path: str) -> Param | None:
        return next((p for p in self.params if p.path == path), None)

    def grid(self) -> Grid | None:
        """Every parameter's grid values (``None`` if one is continuous)."""
        out: Grid = {}
        for p in self.params:
            vals = p.grid_values()
            if vals is None:
                return None
            out[p.path] = vals
        return out

    def grid_size(self) -> int | None:
        g = self.grid()
        return math.prod(len(v) for v in g.values()) if g is not None else None

    def build_sampler(self) -> Any:
        return self.sampler.build(self.grid() if self.sampler.entry.needs_grid else None)

    def build_pruner(self) -> Any:
        return self.pruner.build()

    # -- sampling ------------------------------------------------------------------------

    def resolve(self, pick: Callable[[Param], Any]) -> dict[str, Any]:
        """The values of the active parameters, in order; ``pick`` gives each one's value."""
        full = copy.deepcopy(self._full)
        values: dict[str, Any] = {}
        for p in self.params:
            if p.active(full):
                v = pick(p)
                set_path(full, p.path, v)
                values[p.path] = v
        return values

    def sample(self, trial: Any) -> dict[str, Any]:
        """Ask an Optuna trial for every active parameter: ``{dotted path: config value}``."""
        return self.resolve(lambda p: p.suggest(trial))

    def raw_config(self, values: dict[str, Any]) -> dict[str, Any]:
        raw = copy.deepcopy(self.base)
        for path, v in values.items():
            set_path(raw, path, v)
        return raw

    def config(self, values: dict[str, Any]) -> RootConfig:
        """The validated training config for ``values`` (``ConfigError`` if they do not fit together,
        or if its batch is more than the training set holds: ``orchestrator.config.prepare.validated``; a
        factory's or a text corpus's size is known once loaded, the trial's probe checks it)."""

        return validated(self.raw_config(values))

    def summary(self) -> dict[str, Any]:
        """A JSON-able record of the space (kept in the study's user attributes)."""
        return {
            "source": self.source,
            "base": self.base,
            "objectives": [{"metric": o.metric, "direction": o.direction} for o in self.objectives],
            "sampler": self.sampler.describe(),
            "pruner": self.pruner.describe(),
            "params": {p.path: p.describe() for p in self.params},
        }


def _order(params: list[Param]) -> list[Param]:
    """Parameters named in conditions come before the parameters that depend on them."""
    by_path = {p.path: p for p in params}
    done: list[Param] = []
    state: dict[str, int] = {}

    def visit(p: Param, chain: list[str]) -> None:
        if state.get(p.path) == 2:
            return
        if state.get(p.path) == 1:
            raise SpaceError(
                f"params.{p.path}.when: conditions go in a circle ({' -> '.join(chain + [p.path])}); break the loop"
            )
        state[p.path] = 1
        for c in p.when:
            if c.path in by_path:
                visit(by_path[c.path], chain + [p.path])
        state[p.path] = 2
        done.append(p)

    for p in params:
        visit(p, [])
    return done


def _check_conditions(params: list[Param], full: dict[str, Any]) -> None:
    by_path = {p.path: p for p in params}
    for p in params:
        for c in p.when:
            where = f"params.{p.path}.when"
            try:
                config_field(c.path)
            except ValueError as e:
                raise SpaceError(f"{where}: {c.path}: {e}") from None
            if c.path == p.path:
                raise SpaceError(f"{where}: a parameter cannot depend on itself")
            q = by_path.get(c.path)
            if q is None:
                if not c.holds(full):
                    raise SpaceError(
                        f"{where}: never true ({c.path} is {_show(get_path(full, c.path))} in the base "
                        f"and is not searched); fix the condition or search {c.path}"
                    )
            elif q.kind == "categorical":
                possible = [c.admits(v) for v in q.choices]
                if not any(possible):
                    raise SpaceError(
                        f"{where}: never true: no choice of {c.path} "
                        f"({', '.join(_show(v) for v in q.choices)}) satisfies {c.describe()}"
                    )
                if not c.negate:
                    stray = [v for v in c.values if v not in q.choices]
                    if stray:
                        raise SpaceError(
                            f"{where}: {_show(stray[0])!r} is not among {c.path}'s choices "
                            f"({', '.join(_show(v) for v in q.choices)})"
                        )


def _enabling(p: Param, by_path: dict[str, Param], full: dict[str, Any]) -> dict[str, Any]:
    """Values of the searched parameters that make ``p``'s conditions hold (one way to do it)."""
    out: dict[str, Any] = {}
    for c in p.when:
        q = by_path.get(c.path)
        if q is None:
            continue
        pool = [v for _, v in q.candidates()] if q.kind == "categorical" else []
        choice = next((v for v in pool if c.admits(v)), None)
        if choice is None and q.kind != "categorical":
            choice = next((v for v in c.values if not c.negate), None)
        if choice is not None:
            out.update(_enabling(q, by_path, full))
            out[q.path] = choice
    return out


def _try(space: SearchSpace, assign: dict[str, Any], subject: str) -> str | None:
    """The validation error of the config where the assigned parameters take these values and the
    others their first candidate (``None`` if valid).  ``subject`` must stay active."""
    values = space.resolve(lambda p: assign[p.path] if p.path in assign else p.candidates()[0][1])
    if subject not in values:
        return f"{subject} is not sampled then"
    try:
        space.config(values)
    except ConfigError as e:
        return str(e)
    return None


def check_values(space: SearchSpace) -> None:
    """Each value a parameter can take must give a valid config with *some* setting of the others.

    For value v of parameter p: set p = v (and whatever p's conditions need), the other parameters
    at their first candidate; if that is invalid, try changing one other parameter to each of its
    candidates.  Only when nothing works is v an error: every trial drawing it would fail."""
    by_path = {p.path: p for p in space.params}
    for p in space.params:
        for label, v in p.candidates():
            base = {**_enabling(p, by_path, space._full), p.path: v}
            first = _try(space, base, p.path)
            if first is None:
                continue
            ok = any(
                _try(space, {**base, q.path: w}, p.path) is None
                for q in space.params
                if q.path not in base
                for _, w in q.candidates()
            )
            if not ok:
                raise SpaceError(f"params.{p.path}.{label}: {_show(v)} gives no valid training config ({first})")


def _prefix_config_error(msg: str, prefix: str) -> str:
    """``schedule.warmup: ...`` -> ``base.schedule.warmup: ...`` (a message that names no field gets ``prefix: ``)."""
    head = msg.split(" ", 1)[0]
    if head.endswith(":") and re.fullmatch(r"[\w.\[\]]+:", head) and not head.startswith("config:"):
        return f"{prefix}.{msg}"
    if head.startswith("config:"):
        return f"{prefix}:{msg[len('config:') :]}"
    return f"{prefix}: {msg}"


def _load_base(raw: Any, base_dir: str) -> dict[str, Any]:
    if raw is None:
        raise SpaceError(
            "base: required; give a training config path (relative to the space file) or an inline mapping of sections"
        )
    if isinstance(raw, str):
        path = raw if os.path.isabs(os.path.expanduser(raw)) else os.path.join(base_dir, raw)
        try:
            return read_yaml(os.path.expanduser(path), what="base")
        except ConfigError as e:
            raise SpaceError(str(e)) from None
    if isinstance(raw, dict):
        return copy.deepcopy(raw)
    raise SpaceError(f"base: expected a file path or a mapping of config sections (got {type(raw).__name__})")


def _apply_overrides(base: dict[str, Any], raw: Any) -> dict[str, Any]:
    if raw is None:
        return base
    if isinstance(raw, list):
        items = []
        for i, item in enumerate(raw):
            if not isinstance(item, str):
                raise SpaceError(f"overrides[{i}]: expected 'section.key=value' (got {item!r})")
            try:
                path, value = parse_override(item)
            except ConfigError:
                raise SpaceError(f"overrides[{i}]: expected 'section.key=value' (got {item!r})") from None
            items.append((".".join(path), value))
    elif isinstance(raw, dict):
        items = [(str(k), v) for k, v in raw.items()]
    else:
        raise SpaceError(f"overrides: expected a mapping {{section.key: value}} (got {raw!r})")
    for path, value in items:
        try:
            config_field(path, allow_section=True)
        except ValueError as e:
            raise SpaceError(f"overrides.{path}: {e}") from None
        set_path(base, path, value)
    return base


def parse_space(
    raw: Any,
    base_dir: str = ".",
    source: str = "<inline>",
    text: str | None = None,
    *,
    environment: bool = False,
    tracking_uri: str | None = None,
) -> SearchSpace:
    """Parse and check a space (the YAML mapping); raises ``SpaceError`` naming the field.

    The base goes through the pipeline every entry point uses (``orchestrator.config.prepare.prepare``,
    as a search's base), with the environment stage when ``environment`` (``search run``; against
    ``tracking_uri`` when given).  An error in a base file reads as ``train`` would print it for
    that file; one in an inline base is prefixed ``base.``, where it sits in the space file."""

    if not isinstance(raw, dict):
        raise SpaceError(f"space: expected a mapping with keys {', '.join(TOP_KEYS)} (got {type(raw).__name__})")
    unknown = [k for k in raw if k not in TOP_KEYS]
    if unknown:
        raise SpaceError(f"{unknown[0]}: unknown key; allowed keys: {', '.join(TOP_KEYS)}")
    base = _apply_overrides(_load_base(raw.get("base"), base_dir), raw.get("overrides"))
    try:  # a factory or built-in workload probed once, on the base config
        cfg = prepare(base, environment=environment, tracking_uri=tracking_uri, search_base=True)
    except ConfigError as e:
        raise SpaceError(str(e) if isinstance(raw.get("base"), str) else _prefix_config_error(str(e), "base")) from None
    objectives = parse_objectives(raw.get("objective"))
    sampler = parse_algorithm("sampler", raw.get("sampler"), DEFAULT_SAMPLER, SAMPLERS)
    multi = len(objectives) > 1
    pruner = parse_algorithm("pruner", raw.get("pruner"), "none" if multi else DEFAULT_PRUNER, PRUNERS)
    if multi and not pruner.entry.multi_objective:
        raise SpaceError(
            f"pruner: Optuna cannot prune a multi-objective study ({pruner.name}); set pruner: none "
            f"or keep one objective"
        )
    params_raw = raw.get("params")
    if not isinstance(params_raw, dict) or not params_raw:
        raise SpaceError(
            "params: required; map config fields to ranges, e.g. {optimizer.lr: {low: 0.01, high: 1.0, log: true}}"
        )
    params = [parse_param(str(path), spec) for path, spec in params_raw.items()]
    flags = {k: raw.get(k, default) for k, default in (("keep_checkpoints", False), ("skip_duplicates", True))}
    for k, v in flags.items():
        if not isinstance(v, bool):
            raise SpaceError(f"{k}: must be true or false (got {v!r})")
    report_against = raw.get("report_against", "samples")
    if report_against not in REPORT_AGAINST:
        raise SpaceError(
            f"report_against: must be samples or steps (got {report_against!r}); samples compares trials at equal work"
        )
    full = cfg.model_dump(mode="json")
    _check_conditions(params, full)
    space = SearchSpace(
        source=source,
        text=text if text is not None else yaml.safe_dump(raw, sort_keys=False),
        base=base,
        objectives=objectives,
        sampler=sampler,
        pruner=pruner,
        params=tuple(_order(params)),
        _full=full,
        report_against=report_against,
        **flags,
    )
    grid = space.grid()
    if sampler.entry.needs_grid and grid is None:
        p = next(p for p in space.params if p.grid_values() is None)
        raise SpaceError(f"params.{p.path}: the grid sampler needs a finite set; give step, or choices")
    for spec in (sampler, pruner):
        err = check_options(spec, grid if spec.entry.needs_grid else None)
        if err:
            raise SpaceError(err)
    check_values(space)
    return space


def load_space(path: str, *, environment: bool = False, tracking_uri: str | None = None) -> SearchSpace:
    """Read and check a space file (``environment``, ``tracking_uri``: :func:`parse_space`)."""
    try:
        with open(path) as f:
            text = f.read()
    except FileNotFoundError:
        raise SpaceError(
            f"space: file {path!r} not found; pass a space YAML such as configs/search_quickstart.yaml"
        ) from None
    except OSError as e:
        raise SpaceError(f"space: cannot read {path!r} ({e.strerror})") from None
    try:
        raw = load_yaml_text(text)
    except DuplicateKeyError as e:
        raise SpaceError(e.one_line(repr(path))) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise SpaceError(f"space: {path!r} is not valid YAML{at}; fix the syntax there") from None
    return parse_space(
        raw,
        base_dir=os.path.dirname(os.path.abspath(path)),
        source=path,
        text=text,
        environment=environment,
        tracking_uri=tracking_uri,
    )
