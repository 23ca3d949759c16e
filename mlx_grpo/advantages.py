"""Old import path of the README's public function, kept working: it lives in `mlx_grpo.algorithm.advantages`."""

from mlx_grpo.algorithm.advantages import group_advantages  # noqa: F401
