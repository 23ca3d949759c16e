"""Bytes per parameter and per token of a full fine-tune, from MLX's memory counters.

    uv run python scripts/measure_memory.py small     # or tiny

The README's memory table is computed from what this prints (float32, this backend).
"""

import sys

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten

from mlx_grpo.config import load_config
from mlx_grpo.algorithm.loss import token_logprobs
from mlx_grpo.commands.setup import build_policy

LENGTH, COMPLETION = 128, 64


def batch(rows: int, vocab: int):
    x = np.random.default_rng(0).integers(0, vocab, (rows, LENGTH))
    positions = np.tile(np.arange(LENGTH - COMPLETION - 1, LENGTH - 1), (rows, 1))
    return mx.array(x), mx.array(positions), mx.array(x[:, LENGTH - COMPLETION:])


def main(name: str):
    model, *_ = build_policy(load_config(None, [f'model.path="builtin:{name}"']))
    mx.eval(model.parameters())
    params = sum(v.size for _, v in tree_flatten(model.parameters()))
    args = model.args
    weights = mx.get_active_memory()
    value_and_grad = nn.value_and_grad(model, lambda m, *b: -token_logprobs(m, *b).sum())
    optimizer = optim.AdamW(learning_rate=1e-5)
    _, grads = value_and_grad(model, *batch(1, args.vocab_size))
    optimizer.update(model, grads)
    mx.eval(model.parameters(), optimizer.state)
    del grads
    print(f"{name}: {params:,} parameters, {args.num_hidden_layers} layers x {args.hidden_size} hidden; "
          f"weights {weights / params:.2f} B/param, weights + AdamW {mx.get_active_memory() / params:.2f} B/param")
    peaks = {}
    for rows in (2, 8):
        b = batch(rows, args.vocab_size)
        mx.eval(b)
        base = mx.get_active_memory()
        mx.reset_peak_memory()
        loss, grads = value_and_grad(model, *b)
        mx.eval(loss, grads)
        peaks[rows] = mx.get_peak_memory() - base
        del loss, grads
    per_token = (peaks[8] - peaks[2]) / (6 * LENGTH)
    print(f"forward+backward: {per_token / 1e3:.1f} kB per token = "
          f"{per_token / (args.num_hidden_layers * args.hidden_size):.1f} B per token per layer per hidden unit")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "small")
