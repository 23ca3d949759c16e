"""Old import path of the README's public functions, kept working: it lives in `mlx_grpo.algorithm.loss`."""

from mlx_grpo.algorithm.loss import completion_logprobs, grpo_loss, token_logprobs_and_entropies  # noqa: F401
