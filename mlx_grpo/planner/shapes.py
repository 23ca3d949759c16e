"""What the memory planner knows of a model and a run: the model's config.json and the tensors
listed in its safetensors headers (`ModelShape`, no weight is loaded), and the values of a run
the memory depends on (`RunShape`). Pure Python (json and struct), except `config_model_shape`,
which lists the tensors of a model not yet written (a `shape:NAME`) from mlx-lm's model class for
its config, built lazily: MLX allocates nothing until an array is evaluated.
"""

from dataclasses import dataclass, field
import json
import math
from pathlib import Path
import struct

from mlx_grpo.errors import ModelError
from mlx_grpo.tools import completion_cap

# Bytes per element of each safetensors dtype.
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "U32": 4, "I16": 2,
               "U16": 2, "I8": 1, "U8": 1, "BOOL": 1, "U64": 8}
FLOAT_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
# config.json sizes a loader can build: positive integers up to these bounds (no model people
# train comes near them; mlx's int32 indices end at 2**31). Optional ones may be absent.
SIZES = {"num_hidden_layers": 4096, "hidden_size": 1 << 17, "num_attention_heads": 4096, "vocab_size": 1 << 23}
OPTIONAL_SIZES = {"num_key_value_heads": 4096, "head_dim": 1 << 14, "intermediate_size": 1 << 20}
MAX_HEADER = 100_000_000  # safetensors' own limit on the JSON header


class PlanError(ModelError):
    """A model folder whose config.json or safetensors headers cannot be read as a model's: the same
    one line whether the planner or the loader (models/load.check_model_folder) meets it."""


@dataclass
class Tensor:
    dtype: str
    shape: tuple[int, ...]

    @property
    def size(self) -> int:
        return math.prod(self.shape)


@dataclass
class ModelShape:
    """What the planner needs of a model: its config.json and the tensors of its safetensors."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tensors: dict[str, Tensor] = field(default_factory=dict)
    quant_bits: int = 0  # of a model stored quantized
    quant_group: int = 64


def _size(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def read_header(path: Path, setting: str = "model.path") -> dict[str, Tensor]:
    """The tensors of one safetensors file (an 8-byte little-endian length, then a JSON header),
    each checked against the file: a known dtype, a shape of sizes, and bytes that are there."""
    path = Path(path)
    damaged = lambda why: PlanError(f"{setting}: {path} is damaged or not safetensors: {why}")  # noqa: E731
    size = path.stat().st_size
    with open(path, "rb") as f:
        if size < 8:
            raise damaged(f"{size} bytes, shorter than a header")
        (n,) = struct.unpack("<Q", f.read(8))
        if n > min(MAX_HEADER, size - 8):
            raise damaged(f"its header claims {n:,} bytes, the file holds {size - 8:,} after the length")
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, ValueError) as e:
            raise damaged(f"its header is not JSON ({' '.join(str(e).split())[:100]})") from None
    if not isinstance(header, dict):
        raise damaged("its header is not a JSON object")
    data = size - 8 - n
    tensors = {}
    for name, v in header.items():
        if name == "__metadata__":
            continue
        ok = isinstance(v, dict) and v.get("dtype") in DTYPE_BYTES and isinstance(v.get("shape"), list) \
            and all(map(_size, v["shape"])) and isinstance(v.get("data_offsets"), list) \
            and len(v["data_offsets"]) == 2 and all(map(_size, v["data_offsets"]))
        if not ok:
            raise damaged(f"tensor {name!r} has no dtype, shape and data_offsets of the right kinds")
        t, (start, end) = Tensor(v["dtype"], tuple(v["shape"])), v["data_offsets"]
        if end - start != t.size * DTYPE_BYTES[t.dtype] or end > data:
            raise damaged(f"tensor {name!r} {list(t.shape)} {t.dtype} needs bytes {start:,}-{end:,}"
                          f"{'' if end <= data else f' of {data:,}'} (truncated, or a shape the data does not hold)")
        tensors[name] = t
    return tensors


def read_config(folder, setting: str = "model.path") -> dict:
    """config.json of a model folder (its text_config merged in, for vision-language models),
    with the sizes the planner and the loader need checked."""
    path = Path(folder) / "config.json"
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise PlanError(f"{setting}: cannot read {path} ({e.strerror})") from e
    except (UnicodeDecodeError, ValueError) as e:
        raise PlanError(f"{setting}: {path} is not valid JSON ({' '.join(str(e).split())[:100]})") from e
    return checked_config(cfg, path, setting)


def checked_config(cfg, path, setting: str = "model.path") -> dict:
    """A config.json's object, its text_config merged in, with the sizes checked (`path` names it)."""
    if not isinstance(cfg, dict):
        raise PlanError(f"{setting}: {path} must hold a JSON object, got {type(cfg).__name__}")
    text = cfg.get("text_config")
    cfg = {**(text if isinstance(text, dict) else {}), **cfg}
    for key, most in {**SIZES, **OPTIONAL_SIZES}.items():
        if key not in cfg or (key in OPTIONAL_SIZES and cfg[key] is None):
            if key in SIZES:
                raise PlanError(f"{setting}: {path} has no {key!r}")
            continue
        value = cfg[key]
        if not (_size(value) and 1 <= value <= most):
            raise PlanError(f"{setting}: {path}: {key} must be an integer in [1, {most:,}], got {value!r:.40}")
    return cfg


def read_model_shape(folder, setting: str = "model.path") -> ModelShape:
    """config.json and every model*.safetensors header of a local model folder, checked."""
    folder = Path(folder)
    cfg = read_config(folder, setting)
    files = sorted(folder.glob("model*.safetensors"))
    if not files:
        raise PlanError(f"{setting}: {folder} has no model*.safetensors to read the shapes from")
    tensors = {}
    for f in files:
        tensors.update(read_header(f, setting))
    return _model_shape(cfg, tensors)


def _model_shape(cfg: dict, tensors: dict[str, Tensor]) -> ModelShape:
    heads = cfg["num_attention_heads"]
    q = cfg.get("quantization") if isinstance(cfg.get("quantization"), dict) else {}
    return ModelShape(
        layers=cfg["num_hidden_layers"], hidden=cfg["hidden_size"], heads=heads,
        kv_heads=cfg.get("num_key_value_heads") or heads,
        head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads, vocab=cfg["vocab_size"],
        tensors=tensors, quant_bits=q.get("bits", 0), quant_group=q.get("group_size", 64),
    )


def lazy_model(config: dict):
    """mlx-lm's model for a config.json object, unevaluated (its parameters are shapes only). A
    head its weights would not have (tie_word_embeddings; Gemma 3 builds one anyway) is dropped.
    The layers' initialisers draw from MLX's global random stream even unevaluated: it is put
    back, so that planning mid-run (training.worst_case_first) leaves the run's sampling alone."""
    import copy

    from mlx_lm.utils import _get_classes  # mlx-lm's own config -> class lookup (mlx-lm is pinned)

    from mlx_grpo.rng import capture_rng, restore_rng

    model_class, args_class = _get_classes(config)
    rng = capture_rng()
    try:
        model = model_class(args_class.from_dict(copy.deepcopy(config)))
    finally:
        restore_rng(rng)
    if config.get("tie_word_embeddings") and "lm_head" in model:
        model.pop("lm_head")
    return model


def config_model_shape(config: dict, setting: str = "model.path") -> ModelShape:
    """The ModelShape of a model that has only its config.json so far: its tensors are those of
    `lazy_model` in the config's dtype (bfloat16 unless it says float32 or float16)."""
    from mlx.utils import tree_flatten

    cfg = checked_config(config, "config.json", setting)
    dtype = {"float32": "F32", "float16": "F16"}.get(cfg.get("torch_dtype"), "BF16")
    tensors = {name: Tensor(dtype, tuple(v.shape)) for name, v in tree_flatten(lazy_model(config).parameters())}
    return _model_shape(cfg, tensors)


def _quantizable(name: str, t: Tensor, group: int) -> bool:
    """What mlx-lm's quantize touches: Linear and Embedding weights whose rows split into groups."""
    return name.endswith(".weight") and len(t.shape) == 2 and "norm" not in name and t.shape[-1] % group == 0


def weight_bytes(shape: ModelShape, dtype_bytes: int, bits: int, group: int) -> float:
    """The weights as loaded: floats cast to the run's dtype; quantized ones (stored so, or
    quantized by the run) at bits/8 per parameter plus a scale and a bias per group."""
    total = 0.0
    for name, t in shape.tensors.items():
        if shape.quant_bits or t.dtype in ("U32", "I32", "U8"):
            total += t.size * (DTYPE_BYTES[t.dtype] if t.dtype in ("U32", "I32", "U8") else dtype_bytes)
        elif bits and _quantizable(name, t, group):
            total += t.size * (bits / 8 + 2 * dtype_bytes / group)
        else:
            total += t.size * dtype_bytes
    return total


def _in_features(shape: ModelShape, t: Tensor) -> int:
    return t.shape[-1] * 32 // shape.quant_bits if shape.quant_bits and t.dtype == "U32" else t.shape[-1]


def trainable_params(shape: ModelShape, run: "RunShape") -> int:
    """Every float parameter (full fine-tune), or the LoRA/DoRA adapters' A and B (and DoRA's
    magnitudes) on the target modules of the last lora_layers blocks ("all-linear": every
    matrix of a block, as the loader's target_keys reads it)."""
    if not run.lora:
        return sum(t.size for t in shape.tensors.values())
    adapted = run.lora_layers if 0 <= run.lora_layers <= shape.layers else shape.layers
    first = shape.layers - adapted
    total = 0
    for name, t in shape.tensors.items():
        parts = name.split(".")
        if not name.endswith(".weight") or "layers" not in parts:
            continue
        i = parts.index("layers")
        block, module = int(parts[i + 1]), ".".join(parts[i + 2:-1])
        targeted = len(t.shape) == 2 if run.lora_targets == ("all-linear",) else module in run.lora_targets
        if block >= first and targeted:
            out, inp = t.shape[0], _in_features(shape, t)
            total += run.lora_rank * (inp + out) + (out if run.dora else 0)
    return total


@dataclass(frozen=True)
class JudgeShape:
    """A judge reward's model and the requests it holds at once; sizes by formula, not measured."""

    model: ModelShape
    batch: int  # requests decoded at once
    tokens: int  # one request and its answer, at most


@dataclass(frozen=True)
class RunShape:
    """The run's values the memory depends on (from a Config by `run_shape`)."""

    dtype_bytes: int
    quantize_bits: int
    quantize_group: int
    lora: bool
    lora_rank: int
    lora_layers: int
    lora_targets: tuple[str, ...]
    dora: bool
    beta: float
    sequences: int  # decoded in one rollout: prompts_per_step * accumulation * G
    decode_batch: int  # generation.batch_size, 0 = all
    max_prompt: int
    max_new: int
    part_rows: int  # sequences of one accumulation part: prompts_per_step * G
    micro_batch: int  # 0 = the whole part
    grad_checkpoint: bool
    rollout_bits: int = 0  # generation.quantize_bits: a quantized copy of the policy samples; 0 = none
    shared_prefix: bool = False  # training.shared_prefix: each group's prompt runs once (algorithm/prefix.py)
    group_size: int = 1  # generation.num_generations: rows sharing one prompt
    judges: tuple[JudgeShape, ...] = ()  # judge rewards: held beside the policy, and their own phase
    # the rollout decodes with rollout/engine.py, not BatchGenerator (commands/plan.py resolves it
    # with the model; False, BatchGenerator's larger peak, where nothing did)
    compiled_rollout: bool = False


def run_shape(cfg, dtype: str = "float32") -> RunShape:
    """The RunShape of a Config; `dtype` is model.dtype resolved for this backend."""
    t, gen, lo = cfg.training, cfg.generation, cfg.lora
    return RunShape(
        dtype_bytes=FLOAT_BYTES[dtype], quantize_bits=cfg.model.quantize_bits,
        quantize_group=cfg.model.quantize_group_size, lora=lo.enabled, lora_rank=lo.rank,
        lora_layers=lo.num_layers, lora_targets=tuple(lo.target_modules), dora=lo.method == "dora",
        beta=cfg.grpo.beta,
        sequences=t.prompts_per_step * t.gradient_accumulation_steps * gen.num_generations,
        decode_batch=gen.batch_size, max_prompt=cfg.data.max_prompt_tokens, max_new=completion_cap(cfg),
        part_rows=t.prompts_per_step * gen.num_generations, micro_batch=t.micro_batch_size,
        grad_checkpoint=t.grad_checkpoint, rollout_bits=gen.quantize_bits, shared_prefix=t.shared_prefix,
        group_size=gen.num_generations,
    )
