"""The optimizer and learning-rate schedule: bias-corrected AdamW and transformers' schedules."""

import mlx.core as mx
import mlx.nn as nn
import pytest

from mlx_grpo.config import ConfigError, load_config
from mlx_grpo.update.optimizer import make_lr_schedule, make_optimizer


def _training(*overrides):
    return load_config(None, ["training.learning_rate=0.1", *overrides]).training


def _rates(tcfg, total):
    schedule = make_lr_schedule(tcfg, total)
    return [round(schedule(mx.array(step)).item(), 6) for step in range(total)]


def test_first_update_moves_each_weight_by_the_learning_rate():
    # Bias-corrected Adam: m = (1 - b1) g / (1 - b1) = g, v = g^2, so the first step is
    # lr * g / (|g| + eps) = lr for any g > 0. Without the correction it is
    # lr * 0.1 g / (sqrt(0.001) g) = 3.16 lr (betas 0.9, 0.999): MLX's default.
    layer = nn.Linear(3, 1, bias=False)
    layer.weight = mx.array([[1.0, 2.0, -3.0]])
    optimizer = make_optimizer(_training("training.lr_schedule=\"constant\""), total_updates=10)
    grads = {"weight": mx.array([[0.5, 4.0, -2.0]])}
    optimizer.update(layer, grads)
    assert layer.weight[0].tolist() == pytest.approx([0.9, 1.9, -2.9], abs=1e-6)


def test_linear_schedule_falls_to_zero_at_the_end():
    # lr * (1 - step / total): 0.1, 0.09, ..., 0.01 over 10 updates, as transformers' "linear".
    assert _rates(_training(), 10) == pytest.approx([0.1 * (10 - s) / 10 for s in range(10)])


def test_warmup_then_linear_decay_and_warmup_as_a_share():
    # 2 warmup updates: lr/2, lr; then lr * (1 - (step - 2) / 8).
    expected = [0.05, 0.1] + [0.1 * (1 - (s - 2) / 8) for s in range(2, 10)]
    assert _rates(_training("training.warmup_steps=2"), 10) == pytest.approx(expected)
    assert _rates(_training("training.warmup_steps=0.2"), 10) == pytest.approx(expected)  # 0.2 * 10 updates


def test_cosine_and_constant_schedules():
    cosine = _rates(_training('training.lr_schedule="cosine"', "training.warmup_steps=1"), 5)
    # warmup 1: lr; then lr * (1 + cos(pi * (step - 1) / 4)) / 2 = 0.1, 0.0854, 0.05, 0.0146
    assert cosine == pytest.approx([0.1, 0.1, 0.085355, 0.05, 0.014645], abs=1e-6)
    assert _rates(_training('training.lr_schedule="constant"'), 4) == pytest.approx([0.1] * 4)


def test_warmup_must_be_whole_updates_or_a_share():
    with pytest.raises(ConfigError, match=r"training.warmup_steps must be a whole number of updates"):
        load_config(None, ["training.warmup_steps=2.5"])
