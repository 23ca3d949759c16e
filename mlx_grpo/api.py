"""The Python API: `mlx_grpo.train(config, *, rewards=None, dataset=None, **overrides)`, the run
`mlx-grpo train --config PROFILE --set ...` makes, with reward functions and rows given as
Python objects. An entry point, so it reads the whole config; MLX is imported only when it runs.
"""

import os
from pathlib import Path


def train(config, *, rewards=None, dataset=None, **overrides) -> Path:
    """Train with GRPO; returns the run's output folder.

    config: a TOML profile's path, a dict of the same shape, or a `Config`.
    rewards: functions (this project's `fn(prompts, completions, answers, **kwargs)` or TRL's
        `fn(completions, **kwargs)` form, sync or async; one score or None per completion), names
        as [[rewards]] takes them, or (function, weight) pairs (weight 1.0 otherwise, or
        `reward_weights=[...]` as in TRL), in place of the config's [[rewards]]; each is logged
        as `rewards/<fn.__name__>/mean`.
    dataset: the training rows, a list of dicts or a `datasets.Dataset`, in place of
        data.dataset (data.prompt_field and data.answer_field still name the fields).
    overrides: top-level keys (`output_dir="runs/x"`, `seed=1`) and sections as dicts
        (`training={"max_steps": 3}`), checked as `--set` items are.
    """
    from mlx_grpo.commands.train import train as run
    from mlx_grpo.config import ConfigError, RewardConfig, load_config
    from mlx_grpo.data.load import DataError
    from mlx_grpo.rewards import RewardError, RewardSet

    config_path = str(config) if isinstance(config, (str, os.PathLike)) else None
    cfg = load_config(config, keywords=overrides)
    reward_set = None
    if rewards is not None:
        pairs = [_pair(r, RewardError) for r in rewards]
        base_dir = Path(config_path).parent if config_path else None
        reward_set = RewardSet(pairs, base_dir=base_dir, group_size=cfg.generation.num_generations,
                               weights=cfg.reward_weights)
        # config.toml records an importable function as module:function, which the CLI can load
        cfg.rewards = [RewardConfig(name=_record(fn), weight=reward_set.weights[k])
                       for (fn, _), k in zip(pairs, reward_set.keys)]
    rows = None
    if dataset is not None:
        rows = [dict(row) if not isinstance(row, dict) else row for row in dataset]
        if not rows or not all(isinstance(row, dict) for row in rows):
            raise DataError("mlx_grpo.train(dataset=...): expected a non-empty list of dicts or a datasets.Dataset")
        if cfg.eval.every:
            raise ConfigError("eval.every: evaluation during training reads data.dataset's eval split, "
                              "which mlx_grpo.train(dataset=...) has not; set eval.every = 0")
        cfg.data.dataset = f"mlx_grpo.train(dataset=...), {len(rows)} rows"
    run(cfg, config_path, reward_set=reward_set, rows=rows)
    return Path(cfg.output_dir)


def _pair(item, error):
    """A reward as (function or name, weight)."""
    if isinstance(item, tuple):
        if len(item) != 2:
            raise error(f"mlx_grpo.train(rewards=...): expected a function or (function, weight), got {item!r}")
        return item
    return item, 1.0


def _record(fn) -> str:
    if isinstance(fn, str):
        return fn
    module, name = getattr(fn, "__module__", None), getattr(fn, "__qualname__", fn.__name__)
    if module and module != "__main__" and "." not in name and "<" not in name:
        return f"{module}:{name}"
    return fn.__name__
