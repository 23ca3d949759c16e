"""The gradient of one micro-batch, optionally through `mx.compile`.

A compiled function is traced once per input shape and reused; micro-batches are padded
to a multiple of 32 tokens, so a run sees only a few shapes. Two MLX rules shape this
module: every Python scalar that varies (the loss normalisers) goes in as an array, or
each new value would trigger a new trace; and `nn.value_and_grad` writes traced arrays
into the model, so the model's state (and the random state, for LoRA dropout) is both
an input and an output of the compiled function.
"""

from dataclasses import fields
from functools import partial

import mlx.core as mx
import mlx.nn as nn


def _as_arrays(batch) -> dict:
    """The micro-batch as a dict of arrays: scalars become arrays, absent fields are left out."""
    out = {}
    for f in fields(batch):
        value = getattr(batch, f.name)
        if value is None:
            continue
        out[f.name] = value if isinstance(value, mx.array) else mx.array(float(value))
    return out


def make_grad_fn(model, loss_fn, compiled: bool = True):
    """batch -> ((loss, metrics), grads) of `loss_fn(model, batch)` w.r.t. the trainable parameters.

    `loss_fn` must accept the batch rebuilt from arrays (its normalisers as 0-d arrays).
    """
    value_and_grad = nn.value_and_grad(model, loss_fn)
    if not compiled:
        return lambda batch: value_and_grad(model, batch)
    state = [model.state, mx.random.state]
    batch_type = None

    @partial(mx.compile, inputs=state, outputs=state)
    def step(arrays):
        return value_and_grad(model, batch_type(**arrays))

    def grad_fn(batch):
        nonlocal batch_type
        batch_type = type(batch)
        return step(_as_arrays(batch))

    return grad_fn
