"""Checkpoints: written whole or not at all, loadable by mlx-lm as they are.

A checkpoint folder (run/layout.py names its files) holds either a full model (config.json,
model.safetensors, tokenizer; `mlx_lm.load(path)` reads it) or a LoRA adapter
(adapters.safetensors, adapter_config.json; `mlx_lm.load(base, adapter_path=path)`),
plus optimizer.safetensors, trainer_state.json, the resolved config.toml and a README.md model
card (run/model_card.py). It is
written to a temporary folder and renamed into place, so a kill never leaves half of one.
checkpoint_manifest.json, written last, holds the size and sha256 of every other file, so damage done
later (a truncated copy, a full disk, an editor) is found before the checkpoint is trusted.
"""

import hashlib

import json
from pathlib import Path
import shutil

import mlx.core as mx
from mlx.utils import tree_flatten, tree_unflatten
import mlx_lm.utils

from mlx_grpo.config import save_config
from mlx_grpo.errors import TrainingError
from mlx_grpo.models.saved_template import write_system_prompt
from mlx_grpo.run.log import read_metrics
from mlx_grpo.run.model_card import loadable_base, write_model_card
from mlx_grpo.run.layout import (
    ADAPTER_CONFIG, ADAPTER_WEIGHTS, CONFIG, MANIFEST, OPTIMIZER_STATE, TRAINER_STATE, checkpoint_dir, latest_checkpoint, list_checkpoints,
    write_trainer_state,
)

class CheckpointError(TrainingError):
    """Writing a checkpoint failed; the message says where, why and what is still intact."""

    def __init__(self, step: int, tmp: Path, error: Exception, previous: Path | None):
        kept = f"the previous checkpoint {previous} is intact" if previous else "no earlier checkpoint exists"
        reason = getattr(error, "strerror", None) or " ".join(str(error).split())
        super().__init__(f"checkpoint: cannot write step {step} to {tmp} ({reason}); {kept}")


def adapter_config(cfg, num_layers: int, model) -> dict:
    from mlx_grpo.models.load import adapted_keys, lora_parameters

    return {
        "fine_tune_type": getattr(cfg.lora, "method", "lora"),
        "num_layers": num_layers,
        "lora_parameters": lora_parameters(cfg.lora, adapted_keys(model)),
        "base_model": loadable_base(cfg.model.path),  # never builtin:NAME, which mlx-lm cannot load
    }


def _write_weights(dst: Path, model, tokenizer, cfg, base_path: str, num_layers: int):
    if cfg.lora.enabled:
        adapters = dict(tree_flatten(model.trainable_parameters()))
        mx.save_safetensors(str(dst / ADAPTER_WEIGHTS), adapters)
        (dst / ADAPTER_CONFIG).write_text(json.dumps(adapter_config(cfg, num_layers, model), indent=2))
    else:
        model_config = mlx_lm.utils.load_config(Path(base_path))
        mlx_lm.utils.save(dst, base_path, model, tokenizer, model_config, donate_model=False)
        write_system_prompt(dst, cfg.data.system_prompt, cfg.data.chat_template_kwargs)


def _metrics_of(output_dir, step: int) -> dict | None:
    """The step's row of metrics.jsonl (logged before the checkpoint), if there is one."""
    try:
        rows = [row for row in read_metrics(output_dir) if row.get("step") == step]
    except (OSError, ValueError):  # a damaged log costs the card its metrics, not the checkpoint
        return None
    return rows[-1] if rows else None


def save_checkpoint(output_dir, step, *, model, tokenizer, optimizer, cfg, base_path,
                    num_layers, trainer_state: dict, keep_last: int) -> Path:
    """Write checkpoint `step` atomically, then prune all but the newest `keep_last`."""
    final = checkpoint_dir(output_dir, step)
    tmp = final.with_name(final.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
        _write_weights(tmp, model, tokenizer, cfg, base_path, num_layers)
        opt_state = dict(tree_flatten(optimizer.state))
        mx.save_safetensors(str(tmp / OPTIMIZER_STATE), opt_state)
        save_config(cfg, tmp / CONFIG)
        write_model_card(tmp, cfg, step, _metrics_of(output_dir, step))
        # trainer_state.json goes last: its presence marks the folder complete.
        write_trainer_state(tmp, {"step": step, **trainer_state})
        write_manifest(tmp)
    except (OSError, RuntimeError) as e:  # a full disk (MLX raises RuntimeError): earlier ones stay
        shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointError(step, tmp, e, latest_checkpoint(output_dir)) from e
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    for old in list_checkpoints(output_dir)[:-keep_last]:
        shutil.rmtree(old)
    return final


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST)


def write_manifest(folder: Path) -> None:
    """checkpoint_manifest.json: {relative path: {"size", "sha256"}} of every file in the folder."""
    entries = {str(p.relative_to(folder)): {"size": p.stat().st_size, "sha256": _sha256(p)}
               for p in _files(folder)}
    (folder / MANIFEST).write_text(json.dumps(entries, indent=1))


def checkpoint_damage(folder) -> str | None:
    """What is wrong with a checkpoint folder (naming the file), or None when it is intact.

    With a manifest every listed file must be there with its size and sha256; a manifest that
    is empty, `null` or lists no trainer_state.json is damage too. A checkpoint written before
    manifests existed is accepted when its trainer_state.json and config.toml parse and each
    .safetensors file is whole (its header's tensors end where the file ends); its weights are
    then checked only by loading them.
    """
    folder = Path(folder)
    try:
        text = (folder / MANIFEST).read_text()
    except FileNotFoundError:
        return _unverified_damage(folder)
    except OSError as e:
        return f"{MANIFEST} is unreadable ({e})"
    try:
        manifest = json.loads(text)
    except ValueError as e:
        return f"{MANIFEST} is unreadable ({e})"
    if not isinstance(manifest, dict) or TRAINER_STATE not in manifest:
        return f"{MANIFEST} is unreadable (not a manifest: {text[:40]!r})"
    for name, entry in manifest.items():
        path = folder / name
        try:
            if not path.is_file():
                return f"{name} is missing"
            size = path.stat().st_size
            if size != entry["size"]:
                return f"{name} has {size} bytes, {entry['size']} were written"
            if _sha256(path) != entry["sha256"]:
                return f"{name} differs from what was written (sha256)"
        except FileNotFoundError:  # removed while it was read (a run pruning its checkpoints)
            return f"{name} is missing"
        except OSError as e:
            return f"{name} is unreadable ({e.strerror})"
        except (AttributeError, KeyError, TypeError):
            return f"{MANIFEST} is unreadable (not a manifest)"
    return None


def _unverified_damage(folder: Path) -> str | None:
    """A checkpoint without a manifest: its state files parse and its weights files are whole."""
    import tomllib

    try:
        json.loads((folder / TRAINER_STATE).read_text())
        if (folder / CONFIG).exists():
            tomllib.loads((folder / CONFIG).read_text())
    except (OSError, ValueError) as e:  # TOMLDecodeError and UnicodeDecodeError are ValueErrors
        return f"{MANIFEST} is missing and {TRAINER_STATE} or {CONFIG} is unreadable ({e})"
    for path in sorted(folder.glob("*.safetensors")):
        if problem := _safetensors_damage(path):
            return f"{MANIFEST} is missing and {path.name} {problem}"
    return None


def _safetensors_damage(path: Path) -> str | None:
    """Whether a .safetensors file is cut short or not one: an 8-byte header length, a JSON
    header, then the tensors' bytes, which end where the header says the last one ends."""
    size = path.stat().st_size
    try:
        with open(path, "rb") as f:
            length = int.from_bytes(f.read(8), "little")
            if size < 8 or length > size - 8:
                return f"has {size} bytes, too few for its header"
            header = json.loads(f.read(length))
        end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError) as e:
        return f"is not a safetensors file ({type(e).__name__})"
    if size != 8 + length + end:
        return f"has {size} bytes, its header needs {8 + length + end}"
    return None


def newest_intact(output_dir) -> tuple[Path | None, list[str]]:
    """The newest checkpoint of a run whose files are as written, or None, and `step_N: problem`
    for each newer one that is damaged, newest first. A checkpoint without a manifest is damaged
    when an older one of the run has one: this version writes one into every checkpoint."""
    found = list_checkpoints(output_dir)
    manifests = [(ckpt / MANIFEST).exists() for ckpt in found]
    damaged = []
    for i in reversed(range(len(found))):
        if not manifests[i] and any(manifests[:i]):
            problem = f"{MANIFEST} is missing (the earlier checkpoints have one)"
        else:
            problem = checkpoint_damage(found[i])
        if problem is None:
            return found[i], damaged
        damaged.append(f"{found[i].name}: {problem}")
    return None, damaged


def load_optimizer_state(path: Path):
    return tree_unflatten(list(mx.load(str(Path(path) / OPTIMIZER_STATE)).items()))
