"""Stage 0, the typed config: every default (`sections.py`), and loading a profile with `--set`
overrides, checking each value, and saving (`load.py`). Stdlib only (plus tomli_w); no MLX."""

from mlx_grpo.config.load import (
    RULES, SEED_LIMIT, ConfigError, config_to_dict, load_config, save_config,
)
from mlx_grpo.config.sections import (
    DEFAULT_SYSTEM_PROMPT, CheckpointConfig, Config, DataConfig, EvalConfig, GenerationConfig, GRPOConfig,
    LoggingConfig, LoraConfig, ModelConfig, RewardConfig, TrainingConfig,
)
