"""DAPO dynamic sampling: group filtering, refilling from further rounds, short steps."""

import pytest

from mlx_grpo.algorithm.dynamic_sampling import accumulation_parts, fill_groups, groups_with_spread
from mlx_grpo.rollout.score import ScoredRollout, concat, take_groups
from mlx_grpo.rollout.sample import Rollout


def _batch(rewards, group_size=3, tag=""):
    n = len(rewards)
    rollout = Rollout(
        prompt_tokens=[[i // group_size] for i in range(n)],
        completion_tokens=[[i, i] for i in range(n)],
        texts=[f"{tag}{i}" for i in range(n)],
        truncated=[i % 2 == 0 for i in range(n)],
        group_size=group_size,
    )
    return ScoredRollout(rollout, list(rewards), {"r": list(rewards)}, [f"q{tag}{i // group_size}" for i in range(n)])


def test_groups_with_spread_hand_computed():
    # 2x3: group 0 = [1, 0, 0] has spread, group 1 = [0.5, 0.5, 0.5] does not
    assert groups_with_spread([1.0, 0.0, 0.0, 0.5, 0.5, 0.5], 3) == [0]
    assert groups_with_spread([1.0, 1.0, 1.0, 0.0, 0.0, 0.0], 3) == []
    assert groups_with_spread([0.0, 0.0, 0.1, 2.0, 1.0, 2.0], 3) == [0, 1]
    with pytest.raises(ValueError, match="groups of 3"):
        groups_with_spread([1.0, 0.0], 3)


def test_take_groups_and_concat_keep_rows_aligned():
    b = concat([_batch([1, 0, 0, 5, 5, 5], tag="a"), _batch([2, 2, 2, 0, 1, 0], tag="b")])
    kept = take_groups(b, [3, 0])
    assert kept.rewards == [0, 1, 0, 1, 0, 0]
    assert kept.rollout.texts == ["b3", "b4", "b5", "a0", "a1", "a2"]
    assert kept.per_name["r"] == kept.rewards
    assert kept.questions == ["qb1"] * 3 + ["qa0"] * 3
    assert kept.rollout.truncated == [False, True, False, True, False, True]
    assert kept.num_groups == 2


def test_fill_groups_draws_until_enough_groups_have_spread():
    # round 1: groups [flat, spread]; round 2: [spread, spread] -> need 2: keep round1.g1, round2.g0
    script = iter([[1, 1, 1, 0, 1, 0], [3, 0, 0, 0, 0, 7]])
    calls = []

    def draw(n):
        calls.append(n)
        return _batch(next(script), tag=str(len(calls)))

    kept, drawn, m = fill_groups(draw, 2, max_resample_rounds=4)
    assert calls == [2, 2]
    assert kept.rewards == [0, 1, 0, 3, 0, 0]
    assert drawn.num_groups == 4
    assert m == {"dynamic_sampling/rounds": 2, "dynamic_sampling/prompts_drawn": 4,
                 "dynamic_sampling/groups_dropped": 1, "dynamic_sampling/groups_kept": 2}


def test_fill_groups_stops_after_max_rounds_with_what_it_has():
    draws = iter([[1, 1, 1, 2, 2, 2], [0, 0, 0, 0, 1, 0], [4, 4, 4, 4, 4, 4]])
    kept, drawn, m = fill_groups(lambda n: _batch(next(draws)), 2, max_resample_rounds=1)
    assert kept.rewards == [0, 1, 0]  # rounds ran out (1 + 1) with one group of spread
    assert m["dynamic_sampling/rounds"] == 2 and m["dynamic_sampling/groups_dropped"] == 3
    none, _, m0 = fill_groups(lambda n: _batch([1] * 6), 2, max_resample_rounds=0)
    assert none.num_groups == 0 and m0["dynamic_sampling/prompts_drawn"] == 2


@pytest.mark.parametrize("groups, k, expected", [
    (8, 1, (8, 1)),  # no accumulation: train on all
    (5, 2, (4, 2)),  # 2 parts of 2 groups; one left out
    (1, 4, (1, 1)),  # fewer groups than parts: one part per group
    (0, 2, (0, 0)),  # nothing to train on
])
def test_accumulation_parts(groups, k, expected):
    assert accumulation_parts(groups, k) == expected


def test_step_metrics_use_the_configured_reward_scale():
    """The trainer's step metrics pass grpo.scale_rewards to group_stats: with "batch",
    frac_reward_zero_std says whether the whole step has spread (here it has: 0.0), while
    "group" counts the flat group [5, 5, 5] (0.5). reward_std is the std of all six either way."""
    from mlx_grpo.rollout.score import rollout_metrics

    drawn = _batch([1.0, 0.0, 0.0, 5.0, 5.0, 5.0])
    group, batch = rollout_metrics(drawn, "group"), rollout_metrics(drawn, "batch")
    assert (group["frac_reward_zero_std"], batch["frac_reward_zero_std"]) == (0.5, 0.0)
    assert group["reward_std"] == batch["reward_std"] == pytest.approx((20 / 3) ** 0.5, rel=1e-6)
