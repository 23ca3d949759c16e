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
@pytest.mark.parametrize("group_share", [1.0, 0.01])
def test_the_compiled_update_clips_and_steps_as_the_plain_one(dtype, max_norm, group_share):
    """apply_update against optim.clip_grad_norm + optimizer.update, three updates with a warmup
    schedule, in one group and a parameter per group; bfloat16 through its float32 master, made at
    the first update."""
    from mlx.utils import tree_flatten
    import mlx.optimizers as optim

    from mlx_grpo.update.optimizer import apply_update

    tcfg = _training("training.warmup_steps=2", "training.weight_decay=0.1")
    models, optimizers = [], []
    for _ in range(2):
        mx.random.seed(3)
        models.append(nn.Sequential(nn.Linear(5, 4), nn.Linear(4, 3)))
        models[-1].set_dtype(dtype)
        optimizers.append(make_optimizer(tcfg, total_updates=10))
    for step in range(3):
        grads = tree_map(lambda p: mx.random.normal(p.shape) * (step + 1), models[0].parameters())
        norm = optim.clip_grad_norm(grads, float("inf"))[1]
        clipped = optim.clip_grad_norm(grads, max_norm)[0] if max_norm else grads
        optimizers[0].update(models[0], clipped)
        apply_update(models[1], optimizers[1], grads, norm, max_norm, group_share=group_share)
        mx.eval(models[1].parameters(), optimizers[1].state)
        if step == 0:
            assert norm.item() > 1.0  # the bound clips
        for (k, a), (_, b) in zip(tree_flatten(models[0].parameters()), tree_flatten(models[1].parameters())):
            assert a.dtype == b.dtype == dtype
            assert mx.allclose(a.astype(mx.float32), b.astype(mx.float32), rtol=1e-5, atol=1e-6).item(), (step, k)
    assert optimizers[1].state["step"].item() == 3
    assert len(optimizers[1]._update_plan[3]) == (1 if group_share == 1.0 else 4)
    if dtype == mx.bfloat16:
        assert optimizers[1].state["layers"][0]["weight"]["master"].dtype == mx.float32


def test_an_optimizer_and_its_model_are_freed_after_a_compiled_update():
    import gc
    import weakref

    from mlx_grpo.update.optimizer import apply_update

    model, optimizer = nn.Linear(3, 2), make_optimizer(_training(), total_updates=10)
    grads = {"weight": mx.ones((2, 3)), "bias": mx.ones((2,))}
    apply_update(model, optimizer, grads, mx.array(3.0), 1.0)
    mx.eval(model.parameters())
    assert optimizer._update_plan
    refs = weakref.ref(model), weakref.ref(optimizer)
    del model, optimizer
    gc.collect()
    assert refs[0]() is None and refs[1]() is None


def test_a_full_fine_tune_updates_in_groups_and_adapters_in_one():
    """A compiled group holds its inputs and outputs at once: a full fine-tune goes through in
    groups of at most an eighth of the model's parameters, in order; a small trainable share in one."""
    from mlx_grpo.update.optimizer import _groups

    model = nn.Sequential(*[nn.Linear(8, 8, bias=False) for _ in range(16)])  # 16 x 64 parameters
    assert _groups(model, 0.125) == [[f"layers.{i}.weight", f"layers.{i + 1}.weight"] for i in range(0, 16, 2)]
    for layer in model.layers[:-2]:
        layer.freeze()
    assert _groups(model, 0.125) == [["layers.14.weight", "layers.15.weight"]]


def _update_peak(update) -> int:
    """Bytes above the weights, gradients and AdamW state at the peak of a second update of 16
    float32 Linear(256, 256) layers (4 MiB of weights), the gradients built before the count starts."""
    mx.random.seed(0)
    model = nn.Sequential(*[nn.Linear(256, 256, bias=False) for _ in range(16)])
    optimizer = make_optimizer(_training(), total_updates=10)
    for _ in range(2):
        grads = tree_map(lambda p: mx.random.normal(p.shape), model.parameters())
        mx.eval(grads, model.parameters(), optimizer.state)
        base = mx.get_active_memory()
        mx.reset_peak_memory()
        update(model, optimizer, grads)
        del grads
        mx.eval(model.parameters(), optimizer.state)
    return mx.get_peak_memory() - base


def test_the_grouped_update_peaks_no_higher_than_the_plain_one():
    """Each group is evaluated with no reference left to its old weights and gradients, so it
    holds at most a group's new weights and moments beside the old; one compiled function over
    the whole model holds them all (4 more weight-sized arrays: 16 MiB here)."""
    from mlx_grpo.update.optimizer import apply_update

    def plain(model, optimizer, grads):
        optimizer.update(model, grads)

    def grouped(model, optimizer, grads, share=0.125):
        apply_update(model, optimizer, grads, mx.array(1.0), 0.0, group_share=share)

    weights = 16 * 256 * 256 * 4
    plain_peak, grouped_peak = _update_peak(plain), _update_peak(grouped)
    whole_peak = _update_peak(lambda *a: grouped(*a, share=1.0))
    assert grouped_peak <= plain_peak + weights / 8, (grouped_peak, plain_peak)
    assert whole_peak >= grouped_peak + 2 * weights, (whole_peak, grouped_peak)
