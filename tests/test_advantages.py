import math

import numpy as np
import pytest

from mlx_grpo.algorithm.advantages import group_advantages, group_stats


def test_group_scale_hand_computed():
    # group [1, 0, 0]: mean 1/3, Bessel std sqrt(((2/3)^2 + 2 (1/3)^2) / 2) = sqrt(1/3) = 0.57735
    # A = [2/3, -1/3, -1/3] / (0.57735 + 1e-4)
    a = group_advantages([1.0, 0.0, 0.0, 0.5, 0.5, 0.5], 3)
    s = np.sqrt(1 / 3) + 1e-4
    np.testing.assert_allclose(np.array(a), [2 / 3 / s, -1 / 3 / s, -1 / 3 / s, 0, 0, 0], rtol=1e-5)


def test_batch_scale_keeps_group_means():
    # rewards [1,0,0, 2,4,6]: group means 1/3 and 4; batch std (ddof 1) of all six:
    # mean 13/6, squared deviations sum to 57 - 6 (13/6)^2 = 28.8333; / 5 = 5.76667 -> std 2.40139
    a = group_advantages([1.0, 0.0, 0.0, 2.0, 4.0, 6.0], 3, scale="batch")
    s = math.sqrt(28.833333 / 5) + 1e-4
    np.testing.assert_allclose(np.array(a), [2 / 3 / s, -1 / 3 / s, -1 / 3 / s, -2 / s, 0, 2 / s], rtol=1e-5)


def test_none_scale_only_centers():
    a = group_advantages([1.0, 0.0, 0.0, 2.0, 4.0, 6.0], 3, scale="none")
    np.testing.assert_allclose(np.array(a), [2 / 3, -1 / 3, -1 / 3, -2, 0, 2], rtol=1e-6)


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_equal_rewards_give_exactly_zero(scale):
    a = group_advantages([0.1, 0.1, 0.1, 0.7, 0.7, 0.7], 3, scale=scale)
    assert np.array(a).tolist() == [0.0] * 6


def test_bad_inputs():
    with pytest.raises(ValueError, match="group_size"):
        group_advantages([1.0, 2.0, 3.0], 2)
    with pytest.raises(ValueError, match="scale"):
        group_advantages([1.0, 2.0], 2, scale="global")


def test_group_stats_follow_trl():
    # TRL (GRPOTrainer since 0.29): reward_std is the std of all rewards, whatever the scale.
    # [1, 0, 0, 5, 5, 5]: mean 16/6 = 8/3; squared deviations (5/3)^2 + 2 (8/3)^2 + 3 (7/3)^2
    # = (25 + 128 + 147) / 9 = 100/3; / 5 = 20/3 -> std sqrt(20/3) = 2.581989
    rewards = [1.0, 0.0, 0.0, 5.0, 5.0, 5.0]
    for scale in ("group", "none", "batch"):
        assert group_stats(rewards, 3, scale)["reward_std"] == pytest.approx(math.sqrt(20 / 3), rel=1e-6)
    # frac_reward_zero_std: group/none, the share of groups with zero std (group 1 of 2);
    # batch, whether the one batch std is zero (TRL's std_rewards is the batch std expanded).
    assert group_stats(rewards, 3, "group")["frac_reward_zero_std"] == 0.5
    assert group_stats(rewards, 3, "none")["frac_reward_zero_std"] == 0.5
    assert group_stats(rewards, 3, "batch")["frac_reward_zero_std"] == 0.0
    assert group_stats([2.0] * 6, 3, "batch") == {"reward_std": 0.0, "frac_reward_zero_std": 1.0}


def test_float_noise_is_no_spread():
    """0.1 + 0.2 - 0.3 = 5.55e-17, not 0: a group [5.55e-17, 0, 0] has a std of 3.2e-17, which
    TRL's isclose(std, 0) (tolerance 1e-8) calls zero. Before, only exactly equal rewards
    counted: that group got advantages of about 3.7e-13, counted as having spread and was
    kept by dynamic sampling."""
    from mlx_grpo.algorithm.dynamic_sampling import groups_with_spread

    noise = 0.1 + 0.2 - 0.3
    assert noise != 0.0
    rewards = [noise, 0.0, 0.0, 1.0, 0.0, 0.0]
    for scale in ("group", "batch", "none"):
        assert np.array(group_advantages(rewards, 3, scale=scale))[:3].tolist() == [0.0, 0.0, 0.0]
    assert group_stats(rewards, 3)["frac_reward_zero_std"] == 0.5
    assert groups_with_spread(rewards, 3) == [1]
    # a real spread just above the tolerance still counts: std of [3e-8, 0, 0] is 1.7e-8
    assert group_stats([3e-8, 0.0, 0.0], 3)["frac_reward_zero_std"] == 0.0
