"""What each config value allows beyond its type: the range rules `load_config` checks, one
entry per dotted key, each with the words its error message uses. Stdlib only."""

from collections.abc import Callable
from typing import Any

# What each field allows beyond its type: dotted key -> (check, what the message says).
Rule = tuple[Callable[[Any], bool], str]


def _at_least(lo: float) -> Rule:
    return (lambda v: v >= lo), f">= {lo}"


def _above(lo: float) -> Rule:
    return (lambda v: v > lo), f"> {lo}"


def _within(lo: int, hi: int, why: str = "") -> Rule:
    return (lambda v: lo <= v <= hi), f"in [{lo}, {hi}]" + (f" ({why})" if why else "")


# Sizes past these hold more than any Mac's memory (a 128K-token context is the largest a
# supported model has; 1024 completions of a prompt or 4096 prompts a step are far past the
# largest runs in the literature), so a typo (an extra zero or two) is caught at load, not
# as an allocation failure minutes into the run.
MAX_TOKENS, MAX_SEQUENCES = 131072, 4096


def _one_of(*allowed: object) -> Rule:
    return (lambda v: v in allowed), "one of " + ", ".join(map(repr, allowed))


_UNIT: Rule = (lambda v: 0 <= v < 1), "in [0, 1)"

_NON_EMPTY: Rule = (lambda v: bool(v.strip())), "a non-empty string"

_DATASET: Rule = (
    (lambda v: bool(v.strip()) if isinstance(v, str) else bool(v) and all(k.strip() and f.strip() for k, f in v.items())),
    "a non-empty string (hub id, file or builtin:NAME) or a non-empty table of split names to files",
)

# NumPy's legacy seeding (np.random.seed) takes [0, 2**32); MLX and Python take more.
SEED_LIMIT = 2**32

RULES: dict[str, Rule] = {
    "seed": ((lambda v: 0 <= v < SEED_LIMIT), "in [0, 2**32)"),
    "output_dir": _NON_EMPTY,
    "model.path": _NON_EMPTY,
    "data.dataset": _DATASET,
    "data.split": _NON_EMPTY,
    "data.prompt_field": _NON_EMPTY,
    "model.dtype": _one_of("auto", "float32", "float16", "bfloat16"),
    "model.quantize_bits": _one_of(0, 4, 8),
    "model.quantize_group_size": _one_of(32, 64, 128),
    "lora.rank": _within(1, MAX_SEQUENCES),
    "lora.alpha": _above(0),
    "lora.dropout": _UNIT,
    "lora.target_modules": ((lambda v: bool(v) and ("all-linear" not in v or v == ["all-linear"])),
                            'a non-empty array of module names, or ["all-linear"] alone'),
    "lora.num_layers": ((lambda v: v == -1 or v >= 1), "-1 (all layers) or >= 1"),
    "lora.method": _one_of("lora", "dora"),
    "data.max_prompt_tokens": _within(1, MAX_TOKENS),
    "generation.num_generations": (
        (lambda v: 2 <= v <= 1024),
        "in [2, 1024] (G must be at least 2 because advantages are relative within a group)",
    ),
    "generation.max_new_tokens": _within(1, MAX_TOKENS),
    "generation.temperature": _above(0),
    "generation.top_p": ((lambda v: 0 < v <= 1), "in (0, 1]"),
    "generation.top_k": _at_least(0),
    "generation.min_p": _UNIT,
    "generation.batch_size": _within(0, MAX_SEQUENCES),
    "generation.quantize_bits": _one_of(0, 4, 8),
    "generation.max_turns": _within(1, 1000),
    "generation.max_tool_calls": _at_least(0),
    "generation.max_episode_tokens": _within(0, MAX_TOKENS),
    "generation.engine": _one_of("auto", "compiled", "batch_generator"),
    "grpo.beta": _at_least(0),
    "grpo.epsilon": _above(0),
    "grpo.epsilon_high": _above(0),
    "grpo.loss_type": _one_of("grpo", "bnpo", "dr_grpo", "dapo"),
    "grpo.scale_rewards": _one_of("group", "batch", "none"),
    "grpo.num_iterations": _at_least(1),
    "grpo.importance_sampling_level": _one_of("token", "sequence"),
    "grpo.top_entropy_quantile": ((lambda v: 0 < v <= 1), "in (0, 1]"),
    "grpo.importance_sampling_correction": _one_of("auto", "none", "token_truncate", "sequence_mask"),
    "grpo.importance_sampling_cap": _above(0),
    "grpo.importance_sampling_floor": _at_least(0),
    "grpo.max_resample_rounds": _at_least(0),
    "grpo.overlong_penalty": _at_least(0),
    "grpo.overlong_buffer": _at_least(1),
    "rewards": (bool, "a non-empty array (at least one reward)"),
    "rewards.name": (bool, "a non-empty reward name"),
    "rewards.parse": _one_of("number", "yes_no"),
    "rewards.mode": _one_of("single", "group"),
    "rewards.max_new_tokens": _within(1, MAX_TOKENS),
    "rewards.batch_size": _within(1, MAX_SEQUENCES),
    "training.max_steps": _at_least(1),
    "training.prompts_per_step": _within(1, MAX_SEQUENCES),
    "training.gradient_accumulation_steps": _at_least(1),
    "training.micro_batch_size": _within(0, MAX_SEQUENCES),
    "training.learning_rate": _above(0),
    "training.lr_schedule": _one_of("linear", "cosine", "constant"),
    "training.warmup_steps": (
        (lambda v: 0 <= v < 1 or v == int(v)), "a whole number of updates, or a share in [0, 1)"
    ),
    "training.weight_decay": _at_least(0),
    "training.adam_betas": (
        (lambda v: len(v) == 2 and all(0 <= b < 1 for b in v)), "two values, each in [0, 1)"
    ),
    "training.max_grad_norm": _at_least(0),
    "training.max_bad_steps": _at_least(0),
    "training.worst_case_first": _one_of("auto", "always", "never"),
    "logging.log_every": _at_least(1),
    "logging.log_completions": _at_least(0),
    "logging.report_to": ((lambda v: set(v) <= {"tensorboard", "wandb", "trackio"} and len(set(v)) == len(v)),
                          "an array of distinct names from 'tensorboard', 'wandb', 'trackio'"),
    "logging.project": _NON_EMPTY,
    "logging.warn_zero_std_frac": _UNIT,
    "logging.warn_zero_std_steps": _at_least(0),
    "logging.warn_grad_norm_factor": ((lambda v: v == 0 or v > 1), "0 (off) or > 1"),
    "logging.warn_clipped_ratio": ((lambda v: 0 <= v < 1), "in [0, 1) (0 = off)"),
    "logging.warn_kl": _at_least(0),
    "logging.warn_reward_falling_steps": ((lambda v: v == 0 or v >= 3), "0 (off) or >= 3"),
    "logging.warn_truncated_rewarded": ((lambda v: 0 <= v < 1), "in [0, 1) (0 = off)"),
    "logging.warn_format_window": _at_least(0),
    "logging.warn_eval_drop_se": _at_least(0),
    "logging.warn_unmoved_after": _at_least(0),
    "checkpoint.save_every": _at_least(1),
    "checkpoint.keep_last": _at_least(1),
    "eval.every": _at_least(0),
    "eval.split": (bool, "a non-empty split name"),
    "eval.limit": _at_least(0),
    "eval.num_samples": _within(1, 1024),
    "eval.temperature": _above(0),
    "eval.max_new_tokens": _within(0, MAX_TOKENS),
    "eval.batch_size": _within(1, MAX_SEQUENCES),
    "distributed.timeout_s": _at_least(0),
    "tools.timeout_s": _above(0),
    "tools.schemas_in": _one_of("auto", "template", "system", "none"),
    "distributed.reduce_dtype": _one_of("float32", "bfloat16"),
}

# Keys that once meant something else: dotted key -> what to write instead. A profile or --set
# giving one stops with that line; a run's saved config.toml (a record, not a request) drops it.
RETIRED = {
    "logging.warn_eval_drop": "logging.warn_eval_drop_se, the drop in standard errors of the difference "
                              "between two evaluations (default 2; the old key was an absolute drop)",
}
