"""The params a run logs to MLflow: the resolved config's fields that apply to this run.

The full resolved config is logged as the artifact ``config.yaml`` (and written beside the
checkpoints); the params are what a reviewer compares across runs, so a field is left out when
this run's choices never read it: the synthetic set's ``data.size`` on a digits run,
``schedule.auto_*`` without auto warmup, a batch policy's knobs under ``batch.policy: fixed``,
Adam's ``beta2`` under SGD, unset (``None``) and empty values.  The rules say which field is read
by which choice (preflight's rules for settings that do nothing, and the rules here); they mirror the
code that reads the field (named beside each rule).

:class:`ConfigRecord` is everything the run's MLflow record takes from the config, read once by the
driver (orchestrator/run/runner.py): the store and the run's names, the public config, these params
and the datasets; the record side never sees the config itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mlflow.entities import DatasetInput

from orchestrator.config.preflight import IGNORED_UNLESS
from orchestrator.config.schema import RootConfig
from orchestrator.config.uris import redact_uri
from orchestrator.record.datasets import describe_data
from trainers import catalog
from trainers.combine.config import RULES
from trainers.policies.batching import noise_probe_runs

Rule = tuple[Callable[[RootConfig], bool], tuple[str, ...]]

# (applies(cfg), fields read only then): a listed field (or a prefix ending in "." or "_") is logged
# only when ``applies`` holds.  Besides these, every rule of preflight.IGNORED_UNLESS (the settings
# a user may not set where they do nothing) applies: see :func:`rules`.
EXTRA_RULES: tuple[Rule, ...] = (
    # trainers/data/datasets.py, trainers/workload/build.py: a built-in set or a factory; synthetic's teacher seed
    (lambda c: c.data.factory is None, ("data.name", "data.val_fraction")),
    (lambda c: c.data.factory is not None, ("data.factory", "data.params.")),
    (lambda c: c.data.factory is None and c.data.builtin is catalog.TEXT, ("data.path", "data.context")),
    (lambda c: c.data.factory is None and c.data.builtin is not None and c.data.builtin.generated, ("data.seed",)),
    # trainers/data/sampler.py: the DataLoader runs for map-style data only (factories, text)
    (lambda c: not c.data.in_memory, ("data.loader.",)),
    (lambda c: c.data.loader.workers > 0, ("data.loader.prefetch",)),
    # trainers/workload/models.py, trainers/workload/build.py: the built-in models' knobs
    (lambda c: c.model.factory is None, ("model.name",)),
    (lambda c: c.model.factory is not None, ("model.factory",)),
    (lambda c: c.model.factory is not None or c.model.language_model, ("model.params.",)),
    (lambda c: c.model.factory is None and not c.model.language_model, ("model.norm",)),
    (lambda c: c.scaling.use_gpu, ("model.sync_bn",)),
    # trainers/policies/batching.py noise_probe_runs: the gradient-noise estimator runs for these only
    (
        lambda c: noise_probe_runs(
            c.batch.policy, c.schedule.scaling_rule, c.scaling.policy == "goodput", RULES[c.combine.method].uses_ddp
        ),
        ("batch.ema",),
    ),
    (lambda c: c.batch.policy == "schedule", ("batch.schedule",)),
    (lambda c: c.batch.policy == "ramp", ("batch.ramp_to", "batch.ramp_epochs")),
    # orchestrator/run/phases.py: the resize mode matters when the group can resize
    (lambda c: c.scaling.max_workers > c.scaling.min_workers, ("scaling.resize_mode",)),
    # orchestrator/config/code.py: shipping packages matters only with a factory
    (lambda c: c.data.factory is not None or c.model.factory is not None or bool(c.model.loss), ("code.auto",)),
)


def rules() -> list[Rule]:
    """preflight.IGNORED_UNLESS's rules, then :data:`EXTRA_RULES`."""

    return [(n.holds, (n.field,)) for n in IGNORED_UNLESS] + list(EXTRA_RULES)


def _holds(applies: Callable[[RootConfig], bool], cfg: RootConfig) -> bool:
    try:
        return bool(applies(cfg))
    except (AttributeError, TypeError):  # a rule about a built-in model, on a factory's (model.name None)
        return False


def _unread(cfg: RootConfig) -> tuple[set[str], tuple[str, ...]]:
    """The fields of every rule that does not hold for ``cfg``: the exact names, and the prefixes
    (ending in "." or "_") whose every field it covers."""
    fields = {f for applies, rule_fields in rules() if not _holds(applies, cfg) for f in rule_fields}
    prefixes = tuple(sorted(f for f in fields if f.endswith((".", "_"))))
    return fields.difference(prefixes), prefixes


@dataclass(frozen=True)
class ConfigRecord:
    """What a run's MLflow record takes from its config, read once (:meth:`from_config`).

    ``uri``: the tracking URI as given (credentials included: the record redacts what it shows);
    ``public``: the resolved config with credentials redacted (``config.yaml``, beside the model and
    the checkpoints); ``params``: the public config flattened (``section.key``), without the fields this
    run never reads (:func:`rules`) and without unset or empty values;
    ``datasets``: its training and validation inputs (orchestrator/record/datasets.py)."""

    uri: str
    experiment: str
    run_name: str | None
    outage_timeout_s: float
    register_model: str | None
    register_pick: str
    public: dict[str, Any]
    params: dict[str, Any]
    datasets: list[DatasetInput]

    @classmethod
    def from_config(cls, cfg: RootConfig) -> ConfigRecord:
        tracking, (unread, prefixes) = cfg.tracking, _unread(cfg)
        public = public_config(cfg)
        flat = flatten(public)
        return cls(
            uri=tracking.resolved_uri(),
            experiment=tracking.experiment,
            public=public,
            params={
                key: value
                for key, value in flat.items()
                if value not in (None, [], {}) and key not in unread and not key.startswith(prefixes)
            },
            datasets=describe_data(cfg.data),
            run_name=tracking.run_name,
            outage_timeout_s=tracking.outage_timeout_s,
            register_model=tracking.register_model,
            register_pick=tracking.register_pick,
        )


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``d``'s leaves under dotted keys (``{"a": {"b": 1}}`` -> ``{"a.b": 1}``): MLflow's params."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def public_config(cfg: RootConfig) -> dict[str, Any]:
    """The resolved config as plain data with credentials in ``tracking.uri`` replaced by ``***``:
    what is printed, logged to MLflow and written beside the checkpoints."""

    d = cfg.model_dump(mode="json")
    if d.get("tracking", {}).get("uri"):
        d["tracking"]["uri"] = redact_uri(d["tracking"]["uri"])
    return d
