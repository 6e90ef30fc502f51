"""The one way a config becomes a run's config, for every entry point: load, merge overrides,
validate the schema, check the workload, check the environment; each error one line.

Every entry point calls :func:`prepare`: ``python -m orchestrator train`` (and so ``ray job submit
... -- python -m orchestrator train CONFIG``, which runs that same command on the cluster),
``resume`` (the run's recorded config), ``plan``, ``fit()`` and ``python -m search run`` (the
space's base config).  So a bad config gets the same message and the same exit status 2 from
each, before Ray starts or an MLflow run exists (``tests/integration/test_entry_points.py``).

The stages, in the order a user fixes them:

1. **load**: a YAML file (``orchestrator.config.schema.read_yaml``: missing, binary, empty, invalid,
   duplicate keys) or a dict of sections;
2. **merge**: ``--set`` items (and ``--tracking-uri``) over it;
3. **schema**: every section's fields, one at a time (types, ranges: ``RootConfig``), then every
   rule between fields, in one place (``preflight.check_config``: fields that cannot go together,
   settings with no effect, a batch the data cannot fill, an input shape the model cannot take),
   and the data files (``preflight.check_data_files``);
4. **workload**: the factories probed on two samples (``preflight.check_workload``), and a model
   whose batch statistics cannot take the micro-batches of one sample the config would give it
   (``workload_checks.check_single_samples``);
5. **environment**: the checkpoint folder and the tracking store, read only
   (``environment.check_environment``), for the commands that train.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from orchestrator.config.environment import check_environment
from orchestrator.config.preflight import check_config, check_data_files, check_workload
from orchestrator.config.schema import (
    ConfigError,
    RootConfig,
    apply_overrides,
    drop_replaced_choice,
    read_yaml,
    validate,
)
from orchestrator.config.workload_checks import check_single_samples, single_sample_facts

Functions = Mapping[str, Callable[..., Any]]


def load(source: str | Mapping[str, Any] | None) -> dict[str, Any]:
    """Stage 1: the raw sections of a YAML path, or a copy of a dict of sections (None: all defaults)."""
    if isinstance(source, str):
        return read_yaml(source)
    if source is None:
        return {}
    if not isinstance(source, Mapping):
        raise ConfigError(
            f"config: expected a YAML path or a dict of sections, got {type(source).__name__}; "
            f"pass a path such as configs/quickstart.yaml or a dict such as {{'batch': {{'size': 64}}}}"
        )
    return copy.deepcopy(dict(source))


def merge(raw: dict[str, Any], overrides: Iterable[str] = (), tracking_uri: str | None = None) -> dict[str, Any]:
    """Stage 2: ``--set`` items over the raw sections, then ``--tracking-uri`` (``tracking.uri``)."""
    items = list(overrides)
    if tracking_uri:
        items.append(f"tracking.uri={tracking_uri}")
    return apply_overrides(drop_replaced_choice(raw, items), items)


def prepare(
    source: str | Mapping[str, Any] | None,
    overrides: Iterable[str] = (),
    *,
    functions: Functions | None = None,
    environment: bool = True,
    tracking_uri: str | None = None,
    search_base: bool = False,
) -> RootConfig:
    """Load, merge, validate, check the workload and (``environment``) the environment: the config a
    run trains, or a one-line :class:`ConfigError` before anything starts.

    ``functions``: factories sent by value from Python (``fit(model_fn=...)``).  ``environment``:
    check the checkpoint folder and the tracking store (every command that trains; ``plan`` trains
    nothing and writes nothing, so it leaves them out).  ``search_base``: the config is a search
    space's base, which each trial completes with its parameters, so a setting that acts only with
    some other value is not refused here (a searched parameter may give it that value).  The
    probe's BatchNorm note is printed once to stderr.
    """
    raw = merge(load(source), overrides, tracking_uri)
    cfg = validate(raw)
    check_config(cfg, ignored=not search_base)
    check_data_files(cfg)
    report = check_workload(cfg, functions)
    if report is not None and report.warning:
        print(f"warning: {report.warning}", file=sys.stderr)
    n, layers = single_sample_facts(cfg, report)
    check_single_samples(cfg, n, layers)
    if environment:
        check_environment(cfg)
    return cfg


def validated(raw: Mapping[str, Any]) -> RootConfig:
    """Stage 3 for a config whose parts already went through :func:`prepare` or are the code's own:
    a search trial's (its space's base plus sampled values), a stored trial's, a benchmark's.  The
    schema and every rule between fields (``preflight.check_config``), without refusing settings
    that act only with another value (a trial's parameters set the others) and without building
    the model (a space checks many points).  The workload and the environment are not checked."""
    cfg = validate(copy.deepcopy(dict(raw)))
    check_config(cfg, ignored=False, model_input=False)
    return cfg


def load_config(
    path: str | Mapping[str, Any] | None, overrides: list[str] | None = None, *, functions: Functions | None = None
) -> RootConfig:
    """:func:`prepare` without the environment stage (a config to look at, not to train: tests,
    benches)."""
    return prepare(path, overrides or [], functions=functions, environment=False)
