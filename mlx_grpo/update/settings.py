"""The values the update stage reads, taken from the config once (`UpdateSettings.from_config`).

The update's functions take these settings rather than the whole config. A step that dynamic
sampling left short of groups runs with fewer accumulation parts: a copy of the settings with
that one value changed (`dataclasses.replace`), never a modified copy of the config.
"""

from dataclasses import dataclass, replace


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
    max_new_tokens: int  # generation.max_new_tokens: dr_grpo's normaliser
    shared_prefix: bool = True  # training.shared_prefix: each group's prompt runs once per pass

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
            max_new_tokens=gen.max_new_tokens,
            shared_prefix=t.shared_prefix,
        )

    @classmethod
    def of(cls, source) -> "UpdateSettings":
        """`source` itself, or the settings read from a Config (as tests and scripts pass one)."""
        return source if isinstance(source, cls) else cls.from_config(source)

    def with_parts(self, accumulation_steps: int) -> "UpdateSettings":
        """These settings for a step that trains in fewer accumulation parts (dynamic sampling)."""
        return replace(self, accumulation_steps=accumulation_steps)
