"""Steps without signal: AdamW moves weights on a zero gradient; training.skip_zero_signal_steps
skips such a step's update and leaves weights, moments and the step counter alone."""

import mlx.core as mx
import mlx.optimizers as optim
from mlx.utils import tree_flatten
import numpy as np
import pytest

from mlx_grpo.algorithm.zero_signal import zero_signal
from mlx_grpo.config import load_config
from mlx_grpo.commands.train import train
from mlx_grpo.rewards import RewardSet
from mlx_grpo.run.checkpoint import load_optimizer_state
from mlx_grpo.run.log import format_summary, read_metrics

SMOKE = "configs/smoke_test.toml"


def test_zero_signal_by_hand():
    assert zero_signal([1.0, 1.0, 0.0, 0.0], 2, beta=0.0)  # two groups, each without spread
    assert not zero_signal([1.0, 1.0, 0.0, 1.0], 2, beta=0.0)  # the second group has spread
    assert not zero_signal([1.0, 1.0, 0.0, 0.0], 2, beta=0.04)  # the KL term still has a gradient
    # float noise is no spread: 0.1 + 0.2 and 0.3 differ by 5.6e-17, a std far below ZERO_STD = 1e-8
    assert zero_signal([0.1 + 0.2, 0.3], 2, beta=0.0)
    # 0.5 and 0.500001 (float32): std = 1e-6 / sqrt(2) = 7.1e-7 > 1e-8, a real (small) spread
    assert not zero_signal([0.5, 0.500001], 2, beta=0.0)
    assert zero_signal([], 4, beta=0.0)


def test_adamw_moves_a_weight_on_a_zero_gradient():
    """Why the option exists. Bias-corrected AdamW, lr 0.1, betas (0.9, 0.999), eps 1e-8:
    update 1, g = 1: m = 0.1, v = 0.001, m_hat = v_hat = 1, p = 1 - 0.1 * 1 / (1 + 1e-8) = 0.9;
    update 2, g = 0: m = 0.09, v = 0.000999, m_hat = 0.09 / 0.19 = 0.473684,
    v_hat = 0.000999 / 0.001999 = 0.499750, p = 0.9 - 0.1 * 0.473684 / 0.706930 = 0.832994."""
    opt = optim.AdamW(learning_rate=0.1, betas=[0.9, 0.999], weight_decay=0.0, bias_correction=True)
    params = {"p": mx.array([1.0])}
    params = opt.apply_gradients({"p": mx.array([1.0])}, params)
    assert params["p"].item() == pytest.approx(0.9, abs=1e-6)
    params = opt.apply_gradients({"p": mx.array([0.0])}, params)
    # float32 computes 1 - 0.999**2 with a relative error near 6e-5 (cancellation): 1.5e-6 here
    assert params["p"].item() == pytest.approx(0.832994, abs=5e-6)


def _spread_once():
    """A reward with spread in every group (0, 1, 0, 1) on its first call, 1.0 everywhere after."""
    calls = []

    def once_then_flat(prompts, completions, answers, **kw):
        calls.append(1)
        return [float(i % 2) for i in range(len(completions))] if len(calls) == 1 else [1.0] * len(completions)

    return RewardSet([(once_then_flat, 1.0)], group_size=4)


def _run(tmp_path, name, skip: bool):
    cfg = load_config(SMOKE, [
        "training.max_steps=3", "training.prompts_per_step=2", "generation.max_new_tokens=16",
        "checkpoint.save_every=1", "checkpoint.keep_last=3", "training.learning_rate=1e-3",
        'training.lr_schedule="constant"', f"training.skip_zero_signal_steps={str(skip).lower()}",
        f'output_dir="{tmp_path / name}"',
    ])
    train(cfg, reward_set=_spread_once())
    ckpts = cfg.output_dir + "/checkpoints/step_00000"
    weights = [dict(mx.load(f"{ckpts}{s}/model.safetensors")) for s in (1, 3)]
    states = [load_optimizer_state(f"{ckpts}{s}") for s in (1, 3)]
    return read_metrics(cfg.output_dir), weights, states


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(np.array(a[k]), np.array(b[k])) for k in a)


def test_steps_without_signal_are_skipped_and_change_nothing(tmp_path, capsys):
    rows, (w1, w3), (s1, s3) = _run(tmp_path, "skip", skip=True)
    assert [r["zero_signal_skipped"] for r in rows] == [0.0, 1.0, 1.0]
    assert [r["frac_reward_zero_std"] for r in rows] == [0.0, 1.0, 1.0]
    assert "loss" in rows[0] and "loss" not in rows[1] and "loss" not in rows[2]
    assert _same(w1, w3)  # steps 2 and 3 left every weight as step 1 wrote it
    # ... and the moments and the step counter: the schedule's next update is its second
    assert s3["step"].item() == s1["step"].item() == 1
    assert _same(dict(tree_flatten(s1)), dict(tree_flatten(s3)))
    assert "mlx-grpo: 2 of 3 steps without reward spread (beta = 0): update skipped" in capsys.readouterr().out


def test_without_the_option_adamw_moves_weights_on_a_zero_gradient(tmp_path):
    rows, (w1, w3), (s1, s3) = _run(tmp_path, "keep", skip=False)
    assert "zero_signal_skipped" not in rows[0]  # the column is only written when the option is on
    assert [r["grad_norm"] for r in rows[1:]] == [0.0, 0.0]
    assert s3["step"].item() == 3
    assert not _same(w1, w3)  # momentum alone moved them


def test_the_summary_counts_skipped_steps():
    rows = [{"step": s, "reward": 1.0, "zero_signal_skipped": float(s in (2, 5))} for s in range(1, 7)]
    lines = format_summary(rows, 1.0, 6, None, warnings=0)
    assert ("mlx-grpo: 2 of 6 steps without reward spread (beta = 0): update skipped "
            "(training.skip_zero_signal_steps)") in lines
    without = format_summary([{"step": 1, "reward": 1.0}], 1.0, 1, None, warnings=0)
    assert not any("spread" in line for line in without)  # no line when the option is off
