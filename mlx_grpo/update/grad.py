"""The gradient of one micro-batch, optionally through `mx.compile`.

A compiled function is traced once per input shape and reused; micro-batches are padded
to a multiple of 32 tokens, so a run sees only a few shapes. Two MLX rules shape this
module: every Python scalar that varies (the loss normalisers) goes in as an array, or
each new value would trigger a new trace; and `nn.value_and_grad` writes traced arrays
into the model, so the model's state (and the random state, for LoRA dropout) is both
an input and an output of the compiled function.

Whether compiling pays is measured, not assumed: it was slower on one CPU run and faster on
others, and the answer changes with the backend and the shapes (`FasterOf`).
"""

from dataclasses import fields
from functools import partial
import time

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


def shape_key(batch) -> tuple:
    """What a compile decision holds for: the backend and every array's shape and dtype."""
    arrays = _as_arrays(batch)
    return (str(mx.default_device()), *((k, tuple(v.shape), str(v.dtype)) for k, v in sorted(arrays.items())))


class FasterOf:
    """The plain or the compiled gradient function, whichever measured faster at this shape.

    The first batch of each new `shape_key` runs the compiled function once (it traces: not part
    of its cost), then plain and compiled once each, timed, all from the same random state (LoRA
    dropout draws the same masks); the faster serves that shape for the rest of the run. On the
    CPU backend the two give the same bits (tests/test_update_step.py), so the choice changes the
    speed, not the run.
    """

    def __init__(self, plain, compiled, clock=time.perf_counter):
        self.plain, self.compiled, self.clock = plain, compiled, clock
        self.choice = {}  # shape_key -> "plain" | "compiled"
        self.seconds = {}  # shape_key -> {"plain": s, "compiled": s}, as measured

    def __call__(self, batch):
        key = shape_key(batch)
        if key not in self.choice:
            return self._measure(key, batch)
        return (self.compiled if self.choice[key] == "compiled" else self.plain)(batch)

    def _measure(self, key, batch):
        hi, lo = mx.random.state[0].tolist()
        seconds = {}
        for name, fn in (("trace", self.compiled), ("plain", self.plain), ("compiled", self.compiled)):
            mx.random.seed((hi << 32) | lo)  # the key [hi, lo] is exactly seed (hi << 32 | lo)'s
            tic = self.clock()
            result = fn(batch)  # one result alive at a time: the trial's peak is a plain step's
            mx.eval(result)
            seconds[name] = self.clock() - tic
        self.seconds[key] = {k: seconds[k] for k in ("plain", "compiled")}
        self.choice[key] = "compiled" if seconds["compiled"] < seconds["plain"] else "plain"
        return result  # the compiled step's, whichever won: a correct gradient either way


def make_grad_fn(model, loss_fn, compiled: bool | str = True):
    """batch -> ((loss, metrics), grads) of `loss_fn(model, batch)` w.r.t. the trainable parameters.

    compiled: True, False, or "auto" (`FasterOf`: measured per backend and shape).
    `loss_fn` must accept the batch rebuilt from arrays (its normalisers as 0-d arrays).
    """
    value_and_grad = nn.value_and_grad(model, loss_fn)
    plain = lambda batch: value_and_grad(model, batch)  # noqa: E731
    if not compiled:
        return plain
    state = [model.state, mx.random.state]
    batch_type = None

    @partial(mx.compile, inputs=state, outputs=state)
    def step(arrays):
        return value_and_grad(model, batch_type(**{f.name: arrays.get(f.name) for f in fields(batch_type)}))

    def grad_fn(batch):
        nonlocal batch_type
        batch_type = type(batch)
        return step(_as_arrays(batch))

    return FasterOf(plain, grad_fn) if compiled == "auto" else grad_fn
