"""DAPO's dynamic sampling (Yu et al. 2025): train only on groups whose rewards differ.

A group whose G rewards are all equal gets advantage 0 on every completion, so it adds
no policy gradient and only dilutes the batch. With `grpo.dynamic_sampling` the trainer
drops such groups and draws further rounds of prompts until the step has the groups it
asked for, or `grpo.max_resample_rounds` extra rounds are spent. This module owns the
bookkeeping; the trainer hands it a `draw(n)` that samples and scores n prompts.
"""

from collections.abc import Callable

from mlx_grpo.algorithm.advantages import flat_groups
from mlx_grpo.rollout.score import ScoredRollout, concat, take_groups


def groups_with_spread(rewards, group_size: int) -> list[int]:
    """Indices of the groups (prompt-major, group_size rows each) whose rewards have spread:
    not all equal and a std above advantages.ZERO_STD (float noise is no spread)."""
    if group_size < 1 or len(rewards) % group_size:
        raise ValueError(f"{len(rewards)} rewards do not split into groups of {group_size}")
    if group_size == 1:
        return []
    return [g for g, flat in enumerate(flat_groups(rewards, group_size)) if not flat]


def fill_groups(draw: Callable[[int], ScoredRollout], num_groups: int, max_resample_rounds: int):
    """Draw rounds of `num_groups` prompts until `num_groups` groups have reward spread.

    At most 1 + max_resample_rounds rounds. Returns (kept, drawn, metrics): kept holds the
    first num_groups groups with spread (fewer, possibly none, when the rounds ran out),
    drawn every row sampled this step (for the reward metrics), and metrics the counts.
    """
    rounds, spread = [], []
    while len(rounds) <= max_resample_rounds and len(spread) < num_groups:
        rounds.append(draw(num_groups))
        drawn = concat(rounds)
        spread = groups_with_spread(drawn.rewards, drawn.rollout.group_size)
    kept = take_groups(drawn, spread[:num_groups])
    metrics = {
        "dynamic_sampling/rounds": len(rounds),
        "dynamic_sampling/prompts_drawn": drawn.num_groups,
        "dynamic_sampling/groups_dropped": drawn.num_groups - len(spread),
        "dynamic_sampling/groups_kept": kept.num_groups,
    }
    return kept, drawn, metrics


def accumulation_parts(num_groups: int, gradient_accumulation_steps: int) -> tuple[int, int]:
    """(groups to train on, accumulation parts) when a step is short of groups.

    Each accumulation part needs the same whole number of groups and no part may grow past
    its configured size (memory), so a short step uses min(k, groups) parts and leaves out
    the remainder: at most k - 1 groups.
    """
    parts = min(gradient_accumulation_steps, num_groups)
    if parts == 0:
        return 0, 0
    return num_groups // parts * parts, parts


def fit_parts(kept: ScoredRollout, gradient_accumulation_steps: int) -> tuple[ScoredRollout, int]:
    """The groups a short step trains on and its accumulation parts (see `accumulation_parts`);
    none at all means no update. A full step comes back whole, with its configured parts."""
    used, parts = accumulation_parts(kept.num_groups, gradient_accumulation_steps)
    return take_groups(kept, list(range(used))), max(parts, 1)
