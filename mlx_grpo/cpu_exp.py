"""exp, logsumexp and SwiGLU from multiplies and adds on the CPU, where MLX's own exp is slow.

MLX's CPU backend computes exp at 12-18 ns a float on a 2-core EPYC (its sigmoid 18 ns, against
0.2 ns for a multiply), and at Qwen's vocabulary the logsumexp and softmax over the logits, and in
every layer the MLP's SiLU, are billions of exps a step. Here e^x = 2^n * 2^f, with n = x log2(e)
rounded to an integer by adding and subtracting 1.5 * 2^23, 2^f (|f| <= 1/2) a degree-7 polynomial
in Estrin's form (a shallow graph, which `mx.compile` fuses: Horner's deep chain took 9.2 ns a
float) and 2^n written into the float's exponent bits: 1.3-1.6 ns a float over 2M floats, within
2.3e-7 of mx.exp relative on [-87, 88] (tests/test_cpu_exp.py). Below x = -87.7 it gives 0 (mx.exp:
a denormal); above 88.4, inf (mx.exp: up to 3.4e38); NaN stays NaN. No kernel fuses the bits' `view`,
so a call makes about three arrays of its input's size; past MLX's CPU buffer cache (32 MiB by
default) each is fresh pages from the kernel, 8.4 ns a float: update/worst_case.py's `limit_cache`
keeps an eighth of memory.

Only float32 on the CPU takes this path, and not inside `plain` (the bench's limit, checkpointed
blocks); Metal and CUDA run mx.exp, which is fast there.
"""

import math
from contextlib import contextmanager
from functools import lru_cache

import mlx.core as mx
import mlx.nn as nn

_LOG2E = 1.4426950408889634
_ROUND = 12582912.0  # 1.5 * 2^23: (y + _ROUND) - _ROUND is y rounded to an integer, in float adds
_C = tuple(math.log(2) ** k / math.factorial(k) for k in range(8))  # 2^f = sum (f ln 2)^k / k!
_off = []  # non-empty inside `plain`: MLX's own everywhere
WIDE = 4096  # rows from this many entries are a large vocabulary's: summed in two levels


def _two_to(y):
    """2^y for y in [-127, 128] (clipped there): 0 at n = -127, inf at n = 128."""
    n = (y + _ROUND) - _ROUND
    f = y - n
    f2 = f * f
    low = (_C[0] + _C[1] * f) + f2 * (_C[2] + _C[3] * f)
    high = (_C[4] + _C[5] * f) + f2 * (_C[6] + _C[7] * f)
    return (low + (f2 * f2) * high) * ((n.astype(mx.int32) + 127) << 23).view(mx.float32)


@mx.compile
def _exp(x):
    return _two_to(mx.clip(x * _LOG2E, -127.0, 128.0))


def _sigmoid(x):
    return 1.0 / (1.0 + _two_to(mx.clip(x * -_LOG2E, -127.0, 128.0)))


@mx.compile
def _swiglu(gate, x):
    return gate * _sigmoid(gate) * x


@mx.compile
def _swiglu_slopes(gate, x, cotangent):
    s = _sigmoid(gate)
    silu = gate * s
    return cotangent * x * (s + silu * (1.0 - s)), cotangent * silu


def fast(x) -> bool:
    """Whether `x` takes this file's path: float32 on the CPU, not inside `plain`."""
    return x.dtype == mx.float32 and mx.default_device().type == mx.cpu and not _off


@contextmanager
def plain():
    """MLX's own exp, logsumexp and SwiGLU in the block: the bench's limit (streams.as_shipped), and
    checkpointed blocks (models/load.py), where the custom vjps raised builtin:tiny's peak 16-20%."""
    _off.append(True)
    try:
        yield
    finally:
        _off.pop()


@mx.custom_function
def _fast_exp(x):
    return _exp(x)


@_fast_exp.vjp
def _fast_exp_vjp(primals, cotangent, output):
    return cotangent * output


def exp(x):
    """e^x: mx.exp, or on the CPU in float32 the polynomial above."""
    return _fast_exp(x) if fast(x) else mx.exp(x)


@lru_cache(maxsize=None)  # asked per chunk of the head, forward and backward: once per width
def divisor_near_root(n: int) -> int | None:
    """A divisor of n in [64, 1024] nearest its square root (128 for Qwen's 151,936), or None."""
    divisors = [c for c in range(64, 1025) if n % c == 0]
    return min(divisors, key=lambda c: abs(c * c - n)) if divisors else None


def row_sum(w):
    """The sum over the last axis, in two levels for a row of at least WIDE entries whose length
    has a divisor near its root: MLX's CPU reduction of a softmax row came out 1.4e-5 low at 4,096
    entries and 3e-4 at Qwen's 151,936 (a float32 running sum drops the low bits of each small
    term), 1.4e-6 at 322; chunk sums, then their sum, are within 1e-6. Narrower rows are summed
    as MLX sums them (builtin:tiny's numbers stay those of one sum, bit for bit)."""
    width = divisor_near_root(w.shape[-1]) if w.shape[-1] >= WIDE else None
    if width is None:
        return w.sum(axis=-1)
    return w.reshape(*w.shape[:-1], -1, width).sum(axis=-1).sum(axis=-1)


def logsumexp(z):
    """log sum exp over the last axis (its gradient: the softmax)."""
    if not fast(z):
        return mx.logsumexp(z, axis=-1)
    top = mx.stop_gradient(z.max(axis=-1, keepdims=True))
    top = mx.where(mx.isinf(top), 0.0, top)  # a row of -inf: -inf, as mx.logsumexp
    return mx.log(row_sum(exp(z - top))) + top[..., 0]


@mx.compile
def _shifted_exp(z, top):
    return _exp(z - top)


@mx.custom_function
def _fast_softmax(z):
    top = mx.stop_gradient(z.max(axis=-1, keepdims=True))
    w = _shifted_exp(z, mx.where(mx.isinf(top), 0.0, top))
    return w / w.sum(axis=-1, keepdims=True)


@_fast_softmax.vjp
def _fast_softmax_vjp(primals, cotangent, output):
    return output * (cotangent - (cotangent * output).sum(axis=-1, keepdims=True))


def softmax(z):
    """The softmax over the last axis (attention's, over keys): only its output is kept for the
    backward pass, as mx.softmax keeps it."""
    return _fast_softmax(z) if fast(z) else mx.softmax(z, axis=-1, precise=True)


@mx.custom_function
def _fast_swiglu(gate, x):
    return _swiglu(gate, x)


@_fast_swiglu.vjp
def _fast_swiglu_vjp(primals, cotangent, output):
    return _swiglu_slopes(*primals, cotangent)


def swiglu_slopes(gate, x, cotangent):
    """The cotangents of `swiglu`'s gate and x (float32 on the CPU), one kernel."""
    return _swiglu_slopes(gate, x, cotangent)


def swiglu(gate, x):
    """silu(gate) * x, the MLP of Llama, Qwen and others: one kernel forward and one backward."""
    return _fast_swiglu(gate, x) if fast(gate) and fast(x) else nn.silu(gate) * x


@mx.custom_function
def _fast_softmax_pair(a, b):
    top = mx.stop_gradient(mx.maximum(a.max(axis=-1, keepdims=True), b.max(axis=-1, keepdims=True)))
    top = mx.where(mx.isinf(top), 0.0, top)
    wa, wb = _shifted_exp(a, top), _shifted_exp(b, top)
    total = wa.sum(axis=-1, keepdims=True) + wb.sum(axis=-1, keepdims=True)
    return wa / total, wb / total


@_fast_softmax_pair.vjp
def _fast_softmax_pair_vjp(primals, cotangents, outputs):
    (pa, pb), (da, db) = outputs, cotangents
    dot = (da * pa).sum(axis=-1, keepdims=True) + (db * pb).sum(axis=-1, keepdims=True)
    return pa * (da - dot), pb * (db - dot)


def softmax_pair(a, b):
    """The softmax over the last axis of [a | b] (the same leading axes), as its two parts: attention
    over a shared prompt's keys and a row's own, without the joined scores (or a copy of either
    part) ever being made. Only the outputs are kept for the backward pass."""
    if fast(a) and fast(b):
        return _fast_softmax_pair(a, b)
    p = mx.softmax(mx.concatenate([a, b], axis=-1), axis=-1, precise=True)
    return p[..., :a.shape[-1]], p[..., a.shape[-1]:]
