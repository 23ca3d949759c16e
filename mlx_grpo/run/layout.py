"""The run folder's layout: every file name a run writes, in one place.

    <output_dir>/.lock                         locked (lockf) by the process training here
    <output_dir>/config.toml                   the resolved config
    <output_dir>/metrics.jsonl                 one JSON object per step
    <output_dir>/completions.jsonl             the logged sample completions
    <output_dir>/metrics.jsonl.damaged         lines a resume could not read, moved aside (likewise
                                               completions.jsonl.damaged)
    <output_dir>/checkpoints/step_NNNNNN/      model.safetensors + config.json + tokenizer (full)
                                               or adapters.safetensors + adapter_config.json (LoRA),
                                               optimizer.safetensors, config.toml, README.md
                                               (the model card: base, command, metrics, config),
                                               trainer_state.json (it marks the checkpoint
                                               complete) and checkpoint_manifest.json, last: the
                                               size and sha256 of every other file.
"""

import json
from pathlib import Path

CONFIG = "config.toml"
METRICS = "metrics.jsonl"
COMPLETIONS = "completions.jsonl"
CHECKPOINTS = "checkpoints"
RUN_FILES = (CONFIG, METRICS, COMPLETIONS, CHECKPOINTS)  # what makes a folder hold a run
DAMAGED_SUFFIX = ".damaged"  # metrics.jsonl.damaged: lines a resume could not read, kept
LOCK = ".lock"  # run/lock.py: one training process per run folder

TRAINER_STATE = "trainer_state.json"
OPTIMIZER_STATE = "optimizer.safetensors"
MANIFEST = "checkpoint_manifest.json"  # not manifest.json: a model folder may have its own
ADAPTER_WEIGHTS = "adapters.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
MODEL_CONFIG = "config.json"  # mlx-lm's: a folder holding it is a whole model
_PREFIX = "step_"


def checkpoint_dir(output_dir, step: int) -> Path:
    return Path(output_dir) / CHECKPOINTS / f"{_PREFIX}{step:06d}"


def list_checkpoints(output_dir) -> list[Path]:
    """Complete checkpoints, oldest first (a complete one has trainer_state.json)."""
    root = Path(output_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    found = [p for p in root.glob(f"{_PREFIX}*") if p.name[len(_PREFIX):].isdigit()]
    return sorted((p for p in found if (p / TRAINER_STATE).exists()), key=lambda p: p.name)


def latest_checkpoint(output_dir) -> Path | None:
    found = list_checkpoints(output_dir)
    return found[-1] if found else None


def run_dir_of(checkpoint: Path) -> Path | None:
    """The run folder holding a checkpoint folder, or None for a folder outside a run."""
    return checkpoint.parent.parent if checkpoint.parent.name == CHECKPOINTS else None


def read_trainer_state(checkpoint: Path) -> dict:
    """A checkpoint's trainer_state.json: step, data_position, bad_steps (0 if absent), rng."""
    state = json.loads((Path(checkpoint) / TRAINER_STATE).read_text())
    return {"bad_steps": 0, **state}


def write_trainer_state(checkpoint: Path, state: dict) -> None:
    (Path(checkpoint) / TRAINER_STATE).write_text(json.dumps(state))
