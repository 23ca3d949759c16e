"""How a reward function is called, and what it may return: the reward contract.

Two forms of function, told apart once by their parameters:
- this project's form, `fn(prompts, completions, answers, **kwargs)`: a function whose third
  positional parameter is named `answers` (the built-ins) gets the prompt texts, the completion
  texts and the answer field's values positionally;
- TRL's form, any other function: `fn(prompts=..., completions=..., completion_ids=..., **columns,
  trainer_state=...)`, all keywords, as TRL 1.16's GRPOTrainer calls it; a conversational row's
  prompt is its list of messages and its completion `[{"role": "assistant", "content": text}]`.
Both get as keywords every field of the data row but the prompt field (repeated for each of its
completions), `completion_ids` and `trainer_state`; a function without `**kwargs` gets only the
keywords it names. A field named like an argument (prompts, completions, answers,
completion_ids, trainer_state) is shadowed by it. `async def` functions are awaited together.

A score is a finite int or float, or None: "not mine to score" (TRL's None, read as NaN there).
Pure Python, no MLX.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import numbers
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

from mlx_grpo.errors import UserError

ARGUMENTS = ("prompts", "completions", "answers", "completion_ids", "trainer_state")


class RewardError(UserError, ValueError):
    """A reward that cannot be resolved, raised, or returned an unusable score."""


@dataclass(frozen=True)
class TrainerState:
    """What a reward may read of the run's progress (the attributes of TRL's TrainerState it has)."""

    global_step: int = 0  # training steps finished before this one (eval: 0)
    max_steps: int = 0
    epoch: float = 0.0  # training prompts drawn so far / prompts in the training split


@dataclass
class RewardBatch:
    """A step's completions and all a reward may read of them; item i belongs to completion i."""

    prompts: list  # the prompt texts (a conversation's last user message)
    completions: list[str]
    answers: list  # the answer field's values, as loaded
    completion_ids: list[list[int]] | None = None
    columns: dict[str, list] = field(default_factory=dict)  # every other field, one value per completion
    messages: list | None = None  # per completion, its conversation (a list of messages) or None (text)
    rows: list[int] | None = None  # the data row of each completion, which errors name
    trainer_state: TrainerState = field(default_factory=TrainerState)
    group_size: int = 1  # completions per prompt
    extra: dict = field(default_factory=dict)  # keywords passed to every call as they are (not per row)

    def __len__(self) -> int:
        return len(self.completions)

    def take(self, i: int) -> RewardBatch:
        """Completion i alone, as a batch of one."""
        one = lambda xs: None if xs is None else xs[i : i + 1]  # noqa: E731
        return replace(self, prompts=one(self.prompts), completions=one(self.completions),
                       answers=one(self.answers), completion_ids=one(self.completion_ids),
                       columns={k: one(v) for k, v in self.columns.items()}, messages=one(self.messages),
                       rows=one(self.rows), group_size=1)

    def where(self, i: int) -> str:
        """How a message names completion i: its index, prompt, data row and start."""
        row = f", data row {self.rows[i]}" if self.rows is not None else ""
        return f"sample {i} (prompt {i // self.group_size}{row}, completion {self.completions[i][:80]!r})"


def takes_answers(fn) -> bool:
    """This project's form: the function's third positional parameter is named `answers`."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: TRL's form
        return False
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 3 and positional[2].name == "answers"


def _accepted(fn, kwargs: dict) -> dict:
    """The keywords `fn` takes: all with **kwargs, else those it names."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return kwargs
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return kwargs
    return {k: v for k, v in kwargs.items() if k in params}


def arguments(fn, batch: RewardBatch, old_form: bool) -> tuple[tuple, dict]:
    """The positional and keyword arguments of one call of `fn` on the batch."""
    common = {k: v for k, v in batch.columns.items() if k not in ARGUMENTS}
    common.update(batch.extra)
    common["completion_ids"] = batch.completion_ids
    common["trainer_state"] = batch.trainer_state
    if old_form:
        return (batch.prompts, batch.completions, batch.answers), _accepted(fn, common)
    messages = batch.messages or [None] * len(batch)
    prompts = [p if m is None else m for p, m in zip(batch.prompts, messages)]
    completions = [c if m is None else [{"role": "assistant", "content": c}]
                   for c, m in zip(batch.completions, messages)]
    return (), _accepted(fn, {"prompts": prompts, "completions": completions, **common})


def check_binding(key: str, fn, args: tuple, kwargs: dict) -> None:
    """A function that cannot take these arguments: one line naming the reward, before it runs."""
    try:
        inspect.signature(fn).bind(*args, **kwargs)
    except ValueError:  # no signature to check: the call itself will say
        return
    except TypeError as e:
        fields = ", ".join(k for k in kwargs if k not in ARGUMENTS) or "none"
        form = "fn(prompts, completions, answers, **kwargs)" if args else \
            "fn(prompts=, completions=, completion_ids=, trainer_state=, **fields)"
        raise RewardError(f"reward {key!r} cannot be called as {form}: {e}; the data's other fields: {fields} "
                          "(a function of this project's form names its third parameter 'answers')") from None


def run_all(calls: dict) -> dict:
    """{key: result} of {key: result or awaitable}: the awaitables awaited together, an exception
    kept as the result. Runs in a thread of its own when an event loop is already running
    (a notebook), where asyncio.run cannot."""
    pending = {k: v for k, v in calls.items() if inspect.isawaitable(v)}
    if not pending:
        return calls

    async def gather():
        return await asyncio.gather(*pending.values(), return_exceptions=True)

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        done = asyncio.run(gather())
    else:
        with ThreadPoolExecutor(1) as pool:
            done = pool.submit(asyncio.run, gather()).result()
    return {**calls, **dict(zip(pending, done))}


def finite_real(x: object) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x)


def check_scores(key: str, out, batch: RewardBatch) -> list[float | None]:
    """A reward's output as floats and Nones, one per completion; anything else is one line."""
    n = len(batch)
    try:
        scores = list(out)
    except TypeError:
        raise RewardError(f"reward {key!r} returned a {type(out).__name__}, expected {n} scores") from None
    if len(scores) != n:
        raise RewardError(f"reward {key!r} returned {len(scores)} scores for {n} completions")
    for i, s in enumerate(scores):
        if s is not None and not finite_real(s):
            raise RewardError(f"reward {key!r} gave {s!r:.60} ({type(s).__name__}) for {batch.where(i)}, "
                              "expected a finite int or float, or None (not applicable)")
    return [None if s is None else float(s) for s in scores]
