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
        from mlx_grpo.run.stopping import RunStopped
        from mlx_grpo.commands.train import train

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
        from mlx_grpo.commands.report import write_report

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
        from mlx_grpo.commands.report import ReportError, write_report
        from mlx_grpo.commands.sweep import results_table, run_sweep

        results = run_sweep(args.config, args.vary, steps=args.steps, grid=args.grid, overrides=args.overrides,
                            overwrite=args.overwrite)
        print(results_table(results))
        try:
            print(f"mlx-grpo sweep: wrote {write_report([r['dir'] for r in results])}")
        except ReportError as e:  # the runs are done and tabulated; only the picture is missing
            print(f"mlx-grpo sweep: no report: {e}", file=sys.stderr)

    return run


def _number_at_least(lo, kind=int):
    """An argparse type: a number >= lo, else a one-line usage error naming the value."""

    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {'an integer' if kind is int else 'a number'}, got {text!r}")
        if value < lo:
            raise argparse.ArgumentTypeError(f"must be >= {lo}, got {text}")
        return value

    return parse


def _seed(text):
    """An argparse type: a seed in the range the config's `seed` takes."""
    from mlx_grpo.config import SEED_LIMIT

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}")
    if not 0 <= value < SEED_LIMIT:
        raise argparse.ArgumentTypeError(f"must be in [0, 2**32), got {text}")
    return value


def _model_args(sub, required=True):
    sub.add_argument("--model", required=required, metavar="M",
                     help="a run folder (its latest checkpoint), a checkpoint, an exported or converted "
                     "folder, a hub id, or builtin:tiny")
    sub.add_argument("--adapter", default=None, metavar="DIR", help="an adapter folder to put on the base M")


def _sampling_args(sub, max_tokens=256):
    sub.add_argument("--max-tokens", type=_number_at_least(1), default=max_tokens)
    sub.add_argument("--temperature", type=_number_at_least(0.0, float), default=0.0, help="0 = greedy (default)")
    sub.add_argument("--top-p", type=float, default=1.0)
    sub.add_argument("--seed", type=_seed, default=0)
    sub.add_argument("--system", default=None, metavar="TEXT",
                     help="system prompt (default: the run's data.system_prompt, none for other models)")


@command("convert", "convert a Hugging Face model (hub id or local folder) to an MLX folder")
def _convert(sub):
    from mlx_grpo.models.convert import DTYPES

    sub.add_argument("--hf-path", required=True, metavar="ID_OR_DIR")
    sub.add_argument("--mlx-path", required=True, metavar="DIR")
    sub.add_argument("--quantize", "-q", action="store_true")
    sub.add_argument("--q-bits", type=int, default=4, choices=(2, 3, 4, 5, 6, 8))
    sub.add_argument("--q-group-size", type=int, default=64, choices=(32, 64, 128))
    sub.add_argument("--dtype", default=None, choices=DTYPES, help="default: as the checkpoint stores it")
    sub.add_argument("--force", action="store_true", help="replace a non-empty --mlx-path")
    sub.add_argument("--trust-remote-code", action="store_true")

    def run(args):
        from mlx_grpo.models.convert import main

        main(args)

    return run


@command("export", "fuse a run's adapters into its base and write a standalone model folder")
def _export(sub):
    sub.add_argument("source", metavar="RUN_DIR_OR_CHECKPOINT")
    sub.add_argument("--out", required=True, metavar="DIR")
    sub.add_argument("--adapter", default=None, metavar="DIR", help="an adapter folder, when SOURCE is its base")
    sub.add_argument("--dequantize", action="store_true", help="write float weights for a quantized base")
    sub.add_argument("--force", action="store_true", help="replace a non-empty --out")

    def run(args):
        from mlx_grpo.models.export import main

        main(args)

    return run


@command("generate", "answer one prompt, streamed token by token")
def _generate(sub):
    _model_args(sub)
    sub.add_argument("--prompt", required=True, metavar="TEXT")
    _sampling_args(sub)
    sub.add_argument("--no-stream", dest="stream", action="store_false", help="print the answer at the end")

    def run(args):
        from mlx_grpo.commands.generate import main

        main(args)

    return run


@command("chat", "chat with a model: /reset, /system TEXT, /quit; Ctrl-C stops an answer")
def _chat(sub):
    _model_args(sub)
    _sampling_args(sub)

    def run(args):
        from mlx_grpo.commands.chat import main

        main(args)

    return run


@command("eval", "score a model on a held-out split with the profile's rewards and task metric")
def _eval(sub):
    sub.add_argument("--config", default=None, help="profile (default: the config of the run M comes from)")
    sub.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    _model_args(sub, required=False)
    sub.add_argument("--split", default=None, help="default: eval.split")
    sub.add_argument("--limit", type=_number_at_least(0), default=None, help="first N distinct prompts (default: eval.limit)")
    sub.add_argument("--num-samples", type=_number_at_least(1), default=None, metavar="K", help="K > 1 adds maj@K and pass@K")
    sub.add_argument("--temperature", type=_number_at_least(0.0, float), default=None, help="for the K samples (default: eval.temperature)")
    sub.add_argument("--max-tokens", type=_number_at_least(1), default=None, help="default: eval.max_new_tokens")
    sub.add_argument("--seed", type=_seed, default=None, help="default: the config's seed")
    sub.add_argument("--out", "--json", dest="out", default=None, metavar="FILE",
                     help="results JSON (default: the run folder, else ./eval_<split>.json)")

    def run(args):
        from mlx_grpo.commands.evaluate import main

        main(args)

    return run


@command("bench", "seconds per step against MLX's own limit on the same work (see scripts/bench.py)")
def _bench(sub):
    from mlx_grpo.commands.bench import add_arguments

    add_arguments(sub)

    def run(args):
        from mlx_grpo.commands.bench import main

        main(args)

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
    from mlx_grpo.errors import UserError

    try:
        code = runners[args.command](args)
    except (UserError, OSError) as e:  # OSError: a full disk or a missing permission; it names the file
        print(f"mlx-grpo: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("mlx-grpo: interrupted", file=sys.stderr)
        return 130
    return code or 0
