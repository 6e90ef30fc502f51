"""Samplers and pruners by name: the registries a search space's ``sampler`` and ``pruner`` pick from.

Each entry maps a name to a constructor ``(options, grid) -> instance``; ``options`` are the keyword
arguments written in the space file (``sampler: {name: tpe, seed: 0, n_startup_trials: 4}``) and go
straight to the Optuna class, so every Optuna option is available.  ``grid`` is the finite search
space (param -> values), needed only by the grid sampler.

``check_options`` names a bad option before anything starts: an unknown keyword, or the
``ValueError``/``TypeError`` the Optuna constructor raises for a bad value.
"""

from __future__ import annotations

import importlib.util
import inspect
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import optuna

Grid = dict[str, list[Any]]


@dataclass(frozen=True)
class Algorithm:
    """One registry entry: the Optuna class, how to build it, and what it needs."""

    cls: type
    build: Callable[[dict[str, Any], Grid | None], Any]
    needs_grid: bool = False
    requires: tuple[str, ...] = ()  # extra Python packages
    multi_objective: bool = True  # for pruners: Optuna prunes single-objective studies only


def _plain(cls: type) -> Callable[[dict[str, Any], Grid | None], Any]:
    return lambda options, grid: cls(**options)


class AskTellGridSampler(optuna.samplers.GridSampler):
    """Optuna's grid sampler, for a driver that asks and tells.

    Optuna's ``after_trial`` calls ``study.stop()`` once every grid point has started, which only
    works inside ``study.optimize`` (elsewhere it raises).  The search driver stops by itself: it
    runs no more trials than the grid has points left."""

    def after_trial(self, study: Any, trial: Any, state: Any, values: Any) -> None:
        return None


def _grid(options: dict[str, Any], grid: Grid | None) -> optuna.samplers.GridSampler:
    if grid is None:
        raise ValueError("the grid sampler needs a finite search space")
    return AskTellGridSampler(grid, **options)


SAMPLERS: dict[str, Algorithm] = {
    "tpe": Algorithm(optuna.samplers.TPESampler, _plain(optuna.samplers.TPESampler)),
    "gp": Algorithm(optuna.samplers.GPSampler, _plain(optuna.samplers.GPSampler)),
    "cmaes": Algorithm(optuna.samplers.CmaEsSampler, _plain(optuna.samplers.CmaEsSampler), requires=("cmaes",)),
    "random": Algorithm(optuna.samplers.RandomSampler, _plain(optuna.samplers.RandomSampler)),
    "grid": Algorithm(optuna.samplers.GridSampler, _grid, needs_grid=True),
    "nsgaii": Algorithm(optuna.samplers.NSGAIISampler, _plain(optuna.samplers.NSGAIISampler)),
}

PRUNERS: dict[str, Algorithm] = {
    "median": Algorithm(optuna.pruners.MedianPruner, _plain(optuna.pruners.MedianPruner), multi_objective=False),
    "percentile": Algorithm(
        optuna.pruners.PercentilePruner, _plain(optuna.pruners.PercentilePruner), multi_objective=False
    ),
    "hyperband": Algorithm(
        optuna.pruners.HyperbandPruner, _plain(optuna.pruners.HyperbandPruner), multi_objective=False
    ),
    "successive_halving": Algorithm(
        optuna.pruners.SuccessiveHalvingPruner, _plain(optuna.pruners.SuccessiveHalvingPruner), multi_objective=False
    ),
    "threshold": Algorithm(
        optuna.pruners.ThresholdPruner, _plain(optuna.pruners.ThresholdPruner), multi_objective=False
    ),
    "none": Algorithm(optuna.pruners.NopPruner, _plain(optuna.pruners.NopPruner)),
}

DEFAULT_SAMPLER = "tpe"
DEFAULT_PRUNER = "median"


@dataclass(frozen=True)
class AlgorithmSpec:
    """A sampler or pruner as the space file names it: ``name`` plus constructor options."""

    kind: str  # "sampler" or "pruner"
    name: str
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def entry(self) -> Algorithm:
        return (SAMPLERS if self.kind == "sampler" else PRUNERS)[self.name]

    def build(self, grid: Grid | None = None) -> Any:
        """A fresh instance (samplers keep random state: build one per study object)."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return self.entry.build(dict(self.options), grid)

    def describe(self) -> str:
        if not self.options:
            return self.name
        opts = ", ".join(f"{k}={v!r}" for k, v in sorted(self.options.items()))
        return f"{self.name}({opts})"


def allowed_options(cls: type) -> list[str]:
    """The keyword arguments ``cls.__init__`` accepts (what a space file may set)."""
    sig = inspect.signature(cls.__init__)
    return [n for n, p in sig.parameters.items() if n != "self" and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)]


def check_options(spec: AlgorithmSpec, grid: Grid | None = None) -> str | None:
    """``None`` when ``spec`` builds, else one line naming the bad option (``sampler.seed: ...``)."""
    entry = spec.entry
    for pkg in entry.requires:
        if importlib.util.find_spec(pkg) is None:
            return (
                f"{spec.kind}: {spec.name} needs the Python package {pkg!r}; pip install {pkg}, "
                f"or pick another {spec.kind}"
            )
    allowed = [a for a in allowed_options(entry.cls) if not (entry.needs_grid and a == "search_space")]
    for key in spec.options:
        if key not in allowed:
            return (
                f"{spec.kind}.{key}: not an option of {spec.name} ({entry.cls.__name__}); allowed: {', '.join(allowed)}"
            )
    if entry.needs_grid and grid is None:
        return None  # checked again once the grid is known
    try:
        spec.build(grid)
    except (TypeError, ValueError) as e:
        named = [k for k in spec.options if k in str(e)]
        where = f"{spec.kind}.{named[0]}" if named else spec.kind
        return f"{where}: {spec.name} rejects its options ({e})"
    return None
