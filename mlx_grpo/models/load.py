"""Loading the policy (and, when needed, the reference) with mlx-lm.

Owns: resolving `model.path` (hub id, local folder, `builtin:NAME`, `shape:NAME`), converting and
quantizing once into a cache folder, casting the dtype, and turning on LoRA/DoRA
adapters. With LoRA the reference model is the same weights with the adapters
switched off, so no second copy is held in memory.
"""

from contextlib import contextmanager, redirect_stdout
import io
import os
from pathlib import Path
import re
import shutil
import sys

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_unflatten
import mlx_lm
from mlx_lm.tuner.dora import DoRAEmbedding, DoRALinear
from mlx_lm.tuner.lora import LoRAEmbedding, LoRALinear, LoRASwitchLinear
from mlx_lm.tuner.utils import linear_to_lora_layers

from mlx_grpo.algorithm.prefix import PrefixCache
from mlx_grpo.config.paths import is_local_path
from mlx_grpo.models.builtin import builtin_model_path, cache_dir
from mlx_grpo.models.shapes import PREFIX as SHAPE_PREFIX, shape_model_path
from mlx_grpo.errors import ModelError
from mlx_grpo.planner.shapes import read_model_shape
from mlx_grpo.cpu_exp import plain
from mlx_grpo.streams import split_swiglu
from mlx_grpo.attention import fast_attention

DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}


def resolve_dtype(name: str) -> str:
    """model.dtype as loaded: "auto" is bfloat16 on Metal and float32 on the CPU backend, where
    bfloat16 trains about 6x slower."""
    if name != "auto":
        return name
    on_metal = mx.metal.is_available() and mx.default_device().type == mx.DeviceType.gpu
    return "bfloat16" if on_metal else "float32"
_ADAPTER_TYPES = (LoRALinear, LoRASwitchLinear, LoRAEmbedding, DoRALinear, DoRAEmbedding)


def resolve_model_path(path: str, setting: str = "model.path") -> str:
    """A loadable path: the shipped builtin:tiny, builtin:small or a `shape:NAME` built once into
    the cache (`setting`, the key or flag that named it, is what an unknown name's error names)."""
    if path.startswith("builtin:"):
        return str(builtin_model_path(path.removeprefix("builtin:")))
    if path.startswith(SHAPE_PREFIX):
        return str(shape_model_path(path.removeprefix(SHAPE_PREFIX), setting))
    return path


def quantized_dir(path: str, bits: int, group_size: int, dtype: str) -> Path:
    """Where `quantized_copy` keeps `path` quantized so."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", str(Path(path).expanduser().resolve()) if Path(path).exists() else path)
    return cache_dir() / "quantized" / f"{name.strip('_')}-q{bits}-g{group_size}-{dtype}"


def quantized_copy(path: str, bits: int, group_size: int, dtype: str, trust_remote_code=False) -> str:
    """Convert and quantize `path` with mlx-lm once; later calls reuse the cached folder."""
    dst = quantized_dir(path, bits, group_size, dtype)
    if (dst / "config.json").exists():
        return str(dst)
    tmp = dst.with_name(dst.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    quiet_convert(path, str(tmp), quantize=True, q_bits=bits, q_group_size=group_size, dtype=dtype,
            trust_remote_code=trust_remote_code)
    try:
        tmp.rename(dst)
    except OSError:  # another process finished first; use its copy
        shutil.rmtree(tmp, ignore_errors=True)
    return str(dst)


def quiet_convert(*args, **kwargs):
    """`mlx_lm.convert.convert`, without the `[INFO] Loading/Quantizing ...` lines it prints."""
    from mlx_lm.convert import convert

    with redirect_stdout(io.StringIO()):  # it prints only progress; warnings go to stderr, as ours
        return convert(*args, **kwargs)


_PICKLES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def check_model_folder(path: str, tokenizer: bool = True) -> None:
    """A local model folder must hold config.json, safetensors weights and a tokenizer.

    Weights are read from safetensors only (as mlx-lm does): pickle files can run code. A damaged
    config.json or safetensors header is one line here, the same the memory planner gives.
    A path that is not a folder is left to the hub (mlx-lm downloads safetensors only).
    """
    folder = Path(path).expanduser()
    if not folder.is_dir():
        if folder.exists():
            raise ModelError(f"model.path: {path!r} is a file, not a model folder")
        if is_local_path(path):
            raise ModelError(f"model.path: folder {path!r} does not exist")
        return
    if not (folder / "config.json").is_file():
        raise ModelError(f"model.path: {path} has no config.json")
    if not list(folder.glob("model*.safetensors")):
        pickles = sorted(f.name for f in folder.iterdir() if f.suffix in _PICKLES)
        found = f" (found {', '.join(pickles)}: pickle weights are never loaded)" if pickles else ""
        raise ModelError(f"model.path: {path} has no model*.safetensors weights{found}; "
                         "convert the model to safetensors first")
    if tokenizer and not any((folder / name).is_file() for name in _TOKENIZER_FILES):
        raise ModelError(f"model.path: {path} has no tokenizer (expected one of {', '.join(_TOKENIZER_FILES)})")
    read_model_shape(folder)  # config.json's sizes and every safetensors header: the planner's own checks


def hub_or_cache(repo: str, setting: str = "model.path") -> str:
    """`repo` while the hub answers (or HF_HUB_OFFLINE is set); the cached copy's folder when
    the hub cannot be reached, so that mlx-lm does not wait on it; else one line at once, naming
    `setting` (the key or flag that gave the id)."""
    from mlx_grpo.config.hub import TIMEOUT_S, unreachable

    why = unreachable(repo, "model")
    if why is None:
        return repo
    try:
        local = str(mlx_lm.utils.hf_repo_to_path(repo))
    except Exception:  # not in the cache, or only part of it
        raise ModelError(f"{setting}: cannot load {repo!r} from the hub, which cannot be reached (no answer "
                         f"within {TIMEOUT_S:.0f} s: {why}), and it is not in the Hugging Face cache") from None
    print(f"mlx-grpo: the hub cannot be reached ({why.split(':')[0]}); {setting} {repo!r} loads from "
          f"the cache, {local}", file=sys.stderr)
    return local


def _ours_in_mlx_lm():
    split_swiglu()
    fast_attention()


def load_base(model_cfg, path: str | None = None):
    """(model, tokenizer, local_path) for the configured base model, in eval mode.

    `path` is a local path returned by an earlier call, to load a second copy as it was.
    """
    remote = model_cfg.trust_remote_code  # off unless the config sets it
    if path is not None:
        model, tokenizer = mlx_lm.load(path, tokenizer_config={"trust_remote_code": remote},
                                       trust_remote_code=remote)
        model.set_dtype(DTYPES[resolve_dtype(model_cfg.dtype)])
        _ours_in_mlx_lm()
        return model, tokenizer, path
    path = resolve_model_path(model_cfg.path)
    check_model_folder(path)
    q = model_cfg.quantize_bits
    ready = q and (quantized_dir(path, q, model_cfg.quantize_group_size, resolve_dtype(model_cfg.dtype))
                   / "config.json").exists()
    if not Path(path).expanduser().exists() and not ready:  # a hub id that mlx-lm would fetch
        path = hub_or_cache(path)
    try:
        if model_cfg.quantize_bits:
            path = quantized_copy(path, model_cfg.quantize_bits, model_cfg.quantize_group_size,
                                  resolve_dtype(model_cfg.dtype), model_cfg.trust_remote_code)
        model, tokenizer = mlx_lm.load(path, tokenizer_config={"trust_remote_code": remote},
                                       trust_remote_code=remote)
    except Exception as e:  # mlx-lm's and the hub client's errors have many types; name the model
        where = "" if Path(path).exists() else " from the hub"
        raise ModelError(f"model.path: cannot load {model_cfg.path!r}{where} ({type(e).__name__}: "
                         f"{' '.join(str(e).split())[:300]})") from e
    # Quantized weights keep their packing; only float tensors are cast.
    model.set_dtype(DTYPES[resolve_dtype(model_cfg.dtype)])
    _ours_in_mlx_lm()  # its family's module is imported by now
    local = Path(path) if Path(path).exists() else mlx_lm.utils.hf_repo_to_path(path)
    return model, tokenizer, str(local)


ALL_LINEAR = "all-linear"


def lora_parameters(lora_cfg, keys: list[str] | None = None) -> dict:
    """The `lora_parameters` mlx-lm expects: it takes `scale`, so alpha / rank is mapped here.
    `keys` are the block-relative module names, resolved for the model (`target_keys`)."""
    return {
        "rank": lora_cfg.rank,
        "scale": lora_cfg.alpha / lora_cfg.rank,
        "dropout": lora_cfg.dropout,
        "keys": list(lora_cfg.target_modules) if keys is None else keys,
    }


def target_keys(model, lora_cfg, num_layers: int) -> list[str]:
    """lora.target_modules for this model: the names given, or for "all-linear" every linear
    layer of the last `num_layers` blocks (attention, MLP, and a hybrid's convolution or
    delta-net projections; so the default fits every family)."""
    if list(lora_cfg.target_modules) != [ALL_LINEAR]:
        return list(lora_cfg.target_modules)
    return sorted({name for layer in model.layers[len(model.layers) - num_layers:]
                   for name, m in layer.named_modules() if isinstance(m, (nn.Linear, nn.QuantizedLinear))})


def adapted_keys(model) -> list[str]:
    """The block-relative names of the modules that carry adapters (what adapter_config.json
    lists, so that mlx-lm puts them back in the same places)."""
    return sorted({name for layer in model.layers for name, m in layer.named_modules()
                   if isinstance(m, _ADAPTER_TYPES)})


def add_adapters(model, lora_cfg, use_dora: bool = False) -> int:
    """Freeze the base and add LoRA (or DoRA) layers; returns the number of layers adapted."""
    num_layers = len(model.layers) if lora_cfg.num_layers < 0 else lora_cfg.num_layers
    model.freeze()
    keys = target_keys(model, lora_cfg, min(num_layers, len(model.layers)))
    linear_to_lora_layers(model, num_layers, lora_parameters(lora_cfg, keys), use_dora=use_dora)
    found = {name.split(".")[-1] for name, m in model.named_modules() if isinstance(m, _ADAPTER_TYPES)}
    wanted = {k.split(".")[-1] for k in keys}
    if not found:
        raise ModelError(
            f"lora.target_modules: none of {list(lora_cfg.target_modules)} is a linear layer of this model"
        )
    missing = wanted - found
    if missing:
        raise ModelError(f"lora.target_modules: {sorted(missing)} matched no layer of this model")
    return num_layers


@contextmanager
def adapters_disabled(model):
    """Run the base model: every adapter layer is swapped for the layer it wraps."""
    adapters = [(n, m) for n, m in model.named_modules() if isinstance(m, _ADAPTER_TYPES)]
    base = [(n, m.linear if hasattr(m, "linear") else m.embedding) for n, m in adapters]
    model.update_modules(tree_unflatten(base))
    try:
        yield model
    finally:
        model.update_modules(tree_unflatten(adapters))


def _checkpointed(call):
    def __call__(self, *args, **kwargs):
        if args and isinstance(args[-1], PrefixCache):  # blocks take (x, mask, cache)
            return _checkpointed_on_prefix(call, self, *args[:-1], cache=args[-1], **kwargs)
        if isinstance(kwargs.get("cache"), PrefixCache):
            return _checkpointed_on_prefix(call, self, *args, **kwargs)

        def inner(params, *args, **kwargs):
            self.update(params)
            with plain():  # run again in the backward: MLX's own ops there too
                return call(self, *args, **kwargs)

        return mx.checkpoint(inner)(self.trainable_parameters(), *args, **kwargs)

    return __call__


def _checkpointed_on_prefix(call, self, *args, cache, **kwargs):
    """A checkpointed block over a shared prefix. mx.checkpoint differentiates only its array
    inputs, so the prefix's keys/values go in as inputs and the cache's new ones come out as
    outputs; passed inside the cache object they would get no gradient."""
    prior = () if cache.keys is None else (cache.keys, cache.values)

    def inner(params, prior, *args, **kwargs):
        self.update(params)
        c = PrefixCache()
        if prior:
            c.keys, c.values, c.offset = prior[0], prior[1], prior[0].shape[2]
        with plain():
            return call(self, *args, cache=c, **kwargs), c.keys, c.values

    out, cache.keys, cache.values = mx.checkpoint(inner)(self.trainable_parameters(), prior, *args, **kwargs)
    cache.offset = cache.keys.shape[2]
    return out


_CHECKPOINTED: dict[type, type] = {}  # block class -> its checkpointed subclass


def checkpoint_layers(model) -> None:
    """Gradient checkpointing for this model's blocks: the backward pass recomputes each
    block's activations instead of keeping them.

    mlx-lm's `grad_checkpoint` patches the block class itself, so every later model of that
    architecture in the process (the next run of a sweep, an eval copy) would be
    checkpointed too, and each call would wrap the patch again. Here each block of `model`
    is moved to a subclass of its class with a checkpointed __call__ (one subclass per
    class, made once); the class and other models are left alone.
    """
    for layer in model.layers:
        cls = type(layer)
        if cls in _CHECKPOINTED.values():
            continue
        if cls not in _CHECKPOINTED:
            methods = {"__call__": _checkpointed(cls.__call__), "recomputed": True}  # prefix.py reads it
            _CHECKPOINTED[cls] = type(f"Checkpointed{cls.__name__}", (cls,), methods)
        layer.__class__ = _CHECKPOINTED[cls]
