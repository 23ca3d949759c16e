"""Token log-probs and entropies from final hidden states, a chunk of completion positions at a time.

At a large vocabulary the logits dominate an update's memory: (rows x tokens x vocabulary) float32
values, kept for the backward pass with the softmax that the gradient of the logsumexp needs
(16 rows x 256 tokens at Qwen's 151,936 is 2.5 GB a copy). Here the vocabulary projection runs
over chunks of positions, one after another, in a custom function whose backward pass recomputes
each chunk's logits and adds its gradient in before it starts the next: the logits alive at once
are a few chunks' (LOGITS_BUDGET), whatever the rows and tokens. A chunk holds LOGITS_BUDGET logit elements, so a
small vocabulary is one chunk, computed exactly as without chunks (the same bits).

For completion token t with scaled logits z = head(h_t) / temperature:
    logp[t] = z[target_t] - logsumexp(z)
    H[t]    = logsumexp(z) - sum_v softmax(z)_v z_v      (a constant: stop_gradient)
"""

import mlx.core as mx
from mlx.utils import tree_flatten, tree_unflatten

from mlx_grpo.cpu_exp import exp, logsumexp
from mlx_grpo.streams import split_rows

# Logit elements (rows x positions x vocabulary) one chunk computes: 2^24, 64 MiB a float32 copy.
# builtin:tiny (322 tokens) stays one chunk up to 52,000 rows x positions; Qwen's 151,936 at 16
# rows gets 6 positions a chunk. MLX's CPU backend allocates the outputs of the next ~10
# operations before they run, so an update holds about 11 chunk-sized arrays at its peak (measured
# 11.0 on the padded path, 8.0 sharing prefixes; 4-32 positions of 8 rows x 65,536), about 0.7 GB
# at this budget, against 3 arrays of rows x tokens x vocabulary in one chunk. A smaller budget
# holds less but reads the head's weights once more per chunk.
LOGITS_BUDGET = 1 << 24


def chunk_length(rows: int, positions: int, vocab: int, budget: int | None = None) -> int:
    """Positions per chunk: as many as keep rows x chunk x vocab within `budget` (default
    LOGITS_BUDGET), at least one."""
    budget = LOGITS_BUDGET if budget is None else budget
    return max(1, min(positions, budget // max(rows * vocab, 1)))


def _scaled(logits, temperature: float):
    z = logits.astype(mx.float32)
    return z / temperature if temperature != 1.0 else z


def _normalised(z, targets, entropies: bool) -> tuple:
    """(log-probs of targets, logsumexp[, entropies]) of scaled logits z [n, t, V], [n, t] each."""
    lse = logsumexp(z)
    logp = mx.take_along_axis(z, targets[..., None], axis=-1).squeeze(-1) - lse
    if not entropies:
        return logp, lse
    # The softmax here is a transient [n, t, V] array, never kept for the backward pass.
    zc, norm = mx.stop_gradient(z), mx.stop_gradient(lse)
    probs = exp(zc - norm[..., None])
    return logp, lse, norm - (probs * zc).sum(-1)


def _logit_gradient(z, targets, lse, cotangent) -> tuple:
    """d loss / d z = (onehot(target) - softmax(z)) * d loss / d logp, as a 1-tuple."""
    onehot = mx.arange(z.shape[-1]) == targets[..., None]
    return ((onehot - exp(z - lse[..., None])) * cotangent[..., None],)


def scores(logits, targets, temperature: float, entropies: bool) -> tuple:
    """(log-probs of targets,) or (log-probs, entropies), [n, t] each, of logits [n, t, V]."""
    logp, _, *entropy = _normalised(_scaled(logits, temperature), targets, entropies)
    return (logp, *entropy)


def _after(array, previous: list):
    """`array`, computed only once `previous` are: MLX evaluates up to 20 independent branches of a
    graph side by side (MLX_BFS_MAX_WIDTH), which kept 20 chunks' logits alive where chained chunks
    keep 11 (measured, 32 chunks)."""
    return mx.depends(array, previous) if previous else array


def _chunked(head, temperature: float, entropies: bool, step: int):
    """(hidden, targets, *head parameter leaves) -> (log-probs, logsumexp[, entropies]), a chunk of
    `step` positions at a time in order, forward and backward."""
    names = [k for k, _ in tree_flatten(head.trainable_parameters())] if head is not None else []

    def logits(leaves, hidden):
        """One chunk's scaled float32 logits, the head's trainable parameters given as `leaves`."""
        if head is None:
            return _scaled(hidden, temperature)
        kept = head.trainable_parameters()
        head.update(tree_unflatten(list(zip(names, leaves))))
        z = head(hidden)
        head.update(kept)  # the arrays a gradient trace passes in are not left in the model
        return _scaled(z, temperature)

    @mx.custom_function
    def chunked(hidden, targets, *leaves):
        parts, previous = [], []
        for s in range(0, targets.shape[1], step):
            z = logits(leaves, _after(hidden[:, s:s + step], previous))
            parts.append(split_rows(lambda z, t: _normalised(z, t, entropies), z, targets[:, s:s + step]))
            previous = list(parts[-1])
        return tuple(mx.concatenate(column, axis=1) for column in zip(*parts))

    @chunked.vjp
    def chunked_vjp(primals, cotangents, outputs):
        # d logp[t] / d z[t] = onehot(target) - softmax(z[t]), the softmax from the forward's
        # logsumexp: a chunk's logits are computed once more, and nothing else of its forward.
        hidden, targets, *leaves = primals
        lse, d_hidden, d_leaves = outputs[1], [], None
        for s in range(0, targets.shape[1], step):
            h = _after(hidden[:, s:s + step], d_hidden[-1:] + (d_leaves or []))
            z = logits(leaves, h)
            dz, = split_rows(_logit_gradient, z, targets[:, s:s + step], lse[:, s:s + step],
                              cotangents[0][:, s:s + step])
            _, (dh, *dp) = mx.vjp(lambda h, *p: [logits(p, h)], [h, *leaves], [dz])
            d_hidden.append(dh)
            d_leaves = dp if d_leaves is None else [a + b for a, b in zip(d_leaves, dp)]
        return (mx.concatenate(d_hidden, axis=1), mx.zeros_like(targets), *(d_leaves or []))

    def call(hidden, targets):
        leaves = [v for _, v in tree_flatten(head.trainable_parameters())] if head is not None else []
        logp, _, *entropy = chunked(hidden, targets, *leaves)
        return (logp, *entropy)

    return call


def head_logprobs(hidden, targets, head=None, vocab: int | None = None, temperature: float = 1.0,
                  entropies: bool = False, budget: int | None = None):
    """(log-probs [N, T], entropies [N, T] or None) of `targets` under softmax(head(hidden) / temperature).

    hidden: (N, T, D) final hidden states at the completion positions, or a list of blocks of its
    rows (shared-prefix groups, in order); head: the vocabulary projection (an nn.Module,
    (n, t, D) -> (n, t, V); its trainable parameters get their gradient) with `vocab` outputs, or
    None when `hidden` already holds the logits (N, T, V) of a family whose forward is more than
    head(body(x)); those are scored in chunks too, which bounds their float32 copies but not the
    logits themselves.
    """
    blocks = hidden if isinstance(hidden, list) else [hidden]
    N, T = targets.shape
    step = chunk_length(N, T, blocks[0].shape[-1] if head is None else vocab, budget)
    if step >= T:  # one chunk: each block projected on its own and no recompute, as without chunks
        logits = blocks if head is None else [head(b) for b in blocks]
        out = scores(_rows(logits), targets, temperature, entropies)
    else:
        out = _chunked(head, temperature, entropies, step)(_rows(blocks), targets)
    return out[0], (out[1] if entropies else None)


def _rows(blocks: list) -> mx.array:
    return blocks[0] if len(blocks) == 1 else mx.concatenate(blocks, axis=0)
