"""Stage 2, rollout: G completions per prompt with mlx-lm, and the rewards they score."""
