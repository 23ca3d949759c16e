"""A frozen base's weights laid out for the decode's products, once per model, on the CPU.

A linear layer computes x @ W.T with W (outputs, inputs) in rows. At the decode's few rows,
OpenBLAS spends most of such a product repacking W, and a transposed W costs it more to repack
than one whose (inputs, outputs) rows lie in memory in order. So a weight nothing trains (a LoRA
run's base) is stored once as the transpose of its transposed copy: the same array, the same
values, every product's result the same to the bit, only the memory order changed. Measured on a
2-core EPYC with OpenBLAS at 16 rows: Qwen2.5-0.5B's gate and up projections 4.2 -> 3.3 ms, its
tied head 113 -> 82 ms; the down projection (fewer outputs than inputs) no faster, so it is left,
as are the attention projections with a bias (Qwen's q, k and v).
Trained weights change every step and would be laid out again each rollout, which costs about
what it saves. Off the CPU nothing is done: the repack is OpenBLAS's, and only this backend was
measured.
"""

from contextlib import contextmanager

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten


def frozen_weights(model) -> list[tuple[str, nn.Module]]:
    """(name, module) of each weight to lay out: a frozen, bias-free nn.Linear's with at least as
    many outputs as inputs, and a frozen embedding's when it is also the head (no linear layer of
    its shape). A bias is left out because MLX's reference BLAS adds it in another order to a
    product of the laid-out weight (a last-bit difference); OpenBLAS does not."""
    trained = {name for name, _ in tree_flatten(model.trainable_parameters())}
    modules = [(name, m) for name, m in model.named_modules() if type(m) in (nn.Linear, nn.Embedding)]
    linear_shapes = {tuple(m.weight.shape) for _, m in modules if type(m) is nn.Linear}
    chosen = []
    for name, m in modules:
        rows, cols = m.weight.shape
        wanted = rows >= cols and "bias" not in m if type(m) is nn.Linear else (rows, cols) not in linear_shapes
        if wanted and f"{name}.weight" not in trained:
            chosen.append((f"{name}.weight", m))
    return chosen


def lay_out_frozen(model) -> int:
    """Lay out the model's frozen float32 weights (`frozen_weights`) for the decode, once; returns
    how many this call laid out (none off the CPU, or when done before)."""
    if hasattr(model, "_laid_out") or mx.default_device().type != mx.cpu:
        return 0
    laid = [m for _, m in frozen_weights(model) if m.weight.dtype == mx.float32]
    object.__setattr__(model, "_laid_out", laid)  # an attribute, not a child of the module tree
    _reorder(laid, column_order=True)
    return len(laid)


@contextmanager
def as_loaded(model):
    """The frozen weights in the block in the order mlx-lm loaded them, laid out again after: the
    bench's limit is MLX as shipped, which does not lay them out."""
    laid = getattr(model, "_laid_out", [])
    _reorder(laid, column_order=False)
    try:
        yield
    finally:
        _reorder(laid, column_order=True)


def _reorder(modules, column_order: bool) -> None:
    for m in modules:
        m.weight = mx.contiguous(m.weight.T).T if column_order else mx.contiguous(m.weight)
        mx.eval(m.weight)  # one at a time: each old copy is freed before the next is made
