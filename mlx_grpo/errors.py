"""What "the input is wrong" means, so that the CLI can print it as one line.

Each stage owns its own error type (ConfigError in config, DataError in data, RewardError in
rewards, ReportError in report) and makes it a `UserError`; the CLI catches that base alone,
so this module imports nothing and nothing is pulled in to build a list of errors.
"""


class UserError(Exception):
    """A wrong setting, file or model: the message names it, and the CLI prints it as one line."""


class TrainingError(UserError, RuntimeError):
    """The run cannot go on; the message says why and where."""


class NonFiniteError(TrainingError):
    """A NaN or inf in the loss or the gradients; the update was not applied."""

    def __init__(self, metric: str, value: float):
        self.metric, self.value = metric, value
        super().__init__(f"non-finite {metric} ({value}); the update was not applied")


class ModelError(UserError, ValueError):
    """A model folder or setting that cannot be loaded as configured."""


class naming:
    """`with naming(path):` an OSError raised inside that names no file (a write on a full disk
    does not) names `path`, so the one-line error says which file could not be written."""

    def __init__(self, path):
        self.path = path

    def __enter__(self):
        return self

    def __exit__(self, kind, error, traceback):
        if isinstance(error, OSError) and error.filename is None:
            error.filename = str(self.path)
        return False
