"""Old import path of the README's public function, kept working: it lives in `mlx_grpo.algorithm.overlong`."""

from mlx_grpo.algorithm.overlong import overlong_penalty  # noqa: F401
