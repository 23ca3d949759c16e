"""Token log-probs and entropies from final hidden states, a chunk of completion positions at a time.

At a large vocabulary the logits dominate an update's memory: (rows x tokens x vocabulary) float32
values, kept for the backward pass with the softmax that the gradient of the logsumexp needs
(16 rows x 256 tokens at Qwen's 151,936 is 2.5 GB a copy). Here the vocabulary projection runs
over chunks of positions, one after another, in a custom function whose backward pass recomputes
each chunk's logits and adds its gradient in before it starts the next: the logits alive at once
are one chunk's, whatever the rows and tokens. A chunk holds LOGITS_BUDGET logit elements, so a
small vocabulary is one chunk, computed exactly as without chunks (the same bits).

For completion token t with scaled logits z = head(h_t) / temperature:
    logp[t] = z[target_t] - logsumexp(z)
    H[t]    = logsumexp(z) - sum_v softmax(z)_v z_v      (a constant: stop_gradient)
"""

import mlx.core as mx
from mlx.utils import tree_flatten, tree_unflatten

# Logit elements (rows x positions x vocabulary) one chunk computes: 2^24, 64 MiB a float32 copy.
# builtin:tiny (322 tokens) stays one chunk up to 52,000 rows x positions; Qwen's 151,936 at 16
# rows gets 6 positions a chunk.
LOGITS_BUDGET = 1 << 24


def chunk_length(rows: int, positions: int, vocab: int, budget: int | None = None) -> int:
    """Positions per chunk: as many as keep rows x chunk x vocab within `budget` (default
    LOGITS_BUDGET), at least one."""
    budget = LOGITS_BUDGET if budget is None else budget
    return max(1, min(positions, budget // max(rows * vocab, 1)))


def scores(logits, targets, temperature: float, entropies: bool) -> tuple:
    """(log-probs of targets,) or (log-probs, entropies), [n, t] each, of logits [n, t, V]."""
    z = logits.astype(mx.float32)
    z = z / temperature if temperature != 1.0 else z
    lse = mx.logsumexp(z, axis=-1)
    logp = mx.take_along_axis(z, targets[..., None], axis=-1).squeeze(-1) - lse
    if not entropies:
        return (logp,)
    # The softmax here is a transient [n, t, V] array, never kept for the backward pass.
    zc, norm = mx.stop_gradient(z), mx.stop_gradient(lse)
    probs = mx.exp(zc - norm[..., None])
    return logp, norm - (probs * zc).sum(-1)


def _chunk_scores(head, names: list, temperature: float, entropies: bool):
    """(leaves, hidden, targets) -> `scores` of one chunk, the head's trainable parameters given
    as the array leaves `leaves` (named `names`), so that a gradient can be taken with respect to them."""

    def run(leaves, hidden, targets):
        if head is None:
            return scores(hidden, targets, temperature, entropies)
        kept = head.trainable_parameters()
        head.update(tree_unflatten(list(zip(names, leaves))))
        out = scores(head(hidden), targets, temperature, entropies)
        head.update(kept)  # the arrays a gradient trace passes in are not left in the model
        return out

    return run


def _after(array, previous: list):
    """`array`, computed only once `previous` are: MLX evaluates up to 20 independent branches of a
    graph side by side (MLX_BFS_MAX_WIDTH), which would keep that many chunks' logits alive."""
    return mx.depends(array, previous) if previous else array


def _chunked(head, temperature: float, entropies: bool, step: int):
    """(hidden, targets, *head parameter leaves) -> scores, a chunk of `step` positions at a time
    in order, forward and backward; the backward recomputes each chunk's logits."""
    names = [k for k, _ in tree_flatten(head.trainable_parameters())] if head is not None else []
    run = _chunk_scores(head, names, temperature, entropies)

    @mx.custom_function
    def chunked(hidden, targets, *leaves):
        parts, previous = [], []
        for s in range(0, targets.shape[1], step):
            parts.append(run(leaves, _after(hidden[:, s:s + step], previous), targets[:, s:s + step]))
            previous = list(parts[-1])
        return tuple(mx.concatenate(column, axis=1) for column in zip(*parts))

    @chunked.vjp
    def chunked_vjp(primals, cotangents, outputs):
        hidden, targets, *leaves = primals
        d_hidden, d_leaves = [], None
        for s in range(0, targets.shape[1], step):
            h = _after(hidden[:, s:s + step], d_hidden[-1:] + (d_leaves or []))
            t = targets[:, s:s + step]
            _, (dh, *dp) = mx.vjp(lambda h, *p: [run(p, h, t)[0]], [h, *leaves], [cotangents[0][:, s:s + step]])
            d_hidden.append(dh)
            d_leaves = dp if d_leaves is None else [a + b for a, b in zip(d_leaves, dp)]
        return (mx.concatenate(d_hidden, axis=1), mx.zeros_like(targets), *(d_leaves or []))

    def call(hidden, targets):
        leaves = [v for _, v in tree_flatten(head.trainable_parameters())] if head is not None else []
        return chunked(hidden, targets, *leaves)

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
