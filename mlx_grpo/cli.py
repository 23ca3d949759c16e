"""The `mlx-grpo` command: one sub-command per entry point. Each module named below defines
`add_arguments(parser)` (its flags) and `main(args)`, a thin layer over its library function.
`mlx-grpo --config FILE` is short for `mlx-grpo train --config FILE`."""

import argparse
import importlib
import sys

COMMANDS = {  # name: (module, one-line help)
    "train": ("mlx_grpo.commands.train", "train a model with GRPO (the default command)"),
    "report": ("mlx_grpo.commands.report",
               "plot runs' metrics (overlaid) into a PNG, or an HTML page with sample completions"),
    "sweep": ("mlx_grpo.commands.sweep",
              "short runs varying config values (an ablation, or --grid), then a table and a report"),
    "convert": ("mlx_grpo.models.convert", "convert a Hugging Face model (hub id or local folder) to an MLX folder"),
    "export": ("mlx_grpo.models.export", "fuse a run's adapters into its base and write a standalone model folder"),
    "generate": ("mlx_grpo.commands.generate", "answer one prompt, streamed token by token"),
    "chat": ("mlx_grpo.commands.chat", "chat with a model: /reset, /system TEXT, /quit; Ctrl-C stops an answer"),
    "eval": ("mlx_grpo.commands.evaluate",
             "score a model on a held-out split with the profile's rewards and task metric"),
    "plan": ("mlx_grpo.commands.plan",
             "predict the peak memory of each phase of a profile (no weights loaded); exit 1 if it does not fit"),
    "bench": ("mlx_grpo.commands.bench",
              "seconds per step against MLX's own limit on the same work (see scripts/bench.py)"),
    "config": ("mlx_grpo.commands.config", "print a profile with every default filled in, or the reference of every key"),
    "launch": ("mlx_grpo.commands.launch", "mlx.launch that fails when a rank fails: launch -n 2 -- mlx-grpo train ..."),
    "launch-probe": ("mlx_grpo.commands.probe",
                     "one host's answer to `launch --check`, one JSON line: versions, hashes, backends, memory"),
}

DOCS = {  # name: the page of docs/ that explains it, named at the end of its --help
    "train": "docs/getting-started.md (every key: docs/configuration.md; the algorithm: docs/algorithm.md)",
    "report": "docs/monitoring.md", "sweep": "docs/monitoring.md",
    "convert": "docs/models.md", "export": "docs/models.md", "generate": "docs/models.md", "chat": "docs/models.md",
    "eval": "docs/models.md#evaluation", "plan": "docs/memory.md", "bench": "docs/benchmarks.md",
    "config": "docs/configuration.md", "launch": "docs/several-macs.md", "launch-probe": "docs/several-macs.md",
}


def build_parser(names=None):
    """The parser and, per sub-command in `names` (None: all), its `main`. Only those commands'
    modules are imported, with their flags: the others are listed by name and help alone, so
    `mlx-grpo --help`, `config` or `launch` do not wait about 4 s for MLX and mlx-lm to load."""
    parser = argparse.ArgumentParser(
        prog="mlx-grpo",
        description="GRPO fine-tuning of language models with MLX. "
        "`mlx-grpo --config FILE` is the same as `mlx-grpo train --config FILE`.",
        epilog="docs: README.md, then docs/getting-started.md; each command's --help names its page.",
    )
    from mlx_grpo import __version__

    parser.add_argument("--version", action="version", version=f"mlx-grpo {__version__}")
    subs = parser.add_subparsers(dest="command", metavar="COMMAND")
    runners = {}
    for name, (module_name, help) in COMMANDS.items():
        sub = subs.add_parser(name, help=help, description=help, epilog=f"docs: {DOCS[name]}")
        if names is None or name in names:
            module = importlib.import_module(module_name)
            module.add_arguments(sub)
            runners[name] = module.main
    return parser, runners


def main(argv=None):
    """The command line; returns the exit code."""
    try:
        return _main(argv)
    except KeyboardInterrupt:  # also while the commands' modules load (MLX, mlx-lm: about a second)
        print("mlx-grpo: interrupted", file=sys.stderr)
        return 130


def _main(argv):
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] not in COMMANDS and argv[0] not in ("-h", "--help", "--version"):
        argv.insert(0, "train")
    if argv[:1] in (["launch"], ["launch-probe"]) and argv[1:2] not in (["-h"], ["--help"]):
        argv.insert(1, "--")  # mlx.launch's options (-n 2 ...), train's: not this parser's
    parser, runners = build_parser(argv[:1])  # the command's module only
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    from mlx_grpo.errors import UserError

    try:
        result = runners[args.command](args)
    except (UserError, OSError) as e:  # OSError: a full disk or a missing permission; it names the file
        print(f"mlx-grpo: error: {e}", file=sys.stderr)
        return 2
    # train's main returns its exit code; the others return what they made (eval's results,
    # generate's answer), for callers of the library, which is no exit code.
    return result if isinstance(result, int) else 0
