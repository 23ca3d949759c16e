"""The reward registry: the built-ins by name, resolving a configured name to a function, weighting them.

A reward is a plain function with one score per completion, called as call.py says (this
project's `fn(prompts, completions, answers, **kwargs)` or TRL's keyword form). Built-ins live
in ``REWARDS``; a config may also name ``"package.module:fn"`` or ``"path/to/file.py:fn"``. A
wrong or unparseable answer scores 0.0; None means "not mine to score": the total is the
weighted sum of the scores given (TRL's nansum), and a completion no reward scores stops the
run. A reward that raises or returns a bad score stops the run with a ``RewardError`` naming
the reward and the sample. Pure Python on purpose: no MLX here, so rewards are testable and
importable anywhere.
"""

from __future__ import annotations

import difflib
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from mlx_grpo.rewards.call import (
    RewardBatch, RewardError, arguments, check_binding, check_scores, finite_real, run_all, takes_answers,
)
from mlx_grpo.rewards.gsm8k import gsm8k_correctness, rouge_l, xml_format
from mlx_grpo.rewards.summary import coverage, faithfulness, length_band, no_copy
from mlx_grpo.user_code import describe, is_file_target, load_module

RewardFn = Callable[..., list[float | None]]


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
    if name == "judge":  # a model, not a function: built from its whole entry (commands/setup.make_rewards)
        raise RewardError("reward 'judge' is configured by its [[rewards]] entry (model, template, parse, ...), "
                          "not by name alone")
    if ":" not in name:
        close = difflib.get_close_matches(name, REWARDS, n=1) or [k for k in REWARDS if k.startswith(name)]
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise RewardError(
            f"unknown reward {name!r}{hint}; known built-ins: {', '.join(REWARDS)}; "
            "or give 'package.module:function' or 'path/to/file.py:function'"
        )
    target, func_name = name.rsplit(":", 1)
    if is_file_target(target) and not target.endswith(".py"):
        raise RewardError(f"reward {name!r}: {target!r} is not a .py file (give 'path/to/file.py:function')")
    module = load_module(target, base_dir, f"reward {name!r}", RewardError)
    if not hasattr(module, func_name):
        raise RewardError(f"reward {name!r}: {target!r} has no function {func_name!r}")
    fn = getattr(module, func_name)
    if not callable(fn):
        raise RewardError(f"reward {name!r}: {target}.{func_name} is a {type(fn).__name__}, not callable")
    return fn


class RewardSet:
    """Named, weighted rewards; calling it returns (weighted totals, scores per reward name).

    A weight of 0 still computes the reward, so it is logged as a metric without training on it.
    `weights` (TRL's reward_weights), when given, replaces the items' weights, one per reward.
    """

    def __init__(self, items: list[tuple[str | RewardFn, float]], base_dir: str | Path | None = None,
                 group_size: int = 1, weights: list[float] | None = None):
        self.group_size = group_size  # completions per prompt, so errors can name the prompt
        if not items:
            raise RewardError("no rewards configured: give at least one (name, weight)")
        if weights:
            if len(weights) != len(items):
                raise RewardError(f"reward_weights: {len(weights)} weights for {len(items)} rewards; "
                                  "give one per reward, in their order")
            items = [(name, w) for (name, _), w in zip(items, weights)]
        names = [getattr(name, "__name__", name) if callable(name) else name for name, _ in items]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise RewardError(f"reward(s) listed more than once: {', '.join(dupes)}")
        short = [n.rsplit(":", 1)[-1] for n in names]
        self.keys = [s if short.count(s) == 1 else n for s, n in zip(short, names)]
        self.weights = {}
        for key, (name, weight) in zip(self.keys, items):
            if not finite_real(weight):
                raise RewardError(f"reward {key!r}: weight must be a finite number, got {weight!r}")
            self.weights[key] = float(weight)
        self.fns = {key: resolve_reward(name, base_dir) for key, (name, _) in zip(self.keys, items)}
        self.old_form = {key: takes_answers(fn) for key, fn in self.fns.items()}  # told apart once
        self.seconds = 0.0  # spent scoring since the last `take_timing`

    @classmethod
    def from_config(cls, items, base_dir: str | Path | None = None, group_size: int = 1,
                    weights: list[float] | None = None) -> RewardSet:
        """Items are dicts with 'name'/'weight' keys or objects with .name/.weight attributes."""
        return cls([(_field(item, "name"), _field(item, "weight")) for item in items], base_dir, group_size,
                   weights)

    def __call__(self, prompts, completions, answers, **kwargs) -> tuple[list[float], dict[str, list]]:
        """Score texts alone; `kwargs` reach every reward as they are."""
        n = len(completions)
        if len(prompts) != n or len(answers) != n:
            raise RewardError(f"got {len(prompts)} prompts, {n} completions and {len(answers)} answers")
        return self.score(RewardBatch(list(prompts), list(completions), list(answers), group_size=self.group_size,
                                      extra=kwargs))

    def score(self, batch: RewardBatch) -> tuple[list[float], dict[str, list]]:
        """(weighted totals, {name: scores, None where a reward gave none}) of a batch."""
        tic = time.perf_counter()
        calls = {key: self._start(key, batch) for key in self.keys}
        outputs = run_all(calls)  # the async rewards awaited together
        per_name = {key: self._finish(key, outputs[key], batch) for key in self.keys}
        self.seconds += time.perf_counter() - tic
        return self._totals(per_name, batch), per_name

    def _start(self, key: str, batch: RewardBatch):
        fn = self.fns[key]
        args, kwargs = arguments(fn, batch, self.old_form[key])
        check_binding(key, fn, args, kwargs)
        try:
            return fn(*args, **kwargs)  # a coroutine, for an async function
        except (Exception, SystemExit) as e:  # SystemExit: a sys.exit() while scoring
            return e

    def _finish(self, key: str, out, batch: RewardBatch) -> list[float | None]:
        if isinstance(out, BaseException):
            raise RewardError(f"reward {key!r} raised {describe(out)} on {self._culprit(key, batch)}") from out
        return check_scores(key, out, batch)

    def _culprit(self, key: str, batch: RewardBatch) -> str:
        """The first completion that makes the reward raise when scored alone."""
        fn = self.fns[key]
        for i in range(len(batch)):
            args, kwargs = arguments(fn, batch.take(i), self.old_form[key])
            try:
                out = run_all({0: fn(*args, **kwargs)})[0]
            except (Exception, SystemExit) as e:
                out = e
            if isinstance(out, BaseException):
                return batch.where(i)
        return "index unknown (every sample alone scored without error)"

    def _totals(self, per_name: dict[str, list], batch: RewardBatch) -> list[float]:
        """The weighted sum of the scores each completion got. One that none scored is an error,
        unless a reward that can fail to score (a judge whose answer had no score) is among them:
        then it takes the mean total of its group's scored completions (0 when none is), so its
        advantage is about 0, as TRL leaves such a completion out of the baseline with none."""
        totals, unscored = [], []
        for i in range(len(batch)):
            given = [(self.weights[k], per_name[k][i]) for k in self.keys if per_name[k][i] is not None]
            if not given:
                unscored.append(i)
            totals.append(sum(w * s for w, s in given))
        if unscored and any(getattr(fn, "may_fail_to_score", False) for fn in self.fns.values()):
            G, left_out = batch.group_size, set(unscored)
            for i in unscored:
                scored = [totals[j] for j in range(i - i % G, i - i % G + G) if j not in left_out]
                totals[i] = sum(scored) / len(scored) if scored else 0.0
        elif unscored:
            shown = "; ".join(batch.where(i) for i in unscored[:3]) + ("; ..." if len(unscored) > 3 else "")
            raise RewardError(f"no reward scored {len(unscored)} of {len(batch)} completions (every reward "
                              f"returned None): {shown}; at least one reward must score each completion")
        return totals

    def take_timing(self) -> dict[str, float]:
        """Seconds spent scoring since the last call: `time/rewards`, and each reward's own
        timing (a judge's `time/judge`, ...); the counters start again."""
        out = {"time/rewards": self.seconds}
        for fn in self.fns.values():
            if hasattr(fn, "take_metrics"):
                out.update(fn.take_metrics())
        self.seconds = 0.0
        return out


def _field(item, key: str):
    try:
        return item[key] if isinstance(item, Mapping) else getattr(item, key)
    except (KeyError, AttributeError):
        raise RewardError(f"reward entry {item!r} has no {key!r}") from None
