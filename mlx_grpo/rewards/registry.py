"""The reward registry: the built-ins by name, resolving a configured name to a function, weighting them.

A reward is a plain function ``fn(prompts, completions, answers, **kwargs) -> list[float]`` with one
score per completion. Built-ins live in ``REWARDS``; a config may also name ``"package.module:fn"``
or ``"path/to/file.py:fn"``. A wrong or unparseable answer scores 0.0; a reward that raises or
returns a bad score stops the run with a ``RewardError`` naming the reward and the sample.
Pure Python on purpose: no MLX here, so rewards are testable and importable anywhere.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib
import importlib.util
import math
import numbers
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from mlx_grpo.errors import UserError
from mlx_grpo.rewards.gsm8k import gsm8k_correctness, rouge_l, xml_format
from mlx_grpo.rewards.summary import coverage, faithfulness, length_band, no_copy

RewardFn = Callable[..., list[float]]


class RewardError(UserError, ValueError):
    """A reward that cannot be resolved, raised, or returned an unusable score."""


def _describe(e: BaseException) -> str:
    return f"{type(e).__name__}: {' '.join(str(e).split())}"


def _finite_real(x: object) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x)


REWARDS: dict[str, RewardFn] = {
    "gsm8k_correctness": gsm8k_correctness,
    "xml_format": xml_format,
    "rouge_l": rouge_l,
    # reference-free summary rewards (summary_rewards.py): they compare a completion with its prompt
    "length_band": length_band,
    "coverage": coverage,
    "faithfulness": faithfulness,
    "no_copy": no_copy,
}


def _load_file(name: str, target: str, base_dir: str | Path | None):
    path = Path(target).expanduser()
    roots = [] if path.is_absolute() else [d for d in (base_dir, Path.cwd()) if d is not None]
    candidates = [Path(d) / path for d in roots] or [path]
    found = next((p.resolve() for p in candidates if p.is_file()), None)
    if found is None:
        raise RewardError(f"reward {name!r}: file not found (looked at {', '.join(map(str, candidates))})")
    # One module per resolved path, registered in sys.modules so dataclasses/pickle in the file work
    # and two rewards from one file share its module state (as `import` would).
    mod_name = f"_mlx_grpo_reward_{found.stem}_{hashlib.sha1(str(found).encode()).hexdigest()[:8]}"
    if mod_name in sys.modules:
        return sys.modules[mod_name]
    spec = importlib.util.spec_from_file_location(mod_name, found)
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as e:  # sys.exit() in a reward file must not end the run silently
        del sys.modules[mod_name]
        raise RewardError(f"reward {name!r}: loading {found} failed: {_describe(e)}") from e
    return module


def resolve_reward(name: str, base_dir: str | Path | None = None) -> RewardFn:
    """A built-in name, 'package.module:function', or 'path/to/file.py:function' -> the function.

    Relative file paths are tried against base_dir (e.g. the config file's folder) first, then the cwd.
    A function (the Python API's `rewards=[fn]`) is its own reward.
    """
    if callable(name):
        return name
    if not isinstance(name, str):
        raise RewardError(f"reward name must be a string or a function, got {name!r}")
    if name in REWARDS:
        return REWARDS[name]
    if ":" not in name:
        close = difflib.get_close_matches(name, REWARDS, n=1) or [k for k in REWARDS if k.startswith(name)]
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise RewardError(
            f"unknown reward {name!r}{hint}; known built-ins: {', '.join(REWARDS)}; "
            "or give 'package.module:function' or 'path/to/file.py:function'"
        )
    target, func_name = name.rsplit(":", 1)
    if target.endswith(".py") or "/" in target or "\\" in target:
        if not target.endswith(".py"):
            raise RewardError(f"reward {name!r}: {target!r} is not a .py file (give 'path/to/file.py:function')")
        module = _load_file(name, target, base_dir)
    else:
        try:
            module = importlib.import_module(target)
        except (Exception, SystemExit) as e:
            raise RewardError(f"reward {name!r}: cannot import module {target!r}: {_describe(e)}") from e
    if not hasattr(module, func_name):
        raise RewardError(f"reward {name!r}: {target!r} has no function {func_name!r}")
    fn = getattr(module, func_name)
    if not callable(fn):
        raise RewardError(f"reward {name!r}: {target}.{func_name} is a {type(fn).__name__}, not callable")
    return fn


class RewardSet:
    """Named, weighted rewards; calling it returns (weighted totals, scores per reward name).

    A weight of 0 still computes the reward, so it is logged as a metric without training on it.
    """

    def __init__(self, items: list[tuple[str | RewardFn, float]], base_dir: str | Path | None = None,
                 group_size: int = 1):
        self.group_size = group_size  # completions per prompt, so errors can name the prompt
        if not items:
            raise RewardError("no rewards configured: give at least one (name, weight)")
        names = [getattr(name, "__name__", name) if callable(name) else name for name, _ in items]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise RewardError(f"reward(s) listed more than once: {', '.join(dupes)}")
        short = [n.rsplit(":", 1)[-1] for n in names]
        self.keys = [s if short.count(s) == 1 else n for s, n in zip(short, names)]
        self.weights = {}
        for key, (name, weight) in zip(self.keys, items):
            if not _finite_real(weight):
                raise RewardError(f"reward {key!r}: weight must be a finite number, got {weight!r}")
            self.weights[key] = float(weight)
        self.fns = {key: resolve_reward(name, base_dir) for key, (name, _) in zip(self.keys, items)}

    @classmethod
    def from_config(cls, items, base_dir: str | Path | None = None, group_size: int = 1) -> RewardSet:
        """Items are dicts with 'name'/'weight' keys or objects with .name/.weight attributes."""
        return cls([(_field(item, "name"), _field(item, "weight")) for item in items], base_dir, group_size)

    def __call__(self, prompts, completions, answers, **kwargs) -> tuple[list[float], dict[str, list[float]]]:
        n = len(completions)
        if len(prompts) != n or len(answers) != n:
            raise RewardError(f"got {len(prompts)} prompts, {n} completions and {len(answers)} answers")
        per_name = {k: _score(k, fn, prompts, completions, answers, kwargs, self.group_size)
                    for k, fn in self.fns.items()}
        total = [sum(self.weights[k] * per_name[k][i] for k in self.keys) for i in range(n)]
        return total, per_name


def _field(item, key: str):
    try:
        return item[key] if isinstance(item, Mapping) else getattr(item, key)
    except (KeyError, AttributeError):
        raise RewardError(f"reward entry {item!r} has no {key!r}") from None


def _sample(i: int, completions, group_size: int) -> str:
    return f"sample {i} (prompt {i // group_size}, completion {completions[i][:80]!r})"


def _score(key, fn, prompts, completions, answers, kwargs, group_size: int = 1) -> list[float]:
    """Run one reward on the batch and check its scores; any failure raises naming reward and sample."""
    try:
        out = fn(prompts, completions, answers, **kwargs)
    except (Exception, SystemExit) as e:  # SystemExit: a sys.exit() while scoring
        where = "index unknown (every sample alone scored without error)"
        for i in range(len(completions)):
            try:
                fn(prompts[i : i + 1], completions[i : i + 1], answers[i : i + 1], **kwargs)
            except (Exception, SystemExit):
                where = _sample(i, completions, group_size)
                break
        raise RewardError(f"reward {key!r} raised {_describe(e)} on {where}") from e
    try:
        scores = list(out)
    except TypeError:
        n = len(completions)
        raise RewardError(f"reward {key!r} returned a {type(out).__name__}, expected {n} scores") from None
    if len(scores) != len(completions):
        raise RewardError(f"reward {key!r} returned {len(scores)} scores for {len(completions)} completions")
    for i, s in enumerate(scores):
        if not _finite_real(s):
            raise RewardError(
                f"reward {key!r} gave {s!r} ({type(s).__name__}) for {_sample(i, completions, group_size)}, "
                "expected a finite int or float"
            )
    return [float(s) for s in scores]
