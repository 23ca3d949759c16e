import sys

from mlx_grpo.cli import main

sys.exit(main())
