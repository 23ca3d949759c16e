"""`mlx-grpo launch`: mlx.launch, failing when a rank fails.

mlx.launch (mlx 0.32) exits 0 whatever its ranks do: when one fails it stops the others and
prints a `[WARN] Node with rank N exited with code C` line per rank. This runs the same launcher,
with the same options, in this process, and turns those lines into one `mlx-grpo: error:` line
naming how each rank ended, and exits 2. Each rank's own output (its one-line error) is
printed above it, as mlx.launch passes it through.
"""

import argparse
import re
import sys

from mlx_grpo.errors import UserError

# How mlx.launch reports a rank that ended badly (mlx/_distributed_utils/launch.py).
_FAILED = re.compile(r"Node with rank (\d+) (?:exited with code (-?\d+)|was killed)")


class LaunchError(UserError):
    """A rank of a launched run failed."""


def launch(argv: list[str]) -> None:
    """Run mlx.launch with `argv` (its options, then -- and the command); raise LaunchError
    naming the ranks that failed."""
    from mlx._distributed_utils import launch as mlx_launch

    failed, warn = [], mlx_launch.log_warning

    def note(*args, **kwargs):
        found = _FAILED.search(" ".join(map(str, args)))
        if found:
            failed.append((int(found[1]), int(found[2]) if found[2] is not None else None))
        else:
            warn(*args, **kwargs)

    argv0 = sys.argv
    mlx_launch.log_warning, sys.argv = note, ["mlx.launch", *argv]
    try:
        mlx_launch.main()
    finally:
        mlx_launch.log_warning, sys.argv = warn, argv0
    if failed:
        # Which rank failed first is not known here: the launcher stops the others when it sees
        # one end, and a rank that was already exiting may then count as stopped.
        ends = ", ".join(f"rank {r} " + ("was stopped" if c is None or c < 0 else f"exited with code {c}")
                         for r, c in sorted(failed))
        raise LaunchError(f"the launch failed: {ends}; each rank's own line above says why")


def add_arguments(parser):
    parser.add_argument("launch_args", nargs=argparse.REMAINDER, metavar="MLX_LAUNCH_ARGS",
                        help="mlx.launch's own options (-n, --hostfile, --backend, ...), then -- and the "
                             "command each rank runs, e.g. -n 2 -- mlx-grpo train --config FILE")


def main(args) -> int:
    rest = args.launch_args[1:] if args.launch_args[:1] == ["--"] else args.launch_args
    launch(rest)
    return 0
