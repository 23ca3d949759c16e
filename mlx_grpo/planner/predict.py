"""Predicted peak memory of a run, per phase (`predict`), and the single changes that would fit a
budget (`suggestions`), from a ModelShape and a RunShape (shapes.py) and the measured per-unit
constants (constants.py). What `mlx-grpo plan` prints and `train` checks first. Pure Python.
"""

from dataclasses import replace

from mlx_grpo.algorithm.columns import prefix_columns
from mlx_grpo.planner import constants as C
from mlx_grpo.planner.shapes import ModelShape, RunShape, trainable_params, weight_bytes

def _pad(n: int, to: int) -> int:
    return -(-n // to) * to


def _groups_in_chunk(rows: int, part_rows: int, group_size: int) -> int:
    """The most prompts one micro-batch holds: update/batches.py cuts each part (whole groups)
    into chunks of `rows` from its start, so a chunk not on a group boundary holds part of two."""
    return max(-(-min(lo + rows, part_rows) // group_size) - lo // group_size for lo in range(0, part_rows, rows))


def micro_batch_rows(run: RunShape) -> tuple[int, int]:
    """(rows, prompts) of the largest micro-batch: with shared prefixes under grad_checkpoint and
    LoRA update/batches.py never puts two groups in one."""
    rows = min(run.micro_batch or run.part_rows, run.part_rows)
    if run.shared_prefix and run.grad_checkpoint and run.lora:
        return min(rows, run.group_size), 1
    return rows, _groups_in_chunk(rows, run.part_rows, run.group_size)


def _shared_counts(run: RunShape, rows: int, groups: int) -> tuple[int, int, int, int]:
    """(prompt tokens, sum over them of the keys each attends over, completion inputs, the same
    over theirs) of a shared-prefix micro-batch of `rows` rows holding `groups` prompts: each
    prompt once, its P - 1 tokens padded to `prefix_columns`, each over as many keys, and rows x T
    completion inputs, each over the prompt's keys and the T completion ones."""
    P, T = prefix_columns(max(run.max_prompt - 1, 0)), _pad(run.max_new, C.PAD_TO)
    return groups * P, groups * P * P, rows * T, rows * T * (P + T)


def _layer_bytes(shape: ModelShape, tokens: int, attended: int, per_token: float | None = None,
                 per_key: float | None = None) -> float:
    """One layer's activations: per_token * hidden per token plus per_key * heads per key it attends over."""
    per_token = C.ACT_HIDDEN if per_token is None else per_token
    per_key = C.ACT_ATTENTION if per_key is None else per_key
    return per_token * shape.hidden * tokens + per_key * shape.heads * attended


def _shared_layer(shape: ModelShape, run: RunShape, rows: int, groups: int) -> tuple[float, float]:
    """One layer of a shared-prefix micro-batch: (its prompts' part, its completions' part)."""
    pt, pa, ct, ca = _shared_counts(run, rows, groups)
    return _layer_bytes(shape, pt, pa, C.PREFIX_HIDDEN, C.PREFIX_ATTENTION), _layer_bytes(shape, ct, ca)


def _plain_update(shape: ModelShape, run: RunShape, rows: int, groups: int) -> float:
    """Activations of a micro-batch without checkpointing. Padded: rows x L tokens, each over L."""
    if not run.shared_prefix:
        L = _pad(run.max_prompt + run.max_new, C.PAD_TO)
        return shape.layers * _layer_bytes(shape, rows * L, rows * L * L)
    prompts, completions = _shared_layer(shape, run, rows, groups)
    return max(shape.layers - 1, 0) * prompts + shape.layers * completions


def _checkpointed_update(shape: ModelShape, run: RunShape, rows: int, groups: int) -> float:
    """Activations of a micro-batch under grad_checkpoint, without the gradients."""
    if not run.shared_prefix:
        L = _pad(run.max_prompt + run.max_new, C.PAD_TO)
        recomputed = _layer_bytes(shape, rows * L, rows * L * L, C.CKPT_LAYERS * C.ACT_HIDDEN,
                                  C.CKPT_ATTENTION * C.ACT_ATTENTION)
        return C.CKPT_STORED * shape.layers * shape.hidden * rows * L + recomputed
    pt, _, ct, _ = _shared_counts(run, rows, groups)
    recomputed = sum(_shared_layer(shape, run, rows, groups))  # all groups run as one pass (prefix.py)
    per_token, layers = ((C.CKPT_SHARED_LORA_STORED, C.CKPT_SHARED_LORA_LAYERS) if run.lora
                         else (C.CKPT_SHARED_STORED, C.CKPT_SHARED_LAYERS))
    stored = per_token * shape.layers * shape.hidden * (pt + ct) + _key_copies(shape, run, rows)
    return stored + layers * recomputed


def _rollout_kv(shape: ModelShape, run: RunShape, decoding: int, b: int) -> float:
    """The rollout's peak above the weights: the compiled loop's buffers at their length and its
    decode logits, or BatchGenerator's cache, grown 256 tokens at a time."""
    per_token = shape.layers * shape.kv_heads * shape.head_dim * 2 * b
    if run.compiled_rollout:
        columns = _pad(max(run.max_prompt - 1, 0), C.PROMPT_BUCKET) + run.max_new
        logits = C.DECODE_LOGIT_COPIES * decoding * shape.vocab * 4
        return C.COMPILED_ROLLOUT_FACTOR * decoding * columns * per_token + logits
    return C.ROLLOUT_FACTOR * decoding * _pad(run.max_prompt + run.max_new, C.KV_STEP) * per_token


def _key_copies(shape: ModelShape, run: RunShape, rows: int) -> float:
    """Float32 bytes of every layer's keys and values over prompt + completion, one copy a row: the
    concatenation that the completion pass makes of the gathered prompt keys (prefix.py)."""
    keys = prefix_columns(max(run.max_prompt - 1, 0)) + _pad(run.max_new, C.PAD_TO)
    return shape.layers * rows * keys * shape.kv_heads * shape.head_dim * 2 * 4


def _judges(run: RunShape) -> tuple[float, float]:
    """(the judges' weights, the largest judge's KV cache), by formula: the KV cache of `batch`
    requests of `tokens` each, as the rollout's is counted (without its measured factor)."""
    b = run.dtype_bytes
    weights = sum(weight_bytes(j.model, b, 0, 64) for j in run.judges)
    kv = max((j.batch * _pad(j.tokens, C.KV_STEP) * j.model.layers * j.model.kv_heads * j.model.head_dim * 2 * b
              for j in run.judges), default=0.0)
    return weights, kv


def _logits(shape: ModelShape, run: RunShape, rows: int, T: int) -> float:
    """The completion logits an update holds (algorithm/chunked.py): all of them in one chunk, or
    about CHUNK_COPIES chunks past that, plus a trainable head's gradient accumulated over them."""
    positions = max(1, min(T, C.LOGITS_BUDGET // max(rows * shape.vocab, 1)))
    if positions >= T:
        return rows * T * shape.vocab * 4 * C.LOGIT_COPIES
    head_grad = 0.0 if run.lora else C.HEAD_GRAD_COPIES * shape.vocab * shape.hidden * 4
    return C.CHUNK_COPIES[run.shared_prefix] * rows * positions * shape.vocab * 4 + head_grad


def predict(shape: ModelShape, run: RunShape) -> dict[str, float]:
    """Bytes of each phase, and `peak`: what stays (weights, adapters, AdamW state, reference, a
    judge's weights) plus the largest of the rollout, the update and a judge's answering."""
    b = run.dtype_bytes
    weights = weight_bytes(shape, b, run.quantize_bits, run.quantize_group)
    trainable = trainable_params(shape, run)
    adapters = trainable * 4 if run.lora else 0.0  # adapters are float32 whatever the base's dtype
    # AdamW's moments are float32; a 2-byte full fine-tune adds a float32 master copy (update/optimizer.py)
    optimizer = trainable * (12 if b == 2 and not run.lora else 8)
    reference = weights if run.beta > 0 and not run.lora else 0.0
    # generation.quantize_bits: the quantized copy (rollout/quantized.py, group size 64) is held
    # from one update to the next; the formula, not a measurement
    copy = weight_bytes(shape, b, run.rollout_bits, 64) if run.rollout_bits else 0.0
    decoding = min(run.decode_batch or run.sequences, run.sequences)
    rollout_kv = _rollout_kv(shape, run, decoding, b)
    rows, groups = micro_batch_rows(run)
    T = _pad(run.max_new, C.PAD_TO)
    half = C.ACT_HALF if b == 2 else 1.0
    if run.grad_checkpoint:
        stored = _checkpointed_update(shape, run, rows, groups) * half
        lora = C.LORA_CHECKPOINTED if run.lora and not run.shared_prefix else 1.0  # the shared fit has LoRA in it
        micro = (stored + C.CKPT_GRADS * trainable * b) * lora
    else:
        micro = _plain_update(shape, run, rows, groups) * (C.LORA_PLAIN if run.lora else 1.0) * half
    # over several micro-batches the gradient summed so far sits beside the next one's (update/step.py)
    passes = -(-run.part_rows // rows) * (run.sequences // run.part_rows)
    activations = max(micro + (trainable * b if passes > 1 else 0.0), C.OPTIMIZER_STEP * trainable * b)
    logits = _logits(shape, run, rows, T)
    phases = {
        "weights": weights, "adapters": adapters, "optimizer state": optimizer, "reference": reference,
        "rollout copy": copy, "rollout KV cache": rollout_kv, "update activations": activations, "logits": logits,
    }
    judge_weights, judge_kv = _judges(run)
    held = weights + adapters + optimizer + reference + copy + judge_weights
    phases["rollout"] = held + phases["rollout KV cache"]
    phases["update"] = held + activations + logits
    if run.judges:
        phases.update({"judge weights": judge_weights, "judge KV cache": judge_kv, "judging": held + judge_kv})
    phases["peak"] = max(phases["rollout"], phases["update"], phases.get("judging", 0.0))
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
            # a batch that splits a group is BatchGenerator's (rollout/sample.py)
            compiled = run.compiled_rollout and gb % run.group_size == 0
            tries.append((f"generation.batch_size={gb}", replace(run, decode_batch=gb, compiled_rollout=compiled)))
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
