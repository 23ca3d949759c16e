"""The memory planner: a run's peak memory per phase, predicted from a model's config.json and
safetensors headers without loading a weight (`mlx-grpo plan`, and `train` before it loads)."""
