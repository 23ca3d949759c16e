"""Adapter folders after training: starting a run from one, and fusing adapters into the base.

`load_adapter_weights` puts the weights of an adapter folder (`adapters.safetensors`) into a
model whose LoRA/DoRA layers are already in place, as `lora.resume_adapter` asks; every
tensor must match the model's adapter parameters by name and shape, so an adapter of another
rank, method or layer count is refused instead of half-loaded. `fuse_adapters` folds each
adapter layer back into a plain (or re-quantized) linear layer with mlx-lm's own `fuse()`.
"""

from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten, tree_unflatten

from mlx_grpo.errors import TrainingError
from mlx_grpo.run.layout import ADAPTER_WEIGHTS


def load_adapter_weights(model, folder: str, key: str = "lora.resume_adapter") -> int:
    """Load `folder`'s adapter tensors into the model's trainable adapters; returns their count."""
    path = Path(folder).expanduser() / ADAPTER_WEIGHTS
    if not path.is_file():
        raise TrainingError(f"{key}: {path} not found (an adapter folder holds {ADAPTER_WEIGHTS})")
    saved = mx.load(str(path))
    expected = dict(tree_flatten(model.trainable_parameters()))
    missing = sorted(set(expected) - set(saved))
    extra = sorted(set(saved) - set(expected))
    if missing or extra:
        what = f"lacks {missing[0]}" if missing else f"has {extra[0]}, which this model has not"
        raise TrainingError(
            f"{key}: {path} does not fit the configured adapters ({what}; "
            f"{len(saved)} tensors saved, {len(expected)} expected): check lora.rank, "
            "lora.method, lora.target_modules and lora.num_layers"
        )
    for name, value in saved.items():
        if value.shape != expected[name].shape:
            raise TrainingError(
                f"{key}: {path}: {name} has shape {tuple(value.shape)}, the model's adapter "
                f"{tuple(expected[name].shape)}: check lora.rank"
            )
    # In the adapters' own dtype (float32): a file saved in bfloat16 must not make them train in it.
    model.load_weights([(name, value.astype(expected[name].dtype)) for name, value in saved.items()], strict=False)
    mx.eval(model.parameters())
    return len(saved)


def fuse_adapters(model, dequantize: bool = False) -> int:
    """Replace every LoRA/DoRA layer by its fused linear layer; returns how many were fused.

    A quantized base stays quantized (the fused weight is re-quantized with the base's bits and
    group size) unless `dequantize` is set.
    """
    fused = [(name, m.fuse(dequantize=dequantize)) for name, m in model.named_modules() if hasattr(m, "fuse")]
    if fused:
        model.update_modules(tree_unflatten(fused))
    return len(fused)
