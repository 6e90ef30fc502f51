"""``python -m search``: Optuna searches over training configs, trials run on Ray, tracked in MLflow.

    python -m search run SPACE.yaml [--trials N] [--parallel P] [--storage URL] [--study-name NAME]
                                    [--timeout S] [--tracking-uri URI] [--heartbeat S] [--verbose] [--no-progress]
    python -m search show NAME [--storage URL] [--trial N] [--output FILE] [--target V]

Exit status: 0 done, 1 no trial of this invocation completed or was pruned (all failed),
2 bad input (nothing was started), 130 interrupted (Ctrl-C or SIGTERM: running trials FAIL, queued again).
"""

from __future__ import annotations

import argparse
import os
import sys

from orchestrator.config import command
from orchestrator.config.flags import OneLineParser, number
from orchestrator.config.schema import DEFAULT_TRACKING_URI, ConfigError
from orchestrator.config.uris import redact_uri

EXIT_BAD_INPUT = 2


def _parser() -> argparse.ArgumentParser:
    from search.liveness import DEFAULT_HEARTBEAT_S, GRACE_BEATS
    from search.space import DEFAULT_TRIALS
    from search.study_storage import DEFAULT_STORAGE

    p = OneLineParser(
        prog="python -m search",
        description="Optuna search over training configs: trials are orchestrator runs on "
        "Ray, pruned when hopeless, tracked in MLflow.",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    r = sub.add_parser(
        "run",
        help="run (or continue) a study from a search space file",
        description="Run trials of a search space; running again with the same study name and "
        "storage continues the study (adds trials).",
    )
    r.add_argument("space", help="search space YAML, e.g. configs/search_quickstart.yaml")
    r.add_argument(
        "--trials",
        type=number(int, gt=0, example="--trials 20"),
        metavar="N",
        help=f"trials this command evaluates (default {DEFAULT_TRIALS}; with the grid sampler, the grid "
        f"points not yet tried); the same command run again after its driver died evaluates only "
        f"what is left, the dead driver's trials first",
    )
    r.add_argument(
        "--parallel",
        type=number(int, gt=0, example="--parallel 2"),
        default=1,
        metavar="P",
        help="trials at once (default 1; never more than the cluster's resources fit)",
    )
    r.add_argument(
        "--storage",
        default=DEFAULT_STORAGE,
        metavar="URL",
        help=f"Optuna storage: a journal file path (default {DEFAULT_STORAGE}) or an RDB URL "
        f"(sqlite:///optuna.db, postgresql://user:pass@host/db)",
    )
    r.add_argument("--study-name", metavar="NAME", help="study name (default: the space file's name without .yaml)")
    r.add_argument(
        "--timeout",
        type=number(float, gt=0, example="--timeout 3600"),
        metavar="S",
        help="start no new trial after S seconds (running trials finish)",
    )
    r.add_argument(
        "--tracking-uri",
        metavar="URI",
        help=f"MLflow tracking URI (default: the base config's tracking.uri, $MLFLOW_TRACKING_URI or "
        f"{DEFAULT_TRACKING_URI})",
    )
    r.add_argument(
        "--heartbeat",
        type=number(int, gt=0, example=f"--heartbeat {DEFAULT_HEARTBEAT_S}"),
        default=DEFAULT_HEARTBEAT_S,
        metavar="S",
        help=f"the driver beats every S seconds for its trials (default {DEFAULT_HEARTBEAT_S}); a trial "
        f"without a beat for {GRACE_BEATS} x S seconds belongs to a dead driver: the next run of the "
        f"study fails it and queues its config again. Give every driver of a study the same S",
    )
    r.add_argument("--no-progress", action="store_true", help="no progress bar")
    r.add_argument("--verbose", action="store_true", help="show Ray's and Optuna's own logs")

    s = sub.add_parser(
        "show",
        help="print a study's trials and its best config",
        description="Print a study's trials (state, value, params, duration) and the best "
        "trial's config as a ready-to-train YAML.",
    )
    s.add_argument("name", help="study name")
    s.add_argument(
        "--storage",
        default=DEFAULT_STORAGE,
        metavar="URL",
        help=f"Optuna storage holding the study (default {DEFAULT_STORAGE})",
    )
    s.add_argument(
        "--trial",
        type=number(int, ge=0, example="--trial 3"),
        metavar="N",
        help="print trial N's config instead of the best one",
    )
    s.add_argument("--output", metavar="FILE.yaml", help="also write that config to FILE.yaml")
    s.add_argument(
        "--target",
        type=number(float, example="--target 14"),
        metavar="V",
        help="also show each trial's work (base steps of samples or tokens) and seconds to reach V of "
        "the objective, and the trial that reached it soonest",
    )
    s.add_argument(
        "--full",
        action="store_true",
        help="print every config field (default: the base config as written plus the trial's values)",
    )
    return p


# --------------------------------------------------------------------------- run


def cmd_run(args: argparse.Namespace) -> int:
    from search.space import load_space

    name = args.study_name if args.study_name is not None else os.path.splitext(os.path.basename(args.space))[0]
    if not name.strip():
        raise ConfigError("--study-name: empty; give a name")
    from search.study_storage import check_storage

    check_storage(args.storage)  # the right kind of string, before anything starts
    # the space, and its base through the pipeline every entry point uses (orchestrator/config/prepare.py),
    # environment included: SpaceError / ConfigError before anything starts
    space = load_space(args.space, environment=True, tracking_uri=args.tracking_uri)

    from search.driver import SearchOptions, run_search

    opts = SearchOptions(
        trials=args.trials,
        parallel=args.parallel,
        timeout_s=args.timeout,
        study_name=name,
        storage=args.storage,
        tracking_uri=args.tracking_uri,
        verbose=args.verbose,
        progress=not args.no_progress,
        heartbeat_s=args.heartbeat,
    )
    from orchestrator.interrupts import terminate_as_interrupt

    try:
        with terminate_as_interrupt():  # ray job stop: SIGTERM first; stop as Ctrl-C does, cleanly
            summary = run_search(space, opts)
    except KeyboardInterrupt as e:
        print(f"\n{interrupted_line(e)}", file=sys.stderr)
        return 130
    print(_run_summary(summary, args.storage))
    ran = len(summary.records)
    return 0 if ran == 0 or summary.count("FAIL") < ran else 1


def interrupted_line(stop: BaseException) -> str:
    """What a stopped ``search run`` says: the trials it stopped (``SearchInterrupted``), or that it
    stopped before running any; the same command then finishes the request."""
    stopped = getattr(stop, "stopped", None)
    if stopped is None:
        return "interrupted before any trial ran; run the same command again to run its trials"
    if stopped == 0:
        return "interrupted: no trial was running; run the same command again to finish its trials"
    were = "trial was" if stopped == 1 else "trials were"
    return (
        f"interrupted: {stopped} running {were} stopped, recorded FAIL and queued again; run the same "
        "command again to finish them"
    )


def _run_summary(s, storage_arg: str) -> str:
    from orchestrator.record.ui import open_hint
    from search.study_tracking import trial_values

    c, p, f = s.count("COMPLETE"), s.count("PRUNED"), s.count("FAIL")
    lines = [
        "",
        f"study {s.study_name}: {len(s.records)} trials run now ({c} complete, {p} pruned, {f} failed), "
        f"{s.trials_in_study} in the study; {s.total_steps} optimizer steps, {s.wall_s:.0f} s",
    ]
    for t in s.best[:3]:
        vals = ", ".join(f"{m} {v:.4f}" for m, v in zip(s.objectives, t.values))
        lines.append(f"  best           trial {t.number}: {vals}")
        for path, v in trial_values(t).items():
            lines.append(f"                 {path} = {v}")
    if not s.best:
        lines.append("  best           none yet (no complete trial)")
    store = storage_arg if storage_arg else s.storage
    lines += [
        f"  storage        {s.storage}",
        f"  MLflow parent  {s.parent_run_id} (experiment id {s.experiment_id})",
        f"  tracking URI   {redact_uri(s.tracking_uri)}",
        f"show it:         {command.cli('search')} show {s.study_name} --storage {redact_uri(store)}",
        open_hint(s.tracking_uri, s.experiment_id, s.parent_run_id),
    ]
    return "\n".join(lines)


# --------------------------------------------------------------------------- show


def _cell(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def format_table(rows: list[list[str]], header: list[str]) -> str:
    cells = [header] + rows
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    out = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    out.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(out)


def seconds_to_target(uri: str | None, run_id: str | None, metric: str, target: float, direction: str) -> float | None:
    """Seconds from a trial run's start to its first logged ``metric`` that reaches ``target``, read
    from its MLflow run; None when the run or the store cannot be read or it never got there."""
    if not uri or not run_id or "***" in uri:  # a redacted URI cannot be opened again
        return None
    try:
        from mlflow.tracking import MlflowClient

        c = MlflowClient(uri)
        start = c.get_run(run_id).info.start_time
        points = sorted(c.get_metric_history(run_id, metric), key=lambda m: m.step)
    except Exception:  # the figure is optional; the table is shown without it
        return None
    for m in points:
        if (m.value <= target) if direction == "minimize" else (m.value >= target):
            return (m.timestamp - start) / 1000
    return None


def to_target(study, target: float) -> dict[int, tuple[int, float | None]]:
    """Trial number -> (base steps of work, seconds) to reach ``target`` of the first objective, for the
    trials that reached it (``search.view.work_to_target``; seconds from the trial's MLflow run)."""
    from search.view import work_to_target

    metric = (study.user_attrs.get("objectives") or ["value"])[0]
    direction = study.directions[0].name.lower()
    out = {}
    for t in study.get_trials(deepcopy=False):
        work = work_to_target(dict(t.intermediate_values), target, direction)
        if work is not None:
            out[t.number] = (
                work,
                seconds_to_target(
                    study.user_attrs.get("tracking_uri"), t.user_attrs.get("mlflow_run_id"), metric, target, direction
                ),
            )
    return out


def trials_table(study, reached: dict[int, tuple[int, float | None]] | None = None) -> str:
    from search.liveness import RETRY_ATTR
    from search.study_tracking import trial_values

    rows = []
    retried = {
        int(t.user_attrs[RETRY_ATTR]): t.number for t in study.get_trials(deepcopy=False) if RETRY_ATTR in t.user_attrs
    }
    for t in study.get_trials(deepcopy=False):
        values = ", ".join(f"{v:.4f}" for v in t.values) if t.values else "-"
        dur = f"{t.duration.total_seconds():.1f}" if t.duration is not None else "-"
        params = " ".join(f"{k}={_cell(v)}" for k, v in trial_values(t).items())
        note = t.user_attrs.get("error") or (
            f"pruned at step {t.user_attrs['pruned_at_step']}" if "pruned_at_step" in t.user_attrs else ""
        )
        if "duplicate_of" in t.user_attrs:
            note = f"same config as trial {t.user_attrs['duplicate_of']} (not run again)"
        if t.number in retried:
            note = f"its driver died; run again as trial {retried[t.number]}"
        if RETRY_ATTR in t.user_attrs:
            note = f"again: trial {t.user_attrs[RETRY_ATTR]}'s config" + (f"; {note}" if note else "")
        row = [str(t.number), t.state.name, values, dur, _cell(t.user_attrs.get("steps"))]
        if reached is not None:
            work, secs = reached.get(t.number, (None, None))
            row += ["-" if work is None else str(work), "-" if secs is None else f"{secs:.1f}"]
        rows.append(row + [params, (note or "")[:120]])
    extra = ["to_target_work", "to_target_s"] if reached is not None else []
    return format_table(rows, ["#", "state", "value", "duration_s", "steps", *extra, "params", "note"])


def cmd_show(args: argparse.Namespace) -> int:
    import optuna

    from search.study import best_config_yaml, load_existing_study
    from search.study_storage import describe_storage
    from search.study_tracking import best_trials

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = load_existing_study(args.name, args.storage)
    trials = study.get_trials(deepcopy=False)
    counts = {}
    for t in trials:
        counts[t.state.name] = counts.get(t.state.name, 0) + 1
    objectives = study.user_attrs.get("objectives") or ["value"] * len(study.directions)
    goal = ", ".join(f"{m} ({d.name.lower()})" for m, d in zip(objectives, study.directions))
    print(
        f"study {study.study_name} in {describe_storage(args.storage)}: {len(trials)} trials "
        f"({', '.join(f'{n} {k.lower()}' for k, n in sorted(counts.items()))}); objective {goal}"
    )
    if study.user_attrs.get("mlflow_parent_run_id"):
        print(
            f"MLflow parent run {study.user_attrs['mlflow_parent_run_id']} at "
            f"{study.user_attrs.get('tracking_uri', '?')}"
        )
    print()
    reached = to_target(study, args.target) if args.target is not None and len(study.directions) == 1 else None
    print(trials_table(study, reached) if trials else "(no trials yet)")
    print()
    if reached is not None:
        op = "<=" if study.directions[0].name == "MINIMIZE" else ">="
        if reached:
            n, (work, secs) = min(reached.items(), key=lambda kv: (kv[1][0], kv[0]))
            timed = {k: s for k, (_, s) in reached.items() if s is not None}
            fastest = (
                f"; soonest in time: trial {min(timed, key=timed.get)} after {min(timed.values()):.1f} s"
                if timed
                else ""
            )
            print(
                f"to {objectives[0]} {op} {args.target:g}: least work trial {n} ({work} base steps of samples or "
                f"tokens{'' if secs is None else f', {secs:.1f} s'}){fastest}"
            )
        else:
            print(f"to {objectives[0]} {op} {args.target:g}: no trial reached it")
        print()
    if args.trial is not None:
        match = [t for t in trials if t.number == args.trial]
        if not match:
            raise ConfigError(f"--trial: no trial {args.trial} in study {args.name!r} (0..{len(trials) - 1})")
        chosen = match[0]
        print(f"trial {chosen.number} ({chosen.state.name}): its config")
    else:
        best = best_trials(study)
        if not best:
            print("no complete trial yet: no best config")
            return 0
        chosen = best[0]
        if len(best) > 1:
            print(
                f"Pareto front: trials {', '.join(str(t.number) for t in best)}; the config of trial {chosen.number} "
                f"(--trial N for another)"
            )
        else:
            vals = ", ".join(f"{m} {v:.4f}" for m, v in zip(objectives, chosen.values))
            print(f"best trial {chosen.number}: {vals}; its config, ready to train:")
    text = best_config_yaml(study, chosen, full=args.full)
    print(text)
    if args.output:
        with open(args.output, "w") as f:
            f.write(text or "")
        print(f"written to {args.output}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    try:
        args = _parser().parse_args(argv)
        if args.command == "run":
            return cmd_run(args)
        if args.command == "show":
            return cmd_show(args)
    except ConfigError as e:
        from orchestrator.config.uris import redact_text

        print(f"error: {redact_text(str(e))}", file=sys.stderr)  # a message may quote a URI given
        return EXIT_BAD_INPUT
    return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
