"""Old import path of the README's public function, kept working: it lives in `mlx_grpo.algorithm.dynamic_sampling`."""

from mlx_grpo.algorithm.dynamic_sampling import groups_with_spread  # noqa: F401
