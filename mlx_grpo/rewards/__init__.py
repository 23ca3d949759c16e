"""Rewards: plain functions with one score (or None) per completion, in this project's form
`fn(prompts, completions, answers, **kwargs)` or TRL's keyword form (`call.py` says how each is
called), pure Python (no MLX), registered by name in `registry.REWARDS`; the task rewards in
`gsm8k.py`, the reference-free summary rewards in `summary.py`."""

from mlx_grpo.rewards.gsm8k import (
    ROUGE_TYPES, extract_predicted_number, extract_reference_number, extract_strict_number,
    gsm8k_correctness, lm_eval_exact_match, lm_eval_flexible_extract, lm_eval_strict_match, rouge_l, rouge_scorer,
    xml_format,
)
from mlx_grpo.rewards.call import RewardBatch, TrainerState
from mlx_grpo.rewards.registry import REWARDS, RewardError, RewardFn, RewardSet, resolve_reward
from mlx_grpo.rewards.summary import coverage, faithfulness, length_band, no_copy
