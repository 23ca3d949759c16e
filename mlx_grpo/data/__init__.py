"""Stage 1, data: data sets and their splits, chat prompts, the built-in arithmetic task."""
