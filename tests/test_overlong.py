"""DAPO's soft overlong punishment against hand-computed values."""

import pytest

from mlx_grpo.algorithm.overlong import overlong_penalty


def test_overlong_penalty_hand_computed():
    # L_max = 32, buffer 8 -> ramp starts after 24 tokens; amount 1.0
    # l = 10, 24: 0 ; l = 26: -(26 - 24) / 8 = -0.25 ; l = 30: -6/8 = -0.75 ; l = 32 (cap): -1
    assert overlong_penalty([10, 24, 26, 30, 32, 25], 32, 8, 1.0) == pytest.approx(
        [0.0, 0.0, -0.25, -0.75, -1.0, -0.125])
    # amount scales linearly: 0.5 at l = 28 -> -(4/8) * 0.5 = -0.25
    assert overlong_penalty([28, 32], 32, 8, 0.5) == pytest.approx([-0.25, -0.5])
    # buffer = L_max: every token costs amount / L_max
    assert overlong_penalty([0, 16], 32, 32, 2.0) == pytest.approx([0.0, -1.0])


def test_overlong_penalty_rejects_bad_input():
    with pytest.raises(ValueError, match="buffer"):
        overlong_penalty([1], 32, 40, 1.0)
    with pytest.raises(ValueError, match="more than the cap"):
        overlong_penalty([33], 32, 8, 1.0)
