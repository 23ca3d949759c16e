"""Predicted peak memory of a run, per phase, from config.json and the safetensors headers
alone (no weight is loaded): what `mlx-grpo plan` prints and `train` checks first.

Every per-unit constant below was measured on MLX's CPU backend (float32, mlx 0.32.4,
mlx-lm 0.32.2) with `uv run python scripts/measure_memory.py`, on builtin:tiny (4 layers x
128) and builtin:small (8 x 512) fitted together; each says where it comes from. Pure
Python: json and struct only.
"""

from dataclasses import dataclass, field, replace
import json
import math
from pathlib import Path
import struct

# Bytes per element of each safetensors dtype.
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "U32": 4, "I16": 2,
               "U16": 2, "I8": 1, "U8": 1, "BOOL": 1}
FLOAT_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}

# Update (forward + backward + gradient accumulation of one micro-batch, real GRPO loss, through
# update/step.py's `optimize`, training.shared_prefix off), bytes per token per layer = ACT_HIDDEN *
# hidden + ACT_ATTENTION * heads * L (L: padded sequence length). Least squares over relative error
# on the 10 grid points where the micro-batch decides the peak (tiny 4-8 rows x 64-256 tokens, small
# 4-8 x 128-256); worst point 9.3% off. The gradients this pass holds are inside the fit.
ACT_HIDDEN = 111.7
ACT_ATTENTION = 7.686
# grad_checkpoint: bytes per token = CKPT_STORED * layers * hidden (each block's kept input) +
# CKPT_LAYERS plain layers' ACT_HIDDEN part and CKPT_ATTENTION plain layers' ACT_ATTENTION part (the
# block being recomputed and its gradient) + CKPT_GRADS * the trainable parameters' bytes; the grid
# with checkpointing on, and 8 x 384, 4 x 512 (12 points), worst 2.6% off. One multiple of a whole
# layer (2.33, fitted to 256 tokens) over-predicted LoRA at 384 tokens by 18-23%: the recomputed
# block's attention scores are held fewer times than its other activations.
CKPT_STORED = 5.328
CKPT_LAYERS = 2.604
CKPT_ATTENTION = 1.641
CKPT_GRADS = 0.468
# Shared prefix (training.shared_prefix, algorithm/prefix.py): each group's prompt runs once, with
# no head, and its last layer feeds only its keys and values, so a prompt token counts over
# layers - 1 at PREFIX_HIDDEN * hidden + PREFIX_ATTENTION * heads per key (P - 1 tokens over P - 1
# keys); each completion input counts over all layers at ACT_HIDDEN, ACT_ATTENTION, over the
# prompt's keys and its own. Least squares by `scripts/measure_memory.py shared` (tiny and small,
# G 2-8, 1-8 prompts, prompts 32-320, completions 32-96; 28 points), the completions held at the
# padded constants: -11.0% to +12.8% off. A prompt token charged as a padded one (ACT_HIDDEN, all
# layers) over-predicted 333-token prompts by 37%; it holds as much per key, less per token.
PREFIX_HIDDEN = 81.49
PREFIX_ATTENTION = 7.510
# grad_checkpoint with shared prefixes: bytes per token (prompt tokens once, completion inputs) =
# CKPT_SHARED_STORED * layers * hidden, plus each layer's concatenated prompt + completion keys and
# values for every row (a checkpointed block's outputs, kept to the backward: counted, not fitted;
# a trial fit with them free gave 0.97 of that), plus CKPT_SHARED_LAYERS plain layers of one group's
# passes (prefix.py runs each group apart, so the recomputation holds one group's), plus
# CKPT_GRADS * the gradients: least squares by `scripts/measure_memory.py shared` (tiny full and
# LoRA r8, small full; 27 points): -15.8% to +19.8% off, the scatter mostly tiny's full fine-tunes
# (36 MB at 16 rows x 96 tokens, below LoRA's 40 at the same shape).
CKPT_SHARED_STORED = 25.90
CKPT_SHARED_LAYERS = 1.120
# LoRA (rank 8, all layers) on the same grid, measured / the formulas above with its trainable
# parameters: 0.948 plain (points 0.87-1.04), 0.887 checkpointed (0.84-0.95, the longer grid). Under
# shared prefixes the checkpointed fit below takes LoRA's points in and no ratio.
LORA_PLAIN = 0.948
LORA_CHECKPOINTED = 0.887
# The same update's activations in a 2-byte dtype (bfloat16, float16), as a share of float32's:
# 0.557 and 0.553 on builtin:small (full fine-tune, 8 x 128 and 8 x 256 tokens; bfloat16 / float32
# peak above the weights, this CPU backend), applied to LoRA and grad checkpointing unmeasured.
ACT_HALF = 0.555
# The optimizer part of an update (accumulated, clipped gradients and AdamW's temporaries), in
# trainable-parameter bytes above weights + AdamW state: 239 MB / 101.4 MB on builtin:small,
# where short micro-batches stop growing the peak below it.
OPTIMIZER_STEP = 2.36
# Rollout peak above the weights / the KV cache at mlx-lm's 256-token allocation step: 2.08 on
# builtin:small (1.38-2.31 over 3 shapes and two runs; builtin:tiny 1.24-1.57): the batch cache is built by
# copying the per-prompt caches, and the decode step's logits come on top.
ROLLOUT_FACTOR = 2.08
KV_STEP = 256
# Completion logits held at the update's peak, in float32 [rows, T, vocab] arrays: 3 (the logits,
# their gradient, the entropy's softmax, as the code reads), and measured 3.00 by
# `scripts/measure_memory.py logits` (the peak's growth from a 8,192- to a 65,536-token vocabulary,
# 8 rows x 96 and 4 x 192 completion tokens, a 2 x 64 random qwen2). On the built-ins' 322-token vocabulary
# they are under 3% of the update and inside ACT_HIDDEN.
LOGIT_COPIES = 3
PAD_TO = 32  # update/batches.py pads sequences to a multiple of 32
GB = 1e9


class PlanError(ValueError):
    pass


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


def read_header(path: Path) -> dict[str, Tensor]:
    """The tensors of one safetensors file: an 8-byte little-endian length, then a JSON header."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    return {k: Tensor(v["dtype"], tuple(v["shape"])) for k, v in header.items() if k != "__metadata__"}


def read_model_shape(folder) -> ModelShape:
    """config.json and every model*.safetensors header of a local model folder."""
    folder = Path(folder)
    try:
        cfg = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise PlanError(f"model.path: cannot read {folder / 'config.json'} ({e})") from e
    cfg = {**cfg.get("text_config", {}), **cfg}
    files = sorted(folder.glob("model*.safetensors"))
    if not files:
        raise PlanError(f"model.path: {folder} has no model*.safetensors to read the shapes from")
    tensors = {}
    for f in files:
        tensors.update(read_header(f))
    heads = cfg["num_attention_heads"]
    q = cfg.get("quantization") or {}
    return ModelShape(
        layers=cfg["num_hidden_layers"], hidden=cfg["hidden_size"], heads=heads,
        kv_heads=cfg.get("num_key_value_heads", heads),
        head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads, vocab=cfg["vocab_size"],
        tensors=tensors, quant_bits=q.get("bits", 0), quant_group=q.get("group_size", 64),
    )


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
    magnitudes) on the target modules of the last lora_layers blocks."""
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
        if block >= first and module in run.lora_targets:
            out, inp = t.shape[0], _in_features(shape, t)
            total += run.lora_rank * (inp + out) + (out if run.dora else 0)
    return total


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


def run_shape(cfg, dtype: str = "float32") -> RunShape:
    """The RunShape of a Config; `dtype` is model.dtype resolved for this backend."""
    t, gen, lo = cfg.training, cfg.generation, cfg.lora
    return RunShape(
        dtype_bytes=FLOAT_BYTES[dtype], quantize_bits=cfg.model.quantize_bits,
        quantize_group=cfg.model.quantize_group_size, lora=lo.enabled, lora_rank=lo.rank,
        lora_layers=lo.num_layers, lora_targets=tuple(lo.target_modules), dora=lo.method == "dora",
        beta=cfg.grpo.beta,
        sequences=t.prompts_per_step * t.gradient_accumulation_steps * gen.num_generations,
        decode_batch=gen.batch_size, max_prompt=cfg.data.max_prompt_tokens, max_new=gen.max_new_tokens,
        part_rows=t.prompts_per_step * gen.num_generations, micro_batch=t.micro_batch_size,
        grad_checkpoint=t.grad_checkpoint, rollout_bits=gen.quantize_bits, shared_prefix=t.shared_prefix,
        group_size=gen.num_generations,
    )


def _pad(n: int, to: int) -> int:
    return -(-n // to) * to


def _groups_in_chunk(rows: int, part_rows: int, group_size: int) -> int:
    """The most prompts one micro-batch holds: update/batches.py cuts each part (whole groups)
    into chunks of `rows` from its start, so a chunk not on a group boundary holds part of two."""
    return max(-(-min(lo + rows, part_rows) // group_size) - lo // group_size for lo in range(0, part_rows, rows))


def _shared_counts(run: RunShape, rows: int, groups: int) -> tuple[int, int, int, int]:
    """(prompt tokens, sum over them of the keys each attends over, completion inputs, the same
    over theirs) of a shared-prefix micro-batch of `rows` rows holding `groups` prompts: each
    prompt once, P - 1 tokens over P - 1 keys (not padded), and rows x T completion inputs, each
    over the prompt's P - 1 keys and the T completion ones."""
    P, T = max(run.max_prompt - 1, 0), _pad(run.max_new, PAD_TO)
    return groups * P, groups * P * P, rows * T, rows * T * (P + T)


def _layer_bytes(shape: ModelShape, tokens: int, attended: int, per_token: float = ACT_HIDDEN,
                 per_key: float = ACT_ATTENTION) -> float:
    """One layer's activations: per_token * hidden per token plus per_key * heads per key it attends over."""
    return per_token * shape.hidden * tokens + per_key * shape.heads * attended


def _shared_layer(shape: ModelShape, run: RunShape, rows: int, groups: int) -> tuple[float, float]:
    """One layer of a shared-prefix micro-batch: (its prompts' part, its completions' part)."""
    pt, pa, ct, ca = _shared_counts(run, rows, groups)
    return _layer_bytes(shape, pt, pa, PREFIX_HIDDEN, PREFIX_ATTENTION), _layer_bytes(shape, ct, ca)


def _plain_update(shape: ModelShape, run: RunShape, rows: int, groups: int) -> float:
    """Activations of a micro-batch without checkpointing. Padded: rows x L tokens, each over L."""
    if not run.shared_prefix:
        L = _pad(run.max_prompt + run.max_new, PAD_TO)
        return shape.layers * _layer_bytes(shape, rows * L, rows * L * L)
    prompts, completions = _shared_layer(shape, run, rows, groups)
    return max(shape.layers - 1, 0) * prompts + shape.layers * completions


def _checkpointed_update(shape: ModelShape, run: RunShape, rows: int, groups: int) -> float:
    """Activations of a micro-batch under grad_checkpoint, without the gradients."""
    if not run.shared_prefix:
        L = _pad(run.max_prompt + run.max_new, PAD_TO)
        recomputed = _layer_bytes(shape, rows * L, rows * L * L, CKPT_LAYERS * ACT_HIDDEN,
                                  CKPT_ATTENTION * ACT_ATTENTION)
        return CKPT_STORED * shape.layers * shape.hidden * rows * L + recomputed
    pt, _, ct, _ = _shared_counts(run, rows, groups)
    one = sum(_shared_layer(shape, run, min(run.group_size, rows), 1))
    stored = CKPT_SHARED_STORED * shape.layers * shape.hidden * (pt + ct) + _key_copies(shape, run, rows)
    return stored + CKPT_SHARED_LAYERS * one


def _key_copies(shape: ModelShape, run: RunShape, rows: int) -> float:
    """Float32 bytes of every layer's keys and values over prompt + completion, one copy a row: the
    concatenation that the completion pass makes of the broadcast prompt keys (prefix.py)."""
    keys = max(run.max_prompt - 1, 0) + _pad(run.max_new, PAD_TO)
    return shape.layers * rows * keys * shape.kv_heads * shape.head_dim * 2 * 4


def predict(shape: ModelShape, run: RunShape) -> dict[str, float]:
    """Bytes of each phase, and `peak`: what stays (weights, adapters, AdamW state, reference)
    plus the larger of the rollout and the update."""
    b = run.dtype_bytes
    weights = weight_bytes(shape, b, run.quantize_bits, run.quantize_group)
    trainable = trainable_params(shape, run)
    adapters = trainable * b if run.lora else 0.0
    optimizer = 2 * trainable * b  # AdamW's two moments, in the parameters' dtype
    reference = weights if run.beta > 0 and not run.lora else 0.0
    # generation.quantize_bits: the quantized copy (rollout/quantized.py, group size 64) is held
    # from one update to the next; the formula, not a measurement
    copy = weight_bytes(shape, b, run.rollout_bits, 64) if run.rollout_bits else 0.0
    decoding = min(run.decode_batch or run.sequences, run.sequences)
    slots = _pad(run.max_prompt + run.max_new, KV_STEP)
    kv = decoding * slots * shape.layers * shape.kv_heads * shape.head_dim * 2 * b
    rows = min(run.micro_batch or run.part_rows, run.part_rows)
    T = _pad(run.max_new, PAD_TO)
    groups = _groups_in_chunk(rows, run.part_rows, run.group_size)
    half = ACT_HALF if b == 2 else 1.0
    if run.grad_checkpoint:
        stored = _checkpointed_update(shape, run, rows, groups) * half
        lora = LORA_CHECKPOINTED if run.lora and not run.shared_prefix else 1.0  # the shared fit has LoRA in it
        micro = (stored + CKPT_GRADS * trainable * b) * lora
    else:
        micro = _plain_update(shape, run, rows, groups) * (LORA_PLAIN if run.lora else 1.0) * half
    activations = max(micro, OPTIMIZER_STEP * trainable * b)
    logits = rows * T * shape.vocab * 4 * LOGIT_COPIES
    phases = {
        "weights": weights, "adapters": adapters, "optimizer state": optimizer, "reference": reference,
        "rollout copy": copy, "rollout KV cache": kv * ROLLOUT_FACTOR, "update activations": activations, "logits": logits,
    }
    held = weights + adapters + optimizer + reference + copy
    phases["rollout"] = held + phases["rollout KV cache"]
    phases["update"] = held + activations + logits
    phases["peak"] = max(phases["rollout"], phases["update"])
    return phases


def suggestions(shape: ModelShape, run: RunShape, budget: float) -> list[tuple[str, float]]:
    """Single changes, each as (--set items, predicted peak bytes), that bring the peak under
    `budget`, smallest change first; empty when none does."""
    rows = min(run.micro_batch or run.part_rows, run.part_rows)
    tries = []
    for mb in (rows // 2, rows // 4, 1):
        if 1 <= mb < rows:
            tries.append((f"training.micro_batch_size={mb}", replace(run, micro_batch=mb)))
    decoding = min(run.decode_batch or run.sequences, run.sequences)
    for gb in (decoding // 2, decoding // 4):
        if 1 <= gb < decoding:
            tries.append((f"generation.batch_size={gb}", replace(run, decode_batch=gb)))
    if not run.grad_checkpoint:
        tries.append(("training.grad_checkpoint=true", replace(run, grad_checkpoint=True)))
    if not run.lora:
        tries.append(("lora.enabled=true", replace(run, lora=True)))
    if run.lora and not run.quantize_bits and not shape.quant_bits:
        tries.append(("model.quantize_bits=4", replace(run, quantize_bits=4)))
    if not run.lora:
        tries.append(("lora.enabled=true model.quantize_bits=4", replace(run, lora=True, quantize_bits=4)))
    for n in (run.max_new // 2, run.max_new // 4):
        if n >= 1:
            tries.append((f"generation.max_new_tokens={n}", replace(run, max_new=n)))
    if run.max_prompt >= 2:
        tries.append((f"data.max_prompt_tokens={run.max_prompt // 2}", replace(run, max_prompt=run.max_prompt // 2)))
    out = []
    for text, changed in tries:
        peak = predict(shape, changed)["peak"]
        if peak <= budget:
            out.append((text, peak))
    return out
