"""The values the update stage reads, taken from the config once (`UpdateSettings.from_config`).

The update's functions take these settings rather than the whole config. A step that dynamic
sampling left short of groups runs with fewer accumulation parts: a copy of the settings with
that one value changed (`dataclasses.replace`), never a modified copy of the config.
"""

from dataclasses import dataclass, replace

from mlx_grpo.tools import completion_cap


def samples_another_distribution(gen) -> bool:
    """Whether the rollout samples from a distribution other than softmax(logits / T) of the
    policy: a truncation (top_p, top_k, min_p) or a quantized copy of the policy."""
    return gen.top_p < 1.0 or gen.top_k > 0 or gen.min_p > 0.0 or gen.quantize_bits > 0


def resolve_correction(cfg) -> str:
    """grpo.importance_sampling_correction, "auto" resolved: "token_truncate" when the rollout
    samples from another distribution than the loss scores, else "none" (the weights would be
    1 within float noise, and the default run stays bit for bit as it was)."""
    mode = cfg.grpo.importance_sampling_correction
    if mode != "auto":
        return mode
    return "token_truncate" if samples_another_distribution(cfg.generation) else "none"


@dataclass(frozen=True)
class UpdateSettings:
    accumulation_steps: int  # training.gradient_accumulation_steps: parts of whole groups
    micro_batch_size: int  # training.micro_batch_size: sequences per forward chunk; 0 = a whole part
    max_grad_norm: float  # training.max_grad_norm; 0 = no clipping
    num_iterations: int  # grpo.num_iterations: optimizer updates per rollout
    scale_rewards: str  # grpo.scale_rewards
    mask_truncated: bool  # grpo.mask_truncated_completions
    loss_type: str
    beta: float
    epsilon: float
    epsilon_high: float
    importance_sampling_level: str
    top_entropy_quantile: float
    temperature: float  # generation.temperature: the log-probs are of the sampled distribution
    max_new_tokens: int  # generation.max_new_tokens (with tools, the episode budget): dr_grpo's normaliser
    shared_prefix: bool = True  # training.shared_prefix: each group's prompt runs once per pass
    # training.grad_checkpoint with LoRA: a shared-prefix micro-batch holds one group (update/batches.py)
    one_group_per_pass: bool = False
    # grpo.importance_sampling_correction with "auto" resolved (see `resolve_correction`)
    importance_sampling_correction: str = "none"
    importance_sampling_cap: float = 3.0
    importance_sampling_floor: float = 0.0
    reduce_dtype: str = "float32"  # distributed.reduce_dtype: the gradient all-reduce's

    @classmethod
    def from_config(cls, cfg) -> "UpdateSettings":
        t, g, gen = cfg.training, cfg.grpo, cfg.generation
        return cls(
            accumulation_steps=t.gradient_accumulation_steps, micro_batch_size=t.micro_batch_size,
            max_grad_norm=t.max_grad_norm, num_iterations=g.num_iterations, scale_rewards=g.scale_rewards,
            mask_truncated=g.mask_truncated_completions, loss_type=g.loss_type, beta=g.beta,
            epsilon=g.epsilon, epsilon_high=g.epsilon_high,
            importance_sampling_level=g.importance_sampling_level,
            top_entropy_quantile=g.top_entropy_quantile, temperature=gen.temperature,
            max_new_tokens=completion_cap(cfg),
            shared_prefix=t.shared_prefix, one_group_per_pass=t.grad_checkpoint and cfg.lora.enabled,
            importance_sampling_correction=resolve_correction(cfg),
            importance_sampling_cap=g.importance_sampling_cap,
            importance_sampling_floor=g.importance_sampling_floor,
            reduce_dtype=cfg.distributed.reduce_dtype,
        )

    @classmethod
    def of(cls, source) -> "UpdateSettings":
        """`source` itself, or the settings read from a Config (as tests and scripts pass one)."""
        return source if isinstance(source, cls) else cls.from_config(source)

    def with_parts(self, accumulation_steps: int) -> "UpdateSettings":
        """These settings for a step that trains in fewer accumulation parts (dynamic sampling)."""
        return replace(self, accumulation_steps=accumulation_steps)
