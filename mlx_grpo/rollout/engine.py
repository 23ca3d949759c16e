"""A decode loop of our own for GRPO's shape: P prompts x G completions, one compiled step.

mlx-lm's BatchGenerator builds each decode step's graph in Python, layer by layer, and reads
the sampled tokens back every step. For small models and short completions that overhead is
most of the rollout (on a Mac it is paid in kernel launches). Here every layer's keys and values
are allocated once at their final length, every row writes the same column, and the whole step
(the model, the sampler, the sampled token's log-prob) is one `mx.compile`d function of fixed
shapes: it is traced again only when the batch, the buffer length or the columns attention reads
(`READ_BUCKET`) change, and the prompt part of the buffer is rounded up (`PROMPT_BUCKET`) so
prompts of similar length share a trace. The host looks for finished rows after every step, on
the tokens of `CHECK_LAG` steps back, computed by then, so the device never waits on a read and at
most `CHECK_LAG` steps run after the last row has ended; once at most half the batch is still
decoding, the finished rows leave it (`_kept`: the batch shrinks to a power of two, so a run
traces a few batch sizes).

Each prompt is prefilled once and its cache copied into its G rows, left-padded so that all
rows' next token goes to one column; the mask hides the padding. A layer must keep a plain KVCache
or a sliding window's RotatingKVCache (models/caches.py): the latter's buffer here is the whole
length, not the window, and its mask shows the window. `unsupported` names what another model
keeps, and the rollout then uses BatchGenerator.
"""

from functools import partial

import mlx.core as mx
from mlx_lm.models.cache import KVCache

from mlx_grpo.cpu_exp import logsumexp
from mlx_grpo.models.caches import layer_windows, other_cache_kinds, window_of, within_window
from mlx_grpo.rollout.frozen_layout import lay_out_frozen
from mlx_grpo.rollout.inverse_cdf import InverseCdfSampler
from mlx_grpo.streams import split_rows

PROMPT_BUCKET = 32  # prompt columns are rounded up to a multiple of this (fewer re-traces)
CHECK_LAG = 2  # a look for finished rows reads the step this many steps back
# Attention reads the columns up to the last one written, rounded up to this many, not the whole
# buffer: a trace per bucket, and at long completions about half the keys and values read
# (builtin:tiny, 16 rows x 1,024 tokens: 6.6-7.8 s against 9.5-10.5 s reading the whole buffer).
READ_BUCKET = 256


class StaticKVCache:
    """One layer's keys and values at full length, written at column `idx` (a scalar array), of
    which attention reads the first `limit` (a Python int past the written ones): the part of
    mlx-lm's cache interface its attention layers call."""

    def __init__(self, keys, values, idx, offset, left_padding, limit, window=None):
        self.keys, self.values = keys, values
        self.idx = idx  # the column the current token is written to, the same for every row
        self.offset = offset  # (B,) each row's position: what RoPE reads
        self.left_padding = left_padding  # (B,) columns before each row's prompt
        self.limit = limit
        self.window = window  # the max_size of the RotatingKVCache this layer stands for, or None

    def update_and_fetch(self, keys, values):
        start = self.idx.reshape(1)
        self.keys = mx.slice_update(self.keys, keys, start, axes=(2,))
        self.values = mx.slice_update(self.values, values, start, axes=(2,))
        return self.keys[..., :self.limit, :], self.values[..., :self.limit, :]

    def make_mask(self, N: int, return_array: bool = False, window_size=None, **kwargs):
        cols = mx.arange(self.limit)[None]
        last = self.idx + N - 1
        seen = within_window(last, cols, window_of(window_size, self.window))
        return ((cols >= self.left_padding[:, None]) & seen)[:, None, None, :]


class _PrefillCache(KVCache):
    """mlx-lm's KVCache (every key kept, in order), its mask limited to `window` keys: a prompt's
    prefill for a layer that keeps a RotatingKVCache of max_size `window`."""

    def __init__(self, window: int):
        super().__init__()
        self.window = window

    def make_mask(self, N: int, return_array: bool = False, window_size=None, **kwargs):
        return super().make_mask(N, return_array=return_array, window_size=window_of(window_size, self.window))


def unsupported(model) -> str | None:
    """Why this model cannot decode here (None: it can)."""
    kinds = other_cache_kinds(model)
    return f"its layers keep {', '.join(kinds)}, not only KVCache or a sliding window's RotatingKVCache" if kinds else None


def _prefill_caches(model) -> list:
    return [KVCache() if w is None else _PrefillCache(w) for w in layer_windows(model)]


def _compiled_step(model, sampler, logprob, limit):
    """The compiled step of (sampler, logprob) reading `limit` columns, kept on the model: a
    module-level cache would keep every model it saw alive (its steps hold the model)."""
    steps = getattr(model, "_decode_steps", None)
    if steps is None:
        steps = {}
        object.__setattr__(model, "_decode_steps", steps)  # an attribute, not a child of the module tree
    if (sampler, logprob, limit) not in steps:
        steps[(sampler, logprob, limit)] = _make_step(model, sampler, logprob, limit)
    return steps[(sampler, logprob, limit)]


def _make_step(model, sampler, logprob, limit):
    windows = layer_windows(model)

    # The weights are read at each call (inputs), so an optimizer update is seen without a re-trace.
    @partial(mx.compile, inputs=[model.state, mx.random.state], outputs=[mx.random.state])
    def step(tokens, keys, values, idx, offset, left_padding):
        caches = [StaticKVCache(k, v, idx, offset, left_padding, limit, w) for k, v, w in zip(keys, values, windows)]
        logits = model(tokens[:, None], cache=caches)[:, -1, :]
        nxt, lp = split_rows(partial(_sample, sampler, logprob), logits)
        return nxt, lp, [c.keys for c in caches], [c.values for c in caches]

    return step


def _sample(sampler, logprob, logits) -> tuple:
    """(tokens, their log-probs) of logits (rows, vocab): at Qwen's vocabulary 89 ms of a 370 ms
    step on 2 CPU cores, cut in two by rows there (mlx_grpo.streams). An inverse-CDF sampler draws
    from the logits and gives the log-prob in the same pass (8 rows: 4 ms against 30 ms for the
    log-softmax, MLX's categorical draw and the log-prob's logsumexp); `logprob` is then
    make_sampling_logprob's of the same settings, which computes the same number."""
    if isinstance(sampler, InverseCdfSampler) and sampler.pays(logits.shape[-1]):
        nxt, lp = sampler.draw(logits)
        return nxt, lp if logprob is not None else mx.zeros(nxt.shape, mx.float32)
    logprobs = logits - logsumexp(logits)[:, None]  # as BatchGenerator hands the sampler
    nxt = sampler(logprobs).astype(mx.uint32)
    return nxt, logprob(logprobs, nxt) if logprob is not None else mx.zeros(nxt.shape, mx.float32)


def _prefix_buffers(model, prompts, group_size, new_tokens):
    """Per layer, keys and values (B, heads, columns, dims) holding each row's prompt[:-1],
    right-aligned at column `start`; returns them with `start` and each prompt's length."""
    prefills = []
    for prompt in prompts:
        cache = _prefill_caches(model)
        if len(prompt) > 1:
            model(mx.array(prompt[:-1])[None], cache=cache)
        prefills.append(cache)
    lengths = [len(p) - 1 for p in prompts]
    start = -(-max(lengths) // PROMPT_BUCKET) * PROMPT_BUCKET if max(lengths) else 0
    width = start + new_tokens
    keys, values = [], []
    for layer in range(len(prefills[0])):
        per_kind = []
        for kind in ("keys", "values"):
            like = _shape_of(prefills, layer, kind, model)
            rows = []
            for cache, n in zip(prefills, lengths):
                part = getattr(cache[layer], kind)
                rows.append(_row(part[..., :n, :] if n else None, n, start, width, like))
            per_kind.append(mx.repeat(mx.concatenate(rows), group_size, axis=0))
        keys.append(per_kind[0])
        values.append(per_kind[1])
    return keys, values, start, lengths


def _shape_of(prefills, layer, kind, model):
    """(heads, dims, dtype) of a layer's keys or values, from any prompt that has some."""
    for cache in prefills:
        part = getattr(cache[layer], kind)
        if part is not None:
            return part.shape[1], part.shape[3], part.dtype
    # no prompt longer than one token: one step of the model tells the shape
    probe = _prefill_caches(model)
    model(mx.array([[0]]), cache=probe)
    part = getattr(probe[layer], kind)
    return part.shape[1], part.shape[3], part.dtype


def _row(part, n, start, width, like):
    heads, dims, dtype = like
    pieces = [mx.zeros((1, heads, start - n, dims), dtype)]
    if n:
        pieces.append(part.astype(dtype))
    pieces.append(mx.zeros((1, heads, width - start, dims), dtype))
    return mx.concatenate(pieces, axis=2)


def decode(model, prompts, *, group_size, max_new_tokens, sampler, eos, logprob=None, on_progress=None):
    """Sample `group_size` completions of each prompt. Returns per row (prompt-major) the tokens
    (the ending EOS included), each token's log-prob under the sampling distribution (zeros when
    `logprob` is None) and whether it stopped at `max_new_tokens` rather than at an EOS."""
    lay_out_frozen(model)
    keys, values, start, lengths = _prefix_buffers(model, prompts, group_size, max_new_tokens)
    rows = len(prompts) * group_size
    offset = mx.array([n for n in lengths for _ in range(group_size)], dtype=mx.int32)
    left = start - offset
    tokens = mx.array([p[-1] for p in prompts for _ in range(group_size)], dtype=mx.uint32)
    width = keys[0].shape[2]
    out, eos = [], mx.array(sorted(eos))
    ended = mx.zeros((rows,), dtype=mx.bool_)
    live, sampled = list(range(rows)), 0  # live: the row at each batch position
    for k in range(max_new_tokens):
        read = min(width, start + -(-(k + 1) // READ_BUCKET) * READ_BUCKET)  # columns written so far, rounded up
        step = _compiled_step(model, sampler, logprob, read)
        tokens, lp, keys, values = step(tokens, keys, values, mx.array(start + k, dtype=mx.int32), offset + k, left)
        ended = ended | mx.any(tokens[:, None] == eos[None], axis=1)
        mx.async_eval(tokens, lp, ended)
        out.append((tokens, lp, ended, live))
        if k >= CHECK_LAG:
            checked = k + 1 - CHECK_LAG  # steps whose tokens are read: queued before the last ones
            _, _, done, then = out[checked - 1]
            finished = {r for r, d in zip(then, done.tolist()) if d} | set(range(rows)).difference(then)
            sampled += len(then)  # each step is checked once, in order
            if on_progress:
                on_progress(sampled, len(finished), rows)
            if len(finished) == rows:
                break
            if (keep := _kept(live, finished)) is not None:
                at = mx.array(keep)
                keys, values = [x[at] for x in keys], [x[at] for x in values]
                tokens, offset, left, ended = tokens[at], offset[at], left[at], ended[at]
                live = [live[p] for p in keep]
    return _assemble(out, set(eos.tolist()), rows, on_progress)


def _kept(live, finished):
    """The batch positions to decode on with: the unfinished rows, topped up with finished ones to a
    power of two (so a run traces a few batch sizes); None when that would not halve the batch."""
    alive = [p for p, r in enumerate(live) if r not in finished]
    size = 1 << (len(alive) - 1).bit_length()
    if size > len(live) // 2:
        return None
    spare = [p for p, r in enumerate(live) if r in finished]
    return sorted(alive + spare[:size - len(alive)])


def _assemble(out, eos, rows, on_progress):
    mx.eval([(t, lp) for t, lp, _, _ in out])
    tokens, logprobs, closed = [[] for _ in range(rows)], [[] for _ in range(rows)], [False] * rows
    for t, lp, _, live in out:
        for r, token, value in zip(live, t.tolist(), lp.tolist()):
            if closed[r]:  # its EOS came earlier: what follows is filler
                continue
            tokens[r].append(token)
            logprobs[r].append(value)
            closed[r] = token in eos
    truncated = [seq[-1] not in eos for seq in tokens]
    if on_progress:
        on_progress(sum(len(s) for s in tokens), rows, rows)
    return tokens, logprobs, truncated
