"""Stage 5, the update: micro-batches, their gradients, the optimizer and its schedule, one step."""
