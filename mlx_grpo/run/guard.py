"""What a command may delete when the user passes --force or --overwrite.

`export --out`, `convert --mlx-path`, `eval --out` and `train --overwrite` replace what is
there. Each first asks `check_replaceable`, which refuses in one line a target that is the
command's own input, lies inside it or holds it, and (unless the command replaces a run by
design, as `train --overwrite` does) a folder that holds a training run or a run's own files:
a typo in --out must never cost the checkpoints it was meant to read.
"""

import os
from pathlib import Path

from mlx_grpo.errors import UserError
from mlx_grpo.run.layout import CHECKPOINTS, COMPLETIONS, METRICS, RUN_FILES


class ReplaceError(UserError, ValueError):
    """A --force/--overwrite target that would delete something the user still needs."""


def _resolved(path) -> Path:
    return Path(path).expanduser().resolve()


def _inside(a: Path, b: Path) -> bool:
    """Whether a is b or lies below it."""
    return a == b or b in a.parents


def held_run_files(folder) -> list[str]:
    """The run files (config.toml, metrics.jsonl, completions.jsonl, checkpoints/) in a folder."""
    folder = Path(folder)
    return [name for name in RUN_FILES if (folder / name).exists()] if folder.is_dir() else []


def _run_within(folder: Path) -> Path | None:
    """The first folder at or below `folder` holding what training wrote (metrics, completions,
    checkpoints). A config.toml alone is not a run: an export carries its run's."""
    for root, dirs, files in os.walk(folder):
        if CHECKPOINTS in dirs or METRICS in files or COMPLETIONS in files:
            return Path(root)
    return None


def _run_part(target: Path) -> Path | None:
    """The run folder whose own files hold `target` (its checkpoints/, metrics.jsonl...), if any."""
    for parent in target.parents:
        part = target.relative_to(parent).parts[0]
        if part in RUN_FILES and held_run_files(parent):
            return parent
    return None


def check_replaceable(target, flag: str, keep=(), allow_run: bool = False) -> None:
    """Raise ReplaceError unless deleting `target` loses nothing of `keep` or of a run.

    keep: (what, path) pairs the command reads, e.g. ("the source", "runs/x"); a path that does not
    exist locally (a hub id) is skipped. allow_run: `target` is a run folder the command replaces
    on purpose (train --overwrite), so only `keep` is checked.
    """
    dst = _resolved(target)
    for what, path in keep:
        if path is None or not Path(path).expanduser().exists():
            continue
        src = _resolved(path)
        if _inside(src, dst):
            where = "is" if src == dst else "holds"
            raise ReplaceError(f"{flag} {target}: {where} {what} {path}; replacing it would delete what this "
                               "command reads; choose another folder")
        if _inside(dst, src):
            raise ReplaceError(f"{flag} {target}: lies inside {what} {path}; choose a folder outside it")
    if allow_run:
        return
    if (run := _run_within(dst)) is not None:
        where = "" if run == dst else f" in {Path(target) / run.relative_to(dst)}"
        raise ReplaceError(f"{flag} {target}: holds a training run{where} ({', '.join(held_run_files(run))}); "
                           "choose another folder")
    if (run := _run_part(dst)) is not None:
        raise ReplaceError(f"{flag} {target}: is part of the training run in {run}; choose a folder outside it")
