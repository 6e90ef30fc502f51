"""Study-level helpers: create or continue a study, find its trials, rebuild a trial's config.

A study is created by ``python -m search run`` with its objectives (user attribute ``objectives``),
its base config (``base_config``) and space (``space``), so that ``show`` can rebuild any trial's
training config later: the base config as written plus the trial's values
(``trial_raw_config``).  Storage handling is in ``search.study_storage``; the driver that runs trials is
``search.driver``.  See ``docs/architecture.md`` (the search layer).
"""

from __future__ import annotations

import copy
import hashlib
import json
from typing import TYPE_CHECKING, Any

import optuna
import yaml

from orchestrator.config.prepare import validated
from orchestrator.config.schema import ConfigError, RootConfig, to_yaml, validate
from search.config_paths import set_path
from search.liveness import lost_numbers
from search.registry import AlgorithmSpec
from search.space import SearchSpace, SpaceError
from search.study_storage import describe_storage, open_storage, study_names
from search.study_tracking import best_trials, trial_values

if TYPE_CHECKING:
    from optuna import Study
    from optuna.storages import BaseStorage
    from optuna.trial import FrozenTrial


def create_or_load_study(space: SearchSpace, name: str, storage: BaseStorage) -> Study:
    """Create the study, or load it when it exists (its objectives must match the space's)."""

    existing = study_names(storage)
    if name in existing:
        study = optuna.load_study(study_name=name, storage=storage, pruner=space.build_pruner())
        # A seeded sampler built again would draw the same points as the first invocation did:
        # continue its sequence from a seed offset by the trials already in the study.
        done = len(study.get_trials(deepcopy=False))
        seed = space.sampler.options.get("seed")
        spec = space.sampler
        if isinstance(seed, int) and done:
            spec = AlgorithmSpec(spec.kind, spec.name, {**spec.options, "seed": seed + done})
        study.sampler = spec.build(space.grid() if spec.entry.needs_grid else None)
        have = [d.name.lower() for d in study.directions]
        if have != space.directions:
            raise SpaceError(
                f"objective: study {name!r} already exists and optimizes {', '.join(have)}; "
                f"the space asks {', '.join(space.directions)}; use another --study-name"
            )
        stored = study.user_attrs.get("objectives")
        wanted = [o.metric for o in space.objectives]
        if stored and stored != wanted:
            raise SpaceError(
                f"objective.metric: study {name!r} already exists and optimizes {', '.join(stored)}; "
                f"the space asks {', '.join(wanted)}; use another --study-name"
            )
        return study
    study = optuna.create_study(
        study_name=name,
        storage=storage,
        sampler=space.build_sampler(),
        pruner=space.build_pruner(),
        directions=space.directions,
        load_if_exists=True,
    )
    study.set_user_attr("objectives", [o.metric for o in space.objectives])
    return study


def load_existing_study(name: str, storage_url: str) -> Study:
    """A stored study for ``show``; ``ConfigError`` naming the studies there if it is missing."""

    storage = open_storage(storage_url)
    names = study_names(storage)
    if name not in names:
        there = f"studies there: {', '.join(names)}" if names else "it holds no study"
        raise ConfigError(f"study: no study {name!r} in {describe_storage(storage_url)}; {there}")
    return optuna.load_study(study_name=name, storage=storage)


def grid_remaining(study: Study, space: SearchSpace) -> int | None:
    """Grid points this study has not started yet (``None`` unless the sampler is the grid); the
    points of trials lost with a dead driver, queued again, count as not started."""
    if not space.sampler.entry.needs_grid:
        return None

    grid = space.grid() or {}
    trials = study.get_trials(deepcopy=False)
    lost = lost_numbers(trials)  # a dead driver's trials: their points are queued again (WAITING)
    seen = {
        t.system_attrs["grid_id"]
        for t in trials
        if "grid_id" in t.system_attrs
        and set(t.system_attrs.get("search_space", {})) == set(grid)
        and t.state != optuna.trial.TrialState.WAITING
        and t.number not in lost
    }
    return max(0, (space.grid_size() or 0) - len(seen))


def config_key(cfg: RootConfig) -> str:
    """What makes two trials the same run: the whole config but where results go (tracking,
    checkpoint storage), as the first 16 hex digits of the SHA-1 of its sorted JSON."""
    d = cfg.model_dump(mode="json", exclude={"tracking": True, "checkpoint": {"storage_path"}})
    return hashlib.sha1(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]


def completed_twin(study: Study, key: str) -> FrozenTrial | None:
    """A COMPLETE trial of the study that trained exactly this config (user attribute ``config_key``
    equal to ``key``; a trial that itself reused another's value does not count): its run would repeat."""

    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        if t.user_attrs.get("config_key") == key and "duplicate_of" not in t.user_attrs:
            return t
    return None


def trial_raw_config(study: Study, trial: FrozenTrial) -> dict[str, Any]:
    """The training config a trial ran, as written: the study's base config plus the trial's values
    (validated; ``ConfigError`` if not)."""
    base = study.user_attrs.get("base_config")
    if base is None:
        raise ConfigError(
            f"study: {study.study_name!r} was not created by python -m search (no base config "
            f"stored); cannot rebuild a training config"
        )
    raw = copy.deepcopy(base)
    for path, v in trial_values(trial).items():
        set_path(raw, path, v)
    validated(raw)
    return raw


def best_config_yaml(study: Study, trial: FrozenTrial | None = None, full: bool = False) -> str | None:
    """The best (or given) trial's config as a ready-to-train YAML, with a header saying where it
    comes from: the base config as written plus the trial's values, or with ``full`` every field."""

    best = [trial] if trial is not None else best_trials(study)
    if not best:
        return None
    t = best[0]
    raw = trial_raw_config(study, t)
    body = to_yaml(validate(raw)) if full else yaml.safe_dump(raw, sort_keys=False)
    values = ", ".join(f"{v:.6g}" for v in (t.values or []))
    head = (
        f"# study {study.study_name}, trial {t.number} ({t.state.name}"
        + (f", value {values}" if values else "")
        + ")\n"
        + "# train it: python -m orchestrator train THIS_FILE.yaml\n"
    )
    return head + body
