"""The physical limit under `mlx-grpo bench`: what this machine's MLX backend does at best (a large
matmul's FLOP/s, a large copy's bytes/s), and how much of it the rollout and the update achieve.

The work is counted from the model's linear layers (a quantized layer at its unpacked size): a
token through the blocks costs 2 FLOPs per weight of their linear layers, a scored or sampled
position 2 per weight of the output head. Attention's score and value products are left out, so
the counts are lower bounds (a few per cent at GRPO's lengths and these widths). The update's
backward costs twice its forward for a full fine-tune (gradients of inputs and weights) and once
for LoRA (inputs only; the adapters' own products are too small to count); the recomputed chunked
logits are not counted as work. A decode step reads every weight once, so the rollout's bytes are
the weights' bytes times its decode steps (the KV cache's reads left out: a lower bound again).
"""

import time

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten


def _dims(module) -> tuple[int, int] | None:
    """(inputs, outputs) of a linear or embedding layer at its unpacked size; None for others."""
    if isinstance(module, nn.QuantizedLinear):
        return module.weight.shape[1] * 32 // module.bits, module.weight.shape[0]
    if isinstance(module, nn.Linear):
        return module.weight.shape[1], module.weight.shape[0]
    if isinstance(module, nn.QuantizedEmbedding):
        return module.weight.shape[1] * 32 // module.bits, module.weight.shape[0]
    if isinstance(module, nn.Embedding):
        return module.weight.shape[1], module.weight.shape[0]
    return None


def model_flops(model) -> dict:
    """FLOPs per token through the blocks' linear layers, and per position through the head
    (an lm_head layer, or the largest embedding read as the tied head)."""
    body = head = embed = 0
    for name, module in model.named_modules():
        if "lora_a" in name or not (dims := _dims(module)):
            continue
        weights = dims[0] * dims[1]
        if isinstance(module, (nn.Embedding, nn.QuantizedEmbedding)):
            embed = max(embed, weights)
        elif name.split(".")[-1] == "lm_head":
            head += weights
        else:
            body += weights
    return {"body_per_token": 2 * body, "head_per_position": 2 * (head or embed)}


def update_flops(flops: dict, body_tokens: int, scored_positions: int, lora: bool) -> float:
    """Forward and backward of the update: body_tokens through the blocks (a shared prompt counted
    once), scored_positions through the head."""
    forward = flops["body_per_token"] * body_tokens + flops["head_per_position"] * scored_positions
    return forward * (2 if lora else 3)


def rollout_flops(flops: dict, prompt_tokens: int, sampled: int) -> float:
    """Each distinct prompt prefilled once, each sampled token decoded through body and head."""
    return flops["body_per_token"] * (prompt_tokens + sampled) + flops["head_per_position"] * sampled


def _seconds(fn, repeats: int) -> float:
    mx.eval(fn())  # warm-up: allocation, kernel selection
    best = float("inf")
    for _ in range(repeats):
        tic = time.perf_counter()
        mx.eval(fn())
        best = min(best, time.perf_counter() - tic)
    return best


def matmul_rate(dtype=mx.float32, n: int = 2048, repeats: int = 3) -> float:
    """FLOP/s of an n x n by n x n matmul in dtype, the best of `repeats`."""
    a = mx.random.normal((n, n)).astype(dtype)
    b = mx.random.normal((n, n)).astype(dtype)
    mx.eval(a, b)
    return 2 * n**3 / _seconds(lambda: a @ b, repeats)


def copy_rate(mbytes: int = 256, repeats: int = 3) -> float:
    """Bytes/s of reading and writing a float32 array of about `mbytes` MB (x + 1), each repeat
    writing into the buffer the one before freed. MLX caches freed buffers only up to 32 MiB on the
    CPU backend, so without a cache that holds it every repeat gets fresh pages from the kernel, and
    the probe timed the page faults: 3.3 GB/s where the reused buffer gives 29 GB/s (2-core EPYC)."""
    x = mx.zeros((mbytes * 2**20 // 4,), dtype=mx.float32)
    mx.eval(x)
    limit = mx.set_cache_limit(0)
    mx.set_cache_limit(max(limit, 2 * x.nbytes))
    try:
        return 2 * x.nbytes / _seconds(lambda: x + 1, repeats)
    finally:
        mx.set_cache_limit(limit)
        mx.clear_cache()  # the probe's buffer goes, not kept past the limit


def machine_limits(dtype) -> dict:
    """This backend's matmul FLOP/s in float32 and in the model's dtype, and its copy bytes/s."""
    limits = {"matmul_float32_flops": matmul_rate(mx.float32), "copy_bytes_per_s": copy_rate()}
    if dtype != mx.float32:  # a smaller matmul: bfloat16 runs about 10x slower on the CPU backend
        limits[f"matmul_{str(dtype).split('.')[-1]}_flops"] = matmul_rate(dtype, n=1024)
    return limits


def achieved(model, rollout, step: dict, lora: bool, shared_prefix: bool, limits: dict) -> dict:
    """The step's rollout and update as FLOP/s and bytes/s, and as shares of this machine's best."""
    flops = model_flops(model)
    g = rollout.group_size
    prompts = sum(len(p) for p in rollout.prompt_tokens)
    sampled = sum(len(c) for c in rollout.completion_tokens)
    body = (prompts // g if shared_prefix else prompts) + sampled
    dtype = compute_dtype(model)
    rate = limits.get(f"matmul_{str(dtype).split('.')[-1]}_flops", limits["matmul_float32_flops"])
    weight_bytes = sum(v.nbytes for _, v in _weights(model))
    decode_steps = max(len(c) for c in rollout.completion_tokens)
    out = {
        "update_flops": update_flops(flops, body, sampled, lora),
        "rollout_flops": rollout_flops(flops, prompts // g, sampled),
        "rollout_weight_bytes": weight_bytes * decode_steps,
    }
    out["update_flops_per_s"] = out["update_flops"] / step["update_s"]
    out["rollout_flops_per_s"] = out["rollout_flops"] / step["rollout_s"]
    out["rollout_bytes_per_s"] = out["rollout_weight_bytes"] / step["rollout_s"]
    out["update_share_of_matmul"] = out["update_flops_per_s"] / rate
    out["rollout_share_of_matmul"] = out["rollout_flops_per_s"] / rate
    out["rollout_share_of_copy"] = out["rollout_bytes_per_s"] / limits["copy_bytes_per_s"]
    return out


def _weights(model):
    return [(k, v) for k, v in tree_flatten(model.parameters()) if "lora_" not in k]


def compute_dtype(model):
    """The dtype the model computes in: its first floating-point weight's (a quantized layer's
    scales when the weights are packed)."""
    return next(v.dtype for _, v in _weights(model) if mx.issubdtype(v.dtype, mx.floating))


def format_achieved(r: dict) -> list[str]:
    a, lim = r["achieved"], r["machine"]
    rates = ", ".join(f"{k.removeprefix('matmul_').removesuffix('_flops')} {v / 1e9:.1f}"
                      for k, v in lim.items() if k.startswith("matmul_"))
    return [
        f"machine: matmul GFLOP/s {rates}; copy {lim['copy_bytes_per_s'] / 1e9:.1f} GB/s",
        f"{'update GFLOP/s':24}{a['update_flops_per_s'] / 1e9:10.2f}   {a['update_share_of_matmul']:.3f} of the matmul rate",
        f"{'rollout GFLOP/s':24}{a['rollout_flops_per_s'] / 1e9:10.2f}   {a['rollout_share_of_matmul']:.3f} of the matmul rate; "
        f"weights read {a['rollout_bytes_per_s'] / 1e9:.2f} GB/s, {a['rollout_share_of_copy']:.3f} of the copy rate",
    ]
