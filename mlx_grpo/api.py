"""The Python API: `mlx_grpo.train(config, *, rewards=None, dataset=None, **overrides)`, the run
`mlx-grpo train --config PROFILE --set ...` makes, with reward functions and rows given as
Python objects. An entry point, so it reads the whole config; MLX is imported only when it runs.
Each argument is checked before any work: a wrong one raises ApiError naming it and what it takes.
"""

from collections.abc import Mapping
import os
from pathlib import Path

from mlx_grpo.errors import UserError

CONFIG_TAKES = "a TOML profile's path, a dict of the same shape or a mlx_grpo.config.Config"
REWARDS_TAKES = ("a list of reward functions, reward names ('xml_format', 'module:function', "
                 "'path/file.py:function') or (reward, weight) pairs")
DATASET_TAKES = ("a list of dicts (rows), a dict of columns (name -> list of values), a datasets.Dataset "
                 "or a data file's path (.jsonl, .json, .parquet, .csv)")


class ApiError(UserError, TypeError):
    """An argument of mlx_grpo.train of a kind it does not take; the message names it."""


def train(config, *, rewards=None, dataset=None, tools=None, environment=None, **overrides) -> Path:
    """Train with GRPO; returns the run's output folder.

    config: a TOML profile's path, a dict of the same shape, or a `Config`.
    rewards: functions (this project's `fn(prompts, completions, answers, **kwargs)` or TRL's
        `fn(completions, **kwargs)` form, sync or async; one score or None per completion), names
        as [[rewards]] takes them, or (reward, weight) pairs (weight 1.0 otherwise, or
        `reward_weights=[...]` as in TRL), in place of the config's [[rewards]]; each function is
        logged as `rewards/<fn.__name__>/mean`.
    dataset: the training rows, in place of data.dataset: a list of dicts, a dict of columns,
        a `datasets.Dataset`, or a data file's path (which becomes data.dataset);
        data.prompt_field and data.answer_field still name the fields.
    tools: typed functions the model may call over several turns (TRL's tools=; docs/tools.md), or
        names as tools.functions takes them, in place of the config's [tools] functions.
    environment: a class (one instance per episode, `reset(**row)`, its public methods are tools),
        or its 'module:Class' name, in place of tools.environment.
    overrides: top-level keys (`output_dir="runs/x"`, `seed=1`) and sections as dicts
        (`training={"max_steps": 3}`), checked as `--set` items are.
    """
    from mlx_grpo.config import Config, ConfigError, RewardConfig, load_config

    if not isinstance(config, (str, os.PathLike, Mapping, Config)):
        raise ApiError(f"mlx_grpo.train(config=...): expected {CONFIG_TAKES}, got {_kind(config)}")
    pairs = None if rewards is None else reward_pairs(rewards)
    rows = None if dataset is None or _is_path(dataset) else dataset_rows(dataset)
    config_path = str(config) if isinstance(config, (str, os.PathLike)) else None
    cfg = load_config(dict(config) if isinstance(config, Mapping) else config, keywords=overrides)
    reward_set = None
    if pairs is not None:
        from mlx_grpo.rewards import RewardSet

        base_dir = Path(config_path).parent if config_path else None
        reward_set = RewardSet(pairs, base_dir=base_dir, group_size=cfg.generation.num_generations,
                               weights=cfg.reward_weights)
        # config.toml records an importable function as module:function, which the CLI can load
        cfg.rewards = [RewardConfig(name=_record(fn), weight=reward_set.weights[k])
                       for (fn, _), k in zip(pairs, reward_set.keys)]
    if _is_path(dataset):
        cfg.data.dataset = os.fspath(dataset)
    elif rows is not None:
        if cfg.eval.every:
            raise ConfigError("eval.every: evaluation during training reads data.dataset's eval split, "
                              "which mlx_grpo.train(dataset=...) has not; set eval.every = 0")
        cfg.data.dataset = f"mlx_grpo.train(dataset=...), {len(rows)} rows"
    toolset = None
    if tools is not None or environment is not None:
        toolset = _toolset(cfg, config_path, tools, environment)
    from mlx_grpo.commands.train import train as run

    run(cfg, config_path, reward_set=reward_set, rows=rows, toolset=toolset)
    return Path(cfg.output_dir)


def _toolset(cfg, config_path, tools, environment):
    """The Toolset of `tools=` and `environment=` (checked now, before any weight loads); the
    config records them by name where they are importable."""
    from mlx_grpo.tools import Toolset

    if tools is not None and not isinstance(tools, (list, tuple)):
        raise ApiError(f"mlx_grpo.train(tools=...): expected a list of functions or 'module:function' names, "
                       f"got {_kind(tools)} (one tool is a list of one: tools=[{tools!r:.40}])")
    functions = list(tools) if tools is not None else cfg.tools.functions
    env = environment if environment is not None else (cfg.tools.environment or None)
    base_dir = Path(config_path).parent if config_path else None
    toolset = Toolset(functions, env, base_dir=base_dir, timeout_s=cfg.tools.timeout_s)
    cfg.tools.functions = [_record(fn) for fn in functions]
    cfg.tools.environment = _record(env) if env is not None else ""
    return toolset


def _kind(value) -> str:
    return f"{type(value).__name__} {value!r:.60}"


def _is_path(value) -> bool:
    return isinstance(value, (str, os.PathLike))


def reward_pairs(rewards) -> list[tuple]:
    """`rewards=` as (function or name, weight) pairs; anything else raises ApiError naming it."""
    if not isinstance(rewards, (list, tuple)):
        one = isinstance(rewards, str) or callable(rewards)
        hint = f" (one reward is a list of one: rewards=[{rewards!r:.60}])" if one else ""
        raise ApiError(f"mlx_grpo.train(rewards=...): expected {REWARDS_TAKES}, got {_kind(rewards)}{hint}")
    pairs = []
    for i, item in enumerate(rewards):
        reward, weight = item if isinstance(item, tuple) and len(item) == 2 else (item, 1.0)
        if callable(reward) and not isinstance(getattr(reward, "__name__", None), str):
            raise ApiError(f"mlx_grpo.train(rewards=...): rewards[{i}] ({_kind(reward)}) has no __name__ to log "
                           "it under; wrap it in a def")
        number = isinstance(weight, (int, float)) and not isinstance(weight, bool)
        if not (callable(reward) or isinstance(reward, str)) or not number:
            raise ApiError(f"mlx_grpo.train(rewards=...): rewards[{i}] is {_kind(item)}; expected a reward "
                           "function, a reward name or a (reward, weight) pair with a number as weight")
        pairs.append((reward, weight))
    return pairs


def dataset_rows(dataset) -> list[dict]:
    """`dataset=` as a list of rows; anything else raises ApiError naming it."""
    if isinstance(dataset, Mapping):  # columns, as datasets.Dataset.from_dict takes them
        columns = {k: v for k, v in dataset.items()}
        if not columns or not all(isinstance(v, (list, tuple)) for v in columns.values()):
            raise ApiError(f"mlx_grpo.train(dataset=...): a dict is read as columns (name -> list of values); "
                           f"got {_kind(dataset)} (one row is a list of one: dataset=[row])")
        lengths = {k: len(v) for k, v in columns.items()}
        if len(set(lengths.values())) > 1:
            raise ApiError(f"mlx_grpo.train(dataset=...): the columns differ in length ({lengths})")
        dataset = [dict(zip(columns, values)) for values in zip(*columns.values())]
    if isinstance(dataset, bytes) or not hasattr(dataset, "__iter__"):
        raise ApiError(f"mlx_grpo.train(dataset=...): expected {DATASET_TAKES}, got {_kind(dataset)}")
    rows = list(dataset)
    for i, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise ApiError(f"mlx_grpo.train(dataset=...): row {i} is {_kind(row)}, not a dict; "
                           f"expected {DATASET_TAKES}")
    if not rows:
        raise ApiError(f"mlx_grpo.train(dataset=...): no rows; expected {DATASET_TAKES}")
    return [dict(row) for row in rows]


def _record(fn) -> str:
    if isinstance(fn, str):
        return fn
    module, name = getattr(fn, "__module__", None), getattr(fn, "__qualname__", fn.__name__)
    if module and module != "__main__" and "." not in name and "<" not in name:
        return f"{module}:{name}"
    return fn.__name__
