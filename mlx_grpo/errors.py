"""The errors that mean "the input is wrong", which the CLI prints as one line."""

from mlx_grpo.config import ConfigError
from mlx_grpo.data import DataError
from mlx_grpo.report import ReportError
from mlx_grpo.rewards import RewardError


class TrainingError(RuntimeError):
    """The run cannot go on; the message says why and where."""


USER_ERRORS = (ConfigError, DataError, RewardError, ReportError, TrainingError, FileNotFoundError)
