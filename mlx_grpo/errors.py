"""The errors that mean "the input is wrong", which the CLI prints as one line."""

from mlx_grpo.config import ConfigError
from mlx_grpo.data import DataError
from mlx_grpo.report import ReportError
from mlx_grpo.rewards import RewardError


class TrainingError(RuntimeError):
    """The run cannot go on; the message says why and where."""


class NonFiniteError(TrainingError):
    """A NaN or inf in the loss or the gradients; the update was not applied."""

    def __init__(self, metric: str, value: float):
        self.metric, self.value = metric, value
        super().__init__(f"non-finite {metric} ({value}); the update was not applied")


class ModelError(ValueError):
    """A model folder or setting that cannot be loaded as configured."""


# OSError: a full disk or a missing permission is the machine's state, not a bug; its
# message names the file.

USER_ERRORS = (ConfigError, DataError, RewardError, ReportError, TrainingError, ModelError, OSError)
