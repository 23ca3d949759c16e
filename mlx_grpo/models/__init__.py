"""Models: loading with mlx-lm, the policy and its reference, the built-in models, adapters,
converting and exporting, and the model a user names with `--model M`."""
