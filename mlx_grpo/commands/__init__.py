"""The entry points: one module per `mlx-grpo` sub-command, each a library function with a thin
`main(args)`; only these read the whole config."""
