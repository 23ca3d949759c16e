"""Large elementwise work cut in two by rows, the halves on two streams of the CPU.

MLX's CPU backend runs each elementwise kernel and each reduction on one thread, while its matmuls
(OpenBLAS or Accelerate) use every core; at a vocabulary of 151,936 the logsumexp, the softmax and
the sampler over the logits are a large share of the time and leave the other cores idle. Each
stream has a thread of its own, so two halves of rows run side by side. Measured on a 2-core Linux
x86_64 machine with OpenBLAS, Qwen2.5-0.5B's vocabulary, float32: the chunked head's forward over
16 x 128 tokens 6.0 s against 7.4 s, its forward+backward 15.8 s against 18.8 s, with the same bits.
Other backends run elementwise work in parallel already and are left alone, as are small arrays
(the hand-off to a second stream costs more than it saves).
"""

import sys

import mlx.core as mx
from mlx_lm.models import activations

SPLIT_ELEMENTS = 1 << 20  # the first array's elements from which the work is cut in two
_second = {}  # device -> its second stream, made once
_SWIGLU = activations.swiglu  # mlx-lm's own, before split_swiglu replaces it


def split_rows(fn, *arrays) -> tuple:
    """fn(*arrays), a tuple of arrays with rows first: on the CPU, for a large first array, the first
    half of the rows on the default stream and the second on another, concatenated. `fn` must treat
    rows independently (it draws random numbers per call, so a sampler's draws differ from one
    call's: the same distribution, and the same under a seed)."""
    n, device = arrays[0].shape[0], mx.default_device()
    if device.type != mx.cpu or n < 2 or arrays[0].size < SPLIT_ELEMENTS:
        return fn(*arrays)
    if device not in _second:
        _second[device] = mx.new_stream(device)
    first = fn(*(a[:n // 2] for a in arrays))
    with mx.stream(_second[device]):
        second = fn(*(a[n // 2:] for a in arrays))
    return tuple(mx.concatenate(pair, axis=0) for pair in zip(first, second))


def _swiglu_by_rows(gate, x):
    return split_rows(lambda g, u: (_SWIGLU(g, u),), gate, x)[0]


def split_swiglu() -> list[str]:
    """mlx-lm's `swiglu` (SiLU(gate) * x, the MLP of Llama, Qwen2, Qwen3, Mistral and others) cut
    by rows, in mlx-lm's activations module (families imported later take it from there) and in
    every family module that imported it already; returns those modules' names. Its exp is the
    largest elementwise work of a forward: at Qwen2.5-0.5B's shape over 2,210 tokens, 4.7 s a
    forward and 7.8 s a backward of the 24 layers on one thread, 2.8 and 4.9 s cut in two (2-core
    EPYC). Row by row the same function: the same bits."""
    changed = []
    for name, module in list(sys.modules.items()):
        if name.startswith("mlx_lm.models.") and getattr(module, "swiglu", None) is _SWIGLU:
            module.swiglu = _swiglu_by_rows
            changed.append(name)
    return changed
