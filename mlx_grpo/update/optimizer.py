"""The optimizer: bias-corrected AdamW under transformers' learning-rate schedules, with float32
master weights for parameters held in a 2-byte float (a bfloat16 or float16 full fine-tune)."""

from functools import partial
import math

import mlx.core as mx
import mlx.optimizers as optim
from mlx.utils import tree_flatten, tree_map


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


# bfloat16 keeps 8 bits of mantissa: an update below 2^-9 of a weight rounds away. builtin:tiny in
# bf16 at lr 1e-6, AdamW on the bf16 weights: the first update changed 1.16% of the elements and
# the next 9 none more; through a float32 master, 9.1% had changed after 10 (float32 weights, 16.8%).
# So such parameters are updated in a float32 copy, as TRL's mixed precision keeps its weights.
TWO_BYTE_FLOATS = (mx.bfloat16, mx.float16)


class MasterAdamW(optim.AdamW):
    """mlx's AdamW; a parameter held in a 2-byte float gets a float32 master copy (state "master",
    saved with the rest of the state) and float32 moments. Each update casts the gradient to
    float32, updates the master and hands the model master.astype(its dtype): the model computes
    in its own dtype and no update is lost to its rounding. Other parameters (float32 ones, LoRA
    adapters) are updated exactly as by optim.AdamW: no copy, the same bits."""

    def init_single(self, parameter: mx.array, state: dict):
        super().init_single(parameter, state)
        if parameter.dtype in TWO_BYTE_FLOATS:  # `parameter` may be the gradient (Optimizer.init)
            state["m"], state["v"] = (a.astype(mx.float32) for a in (state["m"], state["v"]))

    def apply_single(self, gradient: mx.array, parameter: mx.array, state: dict):
        if parameter.dtype not in TWO_BYTE_FLOATS:
            return super().apply_single(gradient, parameter, state)
        # Made at the first update from the weights as they are then (after any resume or sync).
        master = state["master"] if "master" in state else parameter.astype(mx.float32)
        master = super().apply_single(gradient.astype(mx.float32), master, state)
        state["master"] = master
        return master.astype(parameter.dtype)


def make_optimizer(tcfg, total_updates: int):
    """AdamW with bias correction, as PyTorch's (and TRL's): MLX's default leaves it off, which
    makes the first updates 1.85-2.1x larger at the same learning rate. 2-byte float parameters
    train through float32 master weights (MasterAdamW)."""
    return MasterAdamW(
        learning_rate=make_lr_schedule(tcfg, total_updates), betas=list(tcfg.adam_betas),
        weight_decay=tcfg.weight_decay, bias_correction=True,
    )


# The clipping and the optimizer's arithmetic as one compiled function: AdamW is a dozen elementwise
# operations per parameter, each a pass over memory when run one by one. builtin:small (25.6M
# float32 parameters, 2-core CPU): clip + AdamW 0.27 s plain, 0.13 s compiled. The function is kept
# on the optimizer (not in a module-level cache, whose entries would keep every model alive).
# But compiled it holds about 1.3 more gradient-sized arrays at its peak than built lazily
# (builtin:small, full fine-tune, micro-batches of 4, where the optimizer step is the update's
# peak: 388 against 260 MB above the weights and AdamW state): so it is compiled only where the
# trainable parameters are at most this share of the model's (adapters), and a full fine-tune,
# whose gradient is the model's size, keeps its peak.
COMPILED_UPDATE_SHARE = 0.25


def apply_update(model, optimizer, grads, grad_norm: mx.array, max_norm: float, compiled: bool | None = None) -> None:
    """Update `model` from `grads` clipped to `max_norm` (0: not clipped; `grad_norm` their global
    norm); `compiled` (default: where the trainable share is at most COMPILED_UPDATE_SHARE) in one
    compiled function, traced again only for a new model, optimizer state or bound."""
    if compiled is None:
        compiled = _trainable_share(model) <= COMPILED_UPDATE_SHARE
    if not compiled:
        optimizer.update(model, _clipped(grads, grad_norm, max_norm))
        return
    entry = getattr(optimizer, "_compiled_update", None)
    if entry is None or entry[0] is not model or entry[1] is not optimizer.state or entry[2] != max_norm:
        _prepare(optimizer, model)
        entry = (model, optimizer.state, max_norm, _compiled_update(model, optimizer, max_norm))
        optimizer._compiled_update = entry
    entry[3](grads, grad_norm)


def _trainable_share(model) -> float:
    count = lambda tree: sum(v.size for _, v in tree_flatten(tree))  # noqa: E731
    return count(model.trainable_parameters()) / max(count(model.parameters()), 1)


def _clipped(grads, grad_norm: mx.array, max_norm: float):
    """`grads` scaled down to a global norm of `max_norm` (0: as they are), optim.clip_grad_norm's rule."""
    if max_norm <= 0:
        return grads
    scale = mx.where(grad_norm < max_norm, 1.0, max_norm / (grad_norm + 1e-6))
    return tree_map(lambda g: g * scale, grads)


def _prepare(optimizer, model) -> None:
    """Every state entry the update reads, made before tracing, so the trace never adds one (a
    2-byte parameter's float32 master from the weights as they are now: after a resume or a sync)."""
    params = model.trainable_parameters()
    optimizer.init(params)
    if isinstance(optimizer, MasterAdamW):
        tree_map(lambda p, st: st.setdefault("master", p.astype(mx.float32)) if p.dtype in TWO_BYTE_FLOATS else None,
                 params, optimizer.state)


def _compiled_update(model, optimizer, max_norm: float):
    state = [model.state, optimizer.state]

    @partial(mx.compile, inputs=state, outputs=state)
    def step(grads, grad_norm):
        optimizer.update(model, _clipped(grads, grad_norm, max_norm))

    return step
