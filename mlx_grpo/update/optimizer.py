"""The optimizer: bias-corrected AdamW under transformers' learning-rate schedules."""

import math

import mlx.core as mx
import mlx.optimizers as optim


def make_lr_schedule(tcfg, total_updates: int):
    """Linear warmup from lr/warmup (never 0) to lr, then linear or cosine decay to 0 at
    `total_updates` (transformers' formulas), or constant.

    `tcfg` is the `[training]` section; `warmup_steps` counts optimizer updates, and a value in
    (0, 1) is that share of all updates.
    """
    lr = tcfg.learning_rate
    w = tcfg.warmup_steps
    warmup = round(w * total_updates) if 0 < w < 1 else int(w)
    decay_steps = max(total_updates - warmup, 1)

    def schedule(step):
        step = step.astype(mx.float32)
        warm = lr * mx.minimum((step + 1) / max(warmup, 1), 1.0)
        if tcfg.lr_schedule == "constant":
            return warm
        progress = mx.clip((step - warmup) / decay_steps, 0.0, 1.0)
        if tcfg.lr_schedule == "cosine":
            decayed = lr * 0.5 * (1 + mx.cos(math.pi * progress))
        else:
            decayed = lr * (1 - progress)
        return mx.where(step < warmup, warm, decayed)

    return schedule


def make_optimizer(tcfg, total_updates: int):
    """AdamW with bias correction, as PyTorch's (and TRL's): MLX's default leaves it off, which
    makes the first updates 1.85-2.1x larger at the same learning rate."""
    return optim.AdamW(
        learning_rate=make_lr_schedule(tcfg, total_updates), betas=list(tcfg.adam_betas),
        weight_decay=tcfg.weight_decay, bias_correction=True,
    )
