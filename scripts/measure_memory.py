"""The per-unit memory constants of mlx_grpo/models/memory.py, from MLX's memory counters.

    uv run python scripts/measure_memory.py           # tiny and small, fitted together

Prints, for builtin:NAME (float32, this backend):
- weights and weights + AdamW state, bytes per parameter;
- the update's forward+backward above the weights (activations and gradients, the real GRPO
  loss of update/step.py) on a grid of micro-batches, fitted per token per layer as
  A * hidden + B * heads * L + C (L = padded sequence length) over both models: A, B, C
  without and with grad checkpointing;
- the rollout above the weights (mlx-lm's BatchGenerator, one prefill per prompt), as a
  multiple of the KV cache's own bytes at mlx-lm's 256-token allocation step.
"""

import sys

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten

from mlx_grpo.commands.setup import build_policy
from mlx_grpo.config import load_config
from mlx_grpo.models.load import checkpoint_layers
from mlx_grpo.rollout.sample import generate_completions, make_rollout_sampler

GRID = [(4, 64), (8, 64), (4, 128), (8, 128), (4, 256), (8, 256)]  # (rows, padded length L)


def update_peaks(model, cfg) -> dict:
    """(rows, L) -> bytes one update (update/step.py's `optimize`: forward, backward, gradient
    accumulation, clipping, AdamW) adds above what is allocated before it, optimizer state made."""
    from mlx_grpo.rollout.sample import Rollout
    from mlx_grpo.update.optimizer import make_optimizer
    from mlx_grpo.update.settings import UpdateSettings
    from mlx_grpo.update.step import optimize

    vocab = model.args.vocab_size
    optimizer = make_optimizer(cfg.training, 100)
    settings = UpdateSettings.from_config(cfg)
    rng = np.random.default_rng(0)
    peaks = {}
    for rows, length in [(4, 64)] + GRID:  # the first makes the optimizer state, and is measured again
        prompt = rng.integers(3, vocab, length // 2).tolist()
        completions = [rng.integers(3, vocab, length // 2 - 1).tolist() for _ in range(rows)]
        rollout = Rollout([prompt] * rows, completions, [""] * rows, [False] * rows, rows)
        rewards = np.linspace(0, 1, rows).tolist()
        mx.eval(model.parameters())
        base = mx.get_active_memory()
        mx.reset_peak_memory()
        optimize(model, optimizer, None, rollout, rewards, settings)
        peaks[rows, length] = mx.get_peak_memory() - base
    return peaks


def points(peaks: dict, layers: int, hidden: int, heads: int, grads: int) -> list[tuple]:
    """([hidden, heads * L, 1], (peak - 3 gradients) / (rows * L * layers)) per grid point:
    the gradients are held three times at the update's peak (a micro-batch's, scaled, clipped)."""
    for (rows, length), p in peaks.items():
        print(f"    {rows} x {length}: {p / 1e6:.1f} MB")
    return [([hidden, heads * length, 1.0], (p - 3 * grads) / (rows * length * layers))
            for (rows, length), p in peaks.items()]


def fit(pts: list[tuple]) -> list[float]:
    """A, B, C of bytes per token per layer = A * hidden + B * heads * L + C, least squares over
    relative errors (so that tiny and small weigh alike)."""
    xs = np.array([x for x, y in pts]) / np.array([[y] for x, y in pts])
    coef, *_ = np.linalg.lstsq(xs, np.ones(len(pts)), rcond=None)
    worst = max(abs(float(np.dot(coef, x)) / y - 1) for x, y in pts)
    print(f"  A = {coef[0]:.2f}, B = {coef[1]:.3f}, C = {coef[2]:.0f}; worst grid point off by {worst:.0%}")
    return [float(c) for c in coef]


def rollout_factor(model, tokenizer, args) -> float:
    """Rollout peak above the weights / the KV cache bytes at mlx-lm's 256-token step."""
    rng = np.random.default_rng(1)
    ratios = []
    for prompts, G, prompt_len, new in ((2, 8, 40, 32), (4, 4, 200, 64), (2, 8, 300, 32)):
        ids = [rng.integers(3, args.vocab_size, prompt_len).tolist() for _ in range(prompts)]
        base = mx.get_active_memory()
        mx.reset_peak_memory()
        generate_completions(model, tokenizer, ids, num_generations=G, max_new_tokens=new,
                             sampler=make_rollout_sampler(1.0, 1.0, 0, 0.0))
        extra = mx.get_peak_memory() - base
        head_dim = args.hidden_size // args.num_attention_heads
        slots = -(-(prompt_len + new) // 256) * 256
        kv = prompts * G * slots * args.num_hidden_layers * args.num_key_value_heads * head_dim * 2 * 4
        ratios.append(extra / kv)
        print(f"  rollout {prompts} prompts x G {G}, prompt {prompt_len} + {new}: {extra / 1e6:.1f} MB "
              f"= {extra / kv:.2f} x the KV cache's {kv / 1e6:.1f} MB")
    return float(np.mean(ratios))


def measure(name: str) -> tuple[list, list]:
    cfg = load_config(None, [f'model.path="builtin:{name}"'])
    model, tokenizer, *_ = build_policy(cfg)
    mx.eval(model.parameters())
    params = sum(v.size for _, v in tree_flatten(model.parameters()))
    args = model.args
    shape = args.num_hidden_layers, args.hidden_size, args.num_attention_heads, 4 * params
    print(f"{name}: {params:,} parameters, {shape[0]} layers x {shape[1]} hidden, {shape[2]} heads; "
          f"weights {mx.get_active_memory() / params:.2f} B/param")
    print(f"  rollout factor (mean): {rollout_factor(model, tokenizer, args):.2f}")
    plain = points(update_peaks(model, cfg), *shape)
    print(f"  weights + AdamW state {mx.get_active_memory() / params:.2f} B/param")
    checkpoint_layers(model)
    return plain, points(update_peaks(model, cfg), *shape)


def main(names: list[str]):
    plain, ckpt = [], []
    for name in names:
        p, c = measure(name)
        plain += p
        ckpt += c
    print("update, plain (bytes per token per layer):")
    fit(plain)
    print("update, grad_checkpoint:")
    fit(ckpt)


if __name__ == "__main__":
    main(sys.argv[1:] or ["tiny", "small"])
