import math

import mlx.core as mx
import numpy as np
import pytest

from mlx_grpo.advantages import group_advantages, group_stats


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


def test_group_stats():
    # stds: group 1 sqrt(1/3) = 0.57735, group 2 0 -> mean 0.288675; one flat group of two
    stats = group_stats([1.0, 0.0, 0.0, 5.0, 5.0, 5.0], 3)
    assert stats["reward_std"] == pytest.approx(0.288675, rel=1e-5)
    assert stats["frac_reward_zero_std"] == 0.5
