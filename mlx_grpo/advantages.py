"""Group-relative advantages: how much better each completion did than its siblings."""

import mlx.core as mx

SCALES = ("group", "batch", "none")
_EPS = 1e-4


def group_advantages(rewards, group_size: int, scale: str = "group") -> mx.array:
    """A_i = r_i - mean(group of i), optionally divided by a standard deviation.

    rewards: N floats in prompt-major order (the G completions of a prompt are adjacent).
    scale: "group" divides by each group's Bessel-corrected std + 1e-4 (GRPO),
    "batch" by the std of all N rewards + 1e-4 (the mean stays per group),
    "none" does not divide (Dr. GRPO). A group whose rewards are all equal gets
    exactly 0, whatever the scale.
    """
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {', '.join(SCALES)}, got {scale!r}")
    r = mx.array(rewards, dtype=mx.float32)
    if r.ndim != 1 or group_size < 2 or r.size % group_size:
        raise ValueError(
            f"expected a flat array whose length divides by group_size >= 2, "
            f"got shape {r.shape} and group_size {group_size}"
        )
    groups = r.reshape(-1, group_size)  # (P, G)
    centered = groups - groups.mean(axis=1, keepdims=True)
    if scale == "group":
        centered = centered / (mx.std(groups, axis=1, keepdims=True, ddof=1) + _EPS)
    elif scale == "batch":
        centered = centered / (mx.std(r, ddof=1) + _EPS)
    # Mean-subtraction of equal floats can leave a rounding residue; zero it exactly.
    flat = groups.max(axis=1, keepdims=True) == groups.min(axis=1, keepdims=True)
    return mx.where(flat, 0.0, centered).reshape(-1)


def group_stats(rewards, group_size: int) -> dict[str, float]:
    """TRL's reward-spread metrics: mean within-group std and the share of flat groups."""
    r = mx.array(rewards, dtype=mx.float32).reshape(-1, group_size)
    std = mx.std(r, axis=1, ddof=1)
    flat = r.max(axis=1) == r.min(axis=1)
    return {
        "reward_std": std.mean().item(),
        "frac_reward_zero_std": flat.astype(mx.float32).mean().item(),
    }
