"""``python -m orchestrator``: train a config on Ray, tracked in MLflow.

Exit status: 0 done, 1 training failed, 2 bad input (nothing was started), 130 stopped by Ctrl-C or
SIGTERM (the run ended KILLED; ``resume`` continues it).
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
import threading
import time

from orchestrator import tokens
from orchestrator.config import command
from orchestrator.config.code import runtime_env
from orchestrator.config.flags import OneLineParser, number, set_without_equals
from orchestrator.config.prepare import prepare
from orchestrator.config.schema import DEFAULT_TRACKING_URI, ConfigError
from orchestrator.config.uris import redact_text, redact_uri
from orchestrator.interrupts import deferred_interrupts, terminate_as_interrupt
from orchestrator.record import ui
from orchestrator.run.outcome import EXIT_INTERRUPTED
from orchestrator.run.ray_env import ensure_ray, quiet_libraries, quiet_ray_env, stop_ray
from trainers.link.messages import process_started
from trainers.link.tags import RUN_KEY as RUN_KEY_TAG
from trainers.loop.storage import join

EXIT_BAD_INPUT = 2  # a run's own exit statuses: orchestrator/run/outcome.py


def _parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="python -m orchestrator", description="Elastic large-batch training on Ray Train, tracked in MLflow."
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    t = sub.add_parser(
        "train",
        help="train a YAML config",
        description="Train a YAML config on a local Ray (or the cluster in $RAY_ADDRESS).",
    )
    t.add_argument("config", help="YAML config file, e.g. configs/quickstart.yaml")
    t.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override one config value (repeatable), e.g. --set batch.size=128",
    )
    t.add_argument(
        "--tracking-uri", help=f"MLflow tracking URI (default: $MLFLOW_TRACKING_URI or {DEFAULT_TRACKING_URI})"
    )
    t.add_argument("--no-progress", action="store_true", help="no progress bar")
    t.add_argument("--verbose", action="store_true", help="show Ray's own logs")
    t.add_argument(
        "--register",
        metavar="NAME",
        help="register the run's model in MLflow's model registry under NAME (a new version each run): the final "
        "one, or with --set tracking.register_pick=best the checkpoint lowest in val/loss",
    )

    t.add_argument(
        "--run-key",
        metavar="KEY",
        help="the run's idempotency key (default: tracking.run_key, else the Ray job's submission id under ray job "
        "submit): a train with the key of an unfinished run resumes that run, of a finished one exits 0",
    )

    r = sub.add_parser(
        "resume",
        help="continue a run whose driver was stopped or killed",
        description="Continue a run from its latest checkpoint, in the same MLflow run.",
    )
    r.add_argument("run", help="the MLflow run id, or the run's checkpoint storage directory")
    r.add_argument("--tracking-uri", help="MLflow tracking URI holding the run (default: the one it was started with)")
    r.add_argument("--no-progress", action="store_true", help="no progress bar")
    r.add_argument("--verbose", action="store_true", help="show Ray's own logs")

    pl = sub.add_parser(
        "plan",
        help="preview lr, mf, batch and workers step by step without training",
        description="Preview the schedule a config implies, without starting anything.",
    )
    pl.add_argument("config", help="YAML config file")
    pl.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    pl.add_argument("--format", choices=["table", "csv"], default="table")
    pl.add_argument(
        "--every",
        type=number(int, ge=0, example="--every 50"),
        default=0,
        metavar="N",
        help="also a row every N steps (default: step 1, epoch ends, batch changes, last step)",
    )
    pl.add_argument("--plot", metavar="FILE.png", help="write a plot of lr and mf (and B, W) against steps")

    u = sub.add_parser(
        "ui",
        help="serve the MLflow UI and print links to the newest runs",
        description="Start the MLflow UI on 127.0.0.1 over the tracking store and print links "
        "that open each run in the model-training view. Stop it with Ctrl-C.",
    )
    u.add_argument(
        "--tracking-uri", help=f"MLflow tracking URI (default: $MLFLOW_TRACKING_URI or {DEFAULT_TRACKING_URI})"
    )
    u.add_argument(
        "--port",
        type=number(int, ge=1, le=65535, example="--port 5000"),
        help="port on 127.0.0.1 (default: 5000 if free, else a free one)",
    )
    u.add_argument("--run", help="link this run id only")
    u.add_argument("--experiment", help="link the newest runs of this experiment (default: all experiments)")
    u.add_argument("--verbose", action="store_true", help="show the MLflow server's own log")
    tokens.add_parser(sub)
    return p


START_PARTS = {
    "launch_s": "command",
    "ray_s": "Ray up",
    "driver_s": "driver",
    "group_s": "Ray Train group",
    "worker_s": "worker start",
    "build_s": "build",
    "step_s": "first step",
}


def start_line(parts: dict[str, float]) -> str:
    """``RunSummary.start`` as one line: each part's name and seconds, in order."""
    return ", ".join(f"{START_PARTS[k]} {v:.1f} s" for k, v in parts.items() if k in START_PARTS)


def _summary(s, cfg) -> str:
    from orchestrator.record.timeline import format_table

    lines = [
        "",
        f"run {s.status.lower()}: {s.steps} steps in {s.wall_s:.1f} s"
        + (f" (first step after {s.first_step_s:.1f} s)" if s.first_step_s is not None else ""),
    ]
    if s.start:
        lines.append("  to the first step: " + start_line(s.start))
    if s.phases:
        lines += ["  " + line for line in format_table(s.phases).splitlines()]
    if s.worker_seconds:  # what every worker group held, from its fit() call to its return
        lines.append(
            f"  cost           {s.worker_seconds:,.0f} worker-seconds"
            + (f", {s.gpu_seconds:,.0f} GPU-seconds" if s.gpu_seconds else "")
        )
    if s.resizes_called_off:
        lines.append(f"  resizes called off: {s.resizes_called_off} (training ended before the new group was ready)")
    if s.error:
        lines.append(f"  error          {s.error}")
    for key in ("train/loss", "val/loss", "val/accuracy"):
        if key in s.final:
            lines.append(f"  {key:<14} {s.final[key]:.4f}")
    if s.model_uri:
        lines.append(f"  model          {s.model_uri}" + (f" (registered {s.registered})" if s.registered else ""))
    lines += [
        f"  MLflow run id  {s.run_id}",
        f"  tracking URI   {redact_uri(s.tracking_uri)}",
        f"  experiment     {cfg.tracking.experiment} (id {s.experiment_id})",
        f"  checkpoints    {join(s.storage_path, s.train_run_name)}",
        ui.open_hint(s.tracking_uri, s.experiment_id, s.run_id),
    ]
    return "\n".join(lines)


def invoked() -> float:
    """When this command was invoked: its process's start (Python's own start and imports count),
    or now where the system does not say."""
    return process_started() or time.time()


def cmd_train(args: argparse.Namespace) -> int:
    """Train a config.  ``ray job submit ... -- python -m orchestrator train CONFIG`` runs this same
    command on the cluster, so a job's config passes the same checks (``orchestrator/config/prepare.py``)."""
    t_invoked = invoked()
    if args.register is not None and not args.register.strip():
        raise ConfigError(
            "--register: empty model name; give the name to register the model under, e.g. --register digits-cnn"
        )
    cfg = prepare(args.config, args.overrides, tracking_uri=args.tracking_uri)  # ConfigError before anything starts
    from orchestrator.run.run_key import decide, find_keyed, run_key

    key = run_key(args.run_key, cfg.tracking.run_key)
    tags = None
    if key is not None:  # a restarted entrypoint (RayJob backoffLimit, a retried ray job submit) goes on with its run
        from mlflow.tracking import MlflowClient

        from orchestrator.config.uris import mlflow_uri

        uri = cfg.tracking.resolved_uri()
        start = decide(find_keyed(MlflowClient(mlflow_uri(uri)), cfg.tracking.experiment, key))
        if start.action == "finished":
            print(f"run {start.run_id} (run key {key}) is FINISHED: nothing to train")
            return 0
        if start.action == "resume":
            print(f"run key {key}: resuming run {start.run_id} from its newest checkpoint", file=sys.stderr)
            return _resume(start.run_id, uri, args, t_invoked, register_model=args.register)
        tags = {RUN_KEY_TAG: key}
    return _train_and_report(
        cfg,
        verbose=args.verbose,
        progress=not args.no_progress,
        t_invoked=t_invoked,
        register_model=args.register,
        tags=tags,
    )


def _train_and_report(cfg, **kwargs) -> int:
    """Run, print the summary; the exit status is the run's end's (orchestrator/run/outcome.py): 0
    FINISHED, 1 FAILED, 130 stopped by Ctrl-C or SIGTERM (``ray job stop``): then the run ended
    KILLED, its message says how to continue it.

    The input is checked by now: Ray starts (or is joined) while a thread loads the driver's modules
    (MLflow, Ray Train) and opens the tracking store; Ray's start is mostly waiting on its processes."""
    verbose = kwargs.get("verbose", False)
    quiet_ray_env(verbose)  # before the thread imports Ray
    launched = time.time()
    loading = threading.Thread(target=_load_driver, args=(cfg.tracking.resolved_uri(),), daemon=True)
    loading.start()
    started = handed = False
    try:
        with terminate_as_interrupt():
            try:
                started = ensure_ray(verbose, runtime_env=runtime_env(cfg))
            finally:  # a stop while Ray starts waits for the imports and the store's schema: a
                with deferred_interrupts():  # daemon thread cut mid-import at exit can abort Python
                    loading.join()
            from orchestrator.run.runner import RunInterrupted, run_training

            handed = True  # the run stops the Ray started here, however it ends
            try:
                summary = run_training(cfg, own_ray=started, t_launched=launched, **kwargs)
            except RunInterrupted as e:
                print(_summary(e.summary, cfg), file=sys.stderr)
                return e.summary.exit_code
    finally:
        if started and not handed:  # Ctrl-C while Ray started
            stop_ray()
    print(_summary(summary, cfg))
    return summary.exit_code


def _load_driver(tracking_uri: str) -> None:
    """Import the driver's modules and open the tracking store (a new SQLite file's migrations)."""
    importlib.import_module("orchestrator.run.runner").open_tracking_store(tracking_uri)


def cmd_plan(args: argparse.Namespace) -> int:
    """Preview a config's schedule.  The config passes the same pipeline as ``train`` (the same
    message for the same mistake) except the environment stage: ``plan`` trains nothing and writes
    no checkpoint or MLflow run, so a checkpoint folder or tracking store that ``train`` could not
    use is no reason to refuse a preview (one may plan on a laptop for a cluster's paths)."""
    cfg = prepare(args.config, args.overrides, environment=False)
    from orchestrator.preview import make_plan, plot, to_csv, to_table

    plan = make_plan(cfg, every=args.every)
    if args.format == "csv":
        sys.stdout.write(to_csv(plan))
        for note in plan.notes:
            print(f"note: {note}", file=sys.stderr)
    else:
        print(to_table(plan))
    if args.plot:
        plot(plan, args.plot)
        print(f"plot written to {args.plot}", file=sys.stderr)
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    return _resume(args.run, args.tracking_uri, args, invoked())


def _resume(ref: str, tracking_uri: str | None, args: argparse.Namespace, t_invoked: float, **kwargs) -> int:
    """Continue the run ``ref`` (an MLflow run id or its folder) with its recorded config: ``resume``,
    and a ``train`` whose run key names an unfinished run."""
    from orchestrator.run.run_info import DriverLock, check_resumable, find_run, run_folder

    run_id, uri, raw = find_run(ref, tracking_uri)
    from orchestrator.api import resume_hint

    hint = resume_hint(run_id, raw)  # functions sent by value from Python: resume there
    if hint:
        raise ConfigError(hint)
    raw.setdefault("tracking", {})["uri"] = uri
    cfg = prepare(raw)  # the recorded config through the same checks as train (code may have moved on)
    name = f"elastic-{run_id}"
    check_resumable(run_id, uri, cfg.checkpoint.storage_path, name)  # never a silent fresh start
    lock = DriverLock(run_folder(cfg.checkpoint.storage_path, name)).acquire(run_id)
    return _train_and_report(
        cfg,
        verbose=args.verbose,
        progress=not args.no_progress,
        t_invoked=t_invoked,
        resume_run_id=run_id,
        driver_lock=lock,
        **kwargs,
    )


def _local_store_path(uri: str) -> str | None:
    """The file or folder a local tracking URI names (None for a server or a database server)."""
    if uri.startswith("sqlite:///"):
        return uri[len("sqlite:///") :]
    if uri.startswith("file://"):
        return uri[len("file://") :]
    return None if "://" in uri else uri


def cmd_ui(args: argparse.Namespace) -> int:
    uri = args.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI
    local = _local_store_path(uri)
    if local is not None and not os.path.exists(local):
        raise ConfigError(
            f"--tracking-uri: {redact_uri(uri)} does not exist yet; train a run first "
            f"({command.cli()} train configs/quickstart.yaml) or pass the store that holds your runs"
        )
    try:
        runs = ui.recent_runs(uri, args.experiment, args.run)
    except Exception as e:  # a bad run id or an unreachable store: one line
        shown = redact_uri(uri)
        what = f"--run: no run {args.run!r} in {shown}" if args.run else f"--tracking-uri: cannot read {shown}"
        raise ConfigError(f"{what} ({type(e).__name__}); check the id and the tracking URI") from None
    if ui.is_server_uri(uri):
        base, proc = ui.ui_base(uri), None  # links without the URI's user and password
    else:
        port = args.port or ui.free_port()
        base = f"http://127.0.0.1:{port}"
        t0 = time.monotonic()
        proc = ui.start_server(uri, port, verbose=args.verbose)
        try:
            ui.wait_until_answering(base + "/health", proc)
        except (RuntimeError, TimeoutError) as e:
            ui.stop_server(proc)
            print(f"error: the MLflow UI did not start on port {port}: {e}", file=sys.stderr)
            return 1
        print(f"MLflow UI at {base}  (answered after {time.monotonic() - t0:.1f} s; Ctrl-C stops it)")
    if not runs:
        print(f"no runs yet in {redact_uri(uri)}")
    for r in runs:
        status = r.info.status.lower()
        url = ui.run_url(base, r.info.experiment_id, r.info.run_id)
        print(f"  {r.info.run_name or r.info.run_id:<28} {status:<9} {url}")
    sys.stdout.flush()
    if proc is None:
        return 0

    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        proc.wait()
    except KeyboardInterrupt:
        pass
    finally:
        ui.stop_server(proc)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        hint = set_without_equals(argv)
        if hint is not None:
            raise hint
        args = _parser().parse_args(argv)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    quiet_libraries(getattr(args, "verbose", False))
    try:
        if args.command == "train":
            return cmd_train(args)
        if args.command == "plan":
            return cmd_plan(args)
        if args.command == "resume":
            return cmd_resume(args)
        if args.command == "ui":
            return cmd_ui(args)
        if args.command == "tokens":
            return tokens.cmd_tokens(args)
    except ConfigError as e:
        print(f"error: {redact_text(str(e))}", file=sys.stderr)  # a message may quote a URI given
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:  # before a run existed (a run's own interruption is reported above)
        print("\ninterrupted before training started: no run was recorded", file=sys.stderr)
        return EXIT_INTERRUPTED
    return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
