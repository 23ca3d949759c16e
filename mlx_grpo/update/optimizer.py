"""The optimizer: bias-corrected AdamW under transformers' learning-rate schedules, with float32
master weights for parameters held in a 2-byte float (a bfloat16 or float16 full fine-tune)."""

from functools import partial
import math

import mlx.core as mx
import mlx.optimizers as optim
from mlx.utils import tree_flatten, tree_map, tree_unflatten


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


# The clipping and AdamW's arithmetic run compiled: AdamW is a dozen elementwise operations per
# parameter, each a pass over memory when run one by one. But a compiled function frees none of its
# inputs before its outputs exist: as one function over a full fine-tune it held about 1.3 more
# gradient-sized arrays at its peak. So the parameters go through in groups of at most this share
# of the model's parameters, each group evaluated before the next with no reference left to its old
# weights and gradients (adapters are one group, a full fine-tune about eight). builtin:small, 25.6M
# float32 parameters, 2-core CPU: clip + AdamW 211 ms plain, 69 ms grouped or as one function; peak
# above the weights and AdamW state with micro-batches of 4: 260 MB plain, 241 grouped, 387 as one.
UPDATE_GROUP_SHARE = 0.125


def apply_update(model, optimizer, grads, grad_norm: mx.array, max_norm: float,
                 group_share: float = UPDATE_GROUP_SHARE) -> None:
    """Update `model` from `grads` clipped to `max_norm` (0: not clipped; `grad_norm` their global
    norm), a group of parameters (at most `group_share` of the model's) per compiled call; traced
    again only for a new model or optimizer state."""
    groups, step = _update_plan(model, optimizer, group_share)
    scale = _clip_scale(grad_norm, max_norm)
    optimizer.apply_gradients({}, {})  # the step count and the scheduled learning rate, once
    grads = dict(tree_flatten(grads))
    params = dict(tree_flatten(model.trainable_parameters()))
    for keys in groups:
        states = [_state_at(optimizer.state, k) for k in keys]
        new_params, new_states = step([grads.pop(k) for k in keys], [params.pop(k) for k in keys],
                                      [dict(st) for st in states], scale)
        model.update(tree_unflatten(list(zip(keys, new_params))))
        for st, new in zip(states, new_states):
            st.update(new)
        if len(groups) > 1:  # the group's old arrays are freed before the next group's are made
            mx.eval(new_params, new_states)


def _update_plan(model, optimizer, group_share: float):
    """The parameter groups and the compiled per-group step, kept on the optimizer (not in a
    module-level cache, whose entries would keep every model alive)."""
    entry = getattr(optimizer, "_update_plan", None)
    if entry is None or entry[0] is not model or entry[1] is not optimizer.state or entry[2] != group_share:
        _prepare(optimizer, model)
        groups = _groups(model, group_share)
        entry = (model, optimizer.state, group_share, groups, _compiled_step(optimizer))
        optimizer._update_plan = entry
    return entry[3], entry[4]


def _groups(model, share: float) -> list[list[str]]:
    """The trainable parameters' names in order, cut into runs of at most `share` of the model's
    parameter count (a larger parameter alone)."""
    limit = share * sum(v.size for _, v in tree_flatten(model.parameters()))
    groups, size = [[]], 0
    for key, value in tree_flatten(model.trainable_parameters()):
        if groups[-1] and size + value.size > limit:
            groups.append([])
            size = 0
        groups[-1].append(key)
        size += value.size
    return [g for g in groups if g]


def _state_at(state: dict, key: str) -> dict:
    """The optimizer state of the parameter named `key` ("layers.0.weight")."""
    for part in key.split("."):
        state = state[int(part)] if isinstance(state, list) else state[part]
    return state


def _clip_scale(grad_norm: mx.array, max_norm: float) -> mx.array:
    """What the gradients are multiplied by for a global norm of at most `max_norm` (0: 1),
    optim.clip_grad_norm's rule."""
    if max_norm <= 0:
        return mx.array(1.0)
    return mx.where(grad_norm < max_norm, 1.0, max_norm / (grad_norm + 1e-6))


def _prepare(optimizer, model) -> None:
    """Every state entry the update reads, made before tracing, so the trace never adds one (a
    2-byte parameter's float32 master from the weights as they are now: after a resume or a sync)."""
    params = model.trainable_parameters()
    optimizer.init(params)
    if isinstance(optimizer, MasterAdamW):
        tree_map(lambda p, st: st.setdefault("master", p.astype(mx.float32)) if p.dtype in TWO_BYTE_FLOATS else None,
                 params, optimizer.state)


def _compiled_step(optimizer):
    # The learning rate and step count are read from optimizer.state inside apply_single: the
    # state is an input, so each call sees this update's values.
    @partial(mx.compile, inputs=[optimizer.state])
    def step(grads, params, states, scale):
        new_params = [optimizer.apply_single(g * scale, p, st) for g, p, st in zip(grads, params, states)]
        return new_params, states

    return step
