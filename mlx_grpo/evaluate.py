"""Scoring a model on held-out prompts with the same rewards that train it."""

import numpy as np

from mlx_grpo.rollout import generate_completions, make_rollout_sampler


def evaluate_rewards(model, tokenizer, examples, reward_set, *, max_new_tokens: int,
                     temperature: float = 0.0, num_samples: int = 1, batch_size: int = 0) -> dict:
    """Mean total reward and mean of each reward function over the examples' completions.

    temperature 0 is greedy decoding (then num_samples > 1 repeats the same answer).
    """
    model.eval()
    rollout = generate_completions(
        model, tokenizer, [e.prompt_tokens for e in examples],
        num_generations=num_samples, max_new_tokens=max_new_tokens,
        sampler=make_rollout_sampler(temperature, 1.0, 0, 0.0), batch_size=batch_size,
    )
    questions = [e.question for e in examples for _ in range(num_samples)]
    answers = [e.answer for e in examples for _ in range(num_samples)]
    total, per_name = reward_set(questions, rollout.texts, answers)
    out = {"reward": float(np.mean(total))}
    out.update({f"rewards/{k}/mean": float(np.mean(v)) for k, v in per_name.items()})
    return out
