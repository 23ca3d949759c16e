"""Token log-probs of sampled completions and the clipped GRPO objective.

For completion i and token t, with ratio r and advantage A_i:

    L[i,t] = -min(r * A_i, clip(r, 1 - eps, 1 + eps_high) * A_i) * keep[i,t] + beta * KL[i,t] * r
    KL[i,t] = exp(ref_logp - logp) - (ref_logp - logp) - 1          (k3 estimator)
    r[i,t] = exp(logp[i,t] - old_logp[i,t])                          (token level, GRPO)
    r[i]   = exp(sum_t m (logp - old_logp) / sum_t m)                 (sequence level, GSPO)

The factor r on the KL term is the importance-sampling correction of the KL estimate
(DeepSeek-V3.2; TRL's use_bias_correction_kl, on by default in TRL 1.16, always on here): 1 in
value on-policy, it only changes the gradient. Under GSPO it is the sequence ratio r[i], so
each token's KL reaches the gradient of every token of its completion, as in TRL
(per_token_kl * coef_1, coef_1 of shape (B, 1)). keep is 1, or with top_entropy_quantile = rho < 1 the mask of the
tokens whose entropy is at least the (1 - rho) quantile of the micro-batch's valid tokens
(Wang et al. 2025); as in TRL it leaves the KL term and the normalisers alone.
With sampling_logp (the sampler's own log-probs of the tokens) the gap metrics of
algorithm/mismatch.py are logged, and with an importance-sampling correction the policy term
is multiplied by its weights w (token or sequence): L[i,t] = -w min(...) * keep + beta KL r.
The token losses are then reduced by one of `AGGREGATIONS`.
"""

import mlx.core as mx
import mlx.nn as nn

from mlx_grpo.algorithm.chunked import head_logprobs
from mlx_grpo.algorithm.mismatch import importance_weights, mismatch_metrics

LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")
IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence")

# Architectures whose forward is `head(body(x))` with nothing in between (no logit scaling or
# softcapping; Gemma 3's embedding scale is inside the body), so the vocabulary projection can
# run on completion positions only (a 150k-262k-token vocabulary over the prompt would otherwise
# dominate memory), a chunk of them at a time (algorithm/chunked.py). The head is `lm_head`, or
# the tied embedding where the model has none.
_PLAIN_HEAD_TYPES = {"qwen2", "qwen3", "llama", "mistral", "qwen2_moe", "qwen3_moe", "gemma3_text", "lfm2"}
# The same, with the language model one level down (vision-language classes mlx-lm loads as text).
_WRAPPED_HEAD_TYPES = {"qwen3_5"}


class _TiedHead(nn.Module):
    """A tied input embedding as the vocabulary projection: its weight, and gradient, are the embedding's."""

    def __init__(self, embedding):
        super().__init__()
        self.embedding = embedding

    def __call__(self, hidden):
        return self.embedding.as_linear(hidden)


def split_head(model):
    """(body, head, vocab): the transformer without its vocabulary projection, the projection (a
    module) and its outputs, where the forward is head(body(x)); else (model, None, None): the whole
    forward, whose outputs are logits already."""
    kind = getattr(model, "model_type", None)
    if kind not in _PLAIN_HEAD_TYPES | _WRAPPED_HEAD_TYPES:
        return model, None, None
    top = model.language_model if kind in _WRAPPED_HEAD_TYPES else model
    embedding = top.model.embed_tokens
    head = top.lm_head if "lm_head" in top else _TiedHead(embedding)
    return top.model, head, embedding.weight.shape[0]  # quantized weights pack along dim 1, not 0


def _completion_scores(model, inputs, positions, targets, temperature: float, entropies: bool):
    """head_logprobs of the completion positions [N, T] of the right-padded sequences `inputs` [N, L]."""
    body, head, vocab = split_head(model)
    hidden = mx.take_along_axis(body(inputs), positions[..., None], axis=1)  # (N, T, D), or (N, T, V) logits
    return head_logprobs(hidden, targets, head, vocab, temperature, entropies)


def token_logprobs(model, inputs, positions, targets, temperature: float = 1.0) -> mx.array:
    """log softmax(logits / temperature)[target] at each completion position, [N, T].

    The target is gathered and the normaliser is a logsumexp: about half the memory
    of a full log_softmax over the vocabulary.
    """
    return _completion_scores(model, inputs, positions, targets, temperature, False)[0]


def token_logprobs_and_entropies(model, inputs, positions, targets, temperature: float = 1.0):
    """`token_logprobs` and the entropy of each position's distribution, from one forward.

    Entropy H = logsumexp(z) - sum_v softmax(z)_v z_v of the temperature-scaled logits z,
    [N, T] each. It is a constant (stop_gradient): TRL computes it without gradient too,
    and it only feeds a metric and the top-entropy mask.
    """
    return _completion_scores(model, inputs, positions, targets, temperature, True)


def pack_sequences(prompts, completions, pad_to: int = 1):
    """Right-padded prompt+completion ids and the index arrays that score the completions.

    Returns (inputs [N, L], positions [N, T], targets [N, T], mask [N, T]) with L and T
    rounded up to a multiple of `pad_to`. positions[i, t] is the input position whose
    logits predict completion token t; padding points at position 0 and is masked out.
    """
    if len(prompts) != len(completions):
        raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
    longest = max(len(c) for c in completions)
    T = max(1, -(-longest // pad_to) * pad_to)
    L = max(len(p) + len(c) for p, c in zip(prompts, completions))
    L = -(-L // pad_to) * pad_to
    inputs, positions, targets, mask = [], [], [], []
    for p, c in zip(prompts, completions):
        if not p:
            raise ValueError("every prompt needs at least one token")
        seq = list(p) + list(c)
        inputs.append(seq + [0] * (L - len(seq)))
        n = len(c)
        positions.append([len(p) - 1 + t for t in range(n)] + [0] * (T - n))
        targets.append(list(c) + [0] * (T - n))
        mask.append([1.0] * n + [0.0] * (T - n))
    return mx.array(inputs), mx.array(positions), mx.array(targets), mx.array(mask)


def completion_logprobs(model, prompts, completions, temperature: float = 1.0) -> mx.array:
    """Log-probs [N, T] of each completion's own tokens given its prompt, 0 past its end.

    prompts, completions: N lists of token ids; T is the longest completion.
    """
    inputs, positions, targets, mask = pack_sequences(prompts, completions)
    return token_logprobs(model, inputs, positions, targets, temperature) * mask


def _grpo(per_token, mask, num_items, num_sequences, max_len):
    per_seq = (per_token * mask).sum(-1) / mx.maximum(mask.sum(-1), 1.0)
    return per_seq.sum() / num_sequences


def _bnpo(per_token, mask, num_items, num_sequences, max_len):
    return (per_token * mask).sum() / mx.maximum(num_items, 1.0)


def _dr_grpo(per_token, mask, num_items, num_sequences, max_len):
    return (per_token * mask).sum() / (num_sequences * max_len)


# How the token losses become one number. Each is sum(...) / normaliser so that a batch
# split into chunks, each given the whole batch's normaliser, sums to the unsplit loss.
# grpo: mean over sequences of each sequence's token mean (DeepSeekMath).
# bnpo: token mean over the batch.  dr_grpo: sum / (N * max_new_tokens) (Dr. GRPO).
# dapo: token sum / tokens of the whole optimizer step (DAPO); same formula as bnpo,
# but the trainer passes the step's token count.
AGGREGATIONS = {"grpo": _grpo, "bnpo": _bnpo, "dr_grpo": _dr_grpo, "dapo": _bnpo}

# dapo's normaliser already spans the accumulated micro-batches; the others are
# per micro-batch and are divided by the accumulation count, as TRL does.
DIVIDES_BY_ACCUMULATION = {"grpo": True, "bnpo": True, "dr_grpo": True, "dapo": False}


def high_entropy_mask(entropies, mask, top_quantile: float) -> mx.array:
    """1 on valid tokens whose entropy is >= the (1 - top_quantile) quantile, [N, T].

    The quantile is over the valid tokens only, linearly interpolated between order
    statistics (torch.quantile's default, which TRL uses), so top_quantile = 0.2 keeps
    about the 20% highest-entropy tokens.
    """
    valid = mask > 0
    n = valid.sum()
    ordered = mx.sort(mx.where(valid, entropies, mx.inf).reshape(-1))  # valid values first
    pos = (1.0 - top_quantile) * mx.maximum(n - 1, 0).astype(mx.float32)
    lo = mx.floor(pos).astype(mx.int32)
    hi = mx.minimum(lo + 1, mx.maximum(n - 1, 0)).astype(mx.int32)
    a, b = ordered[lo], ordered[hi]
    threshold = a + (pos - lo.astype(mx.float32)) * (b - a)
    return ((entropies >= threshold) & valid).astype(mx.float32)


def _importance_ratio(logp, old_logp, mask, level: str) -> mx.array:
    """exp(log ratio): [N, T] per token, or [N, 1] from each sequence's mean log ratio (GSPO)."""
    log_ratio = logp - old_logp  # (N, T)
    if level == "sequence":
        log_ratio = (log_ratio * mask).sum(-1, keepdims=True) / mx.maximum(mask.sum(-1, keepdims=True), 1.0)
    return mx.exp(log_ratio)


def _masked_mean(x, mask, tokens):
    """TRL's masked_batch_mean: a token mean, or for [N, 1] sequence values the row mean."""
    x = x.astype(mx.float32)
    return x.mean() if x.shape[-1] == 1 else (x * mask).sum() / tokens


def _check_options(loss_type: str, level: str, needs_entropies: bool, needs_sampling_logp: bool) -> None:
    if loss_type not in AGGREGATIONS:
        raise ValueError(f"loss_type must be one of {', '.join(LOSS_TYPES)}, got {loss_type!r}")
    if level not in IMPORTANCE_SAMPLING_LEVELS:
        raise ValueError(f"importance_sampling_level must be one of {', '.join(IMPORTANCE_SAMPLING_LEVELS)}, "
                         f"got {level!r}")
    if needs_entropies:
        raise ValueError("entropies are required when top_entropy_quantile < 1")
    if needs_sampling_logp:
        raise ValueError("sampling_logp is required with an importance-sampling correction")


def _clip_metrics(ratio, adv, mask, tokens, epsilon: float, epsilon_high: float) -> dict:
    """TRL's clip_ratio/*: the share of tokens (or completions, under GSPO) the clip cut."""
    low = (ratio < 1 - epsilon) & (adv < 0)
    high = (ratio > 1 + epsilon_high) & (adv > 0)
    return {"clip_ratio/low_mean": _masked_mean(low, mask, tokens),
            "clip_ratio/high_mean": _masked_mean(high, mask, tokens),
            "clip_ratio/region_mean": _masked_mean(low | high, mask, tokens)}


def grpo_loss(
    logp,
    old_logp,
    ref_logp,
    advantages,
    mask,
    *,
    beta: float,
    epsilon: float,
    epsilon_high: float,
    loss_type: str,
    max_completion_length: int,
    num_items=None,
    num_sequences=None,
    importance_sampling_level: str = "token",
    top_entropy_quantile: float = 1.0,
    entropies=None,
    sampling_logp=None,
    importance_sampling_correction: str = "none",
    importance_sampling_cap: float = 3.0,
    importance_sampling_floor: float = 0.0,
):
    """The clipped GRPO loss of one micro-batch and its metrics (see module docstring).

    logp, old_logp, ref_logp, mask: [N, T]; advantages: [N]. old_logp=None means
    on-policy (stop_gradient(logp)); ref_logp may be None when beta == 0. num_items is
    the token count to normalise by (bnpo, dapo; default mask.sum()) and num_sequences
    the sequence count (grpo, dr_grpo; default N): pass the totals of the whole batch
    when it is processed in chunks. importance_sampling_level "sequence" is GSPO: one
    ratio per completion, clipped per completion. entropies [N, T] (optional) is logged
    as `entropy` and is required when top_entropy_quantile < 1. sampling_logp [N, T] (optional)
    is the sampler's log-prob of each token: the gap to old_logp is logged, and with
    importance_sampling_correction "token_truncate" or "sequence_mask" it weights the policy
    term (algorithm/mismatch.py; cap and floor bound the weights).
    """
    _check_options(loss_type, importance_sampling_level, top_entropy_quantile < 1.0 and entropies is None,
                   importance_sampling_correction != "none" and sampling_logp is None)
    if old_logp is None:
        old_logp = mx.stop_gradient(logp)
    mask = mask.astype(mx.float32)
    adv = advantages[:, None]  # (N, 1)
    ratio = _importance_ratio(logp, old_logp, mask, importance_sampling_level)  # (N, T) or (N, 1)
    clipped = mx.clip(ratio, 1 - epsilon, 1 + epsilon_high)
    per_token = -mx.minimum(ratio * adv, clipped * adv) * mx.ones_like(mask)  # (N, T)
    tokens = mx.maximum(mask.sum(), 1.0)
    metrics = {}
    if entropies is not None:
        metrics["entropy"] = (entropies * mask).sum() / tokens
        if top_entropy_quantile < 1.0:
            per_token = per_token * high_entropy_mask(entropies, mask, top_entropy_quantile)
    if sampling_logp is not None:  # against old_logp: the parameters that sampled, as in TRL
        metrics.update(mismatch_metrics(old_logp, sampling_logp, mask))
        if importance_sampling_correction != "none":
            weights, weight_metrics = importance_weights(
                old_logp, sampling_logp, mask, importance_sampling_correction,
                importance_sampling_cap, importance_sampling_floor,
            )
            per_token = per_token * weights
            metrics.update(weight_metrics)
    if beta != 0.0:
        if ref_logp is None:
            raise ValueError("ref_logp is required when beta != 0")
        delta = ref_logp - logp
        kl = mx.exp(delta) - delta - 1  # (N, T)
        per_token = per_token + beta * kl * ratio
        metrics["kl"] = (kl * mask).sum() / tokens
    metrics.update(_clip_metrics(ratio, adv, mask, tokens, epsilon, epsilon_high))
    num_items = mask.sum() if num_items is None else num_items
    num_sequences = mask.shape[0] if num_sequences is None else num_sequences
    loss = AGGREGATIONS[loss_type](per_token, mask, num_items, num_sequences, max_completion_length)
    return loss, metrics
