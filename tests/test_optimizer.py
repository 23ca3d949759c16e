"""The optimizer and learning-rate schedule: bias-corrected AdamW and transformers' schedules."""

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_map
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


@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16])
@pytest.mark.parametrize("max_norm", [0.0, 1.0])
@pytest.mark.parametrize("compiled", [True, False])
def test_the_compiled_update_clips_and_steps_as_the_plain_one(dtype, max_norm, compiled):
    """apply_update against optim.clip_grad_norm + optimizer.update, three updates with a warmup
    schedule; bfloat16 through its float32 master, made at the first update."""
    from mlx.utils import tree_flatten
    import mlx.optimizers as optim

    from mlx_grpo.update.optimizer import apply_update

    tcfg = _training("training.warmup_steps=2", "training.weight_decay=0.1")
    models, optimizers = [], []
    for _ in range(2):
        mx.random.seed(3)
        models.append(nn.Linear(5, 4))
        models[-1].set_dtype(dtype)
        optimizers.append(make_optimizer(tcfg, total_updates=10))
    for step in range(3):
        grads = {"weight": mx.random.normal((4, 5)) * (step + 1), "bias": mx.random.normal((4,))}
        norm = optim.clip_grad_norm(grads, float("inf"))[1]
        clipped = optim.clip_grad_norm(grads, max_norm)[0] if max_norm else grads
        optimizers[0].update(models[0], clipped)
        apply_update(models[1], optimizers[1], grads, norm, max_norm, compiled=compiled)
        mx.eval(models[1].parameters(), optimizers[1].state)
        if step == 0:
            assert norm.item() > 1.0  # the bound clips
        for (k, a), (_, b) in zip(tree_flatten(models[0].parameters()), tree_flatten(models[1].parameters())):
            assert a.dtype == b.dtype == dtype
            assert mx.allclose(a.astype(mx.float32), b.astype(mx.float32), rtol=1e-5, atol=1e-6).item(), (step, k)
    assert optimizers[1].state["step"].item() == 3
    if dtype == mx.bfloat16:
        assert optimizers[1].state["weight"]["master"].dtype == mx.float32


def test_an_optimizer_and_its_model_are_freed_after_a_compiled_update():
    import gc
    import weakref

    from mlx_grpo.update.optimizer import apply_update

    model, optimizer = nn.Linear(3, 2), make_optimizer(_training(), total_updates=10)
    grads = {"weight": mx.ones((2, 3)), "bias": mx.ones((2,))}
    apply_update(model, optimizer, grads, mx.array(3.0), 1.0, compiled=True)
    mx.eval(model.parameters())
    assert optimizer._compiled_update
    refs = weakref.ref(model), weakref.ref(optimizer)
    del model, optimizer
    gc.collect()
    assert refs[0]() is None and refs[1]() is None


def test_a_full_fine_tune_updates_plain_and_adapters_compiled():
    """The compiled update holds more at its peak: only a model training a small share of its
    parameters (LoRA's adapters) gets it by default."""
    from mlx_grpo.update.optimizer import apply_update

    def updated(frozen):
        model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 2))
        if frozen:
            model.layers[0].freeze()  # 72 of 90 parameters: 0.2 of them train
        optimizer = make_optimizer(_training(), total_updates=10)
        grads = tree_map(mx.ones_like, model.trainable_parameters())
        apply_update(model, optimizer, grads, mx.array(1.0), 1.0)
        return getattr(optimizer, "_compiled_update", None) is not None

    assert not updated(False) and updated(True)
