"""Float32 master weights: a bfloat16 full fine-tune loses no update to bf16 rounding, and a
float32 one is updated exactly as before (update/optimizer.py, MasterAdamW)."""

import mlx.core as mx
import mlx.optimizers as optim
import pytest
from mlx.utils import tree_flatten

from mlx_grpo.config import load_config
from mlx_grpo.update.optimizer import make_optimizer
from mlx_grpo.update.step import optimize


def _cfg(lr):
    return load_config(None, [
        "generation.num_generations=3", "training.prompts_per_step=2", "generation.max_new_tokens=12",
        "grpo.beta=0", f"training.learning_rate={lr}", 'training.lr_schedule="constant"',
    ])


def _flat(tree) -> dict:
    return dict(tree_flatten(tree))


def _train(model, optimizer, cfg, updates: int, fixed) -> list[dict]:
    return [optimize(model, optimizer, None, *fixed, cfg) for _ in range(updates)]


def _copy(model, dtype):
    """`model` again, its weights cast to `dtype` (the same starting values in both runs)."""
    from mlx_lm.models import qwen2

    twin = qwen2.Model(model.args)
    twin.update(model.parameters())
    twin.set_dtype(dtype)
    mx.eval(twin.parameters())
    return twin


def test_float32_parameters_are_updated_exactly_as_by_mlx_adamw(random_qwen2, fixed_rollout):
    cfg = _cfg(1e-3)
    ours, theirs = _copy(random_qwen2, mx.float32), _copy(random_qwen2, mx.float32)
    mine = make_optimizer(cfg.training, 10)
    plain = optim.AdamW(learning_rate=1e-3, betas=list(cfg.training.adam_betas),
                        weight_decay=cfg.training.weight_decay, bias_correction=True)
    assert _train(ours, mine, cfg, 3, fixed_rollout) == _train(theirs, plain, cfg, 3, fixed_rollout)  # every metric of every update
    a, b = _flat(ours.trainable_parameters()), _flat(theirs.trainable_parameters())
    assert all(mx.array_equal(a[k], b[k]).item() for k in a)
    state, plain_state = _flat(mine.state), _flat(plain.state)
    assert state.keys() == plain_state.keys() and not any(k.endswith(".master") for k in state)
    assert all(mx.array_equal(state[k], plain_state[k]).item() for k in state)


def test_a_bfloat16_full_fine_tune_follows_the_float32_run(random_qwen2, fixed_rollout):
    # 8 updates at lr 1e-5: each moves a weight by about 1e-5, below half a bfloat16 step
    # (|w| * 2^-8) for most weights, so plain bf16 AdamW rounds most of them away (measured: it
    # moved 2.3% of the elements, the float32 run rounded to bf16 moved 18.4%, and 82% of its
    # weights equal the float32 run's rounded to bf16). Through the float32 master the bf16 weights
    # are the float32 run's rounded on 99.8%; the master's movement is the float32 run's within
    # 7% (the gradients are computed in bf16).
    cfg = _cfg(1e-5)
    bf16 = _copy(random_qwen2, mx.bfloat16)
    f32 = _copy(bf16, mx.float32)  # both start from the same (bf16-representable) weights
    start = _flat(_copy(bf16, mx.float32).parameters())
    _train(f32, make_optimizer(cfg.training, 10), cfg, 8, fixed_rollout)
    optimizer = make_optimizer(cfg.training, 10)
    _train(bf16, optimizer, cfg, 8, fixed_rollout)
    w32, wbf, state = _flat(f32.parameters()), _flat(bf16.parameters()), _flat(optimizer.state)
    n = sum(v.size for v in wbf.values())
    rounded = {k: v.astype(mx.bfloat16) for k, v in w32.items()}
    same = sum((wbf[k] == rounded[k]).sum().item() for k in wbf) / n
    moved = sum((wbf[k].astype(mx.float32) != start[k]).sum().item() for k in wbf) / n
    moved32 = sum((rounded[k].astype(mx.float32) != start[k]).sum().item() for k in wbf) / n
    assert same > 0.99 and moved == pytest.approx(moved32, abs=0.02) and moved32 > 0.1
    master = {k: state.get(f"{k}.master", wbf[k]).astype(mx.float32) for k in wbf}
    err = sum(((master[k] - w32[k]) ** 2).sum().item() for k in wbf)
    movement = sum(((w32[k] - start[k]) ** 2).sum().item() for k in wbf)
    assert (err / movement) ** 0.5 < 0.2
    assert all(v.dtype == mx.bfloat16 for v in wbf.values())
    assert all(state[f"{k}.{s}"].dtype == mx.float32 for k in wbf for s in ("master", "m", "v"))
    assert all(mx.array_equal(state[f"{k}.master"].astype(mx.bfloat16), wbf[k]).item() for k in wbf)
