"""GRPO improves the policy: on a fixed prompt, the sampled reward rises.

The tiny model does not yet generalise what it learns to held-out prompts within a
test's budget; this checks the policy improvement itself."""

import json

import mlx.core as mx
import mlx_lm

from mlx_grpo.config import load_config
from mlx_grpo.data import load_examples
from mlx_grpo.evaluate import evaluate_rewards
from mlx_grpo.rewards import RewardSet
from mlx_grpo.train import train

ROWS = [{"question": "What is 7 + 5?", "answer": "#### 12"}]


def _sampled_accuracy(path, cfg):
    model, tokenizer = mlx_lm.load(str(path))
    examples = load_examples(cfg.data, tokenizer)
    mx.random.seed(123)
    rewards = RewardSet.from_config(cfg.rewards)
    out = evaluate_rewards(model, tokenizer, examples, rewards, max_new_tokens=32, temperature=1.0, num_samples=16)
    return out["rewards/gsm8k_correctness/mean"]


def test_grpo_raises_sampled_accuracy(tmp_path, tiny_path):
    data = tmp_path / "two.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    cfg = load_config("configs/smoke_test.toml", [
        f'output_dir="{tmp_path / "run"}"', f'data.dataset="{data}"', "training.max_steps=10", "training.learning_rate=1e-4",
        "training.prompts_per_step=1", "generation.num_generations=8", "generation.max_new_tokens=32",
        "checkpoint.save_every=100", 'rewards=[{name="gsm8k_correctness",weight=1.0}]',
    ])
    before = _sampled_accuracy(tiny_path, cfg)
    after = _sampled_accuracy(train(cfg), cfg)
    print("sampled accuracy before", before, "after", after)
    assert after >= before + 0.25, (before, after)
