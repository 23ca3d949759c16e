"""Shared-prefix scoring: each group's prompt runs once, its G completions run on top.

A group's prompt p is run once over p[:-1]; each layer's keys and values are gathered along the
batch for its G completions, which then run as inputs [p[-1]] + c[:-1] (right-padded) on top of
that prefix, so logits position t predicts completion token t. Gradients reach the prompt's
keys/values from every completion and flow back through the one prefix pass. The log-probs equal
those of the padded full sequences (`pack_sequences`) to float precision (tests/test_prefix.py);
the prompt's work drops from G passes to one.

A micro-batch's prompts run as one (groups, columns) pass, left-padded (`columns.prefix_columns`),
so that its arrays, and a compiled step traced on them, keep their shapes from step to
step. Within a group every position moves by the same padding, so the distances RoPE sees are the
unpadded ones; the masks hide the padding from every real token (a padding query sees itself, so
its softmax has a term). A sliding-window layer (Gemma 3's) keeps every key too, and its masks show
each query the last `window` of them, as its RotatingKVCache would (models/caches.py).
"""

import mlx.core as mx

from mlx_grpo import cpu_exp
from mlx_grpo.algorithm.chunked import head_logprobs
from mlx_grpo.algorithm.columns import prefix_columns
from mlx_grpo.algorithm.loss import split_head, token_logprobs, token_logprobs_and_entropies
from mlx_grpo.models.caches import layer_windows, other_cache_kinds, window_of, within_window


class PrefixCache:
    """The part of mlx-lm's KVCache interface the attention layers use, without in-place writes
    (each call concatenates), so gradients and mx.checkpoint see plain array functions. `mask`,
    when set, is what the next forward's attention gets (padded prompts need one); `window`: the
    max_size of the sliding window's RotatingKVCache this layer stands for, or None."""

    def __init__(self, window=None):
        self.keys = self.values = self.mask = None
        self.window = window
        self.offset = 0
        self.shared_prefix = None  # (keys, values, seen) of each group's prompt, for attention.py
        self.attended = False  # whether an attention took shared_prefix

    def update_and_fetch(self, keys, values):
        if self.shared_prefix is not None:  # the attention joins the prompt's keys to these itself
            return keys, values
        if self.keys is not None:
            keys = mx.concatenate([self.keys, keys], axis=2)
            values = mx.concatenate([self.values, values], axis=2)
        self.keys, self.values, self.offset = keys, values, keys.shape[2]
        return keys, values

    def make_mask(self, n: int, return_array: bool = False, window_size=None):
        if self.mask is not None or self.shared_prefix is not None:  # attention.py masks a shared prompt itself
            return self.mask
        window = window_of(window_size, self.window)
        if window is None and n == 1:
            return None
        if window is None and not return_array:
            return "causal"  # lower-right aligned: query i sees keys 0 .. offset + i
        rows = mx.arange(self.offset, self.offset + n)[:, None]
        return within_window(rows, mx.arange(self.offset + n)[None], window)

    @property
    def state(self):
        return self.keys, self.values


def unshared_cache_kinds(model) -> list[str]:
    """The names of the cache kinds of `model` that PrefixCache cannot stand in for: it does a plain
    KVCache and a sliding window's RotatingKVCache; the state of convolution, SSM or delta-net
    layers (hybrids' ArraysCache) cannot share a prefix this way, and such models are scored on
    the padded path (commands/setup.py decides, once)."""
    return other_cache_kinds(model)


def group_hidden(model, body, prefix: mx.array, pad: mx.array, row_group: mx.array, inputs: mx.array) -> mx.array:
    """Final hidden states (N, T, D) of completion inputs (N, T), each row on top of its group's
    prompt: prefix (groups, C) left-padded by pad (groups,) columns, row_group (N,) each row's
    group; logits (N, T, V) where `body` is the whole model (`split_head`).

    All groups run in one pass, not one after another: on builtin:small (4 groups of 4, 32-token
    completions) a forward+backward measured 0.95 s against 1.42 s and a 10% lower peak; on
    builtin:tiny, whose backward transients outweigh what it stores, 0.10 s against 0.14 s at a 17%
    higher peak (51 against 43 MB).

    Groups of equal size (row_group (groups, G)) on the CPU in float32 keep one copy of each
    prompt's keys and values (`_over_shared`); otherwise each row gets its group's, gathered."""
    cache = [PrefixCache(w) for w in layer_windows(model)]
    if not prefix.shape[1]:
        return body(inputs, cache=cache)
    seen = mx.arange(prefix.shape[1])[None] >= pad[:, None]  # (groups, C): the real prompt columns
    _set_masks(cache, lambda window: _prefix_mask(seen, window))
    body(prefix, cache=cache)  # keys/values only: the head never runs here
    if row_group.ndim == 2 and cpu_exp.fast(cache[0].keys) and not getattr(model.layers[0], "recomputed", False):
        hidden = _over_shared(body, cache, seen, inputs)
        if hidden is not None:
            return hidden
    rows = row_group.reshape(-1)
    for c in cache:
        c.keys, c.values = c.keys[rows], c.values[rows]
    _set_masks(cache, lambda window: _completion_mask(seen[rows], inputs.shape[1], window))
    return body(inputs, cache=cache)


def _set_masks(cache, make):
    """Each layer's mask, `make(window)`, made once per window: the model asks one layer of each
    kind for the mask its kind shares (Gemma 3: the first layer for the sliding ones)."""
    made = {}
    for c in cache:
        if c.window not in made:
            made[c.window] = make(c.window)
        c.mask = made[c.window]


def _over_shared(body, cache, seen, inputs):
    """The completions' hidden states with every layer's attention over its group's prompt keys
    as they are (attention.py's `_over_shared_prefix`), or None, the caches as they were, where a
    layer's attention did not take them (a family with an attention of its own, sinks).

    Measured (the bench's P=2 x G=8, 64 new tokens, beta 0.04, float32, 2-core EPYC, OpenBLAS,
    rounds in turn): builtin:tiny's update peaked at 51.2-51.4 MB against 53.7-53.8 gathered and
    took 0.11-0.13 s against 0.14-0.15 s; builtin:small's peaked at 0.922 GB against 0.936."""
    for c in cache:
        c.shared_prefix, c.keys, c.values, c.mask = (c.keys, c.values, seen), None, None, None
    hidden = body(inputs, cache=cache)
    if all(c.attended for c in cache):
        return hidden
    for c in cache:
        (c.keys, c.values, _), c.shared_prefix = c.shared_prefix, None
    return None


def _prefix_mask(seen: mx.array, window=None) -> mx.array:
    """(groups, 1, C, C): causal over the real columns (the last `window` of them); a padding
    column sees itself only."""
    C = seen.shape[1]
    if window is None:
        causal = mx.tril(mx.ones((C, C), dtype=mx.bool_))
    else:
        causal = within_window(mx.arange(C)[:, None], mx.arange(C)[None], window)
    return (causal & (seen[:, None, :] | mx.eye(C, dtype=mx.bool_)))[:, None]


def _completion_mask(seen: mx.array, T: int, window=None) -> mx.array:
    """(N, 1, T, C + T): each row's real prompt columns, then causal over its completion; the
    last `window` columns of both where it is set."""
    N, C = seen.shape
    prompt = mx.broadcast_to(seen[:, None, None, :], (N, 1, T, C))
    if window is None:
        own = mx.broadcast_to(mx.tril(mx.ones((T, T), dtype=mx.bool_)), (N, 1, T, T))
        return mx.concatenate([prompt, own], axis=-1)
    near = within_window(mx.arange(C, C + T)[:, None], mx.arange(C + T)[None], window)  # completion t is column C + t
    return mx.concatenate([prompt, mx.ones((N, 1, T, T), dtype=mx.bool_)], axis=-1) & near[None, None]


def _grouped_scores(model, batch, temperature: float, entropies: bool):
    """head_logprobs of a shared-prefix micro-batch, (N, T) each."""
    body, head, vocab = split_head(model)
    hidden = group_hidden(model, body, batch.prefix, batch.prefix_pad, batch.row_group, batch.inputs)
    return head_logprobs(hidden, batch.targets, head, vocab, temperature, entropies)


def grouped_token_logprobs(model, batch, temperature: float = 1.0) -> mx.array:
    """log softmax(logits / temperature)[target] of each completion token, (N, T)."""
    return _grouped_scores(model, batch, temperature, False)[0]


def grouped_token_logprobs_and_entropies(model, batch, temperature: float = 1.0):
    """`grouped_token_logprobs` and each position's entropy (a constant), (N, T) each."""
    return _grouped_scores(model, batch, temperature, True)


def pack_groups(prompts, completions, pad_to: int = 1):
    """The completions of consecutive rows sharing a prompt, for `grouped_token_logprobs`.

    Returns (prefix [groups, C]: each run of equal prompts' p[:-1], left-padded to C columns
    (`prefix_columns`); pad [groups]: its padding columns; row_group [N]: each row's run, or
    [groups, N / groups] where the runs have one length (`group_hidden` shares prompts then); inputs
    [N, T], targets [N, T], mask [N, T]); inputs[i] = [p[-1]] + c[:-1], right-padded to T (a
    multiple of `pad_to`), so inputs[i, t] is followed by targets[i, t].
    """
    if len(prompts) != len(completions):
        raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
    longest = max(len(c) for c in completions)
    T = max(1, -(-longest // pad_to) * pad_to)
    runs, row_group, inputs, targets, mask = [], [], [], [], []
    for p, c in zip(prompts, completions):
        if not p:
            raise ValueError("every prompt needs at least one token")
        if not runs or list(runs[-1]) != list(p):
            runs.append(p)
        row_group.append(len(runs) - 1)
        n = len(c)
        inputs.append([p[-1]] + list(c[:-1]) + [0] * (T - max(n, 1)))
        targets.append(list(c) + [0] * (T - n))
        mask.append([1.0] * n + [0.0] * (T - n))
    C = prefix_columns(max(len(p) - 1 for p in runs))
    pad = [C - (len(p) - 1) for p in runs]
    prefix = [[0] * k + list(p[:-1]) for p, k in zip(runs, pad)]
    groups = mx.array(row_group, dtype=mx.int32)
    if len({row_group.count(g) for g in range(len(runs))}) == 1:  # runs of one size: their shape says so
        groups = groups.reshape(len(runs), -1)
    return (mx.array(prefix, dtype=mx.int32).reshape(len(runs), C), mx.array(pad, dtype=mx.int32),
            groups, mx.array(inputs), mx.array(targets), mx.array(mask))


def batch_logprobs(model, b, temperature: float) -> mx.array:
    """Token log-probs (n, T) of a micro-batch (update/batches.py), packed or shared-prefix."""
    if b.prefix is not None:
        return grouped_token_logprobs(model, b, temperature)
    return token_logprobs(model, b.inputs, b.positions, b.targets, temperature)


def batch_logprobs_and_entropies(model, b, temperature: float):
    """Token log-probs and entropies (n, T) of a micro-batch (update/batches.py), packed or shared-prefix."""
    if b.prefix is not None:
        return grouped_token_logprobs_and_entropies(model, b, temperature)
    return token_logprobs_and_entropies(model, b.inputs, b.positions, b.targets, temperature)

