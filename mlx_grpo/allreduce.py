"""The gradient all-reduce of a data-parallel update: the mean of every rank's gradients, in
buckets, on a stream of its own, so that it can overlap the end of the backward pass.

Gradients are flattened, cast to the reduce dtype (distributed.reduce_dtype: float32, or
bfloat16 for half the bytes), and concatenated into buckets of about BUCKET_BYTES, the last
parameters first: the backward pass makes the last layers' gradients first. Each bucket is one
`all_sum` on the communication stream; its sum is divided by the number of ranks in float32 and
cast back to each gradient's dtype. Summing bfloat16 gradients in float32 and rounding once
keeps the mean as exact as one rounding allows; a bfloat16 reduction rounds each rank's
gradient and every partial sum (docs/benchmarks.md, "The gradient all-reduce", has the error measured on a
real update).

MLX evaluates lazily: the update leaves its last micro-batch's gradients unevaluated
(update/step.py), so one evaluation runs that backward pass and the buckets' all-reduces, and a
bucket whose gradients are ready is sent on the communication stream while the default stream
computes the rest (for that, the bucket sums are evaluated first, then the mean built on them).
That is all the overlap mx.distributed allows: a collective cannot start
inside a compiled backward pass.
"""

import mlx.core as mx
from mlx.utils import tree_flatten, tree_unflatten

BUCKET_BYTES = 32 * 2**20  # mlx.nn.average_gradients' all_reduce_size, in the reduce dtype
DTYPES = {"float32": mx.float32, "bfloat16": mx.bfloat16}


def buckets(sizes: list[int], itemsize: int, bucket_bytes: int = BUCKET_BYTES) -> list[list[int]]:
    """Indices of the arrays (of `sizes` elements) in each bucket, the last array first; a bucket
    closes once it holds `bucket_bytes` or more."""
    out, current, held = [], [], 0
    for i in reversed(range(len(sizes))):
        current.append(i)
        held += sizes[i] * itemsize
        if held >= bucket_bytes:
            out.append(current)
            current, held = [], 0
    return out + [current] if current else out


def mean_over_ranks(grads, group, dtype: str = "float32", stream=None, bucket_bytes: int = BUCKET_BYTES):
    """The mean of `grads` over the ranks of `group` (lazy: the caller evaluates it), in buckets
    as the module's docstring says; returns (the mean, each bucket's all_sum in bucket order).

    Evaluate the sums first, then the mean: an evaluation of the mean's arrays would have the
    default stream wait for each bucket's sum before it computes the next bucket's gradients."""
    flat = tree_flatten(grads)
    if not flat:
        return grads, []
    reduce_dtype, ranks = DTYPES[dtype], group.size()
    out, sums = [None] * len(flat), []
    for bucket in buckets([g.size for _, g in flat], reduce_dtype.size, bucket_bytes):
        big = mx.concatenate([flat[i][1].reshape(-1).astype(reduce_dtype) for i in bucket])
        sums.append(mx.distributed.all_sum(big, group=group, stream=stream))
        ends, total = [], 0
        for i in bucket[:-1]:
            total += flat[i][1].size
            ends.append(total)
        for i, piece in zip(bucket, mx.split(sums[-1].astype(mx.float32) / ranks, ends)):
            key, g = flat[i]
            out[i] = (key, piece.reshape(g.shape).astype(g.dtype))
    return tree_unflatten(out), sums
