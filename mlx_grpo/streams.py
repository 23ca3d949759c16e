"""Large elementwise work cut in two, the halves on two streams of the CPU.

MLX's CPU backend runs each elementwise kernel and each reduction on one thread (exp took 14 ns a
float on a 2-core EPYC), while its matmuls (OpenBLAS or Accelerate) use every core; at Qwen's
vocabulary of 151,936 the logsumexp, the softmax and the sampler over the logits, and in every layer
the MLP's SiLU, left the other cores idle. Each stream has a thread of its own, so two halves of
the rows run side by side. Measured on a 2-core Linux x86_64 machine with OpenBLAS, Qwen2.5-0.5B's
shape, float32: the chunked head's forward+backward over 16 x 128 tokens 15.8 s against 18.8 s; the
24 layers' SiLU over 2,210 tokens 2.8 s against 4.7 s forward, 4.9 s against 7.8 s backward; the
sampler 52 ms against 89 ms a decode step. Each half does the same arithmetic as the whole, so the
bits are the same. (Attention's softmax cut by heads saved 0.5 of its 3.6 s a step there, about 1%
of a step: not done; mlx_grpo/attention.py gives it cpu_exp's exps instead.) Other backends run
elementwise work in parallel already and are left alone, as are small arrays (the hand-off to the
second stream costs more than it saves). Within each half the exps are cpu_exp's (float32 on the
CPU), and `split_swiglu`'s SwiGLU is cpu_exp's one-kernel forward and backward.
"""

import sys
from contextlib import contextmanager

import mlx.core as mx
from mlx_lm.models import activations

from mlx_grpo import cpu_exp

SPLIT_ELEMENTS = 1 << 20  # elements of the first array from which work is cut
_second = {}  # device -> its second stream, made once
_off = []  # non-empty inside as_shipped: nothing is cut
_SWIGLU = activations.swiglu  # mlx-lm's own, before split_swiglu replaces it
_SHIPPED_CACHE = mx.set_cache_limit(0)  # MLX's own buffer cache limit, read once and put back
mx.set_cache_limit(_SHIPPED_CACHE)


def _cut(elements: int) -> bool:
    return elements >= SPLIT_ELEMENTS and mx.default_device().type == mx.cpu and not _off


def _second_stream():
    device = mx.default_device()
    if device not in _second:
        _second[device] = mx.new_stream(device)
    return _second[device]


def split_rows(fn, *arrays) -> tuple:
    """fn(*arrays), a tuple of arrays with rows first: on the CPU, for a large first array, the first
    half of the rows on the default stream and the second on another, concatenated. `fn` must treat
    rows independently (it draws random numbers per call, so a sampler's draws differ from one
    call's: the same distribution, and the same under a seed)."""
    n = arrays[0].shape[0]
    if n < 2 or not _cut(arrays[0].size):
        return fn(*arrays)
    first = fn(*(a[:n // 2] for a in arrays))
    with mx.stream(_second_stream()):
        second = fn(*(a[n // 2:] for a in arrays))
    return tuple(mx.concatenate(pair, axis=0) for pair in zip(first, second))


def _swiglu(gate, x):
    """cpu_exp's SwiGLU where it runs (float32 on the CPU, outside as_shipped), else mlx-lm's."""
    return cpu_exp.swiglu(gate, x) if cpu_exp.fast(gate) and cpu_exp.fast(x) else _SWIGLU(gate, x)


def _swiglu_slopes(gate, x, cotangent):
    if cpu_exp.fast(gate) and cpu_exp.fast(x):
        return cpu_exp.swiglu_slopes(gate, x, cotangent)
    return tuple(mx.vjp(_SWIGLU, [gate, x], [cotangent])[1])


@mx.custom_function
def _swiglu_halves(gate, x):
    return split_rows(lambda g, u: (_swiglu(g, u),), gate, x)[0]


@_swiglu_halves.vjp
def _swiglu_halves_vjp(primals, cotangent, output):
    # the halves' slopes joined directly: differentiated through, each half's slice would scatter
    # into a zeroed copy of the whole and the two be added (small: 26 MB more at the update's peak)
    return split_rows(_swiglu_slopes, *primals, cotangent)


def _swiglu_by_rows(gate, x):
    if gate.shape[0] < 2 or not _cut(gate.size):
        return _swiglu(gate, x)
    return _swiglu_halves(gate, x)


def split_swiglu() -> list[str]:
    """mlx-lm's `swiglu` (the MLP of Llama, Qwen2, Qwen3, Mistral and others) cut by rows, in
    mlx-lm's activations module (families imported later take it from there) and in every family
    module that imported it already; returns the names of the modules changed. Called once a model
    loads: its family's module is imported by then."""
    return replace_in_mlx_lm("swiglu", _SWIGLU, _swiglu_by_rows)


def replace_in_mlx_lm(name: str, theirs, ours) -> list[str]:
    """`ours` for `theirs` as `name` in every mlx_lm.models module that holds it; their names."""
    changed = []
    for module_name, module in list(sys.modules.items()):
        if module_name.startswith("mlx_lm.models.") and getattr(module, name, None) is theirs:
            setattr(module, name, ours)
            changed.append(module_name)
    return changed


@contextmanager
def as_shipped():
    """Nothing cut in the block (a cut swiglu computes mlx-lm's own whole), no cpu_exp and MLX's own
    buffer cache limit (not update/worst_case.py's): what MLX computes as shipped, the bench's limit."""
    _off.append(True)
    ours = mx.set_cache_limit(_SHIPPED_CACHE)
    try:
        with cpu_exp.plain():
            yield
    finally:
        _off.pop()
        mx.set_cache_limit(ours)
