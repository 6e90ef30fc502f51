"""MLflow for a study: one parent run per study, one child run per trial under it.

The parent holds the study's name, storage, sampler, pruner and objective (params on creation,
tags always), the space file as an artifact, and at the end of each invocation the best value and
params, trial counts, the best config as YAML and Optuna's plots (PNG, and interactive HTML when
plotly is installed).  As each trial ends (``trial_done``) it gets the objective history as
metrics at step = trial number, the best trial as a link to its run (tags and the run's
description), and the table of every trial (``trials.csv``, ``trials.json``): ``search.view``
computes them.  Continuing a study (``run`` again
with the same name and storage) reopens the same parent: its id is kept in the study's user
attributes, with a tag search (``search.study_name``, ``search.storage``) as a fallback.

Child runs are created by ``run_training`` inside the trial actor (``RunTracker(parent_run_id=...)``
sets ``mlflow.parentRunId``); this module adds each one's final state, and creates the child run
itself for a trial that failed before training started (an invalid sampled config).
"""

from __future__ import annotations

import html
import json
import math
import os
import tempfile
import time
import warnings
from typing import Any

import matplotlib
import matplotlib.pyplot as plt
import mlflow
import optuna
import optuna.visualization as ov
from mlflow.entities import Metric, Param, RunTag
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from optuna.visualization import matplotlib as ovm

from orchestrator.config.uris import mlflow_uri
from orchestrator.interrupts import deferring
from orchestrator.record.ui import experiment_id
from search.space import SearchSpace
from search.view import (
    best_key,
    best_note,
    best_points,
    objective_key,
    objective_points,
    settled_upto,
    table_csv,
    table_json,
    trials_table,
)
from trainers.errors import one_line
from trainers.link import tags as T

STATE_TAG = "search.state"
RUN_STATUS = {"COMPLETE": "FINISHED", "PRUNED": "KILLED", "FAIL": "FAILED"}
PARENT_RUN_ATTR = "mlflow_parent_run_id"
LOGGED_ARTIFACTS_TAG = "mlflow.loggedArtifacts"  # where MlflowClient.log_table lists its tables
INTERACTIVE_PLOTS = "interactive.html"
NOTE_MAX = 7500  # MLflow keeps tag values up to 8000 characters


def _client(uri: str) -> Any:

    uri = mlflow_uri(uri)  # what MLflow sees: never a password (it prints and quotes its URI)
    mlflow.set_tracking_uri(uri)
    return deferring(MlflowClient(uri))  # a stop (Ctrl-C, SIGTERM) never lands inside a store's transaction


def _fmt(v: Any) -> str:
    return json.dumps(v) if isinstance(v, (list, dict)) else str(v)


class StudyTracker:
    """The parent run of a study and the final touches on its children."""

    def __init__(
        self,
        uri: str,
        experiment: str,
        study_name: str,
        storage: str,
        space: SearchSpace,
        existing_run_id: str | None = None,
    ):
        self.uri, self.study_name, self.storage, self.space = uri, study_name, storage, space
        self.client = _client(uri)
        # artifacts beside the store; MLflow's UI opens it in the model-training view
        self.experiment_id = experiment_id(self.client, uri, experiment)
        self.run_id = self._find(existing_run_id)
        self.resumed = self.run_id is not None
        if self.run_id is None:
            run = self.client.create_run(self.experiment_id, run_name=study_name, tags=self._tags())
            self.run_id = run.info.run_id
            self._log_params()
        else:
            self.client.update_run(self.run_id, status="RUNNING")
            for k, v in self._tags().items():
                self.client.set_tag(self.run_id, k, v)
        self.client.log_text(self.run_id, space.text, "space.yaml")
        self.client.log_text(self.run_id, json.dumps(space.summary(), indent=1, default=str), "space_resolved.json")
        self._load_view_state()

    def _tags(self) -> dict[str, str]:
        s = self.space
        return {
            "search.role": "study",
            "search.study_name": self.study_name,
            "search.storage": self.storage,
            "search.sampler": s.sampler.describe(),
            "search.pruner": s.pruner.describe(),
            "search.objective": ", ".join(f"{o.metric} ({o.direction})" for o in s.objectives),
            "search.space_file": s.source,
        }

    def _log_params(self) -> None:
        s = self.space
        params = {
            "study_name": self.study_name,
            "storage": self.storage,
            "sampler": s.sampler.describe(),
            "pruner": s.pruner.describe(),
            "objective": ", ".join(f"{o.metric} ({o.direction})" for o in s.objectives),
        }
        for p in s.params:
            params[f"space.{p.path}"] = p.describe()[:6000]

        items = [Param(k, str(v)[:6000]) for k, v in params.items()]
        for i in range(0, len(items), 90):
            self.client.log_batch(self.run_id, params=items[i : i + 90])

    def _find(self, existing: str | None) -> str | None:

        if existing:
            try:
                run = self.client.get_run(existing)
                if run.info.experiment_id == self.experiment_id and run.info.lifecycle_stage == "active":
                    return existing
            except MlflowException:
                pass
        name = self.study_name.replace("'", "\\'")
        storage = self.storage.replace("'", "\\'")
        runs = self.client.search_runs(
            [self.experiment_id],
            filter_string=(
                f"tags.`search.role` = 'study' and tags.`search.study_name` = '{name}' "
                f"and tags.`search.study_storage` = '{storage}'"
            ),
            max_results=1,
            order_by=["attributes.start_time DESC"],
        )
        return runs[0].info.run_id if runs else None

    # -- what the parent shows of the trials (search.view) -------------------------------

    def _load_view_state(self) -> None:
        """What the parent already holds (a continued study's parent): the trial numbers whose
        objective is logged, the last step of the best-so-far series, the ``best.*`` tags."""
        metrics = [o.metric for o in self.space.objectives]
        self._logged: set[int] = set()
        self._best_upto = -1
        self._best_tags: set[str] = set()
        self._note: str | None = None
        self._table_tagged = False
        if not self.resumed:
            return
        self._logged = {m.step for m in self.client.get_metric_history(self.run_id, objective_key(metrics[0]))}
        if not self.space.multi_objective:
            steps = [m.step for m in self.client.get_metric_history(self.run_id, best_key(metrics[0]))]
            self._best_upto = max(steps, default=-1)
        tags = self.client.get_run(self.run_id).data.tags
        self._best_tags = {k for k in tags if k.startswith("best.")}
        self._note = tags.get(T.NOTE)
        self._table_tagged = "trials.json" in tags.get(LOGGED_ARTIFACTS_TAG, "")

    def trial_done(self, study: Any) -> str | None:
        """Called by the driver each time it records a trial: bring the parent's history, best trial
        and table up to date (``sync``).  MLflow trouble is returned as a warning line, not raised."""
        try:
            self.sync(study)
        except Exception as e:  # MLflow trouble must not stop the study
            return f"warning: cannot update the MLflow parent run ({one_line(e, 300)})"
        return None

    def sync(self, study: Any, final: bool = False) -> None:
        """Log what is new since the last call: ``trials/<metric>`` for each newly COMPLETE trial,
        ``trials/best_<metric>`` for the steps every earlier trial has settled (``final``: up to the last
        trial, whatever state the others are left in), the best trial's tags and link, the table."""

        trials = study.get_trials(deepcopy=False)
        metrics = [o.metric for o in self.space.objectives]
        points = objective_points(trials, metrics, self._logged)
        upto = self._best_upto
        if not self.space.multi_objective and trials:
            upto = max(t.number for t in trials) if final else settled_upto(trials)
            points += best_points(trials, metrics[0], self.space.directions[0], self._best_upto, upto)
        items = [Metric(p.key, p.value, p.timestamp_ms, p.step) for p in points]
        for i in range(0, len(items), 900):
            self.client.log_batch(self.run_id, metrics=items[i : i + 900])
        self._logged |= {p.step for p in points if p.key == objective_key(metrics[0])}
        self._best_upto = max(self._best_upto, upto)
        self._show_best(study, trials, metrics)
        self._log_table(trials, metrics)

    def _show_best(self, study: Any, trials: list[Any], metrics: list[str]) -> None:
        """The best trial (or Pareto front) as tags ``search.best_trial(s)``, ``search.best_run_id(s)``
        and ``best.<path>``, and as links in the run's description."""
        best = best_trials(study)
        tags: dict[str, str] = {}
        if best and not self.space.multi_objective:
            t = best[0]
            tags = {"search.best_trial": str(t.number)}
            if t.user_attrs.get("mlflow_run_id"):
                tags["search.best_run_id"] = str(t.user_attrs["mlflow_run_id"])
            tags |= {f"best.{path}": _fmt(v)[:5000] for path, v in trial_values(t).items()}
        elif best:
            tags = {
                "search.best_trials": ", ".join(str(t.number) for t in best),
                "search.best_run_ids": ", ".join(str(t.user_attrs.get("mlflow_run_id", "")) for t in best),
            }
        for k in self._best_tags - set(tags):  # a param the new best does not have (a `when` condition)
            self.client.delete_tag(self.run_id, k)
        self._best_tags = {k for k in tags if k.startswith("best.")}
        counts: dict[str, int] = {}
        for t in trials:
            counts[t.state.name] = counts.get(t.state.name, 0) + 1
        note = best_note(self.study_name, self.experiment_id, metrics, self.space.directions, best, counts)
        note = note if len(note) <= NOTE_MAX else note[: NOTE_MAX - 40] + "\n\n(cut: see trials.csv)"
        if note != self._note:
            tags[T.NOTE] = note
            self._note = note

        if tags:
            self.client.log_batch(self.run_id, tags=[RunTag(k, v) for k, v in tags.items()])

    def _log_table(self, trials: list[Any], metrics: list[str]) -> None:
        """Every trial's number, state, objective, params and run id as ``trials.csv`` (MLflow's
        artifact view shows it as a table) and ``trials.json`` (``MlflowClient.load_table`` reads it)."""
        columns, rows = trials_table(trials, metrics)
        self.client.log_text(self.run_id, table_csv(columns, rows), "trials.csv")
        self.client.log_text(self.run_id, table_json(columns, rows), "trials.json")
        if not self._table_tagged:
            tags = self.client.get_run(self.run_id).data.tags
            listed = json.loads(tags.get(LOGGED_ARTIFACTS_TAG, "[]"))
            entry = {"path": "trials.json", "type": "table"}
            if entry not in listed:
                self.client.set_tag(self.run_id, LOGGED_ARTIFACTS_TAG, json.dumps([*listed, entry]))
            self._table_tagged = True

    # -- children -------------------------------------------------------------------------

    def child_tags(self, number: int, values: dict[str, Any]) -> dict[str, str]:
        """Tags a trial's run starts with (the sampled params as ``search.param.<path>``)."""
        tags = {
            "search.study_name": self.study_name,
            "search.trial": str(number),
            "search.role": "trial",
            "search.params": json.dumps(values, sort_keys=True, default=str)[:5000],
        }
        for path, v in values.items():
            tags[f"search.param.{path}"] = _fmt(v)[:5000]
        return tags

    def failed_child(self, number: int, values: dict[str, Any], error: str, run_name: str) -> str:
        """A child run for a trial that never trained (its config was invalid): params, FAIL, the error."""

        tags = {**self.child_tags(number, values), "mlflow.parentRunId": self.run_id}
        run = self.client.create_run(self.experiment_id, run_name=run_name, tags=tags)
        items = [Param(k, _fmt(v)[:6000]) for k, v in values.items()]
        if items:
            self.client.log_batch(run.info.run_id, params=items)
        self.finish_child(run.info.run_id, "FAIL", None, error)
        return run.info.run_id

    def duplicate_child(self, number: int, values: dict[str, Any], of: Any, metrics: list[str], run_name: str) -> str:
        """A child run for a trial that drew a config already run: tags, params and the reused value."""

        tags = {
            **self.child_tags(number, values),
            "mlflow.parentRunId": self.run_id,
            "search.duplicate_of": str(of.number),
        }
        run = self.client.create_run(self.experiment_id, run_name=run_name, tags=tags)
        items = [Param(k, _fmt(v)[:6000]) for k, v in values.items()]
        now = int(time.time() * 1000)
        ms = [Metric(m, float(v), now, 0) for m, v in zip(metrics, of.values)]
        self.client.log_batch(run.info.run_id, params=items, metrics=ms)
        self.finish_child(run.info.run_id, "COMPLETE", list(of.values), None)
        return run.info.run_id

    def finish_child(
        self,
        run_id: str,
        state: str,
        value: list[float] | None,
        error: str | None,
        detail: str | None = None,
        pruned_at: int | None = None,
    ) -> None:
        """The trial's final state as tag ``search.state`` and run status (PRUNED runs end KILLED);
        a PRUNED trial's ``search.value`` is the value it was judged at, at step ``search.pruned_at_step``."""
        self.client.set_tag(run_id, STATE_TAG, state)
        if value is not None:
            self.client.set_tag(run_id, "search.value", ", ".join(f"{v:.6g}" for v in value))
        if pruned_at is not None:
            self.client.set_tag(run_id, "search.pruned_at_step", str(pruned_at))
        if error:
            self.client.set_tag(run_id, "search.error", error[:5000])
        if detail:
            self.client.log_text(run_id, detail, "error.txt")
        self.client.set_terminated(run_id, status=RUN_STATUS[state])

    # -- the end of an invocation ----------------------------------------------------------

    def finish(self, study: Any, status: str, wall_s: float, best_yaml: str | None) -> None:
        """The history, best trial and table brought up to date (``sync(final=True)``); best value,
        the study's trial counts and optimizer steps (all invocations, logged at step = trials in
        the study), this invocation's wall time, plots; then end the parent run."""

        try:
            self.sync(study, final=True)
        except Exception as e:  # the figures and the run's end matter more
            self.client.set_tag(self.run_id, "search.view_error", one_line(e, 5000))
        trials = study.get_trials(deepcopy=False)
        n = len(trials)
        now = int(time.time() * 1000)
        counts = {s: sum(t.state.name == s for t in trials) for s in ("COMPLETE", "PRUNED", "FAIL")}
        total_steps = sum(int(t.user_attrs.get("steps", 0)) for t in trials)
        metrics = [Metric(f"trials/{k.lower()}", float(v), now, n) for k, v in counts.items()]
        metrics += [
            Metric("trials/total", float(n), now, n),
            Metric("search/total_steps", float(total_steps), now, n),
            Metric("search/wall_s", float(wall_s), now, n),
        ]
        best = best_trials(study)
        if best:
            if not self.space.multi_objective:
                metrics.append(Metric("best/value", float(best[0].value), now, n))
            self.client.log_text(
                self.run_id,
                json.dumps(
                    [
                        {
                            "number": t.number,
                            "values": t.values,
                            "params": trial_values(t),
                            "run_id": t.user_attrs.get("mlflow_run_id"),
                        }
                        for t in best
                    ],
                    indent=1,
                    default=str,
                ),
                "best_trials.json",
            )
        if best_yaml:
            self.client.log_text(self.run_id, best_yaml, "best_config.yaml")
        self.client.log_batch(self.run_id, metrics=metrics)
        skipped = self.log_plots(study)
        if skipped:
            self.client.set_tag(self.run_id, "search.plots_skipped", "; ".join(skipped)[:5000])
        self.client.set_terminated(self.run_id, status=status)

    def _plots(self, study: Any, module: Any) -> list[tuple[str, Any]]:
        """Optuna's plots for this study from ``module`` (``optuna.visualization`` or its
        ``matplotlib`` twin: same functions, same arguments), as ``(name, make)``."""
        multi = self.space.multi_objective
        first = self.space.objectives[0].metric
        target = (lambda t: t.values[0]) if multi else None
        kw = {"target": target, "target_name": first} if multi else {"target_name": first}
        plots: list[tuple[str, Any]] = [
            ("optimization_history", lambda: module.plot_optimization_history(study, **kw)),
            ("param_importances", lambda: module.plot_param_importances(study, **kw)),
            ("parallel_coordinate", lambda: module.plot_parallel_coordinate(study, **kw)),
            ("timeline", lambda: module.plot_timeline(study)),
        ]
        if not multi:
            plots.append(("intermediate_values", lambda: module.plot_intermediate_values(study)))
        else:
            names = [o.metric for o in self.space.objectives]
            plots.append(("pareto_front", lambda: module.plot_pareto_front(study, target_names=names)))
        return plots

    @staticmethod
    def _too_few(name: str, study: Any) -> bool:
        """Plots Optuna cannot draw yet: importances need 2 COMPLETE trials, history and parallel coordinates 1."""

        need = {"param_importances": 2, "parallel_coordinate": 1, "optimization_history": 1}.get(name, 0)
        complete = sum(t.state == optuna.trial.TrialState.COMPLETE for t in study.get_trials(deepcopy=False))
        return complete < need

    def log_plots(self, study: Any) -> list[str]:
        """Optuna's plots as PNG artifacts under ``plots/``, and the same plots interactive in one
        ``plots/interactive.html`` (``log_html_plots``); returns why any were skipped."""

        matplotlib.use("Agg")

        skipped = []
        with tempfile.TemporaryDirectory() as d, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for name, make in self._plots(study, ovm):
                if self._too_few(name, study):
                    skipped.append(f"{name}: needs more complete trials")
                    continue
                try:
                    ax = make()
                    fig = (ax.flat[0] if hasattr(ax, "flat") else ax).figure
                    fig.set_size_inches(max(fig.get_size_inches()[0], 8), max(fig.get_size_inches()[1], 5))
                    fig.tight_layout()
                    path = os.path.join(d, f"{name}.png")
                    fig.savefig(path, dpi=100)
                    self.client.log_artifact(self.run_id, path, "plots")
                except Exception as e:  # a plot Optuna cannot draw for this study (e.g. no varying param)
                    skipped.append(f"{name}: {one_line(e, None)}")
                finally:
                    plt.close("all")
        return skipped + self.log_html_plots(study)

    def log_html_plots(self, study: Any) -> list[str]:
        """Optuna's plotly plots in one self-contained page ``plots/interactive.html`` (plotly.js
        embedded once, so it opens offline and in MLflow's artifact view); returns why any were
        skipped.  Without plotly (not a dependency) nothing is written and the reason is returned."""

        if not ov.is_available():
            return [f"{INTERACTIVE_PLOTS}: plotly is not installed; pip install plotly to get the interactive plots"]
        parts: list[str] = []
        skipped = []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for name, make in self._plots(study, ov):
                if self._too_few(name, study):
                    continue  # reported once, with the PNGs
                try:
                    div = make().to_html(full_html=False, include_plotlyjs=not parts)
                    parts.append(f"<h2>{html.escape(name.replace('_', ' '))}</h2>\n{div}")
                except Exception as e:
                    skipped.append(f"{name} (html): {one_line(e, None)}")
        if parts:
            title = html.escape(f"study {self.study_name}: Optuna plots")
            page = (
                f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>{title}</title></head>\n'
                f'<body style="font-family: sans-serif">\n<h1>{title}</h1>\n' + "\n".join(parts) + "\n</body></html>\n"
            )
            self.client.log_text(self.run_id, page, f"plots/{INTERACTIVE_PLOTS}")
        return skipped


def close_lost_child(
    uri: str, parent_run_id: str | None, study_name: str, number: int, run_id: str | None, error: str
) -> str | None:
    """Close the MLflow child run of a trial whose driver died: tag ``search.state`` FAIL, the error,
    status KILLED (only a run still RUNNING is touched).  The run is ``run_id`` or, when the driver
    died before it learnt the id, the child of ``parent_run_id`` tagged with the trial's number.
    Returns the run's id (``None`` if there is none)."""
    if not run_id and not parent_run_id:
        return None
    client = _client(uri)
    run = None
    if run_id:
        try:
            run = client.get_run(run_id)
        except Exception:
            run = None
    if run is None and parent_run_id:
        try:
            parent = client.get_run(parent_run_id)
        except Exception:
            return None
        name = study_name.replace("'", "\\'")
        found = client.search_runs(
            [parent.info.experiment_id],
            filter_string=(
                f"tags.`mlflow.parentRunId` = '{parent_run_id}' and tags.`search.trial` = '{number}' "
                f"and tags.`search.study_name` = '{name}'"
            ),
            max_results=1,
        )
        run = found[0] if found else None
    if run is None:
        return None
    if run.info.status == "RUNNING":
        client.set_tag(run.info.run_id, STATE_TAG, "FAIL")
        client.set_tag(run.info.run_id, "search.error", error[:5000])
        client.set_terminated(run.info.run_id, status="KILLED")
    return run.info.run_id


def trial_values(trial: Any) -> dict[str, Any]:
    """The config values a trial used (decoded), from its user attributes or its Optuna params."""
    return dict(trial.user_attrs.get("config_values") or trial.params)


def best_trials(study: Any) -> list[Any]:
    """The best trial (single objective) or the Pareto front (several); empty if none completed."""

    if not any(t.state == optuna.trial.TrialState.COMPLETE for t in study.get_trials(deepcopy=False)):
        return []
    if len(study.directions) > 1:
        return list(study.best_trials)
    try:
        t = study.best_trial
    except ValueError:
        return []
    return [t] if t.value is not None and not math.isnan(t.value) else []
