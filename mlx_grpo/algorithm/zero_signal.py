"""Steps without signal: when no group of a step has reward spread and beta = 0.

Every advantage is then exactly 0 (advantages.py: a group whose std is at most ZERO_STD
counts as equal, so float noise is no spread), the policy term's gradient is exactly 0 and,
with beta = 0, there is no KL term: the loss's gradient is zero. AdamW would still move
every weight, by its momentum (lr * m_hat / (sqrt(v_hat) + eps) with m carried over from
earlier steps) and its weight decay. `training.skip_zero_signal_steps` skips the update of
such a step instead: no optimizer call, so weights, moments and the optimizer's step counter
(which the learning-rate schedule reads) stay as they were.
"""

from mlx_grpo.algorithm.advantages import flat_groups


def zero_signal(rewards, group_size: int, beta: float) -> bool:
    """True when an update on these rewards has a zero gradient: beta = 0 and every group
    (prompt-major, group_size rows each) has no reward spread. No rows: True."""
    if beta != 0:
        return False  # the KL term has a gradient wherever the policy left the reference
    return not rewards or all(flat_groups(rewards, group_size))
