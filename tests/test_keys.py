"""Every key acts: each test changes one training key and checks the effect it promises,
on a short real run of builtin:tiny (or its model), without depending on its weights."""

import json
from pathlib import Path

import mlx.core as mx
import mlx_lm
import numpy as np
import pytest
from mlx.utils import tree_flatten, tree_unflatten

from mlx_grpo.config import load_config
from mlx_grpo.run.log import read_metrics
from mlx_grpo.commands.setup import build_policy
from mlx_grpo.commands.train import train

SMOKE = "configs/smoke_test.toml"
# Every optimizer key the tests read is set here, so a change of defaults does not move them.
FAST = ["training.max_steps=1", "training.prompts_per_step=2", "generation.max_new_tokens=16",
        "checkpoint.save_every=10", "training.learning_rate=1e-3", "training.warmup_steps=0",
        'training.lr_schedule="constant"', "training.weight_decay=0.0", "training.adam_betas=[0.9, 0.99]",
        "logging.log_completions=8"]  # every completion: 2 prompts x G = 4


def _run(tmp_path, name, *extra):
    cfg = load_config(SMOKE, FAST + [f'output_dir="{tmp_path / name}"', *extra])
    ckpt = train(cfg)
    return cfg, read_metrics(cfg.output_dir), ckpt


def _groups(cfg) -> list[list[str]]:
    rows = [json.loads(line) for line in (Path(cfg.output_dir) / "completions.jsonl").read_text().splitlines()]
    texts = [r["completion"] for r in rows]
    g = cfg.generation.num_generations
    return [texts[i:i + g] for i in range(0, len(texts), g)]


def _params(model) -> dict:
    return {k: np.array(v) for k, v in tree_flatten(model.parameters())}


@pytest.mark.parametrize("key", ["generation.top_k=1", "generation.top_p=1e-6", "generation.min_p=0.99"])
def test_rollout_truncation_keys_act(tmp_path, key):
    """At temperature 3, top_k = 1, top_p near 0 and min_p = 0.99 each leave only the most
    likely token (mlx-lm truncates before the temperature), so the G completions of a group
    are one greedy completion and every group has zero reward spread; without, they differ."""
    hot = "generation.temperature=3.0"
    free = _run(tmp_path, "free", hot)[0]
    assert any(len(set(g)) > 1 for g in _groups(free))
    cut, rows, _ = _run(tmp_path, "cut", hot, key)
    assert all(len(set(g)) == 1 for g in _groups(cut))
    assert rows[0]["frac_reward_zero_std"] == 1.0


def test_generation_batch_size_caps_the_sequences_decoded_at_once(tmp_path, monkeypatch):
    """8 sequences a step: generation.batch_size = 3 decodes at most 3 at a time, 0 all 8."""
    model_type = type(build_policy(load_config(SMOKE))[0])
    call, widths = model_type.__call__, []

    def recording(self, inputs, *args, **kwargs):
        if inputs.shape[1] == 1:  # a decode step (a prefill has the prompt's length)
            widths.append(inputs.shape[0])
        return call(self, inputs, *args, **kwargs)

    monkeypatch.setattr(model_type, "__call__", recording)
    _run(tmp_path, "three", "generation.batch_size=3")
    assert max(widths) == 3
    widths.clear()
    _run(tmp_path, "all", "generation.batch_size=0")
    assert max(widths) == 8


def test_warmup_steps_sets_the_first_learning_rate(tmp_path):
    """warmup_steps = 4 at lr 1e-3: the first update uses 1e-3 / 4. AdamW's first step moves
    each parameter by lr * g / |g| (m = (1 - b1) g, v = (1 - b2) g^2 with b1 = 0.9, b2 = 0.99,
    with or without bias correction), so the largest change of any weight is that rate."""
    cfg, rows, ckpt = _run(tmp_path, "warm", "training.warmup_steps=4")
    assert rows[0]["learning_rate"] == pytest.approx(2.5e-4)
    before, after = _params(build_policy(cfg)[0]), _params(mlx_lm.load(str(ckpt))[0])
    largest = max(np.abs(after[k] - before[k]).max() for k in before)
    assert largest == pytest.approx(2.5e-4, rel=1e-3)


def test_lr_schedule_cosine_decays_to_zero_over_the_run(tmp_path):
    """cosine over 3 updates, no warmup: lr (1 + cos(pi k / 3)) / 2 = 1, 0.75, 0.25 of 1e-3."""
    _, cosine, _ = _run(tmp_path, "cosine", "training.max_steps=3", 'training.lr_schedule="cosine"')
    assert [r["learning_rate"] for r in cosine] == pytest.approx([1e-3, 7.5e-4, 2.5e-4], rel=1e-5)
    _, constant, _ = _run(tmp_path, "constant", "training.max_steps=3")
    assert [r["learning_rate"] for r in constant] == pytest.approx([1e-3] * 3, rel=1e-5)


def test_weight_decay_shrinks_every_weight_by_lr_times_decay(tmp_path):
    """Two runs differing only in weight_decay sample the same completions and compute the same
    gradients at step 1; AdamW's decoupled decay then makes the one difference
    theta * (1 - lr wd) - theta = -1e-3 * 0.1 * theta."""
    cfg, _, plain = _run(tmp_path, "plain")
    _, _, decayed = _run(tmp_path, "decayed", "training.weight_decay=0.1")
    theta = _params(build_policy(cfg)[0])
    a, b = _params(mlx_lm.load(str(plain))[0]), _params(mlx_lm.load(str(decayed))[0])
    for k in theta:
        np.testing.assert_allclose(b[k] - a[k], -1e-4 * theta[k], atol=2e-7, err_msg=k)
    assert max(np.abs(theta[k]).max() for k in theta) * 1e-4 > 1e-5  # a difference well above rounding


def test_adam_betas_set_the_moment_averages(tmp_path):
    """After one step from zero moments, m = (1 - b1) g and v = (1 - b2) g^2, so
    m^2 / v = (1 - b1)^2 / (1 - b2): 0.5^2 / 0.1 = 2.5 for betas [0.5, 0.9] on every weight."""
    _, _, ckpt = _run(tmp_path, "betas", "training.adam_betas=[0.5, 0.9]")
    state = mx.load(str(ckpt / "optimizer.safetensors"))
    ratios = []
    for key in [k for k in state if k.endswith(".m")]:
        m, v = np.array(state[key], dtype=np.float64), np.array(state[key[:-1] + "v"], dtype=np.float64)
        seen = np.abs(m) > 1e-6
        ratios.append(m[seen] ** 2 / v[seen])
    ratios = np.concatenate(ratios)
    assert ratios.size > 1000
    np.testing.assert_allclose(ratios, 2.5, rtol=1e-4)


def test_lora_dropout_acts_in_training_mode_only():
    """lora.dropout = 0.5: two training-mode forwards differ (each drops other inputs of the
    adapters), eval-mode forwards (rollouts) are equal; with dropout 0 training mode is
    deterministic too. B is set non-zero: at its zero init the adapters add nothing."""
    x = mx.array([[1, 2, 3, 4, 5]])

    def forwards(dropout, train_mode):
        model = build_policy(load_config(SMOKE, ["lora.enabled=true", "lora.rank=4", f"lora.dropout={dropout}"]))[0]
        mx.random.seed(0)
        model.update(tree_unflatten([(k, 0.5 * mx.random.normal(v.shape)) for k, v in
                                     tree_flatten(model.trainable_parameters()) if k.endswith("lora_b")]))
        model.train(train_mode)
        return model(x), model(x)

    first, second = forwards(0.5, True)
    assert not mx.allclose(first, second).item()
    assert mx.array_equal(*forwards(0.5, False)).item()
    assert mx.array_equal(*forwards(0.0, True)).item()
