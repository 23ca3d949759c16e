"""mlx-grpo: GRPO fine-tuning of small language models with MLX.

`mlx_grpo.train(config, *, rewards=None, dataset=None, **overrides)` is the Python API (api.py);
`mlx-grpo` the command line (cli.py).
"""

__version__ = "0.1.0"

from mlx_grpo.api import train  # noqa: E402

__all__ = ["train", "__version__"]
