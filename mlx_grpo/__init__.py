"""mlx-grpo: GRPO fine-tuning of small language models with MLX."""

__version__ = "0.1.0"
