"""Shared-prefix scoring: each group's prompt runs once, its G completions run on top.

A group's prompt p is run once over p[:-1]; each layer's keys and values are repeated along
the batch for its G completions, which then run as inputs [p[-1]] + c[:-1] (right-padded) on
top of that prefix, so logits position t predicts completion token t. Gradients reach the
prompt's keys/values from every completion and flow back through the one prefix pass. The
log-probs equal those of the padded full sequences (`pack_sequences`) to float precision
(tests/test_prefix.py); the prompt's work drops from G passes to one.
"""

import mlx.core as mx
from mlx_lm.models.cache import KVCache, make_prompt_cache

from mlx_grpo.algorithm.chunked import head_logprobs
from mlx_grpo.algorithm.loss import split_head, token_logprobs, token_logprobs_and_entropies


class PrefixCache:
    """The part of mlx-lm's KVCache interface the attention layers use, without in-place writes
    (each call concatenates), so gradients and mx.checkpoint see plain array functions."""

    def __init__(self):
        self.keys = self.values = None
        self.offset = 0

    def update_and_fetch(self, keys, values):
        if self.keys is not None:
            keys = mx.concatenate([self.keys, keys], axis=2)
            values = mx.concatenate([self.values, values], axis=2)
        self.keys, self.values, self.offset = keys, values, keys.shape[2]
        return keys, values

    def make_mask(self, n: int, return_array: bool = False, window_size=None):
        if window_size is not None:
            raise ValueError("shared-prefix scoring does not support sliding-window attention")
        if n == 1:
            return None
        if not return_array:
            return "causal"  # lower-right aligned: query i sees keys 0 .. offset + i
        rows = mx.arange(self.offset, self.offset + n)[:, None]
        return rows >= mx.arange(self.offset + n)[None]

    @property
    def state(self):
        return self.keys, self.values


def supports_shared_prefix(model) -> bool:
    """Whether every layer keeps a plain attention cache (mlx-lm's KVCache), the one kind
    PrefixCache stands in for. Sliding-window attention (Gemma 3's RotatingKVCache) and the
    state of convolution, SSM or delta-net layers (hybrids' ArraysCache) cannot share a prefix
    this way: such models are scored on the padded path (commands/setup.py decides, once)."""
    return not unshared_cache_kinds(model)


def unshared_cache_kinds(model) -> list[str]:
    """The names of the cache kinds of `model` that PrefixCache cannot stand in for."""
    return sorted({type(c).__name__ for c in make_prompt_cache(model) if type(c) is not KVCache})


def group_hidden(model, body, prompt: mx.array, inputs: mx.array) -> mx.array:
    """Final hidden states (G, T, D) of one group: prompt (P,) run once, inputs (G, T) on top of
    it; logits (G, T, V) where `body` is the whole model (`split_head`)."""
    cache = [PrefixCache() for _ in range(len(model.layers))]
    if prompt.shape[0] > 1:
        body(prompt[None, :-1], cache=cache)  # (1, P-1): keys/values only, no head
        for c in cache:  # a broadcast view: the concatenation with the completions' keys is the one copy
            c.keys, c.values = (mx.broadcast_to(a, (inputs.shape[0], *a.shape[1:])) for a in (c.keys, c.values))
    return body(inputs, cache=cache)


def _grouped_scores(model, batch, temperature: float, entropies: bool):
    """head_logprobs of a shared-prefix micro-batch, its groups in order, (N, T) each."""
    body, head, vocab = split_head(model)
    parts, row = [], 0
    for prompt, count in zip(batch.prompts, batch.group_rows):
        parts.append(group_hidden(model, body, prompt, batch.inputs[row:row + count]))
        row += count
    return head_logprobs(parts, batch.targets, head, vocab, temperature, entropies)  # parts: (G, T, D) each


def grouped_token_logprobs(model, batch, temperature: float = 1.0) -> mx.array:
    """log softmax(logits / temperature)[target] of each completion token, (N, T)."""
    return _grouped_scores(model, batch, temperature, False)[0]


def grouped_token_logprobs_and_entropies(model, batch, temperature: float = 1.0):
    """`grouped_token_logprobs` and each position's entropy (a constant), (N, T) each."""
    return _grouped_scores(model, batch, temperature, True)


def pack_groups(prompts, completions, pad_to: int = 1):
    """The completions of consecutive rows sharing a prompt, for `grouped_token_logprobs`.

    Returns (prompts: one (P,) array per run of equal prompts, group_rows: rows of each run,
    inputs [N, T], targets [N, T], mask [N, T]); inputs[i] = [p[-1]] + c[:-1], right-padded
    to T (a multiple of `pad_to`), so inputs[i, t] is followed by targets[i, t].
    """
    if len(prompts) != len(completions):
        raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
    longest = max(len(c) for c in completions)
    T = max(1, -(-longest // pad_to) * pad_to)
    runs, rows, inputs, targets, mask = [], [], [], [], []
    for p, c in zip(prompts, completions):
        if not p:
            raise ValueError("every prompt needs at least one token")
        if runs and list(runs[-1]) == list(p):
            rows[-1] += 1
        else:
            runs.append(p)
            rows.append(1)
        n = len(c)
        inputs.append([p[-1]] + list(c[:-1]) + [0] * (T - max(n, 1)))
        targets.append(list(c) + [0] * (T - n))
        mask.append([1.0] * n + [0.0] * (T - n))
    return ([mx.array(list(p)) for p in runs], rows, mx.array(inputs), mx.array(targets), mx.array(mask))


def batch_logprobs(model, b, temperature: float) -> mx.array:
    """Token log-probs (n, T) of a micro-batch (update/batches.py), packed or shared-prefix."""
    if b.prompts is not None:
        return grouped_token_logprobs(model, b, temperature)
    return token_logprobs(model, b.inputs, b.positions, b.targets, temperature)


def batch_logprobs_and_entropies(model, b, temperature: float):
    """Token log-probs and entropies (n, T) of a micro-batch (update/batches.py), packed or shared-prefix."""
    if b.prompts is not None:
        return grouped_token_logprobs_and_entropies(model, b, temperature)
    return token_logprobs_and_entropies(model, b.inputs, b.positions, b.targets, temperature)

