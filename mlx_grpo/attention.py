"""Attention whose softmax takes cpu_exp's exps, on the CPU in float32.

mlx-lm's layers call `scaled_dot_product_attention` (mlx_lm.models.base), which calls
mx.fast.scaled_dot_product_attention; on the CPU backend that is queries x keys, MLX's softmax and
probabilities x values, and its softmax takes MLX's exp, 12-18 ns a float on a 2-core EPYC. Here
the same three steps run with cpu_exp's softmax.
"""

import mlx.core as mx
from mlx_lm.models import base

from mlx_grpo import cpu_exp
from mlx_grpo.models.caches import within_window
from mlx_grpo.streams import replace_in_mlx_lm

_SDPA = base.scaled_dot_product_attention  # mlx-lm's own, before `fast_attention` replaces it


def _by_kv_head(mask, kv_heads: int):
    """A mask over (..., heads, queries, keys) laid out as the grouped scores' (..., kv heads,
    queries per kv head, queries, keys)."""
    if mask.ndim < 3:
        return mask
    if mask.shape[-3] == 1:
        return mx.expand_dims(mask, -3)
    return mask.reshape(*mask.shape[:-3], kv_heads, -1, *mask.shape[-2:])


def _masked(scores, mask, kv_heads: int):
    if mask is None:
        return scores
    if isinstance(mask, str):  # "causal", lower-right aligned: query i sees keys up to offset + i
        n, keys = scores.shape[-2:]
        mask = mx.arange(keys - n, keys)[:, None] >= mx.arange(keys)[None]
    mask = _by_kv_head(mask, kv_heads)
    if mask.dtype == mx.bool_:  # the lowest float, not -inf: a row with every key masked averages them, as MLX's
        return mx.where(mask, scores, mx.finfo(scores.dtype).min)
    return scores + mask.astype(scores.dtype)


def attention(queries, keys, values, cache, scale: float, mask, sinks=None):
    """mlx-lm's scaled_dot_product_attention: queries (B, heads, n, d) over keys and values
    (B, kv heads, keys, d), softmax(q k^T scale + mask) v; cpu_exp's softmax where it runs."""
    shared = getattr(cache, "shared_prefix", None)
    if shared is not None and sinks is None:
        cache.attended = True
        return _over_shared_prefix(queries, keys, values, shared, scale, getattr(cache, "window", None))
    if sinks is not None or hasattr(cache, "bits") or not cpu_exp.fast(queries):
        return _SDPA(queries, keys, values, cache, scale=scale, mask=mask, sinks=sinks)
    b, heads, n, d = queries.shape
    kv_heads = keys.shape[1]
    per_kv = heads // kv_heads
    # A kv head's queries as the rows of one product: MLX's CPU matmul makes one BLAS call per
    # batch element, and broadcasting the keys over the query heads made per_kv times as many
    # (Qwen2.5-0.5B's decode, 16 rows: 5.2 against 2.8 ms a layer).
    rows = (queries * scale).reshape(b, kv_heads, per_kv * n, d)
    scores = _masked((rows @ keys.swapaxes(-1, -2)).reshape(b, kv_heads, per_kv, n, -1), mask, kv_heads)
    out = cpu_exp.softmax(scores).reshape(b, kv_heads, per_kv * n, -1) @ values
    return out.reshape(b, heads, n, values.shape[-1])


def _over_shared_prefix(queries, keys, values, shared, scale: float, window=None):
    """Completion rows (N, heads, T, d), groups of N / groups rows in order, each over its group's
    prompt (`shared`: keys and values (groups, kv heads, C, d) and seen (groups, C), its real
    columns) and then causally over its own keys and values (N, kv heads, T, d); a sliding-window
    layer's over the last `window` columns of both (completion position t is column C + t).

    A group's rows meet its prompt's keys in one product, (rows x T) queries at once, and the
    prompt's keys are never copied per row nor joined to the rows' own: the scores stay in two
    parts (`cpu_exp.softmax_pair`)."""
    prefix_keys, prefix_values, seen = shared
    N, heads, T, d = queries.shape
    groups, kv_heads, C, _ = prefix_keys.shape
    rows, per_kv = N // groups, heads // kv_heads
    q = (queries * scale).reshape(groups, rows, kv_heads, per_kv, T, d).transpose(0, 2, 3, 1, 4, 5)
    q = q.reshape(groups, kv_heads, per_kv, rows * T, d)  # a group's queries as one matrix
    lowest = mx.finfo(q.dtype).min
    visible, causal = _windowed(seen, T, rows, window)
    over_prompt = mx.where(visible, q @ prefix_keys[:, :, None].swapaxes(-1, -2), lowest)
    own = lambda x: x.reshape(groups, rows, kv_heads, T, -1).transpose(0, 2, 1, 3, 4)[:, :, None]
    over_own = mx.where(causal, q.reshape(groups, kv_heads, per_kv, rows, T, d) @ own(keys).swapaxes(-1, -2), lowest)
    p_prompt, p_own = cpu_exp.softmax_pair(over_prompt.reshape(groups, kv_heads, per_kv, rows, T, C), over_own)
    out = (p_prompt.reshape(groups, kv_heads, per_kv, rows * T, C) @ prefix_values[:, :, None]).reshape(
        groups, kv_heads, per_kv, rows, T, -1) + p_own @ own(values)
    return out.transpose(0, 3, 1, 2, 4, 5).reshape(N, heads, T, -1)


def _windowed(seen, T: int, rows: int, window):
    """(the prompt columns each of a group's rows x T queries sees, (groups, 1, 1, rows * T | 1, C);
    the causal mask over its own T, (T, T)), within the last `window` columns where it is set."""
    C = seen.shape[1]
    if window is None:
        return seen[:, None, None, None, :], mx.tril(mx.ones((T, T), dtype=mx.bool_))
    t = mx.arange(T)[:, None]
    near = mx.tile(within_window(C + t, mx.arange(C)[None], window), (rows, 1))  # (rows * T, C)
    return seen[:, None, None, None, :] & near, within_window(t, t.T, window)


def fast_attention() -> list[str]:
    """`attention` for mlx-lm's scaled_dot_product_attention, in its base module (families imported
    later take it from there) and in every family module that imported it already; returns the
    names of the modules changed. Called once a model loads, as streams.split_swiglu."""
    return replace_in_mlx_lm("scaled_dot_product_attention", _SDPA, attention)
