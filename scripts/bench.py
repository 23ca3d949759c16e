"""The mlx-grpo benchmark: trainer step time against MLX's own limit (same as `mlx-grpo bench`).

    uv run python scripts/bench.py --size small --json bench.json
"""

import sys

from mlx_grpo.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
