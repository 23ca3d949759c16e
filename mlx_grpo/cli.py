"""The `mlx-grpo` command: one sub-command per entry point, each a thin layer over a
library function. `mlx-grpo --config FILE` is short for `mlx-grpo train --config FILE`."""

import argparse
import shlex
import sys

COMMANDS = {}


def command(name, help):
    def register(fn):
        COMMANDS[name] = (fn, help)
        return fn

    return register


@command("train", "train a model with GRPO (the default command)")
def _train(sub):
    sub.add_argument("--config", required=True, help="TOML profile, e.g. configs/smoke_test.toml")
    sub.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="override a config key with a TOML value, e.g. --set training.max_steps=20 (repeatable)",
    )
    start = sub.add_mutually_exclusive_group()
    start.add_argument("--resume", action="store_true",
                       help="continue from the newest checkpoint in output_dir (as checkpoint.resume = true)")
    start.add_argument("--overwrite", action="store_true", help="replace a run already in output_dir")
    sub.add_argument("--force", action="store_true",
                     help="resume even though the config differs from the run's")

    def run(args):
        from mlx_grpo.config import load_config
        from mlx_grpo.stopping import RunStopped
        from mlx_grpo.train import train

        cfg = load_config(args.config, args.overrides)
        cfg.checkpoint.resume = cfg.checkpoint.resume or args.resume
        try:
            train(cfg, config_path=args.config, overwrite=args.overwrite, force=args.force)
        except RunStopped as e:
            again = " ".join(["mlx-grpo train --config", shlex.quote(args.config),
                              *(f"--set {shlex.quote(o)}" for o in args.overrides), "--resume"])
            print(f"mlx-grpo: {e}\nmlx-grpo: resume with: {again}", file=sys.stderr)
            return e.exit_code
        return 0

    return run


@command("report", "plot runs' metrics (overlaid) into a PNG, or an HTML page with sample completions")
def _report(sub):
    sub.add_argument("runs", nargs="+", metavar="RUN_DIR", help="a run's output_dir (several are overlaid)")
    sub.add_argument("--out", metavar="FILE", help="FILE.png or FILE.html (default: report.html in the run folder)")

    def run(args):
        from mlx_grpo.report import write_report

        print(f"mlx-grpo report: wrote {write_report(args.runs, args.out)}")

    return run


@command("sweep", "short runs varying config values (an ablation, or --grid), then a table and a report")
def _sweep(sub):
    sub.add_argument("--config", required=True, help="TOML profile the runs start from")
    sub.add_argument("--vary", action="append", default=[], required=True, metavar="KEY=V1,V2,...",
                     help="values to try for one key, e.g. --vary grpo.beta=0,0.04,0.1 (repeatable)")
    sub.add_argument("--steps", type=int, help="training.max_steps of every run")
    sub.add_argument("--grid", action="store_true", help="every combination of the --vary values, "
                     "instead of one key at a time")
    sub.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                     help="override a config key in every run (repeatable)")
    sub.add_argument("--overwrite", action="store_true", help="replace runs of an earlier sweep")

    def run(args):
        from mlx_grpo.report import ReportError, write_report
        from mlx_grpo.sweep import results_table, run_sweep

        results = run_sweep(args.config, args.vary, steps=args.steps, grid=args.grid, overrides=args.overrides,
                            overwrite=args.overwrite)
        print(results_table(results))
        try:
            print(f"mlx-grpo sweep: wrote {write_report([r['dir'] for r in results])}")
        except ReportError as e:  # the runs are done and tabulated; only the picture is missing
            print(f"mlx-grpo sweep: no report: {e}", file=sys.stderr)

    return run


def build_parser():
    parser = argparse.ArgumentParser(
        prog="mlx-grpo",
        description="GRPO fine-tuning of language models with MLX. "
        "`mlx-grpo --config FILE` is the same as `mlx-grpo train --config FILE`.",
    )
    subs = parser.add_subparsers(dest="command", metavar="COMMAND")
    runners = {}
    for name, (fn, help) in COMMANDS.items():
        runners[name] = fn(subs.add_parser(name, help=help, description=help))
    return parser, runners


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] not in COMMANDS and argv[0] not in ("-h", "--help"):
        argv.insert(0, "train")
    parser, runners = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    from mlx_grpo.errors import USER_ERRORS

    try:
        code = runners[args.command](args)
    except USER_ERRORS as e:
        print(f"mlx-grpo: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("mlx-grpo: interrupted", file=sys.stderr)
        return 130
    return code or 0
