"""``python -m orchestrator``: train a config on Ray, tracked in MLflow.

Exit status: 0 done, 1 training failed, 2 bad input (nothing was started).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from orchestrator.config import DEFAULT_TRACKING_URI, ConfigError, load_config

EXIT_BAD_INPUT = 2


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m orchestrator",
                                description="Elastic large-batch training on Ray Train, tracked in MLflow.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    t = sub.add_parser("train", help="train a YAML config",
                       description="Train a YAML config on a local Ray (or the cluster in $RAY_ADDRESS).")
    t.add_argument("config", help="YAML config file, e.g. configs/quickstart.yaml")
    t.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override one config value (repeatable), e.g. --set batch.size=128")
    t.add_argument("--tracking-uri", help=f"MLflow tracking URI (default: $MLFLOW_TRACKING_URI or "
                                          f"{DEFAULT_TRACKING_URI})")
    t.add_argument("--no-progress", action="store_true", help="no progress bar")
    t.add_argument("--verbose", action="store_true", help="show Ray's own logs")

    r = sub.add_parser("resume", help="continue a run whose driver was stopped or killed",
                       description="Continue a run from its latest checkpoint, in the same MLflow run.")
    r.add_argument("run", help="the MLflow run id, or the run's checkpoint storage directory")
    r.add_argument("--tracking-uri", help="MLflow tracking URI holding the run (default: the one it was started with)")
    r.add_argument("--no-progress", action="store_true", help="no progress bar")
    r.add_argument("--verbose", action="store_true", help="show Ray's own logs")

    pl = sub.add_parser("plan", help="preview lr, mf, batch and workers step by step without training",
                        description="Preview the schedule a config implies, without starting anything.")
    pl.add_argument("config", help="YAML config file")
    pl.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    pl.add_argument("--format", choices=["table", "csv"], default="table")
    pl.add_argument("--every", type=int, default=0, metavar="N",
                    help="also a row every N steps (default: step 1, epoch ends, batch changes, last step)")
    pl.add_argument("--plot", metavar="FILE.png", help="write a plot of lr and mf (and B, W) against steps")
    return p


def _summary(s, cfg) -> str:
    lines = [
        "",
        f"run {s.status.lower()}: {s.steps} steps in {s.wall_s:.1f} s",
    ]
    for key in ("train/loss", "val/loss", "val/accuracy"):
        if key in s.final:
            lines.append(f"  {key:<14} {s.final[key]:.4f}")
    lines += [
        f"  MLflow run id  {s.run_id}",
        f"  tracking URI   {s.tracking_uri}",
        f"  experiment     {cfg.tracking.experiment} (id {s.experiment_id})",
        f"  checkpoints    {os.path.join(s.storage_path, s.train_run_name)}",
        f"open the UI:     mlflow ui --backend-store-uri {s.tracking_uri}   (then http://127.0.0.1:5000)"
        if s.tracking_uri.startswith(("sqlite:", "file:", "/")) or "://" not in s.tracking_uri
        else f"open the UI:     {s.tracking_uri}",
    ]
    return "\n".join(lines)


def cmd_train(args: argparse.Namespace) -> int:
    t_invoked = time.time()
    overrides = list(args.overrides)
    if args.tracking_uri:
        overrides.append(f"tracking.uri={args.tracking_uri}")
    cfg = load_config(args.config, overrides)  # raises ConfigError before anything starts

    from orchestrator.runner import run_training

    summary = run_training(cfg, verbose=args.verbose, progress=not args.no_progress, t_invoked=t_invoked)
    print(_summary(summary, cfg))
    return 0 if summary.status == "FINISHED" else 1


def cmd_plan(args: argparse.Namespace) -> int:
    if args.every < 0:
        raise ConfigError(f"--every: must be >= 0 (got {args.every})")
    cfg = load_config(args.config, args.overrides)
    from orchestrator.plan import make_plan, plot, to_csv, to_table

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
    t_invoked = time.time()
    from orchestrator.config import validate
    from orchestrator.runner import find_run, run_training

    run_id, uri, raw = find_run(args.run, args.tracking_uri)
    raw.setdefault("tracking", {})["uri"] = uri
    cfg = validate(raw)
    summary = run_training(cfg, verbose=args.verbose, progress=not args.no_progress, t_invoked=t_invoked,
                           resume_run_id=run_id)
    print(_summary(summary, cfg))
    return 0 if summary.status == "FINISHED" else 1


def _quiet(verbose: bool) -> None:
    """Library chatter (MLflow's database setup, Ray's INFO lines) only with --verbose."""
    if not verbose:
        import logging

        for name in ("mlflow", "alembic", "ray"):
            logging.getLogger(name).setLevel(logging.WARNING)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    _quiet(getattr(args, "verbose", False))
    try:
        if args.command == "train":
            return cmd_train(args)
        if args.command == "plan":
            return cmd_plan(args)
        if args.command == "resume":
            return cmd_resume(args)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
