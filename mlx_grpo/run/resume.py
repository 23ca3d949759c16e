"""Continuing a run: what an output_dir already holds, whether this config may continue it,
and putting a checkpoint's state back so the resumed run repeats the uninterrupted one.

The state a checkpoint restores: the trainable weights (full model or adapters), the
optimizer state (its `step` drives the learning-rate schedule), the data position, the
count of skipped bad steps, the MLX, NumPy and Python PRNG states, and the unmoved-tensor
check's start (update/movement.py). The resolved config
is compared key by key with the run's; any difference except `training.max_steps`, the
`[logging]` section, `checkpoint.resume`, `output_dir` (where the run is, not what it
is) and `distributed.timeout_s` stops the resume unless forced.
"""

from dataclasses import dataclass
from pathlib import Path
import shutil
import sys
import tomllib

import mlx.core as mx

from mlx_grpo.config import config_to_dict
from mlx_grpo.errors import TrainingError
from mlx_grpo.run.checkpoint import load_optimizer_state, newest_intact
from mlx_grpo.run.guard import check_replaceable
from mlx_grpo.run.layout import (
    ADAPTER_WEIGHTS, CHECKPOINTS, CONFIG, METRICS, RUN_FILES, TRAINER_STATE, checkpoint_dir, list_checkpoints,
    read_trainer_state,
)

MAY_DIFFER = ("training.max_steps", "logging", "checkpoint.resume", "output_dir", "distributed.timeout_s")


@dataclass
class ResumePoint:
    checkpoint: Path
    step: int
    data_position: int
    bad_steps: int
    rng: dict
    movement: dict | None = None  # update/movement.py's check, when the run has one

    @classmethod
    def read(cls, checkpoint: Path) -> "ResumePoint":
        """The state a checkpoint folder holds, from its trainer_state.json."""
        state = read_trainer_state(checkpoint)
        return cls(checkpoint, state["step"], state["data_position"], state["bad_steps"], state["rng"],
                   state.get("movement"))


def _flat(table: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in table.items():
        dotted = f"{prefix}.{key}" if prefix else key
        out.update(_flat(value, dotted) if isinstance(value, dict) else {dotted: value})
    return out


def config_differences(saved: dict, current: dict) -> list[str]:
    """`key (run: A, now: B)` for every key that differs, except those in MAY_DIFFER."""
    old, new = _flat(saved), _flat(current)
    keys = sorted(set(old) | set(new))
    free = lambda k: any(k == m or k.startswith(m + ".") for m in MAY_DIFFER)
    return [f"{k} (run: {old.get(k, 'unset')!r}, now: {new.get(k, 'unset')!r})"
            for k in keys if not free(k) and old.get(k) != new.get(k)]


def _held_run(out: Path) -> list[str]:
    """The run files in `out`, or none while it holds no run yet: a start that failed before
    its first step (a full disk, a crash) leaves config.toml and an empty metrics.jsonl but no
    checkpoint and no metrics row, and a rerun or --resume may start there afresh."""
    metrics = out / METRICS
    if not list_checkpoints(out) and not (metrics.is_file() and metrics.stat().st_size > 0):
        return []
    return [name for name in RUN_FILES if (out / name).exists()]


def _check_same_run(cfg, config_file: Path, force: bool) -> None:
    try:
        with open(config_file, "rb") as f:
            saved = tomllib.load(f)
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise TrainingError(f"checkpoint.resume: {config_file} is damaged ({e}); "
                            "pass --overwrite to start this run over") from e
    diffs = config_differences(saved, config_to_dict(cfg))
    if diffs and not force:
        raise TrainingError(
            f"checkpoint.resume: the config differs from that of {config_file.parent} in "
            f"{len(diffs)} key(s): {'; '.join(diffs)}; pass --force to resume anyway"
        )
    if diffs:
        print(f"mlx-grpo: resuming despite config differences (--force): {'; '.join(diffs)}")


def newest_intact_checkpoint(out: Path) -> Path | None:
    """The newest checkpoint whose files are as written; each damaged newer one is named in a
    warning. Raises when checkpoints exist but none is intact."""
    ckpt, damaged = newest_intact(out)
    if ckpt is not None:
        if damaged:
            print(f"mlx-grpo: warning: damaged checkpoint(s) skipped: {'; '.join(damaged)}; "
                  f"resuming from {ckpt.name}", file=sys.stderr)
        return ckpt
    if damaged:  # --overwrite deletes no intact checkpoint here: there is none
        raise TrainingError(f"checkpoint.resume: no intact checkpoint in {out / CHECKPOINTS} "
                            f"({'; '.join(damaged)}); pass --overwrite to start over")
    return None


def open_run(cfg, *, overwrite: bool = False, force: bool = False) -> ResumePoint | None:
    """Decide how this run starts in cfg.output_dir: fresh (None) or from a checkpoint.

    Raises when the folder holds another run and neither resume nor overwrite was asked for,
    or when resuming with a config that differs from the run's (unless `force`).
    """
    out = Path(cfg.output_dir)
    held = _held_run(out)
    if overwrite:
        keep = [("model.path", cfg.model.path), ("lora.resume_adapter", cfg.lora.resume_adapter or None)]
        for name in held:  # only what a run writes; other files in the folder stay
            path = out / name
            check_replaceable(path, "--overwrite", keep, allow_run=True)
        for name in held:
            path = out / name
            shutil.rmtree(path) if path.is_dir() else path.unlink()
        return None
    if not cfg.checkpoint.resume:
        if held:
            found = list_checkpoints(out)
            last = f", newest checkpoint {found[-1].name}" if found else ""
            raise TrainingError(
                f"output_dir: {out} already holds a run ({', '.join(held)}{last}); "
                "pass --resume to continue it, --overwrite to replace it, or choose another output_dir"
            )
        return None
    ckpt = newest_intact_checkpoint(out)
    config_file = (ckpt or out) / CONFIG
    if held and config_file.exists():
        _check_same_run(cfg, config_file, force)
    if ckpt is None:
        print(f"mlx-grpo: no complete checkpoint in {out}; starting from step 1")
        return None
    point = ResumePoint.read(ckpt)
    if point.step > cfg.training.max_steps:
        raise TrainingError(
            f"training.max_steps: {cfg.training.max_steps} is below step {point.step} of the checkpoint "
            f"{ckpt}; set training.max_steps >= {point.step} to resume it"
        )
    return point


def restore_training_state(point: ResumePoint, model, optimizer, lora: bool) -> None:
    """Load the checkpoint's trainable weights and optimizer state into model and optimizer."""
    try:  # a checkpoint without a manifest (written before them) is checked here, by loading it
        if lora:
            weights = mx.load(str(point.checkpoint / ADAPTER_WEIGHTS))
            model.load_weights(list(weights.items()), strict=False)
        else:
            weights = {}
            for shard in sorted(point.checkpoint.glob("model*.safetensors")):
                weights.update(mx.load(str(shard)))
            model.load_weights(list(weights.items()), strict=True)
        optimizer.state = load_optimizer_state(point.checkpoint)
        mx.eval(model.parameters(), optimizer.state)
    except (OSError, RuntimeError, ValueError) as e:
        raise TrainingError(f"checkpoint.resume: cannot load {point.checkpoint} ({' '.join(str(e).split())}); "
                            f"{_without(point.checkpoint)}") from e


def _without(ckpt: Path) -> str:
    """What to do about a checkpoint that does not load: never --overwrite while an earlier
    checkpoint could still be resumed from, as it would delete that one too."""
    earlier = [c for c in list_checkpoints(ckpt.parent.parent) if c.name < ckpt.name]
    if not earlier:
        return "pass --overwrite to start over"
    return f"move it out of {ckpt.parent} to resume from {earlier[-1].name}, the checkpoint before it"


def share_resume_point(start: ResumePoint | None, output_dir, world) -> ResumePoint | None:
    """Rank 0's decision (fresh or the step to resume) on every rank.

    Rank 0 alone inspects and may clear the run folder (`open_run`); the others wait here,
    then read the same checkpoint from their own copy of the folder (the same path on every
    machine: a shared folder, or one copied there before resuming).
    """
    if world.size == 1:
        return start
    step = int(world.sum([float(start.step) if start is not None else 0.0])[0])
    if world.is_main or step == 0:
        return start
    ckpt = checkpoint_dir(output_dir, step)
    if not (ckpt / TRAINER_STATE).exists():
        raise TrainingError(
            f"rank {world.rank}: resuming from step {step} needs {ckpt} on this machine too; "
            "copy the run folder to the same path on every machine"
        )
    return ResumePoint.read(ckpt)
