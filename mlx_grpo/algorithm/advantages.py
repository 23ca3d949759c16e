"""Group-relative advantages: how much better each completion did than its siblings."""

import mlx.core as mx

SCALES = ("group", "batch", "none")
_EPS = 1e-4
# A spread of rewards this small is none: TRL tests torch.isclose(std, 0), whose default
# tolerance is 1e-8, so float noise such as 0.1 + 0.2 - 0.3 = 5.6e-17 counts as no spread.
ZERO_STD = 1e-8


def _groups(rewards, group_size: int) -> mx.array:
    r = mx.array(rewards, dtype=mx.float32)
    if r.ndim != 1 or group_size < 2 or r.size % group_size:
        raise ValueError(
            f"expected a flat array whose length divides by group_size >= 2, "
            f"got shape {r.shape} and group_size {group_size}"
        )
    return r.reshape(-1, group_size)  # (P, G)


def _no_spread(x: mx.array, axis=None) -> mx.array:
    """True where the values along `axis` are equal, or their std is at most ZERO_STD."""
    equal = x.max(axis=axis, keepdims=True) == x.min(axis=axis, keepdims=True)
    return equal | (mx.std(x, axis=axis, keepdims=True, ddof=1) <= ZERO_STD)


def flat_groups(rewards, group_size: int) -> list[bool]:
    """For each group (prompt-major), whether its rewards have no spread (see ZERO_STD)."""
    return _no_spread(_groups(rewards, group_size), axis=1).reshape(-1).tolist()


def group_advantages(rewards, group_size: int, scale: str = "group") -> mx.array:
    """A_i = r_i - mean(group of i), optionally divided by a standard deviation.

    rewards: N floats in prompt-major order (the G completions of a prompt are adjacent).
    scale: "group" divides by each group's Bessel-corrected std + 1e-4 (GRPO),
    "batch" by the std of all N rewards + 1e-4 (the mean stays per group),
    "none" does not divide (Dr. GRPO). A group whose rewards have no spread (all equal,
    or a std of at most ZERO_STD) gets exactly 0, whatever the scale.
    """
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {', '.join(SCALES)}, got {scale!r}")
    groups = _groups(rewards, group_size)
    centered = groups - groups.mean(axis=1, keepdims=True)
    if scale == "group":
        centered = centered / (mx.std(groups, axis=1, keepdims=True, ddof=1) + _EPS)
    elif scale == "batch":
        centered = centered / (mx.std(groups, ddof=1) + _EPS)
    return mx.where(_no_spread(groups, axis=1), 0.0, centered).reshape(-1)


def group_stats(rewards, group_size: int, scale: str = "group") -> dict[str, float]:
    """TRL's reward-spread metrics (GRPOTrainer since TRL 0.29, 1.x included).

    reward_std: the Bessel-corrected std of all N rewards, whatever the scale.
    frac_reward_zero_std: the share of rows whose scaling std has no spread, so with
    "group" or "none" the share of groups without spread, and with "batch" 1.0 when the
    whole batch has none, else 0.0.
    """
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {', '.join(SCALES)}, got {scale!r}")
    groups = _groups(rewards, group_size)
    flat = _no_spread(groups) if scale == "batch" else _no_spread(groups, axis=1)
    return {
        "reward_std": mx.std(groups, ddof=1).item(),
        "frac_reward_zero_std": flat.astype(mx.float32).mean().item(),
    }
