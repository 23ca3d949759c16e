"""Command-line flags that several sub-commands share, and the argparse types that check a
number as it is parsed (a bad value is a one-line usage error naming it)."""

import argparse


def number_at_least(lo, kind=int):
    """An argparse type: a number >= lo."""

    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {'an integer' if kind is int else 'a number'}, got {text!r}")
        if value < lo:
            raise argparse.ArgumentTypeError(f"must be >= {lo}, got {text}")
        return value

    return parse


def seed_number(text):
    """An argparse type: a seed in the range the config's `seed` takes."""
    from mlx_grpo.config import SEED_LIMIT

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}")
    if not 0 <= value < SEED_LIMIT:
        raise argparse.ArgumentTypeError(f"must be in [0, 2**32), got {text}")
    return value


def add_model_args(parser, required=True):
    parser.add_argument("--model", required=required, metavar="M",
                        help="a run folder (its latest checkpoint), a checkpoint, an exported or converted "
                        "folder, a hub id, builtin:tiny, or shape:NAME (a published shape, random weights)")
    parser.add_argument("--adapter", default=None, metavar="DIR", help="an adapter folder to put on the base M")


def add_sampling_args(parser, max_tokens=256):
    parser.add_argument("--max-tokens", type=number_at_least(1), default=max_tokens,
                        help=f"most new tokens per answer (default {max_tokens})")
    parser.add_argument("--temperature", type=number_at_least(0.0, float), default=0.0, help="0 = greedy (default)")
    parser.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling share when temperature > 0 (default 1.0 = off)")
    parser.add_argument("--seed", type=seed_number, default=0, help="the sampling seed (default 0)")
    parser.add_argument("--system", default=None, metavar="TEXT",
                        help="system prompt (default: the run's data.system_prompt, none for other models)")


def add_progress_arg(parser):
    """--no-progress, for the commands that draw a progress bar (none is drawn where stdout or
    stderr is not a terminal, nor with TQDM_DISABLE=1: run/console.py's show_bar)."""
    parser.add_argument("--no-progress", dest="progress", action="store_false",
                        help="print no progress bar, only the lines (as when the output is not a terminal, "
                             "or TQDM_DISABLE=1)")
