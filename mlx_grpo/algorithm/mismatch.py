"""The gap between the distribution tokens were sampled from and the one the loss scores, and
the importance-sampling weights that correct for it (TRL's vLLM importance-sampling correction).

With d[i,t] = trainer_logp[i,t] - sampling_logp[i,t] on completion tokens (the trainer's
log-prob under the parameters that sampled, minus the sampler's own log-prob of the token):

    token_truncate:  w[i,t] = clip(exp(d[i,t]), floor, cap)                          [N, T]
    sequence_mask:   w[i]   = rho[i] if floor <= rho[i] <= cap else 0,
                     rho[i] = exp(sum_t m d[i,t])                                       [N, 1]

as TRL's GRPOTrainer defines `vllm_importance_sampling_mode` = "token_truncate" /
"sequence_mask" with `vllm_importance_sampling_clip_min` (floor; TRL's None is 0 here, the
same band since rho > 0) and `_clip_max` (cap): a sequence inside the band keeps its own ratio,
one outside it gets 0 (TRL masks rho < clip_min or rho > clip_max). The weights multiply the
policy term of each token's loss, not the KL term. The sequence ratio is a product over tokens
(TRL sums the log differences), not GSPO's geometric mean.

Mismatch metrics, token means over the completion tokens:
    sampling/logprob_diff_mean, sampling/logprob_diff_max: |d| (TRL's
        sampling/sampling_logp_difference/mean and /max)
    sampling/kl: mean of -d, the k1 estimate of KL(sampler || trainer) = E_sampler[log s - log t]
        from tokens the sampler drew: unbiased whatever the sampler truncated, since it needs
        only the sampler's support to lie inside the trainer's; one batch can read below 0.

Not k3 (exp(d) - d - 1, as for the loss's KL to the reference): its mean is unbiased only when
E_sampler[exp(d)] = 1, i.e. when both put mass on the same tokens. After top_p/top_k/min_p the
sampler draws from a set S of trainer mass t(S) < 1, E_sampler[exp(d)] = t(S), and k3 reads
KL - (1 - t(S)): with top_p 0.7 keeping 0.8 of the mass, 0.023 against the true 0.223.
"""

import mlx.core as mx

CORRECTIONS = ("none", "token_truncate", "sequence_mask")


def mismatch_metrics(trainer_logp, sampling_logp, mask) -> dict:
    """The gap metrics of one micro-batch; trainer_logp, sampling_logp, mask: [N, T]."""
    d = mx.stop_gradient(trainer_logp - sampling_logp) * mask
    tokens = mx.maximum(mask.sum(), 1.0)
    return {
        "sampling/logprob_diff_mean": mx.abs(d).sum() / tokens,
        "sampling/logprob_diff_max": mx.abs(d).max(),
        "sampling/kl": -d.sum() / tokens,  # d is 0 off the mask
    }


def importance_weights(trainer_logp, sampling_logp, mask, mode: str, cap: float, floor: float = 0.0):
    """(weights, metrics): [N, T] (token_truncate) or [N, 1] (sequence_mask) constants that
    multiply the per-token loss, and their min/mean/max (and the masked share) over the
    completion tokens, or over the completions with at least one token."""
    if mode not in CORRECTIONS[1:]:
        raise ValueError(f"importance_sampling_correction must be one of {', '.join(CORRECTIONS)}, got {mode!r}")
    d = mx.stop_gradient(trainer_logp - sampling_logp) * mask  # (N, T)
    if mode == "token_truncate":
        weights = mx.clip(mx.exp(d), floor, cap)
        valid = mask > 0
    else:
        ratio = mx.exp(d.sum(-1, keepdims=True))  # (N, 1); inf past float range, then masked
        inside = (ratio >= floor) & (ratio <= cap)
        weights = mx.where(inside, ratio, 0.0)  # where, not a product: inf * 0 would be nan
        valid = mask.sum(-1, keepdims=True) > 0
    count = mx.maximum(valid.sum(), 1)
    metrics = {
        "sampling/importance_sampling_ratio/mean": mx.where(valid, weights, 0.0).sum() / count,
        "sampling/importance_sampling_ratio/min": mx.where(valid, weights, mx.inf).min(),
        "sampling/importance_sampling_ratio/max": mx.where(valid, weights, -mx.inf).max(),
    }
    if mode == "sequence_mask":
        metrics["sampling/importance_sampling_masked_frac"] = (valid & ~inside).sum() / count
    return weights, metrics
