"""The judge reward: a model scores the completions (`[[rewards]] name = "judge"`).

Each completion becomes a request, the template filled with {prompt} (the prompt text),
{completion}, {answer} and any field of its data row (Python's str.format: write a literal
brace twice). All the step's requests that are not in the cache go to the judge together,
`batch_size` at a time, and its answer is read by `parse`:
- "number": the number in the last <answer>...</answer> of its answer, else its last number
  (as gsm8k_correctness reads a completion);
- "yes_no": P(yes) / (P(yes) + P(no)) of its next token, in [0, 1], with no decoding.
In group mode one request per prompt holds its G completions ({completions}, numbered [1]..[G])
and the judge answers with their numbers, best first: the one ranked r-th (from 0) scores
1 - r / (G - 1). An answer that gives no score (no number, not a whole ranking) scores None for
its completions, counted (`judge/unparsed`) and warned about once; it never stops the run (a
completion no other reward scores takes its group's mean total, registry.py).
Identical requests are answered once: the answers are kept by request text.
"""

import json
import re
import string
import time

import mlx.core as mx

from mlx_grpo.rewards.call import RewardError
from mlx_grpo.rewards.gsm8k import extract_predicted_number

GB = 1e9
CACHE_SIZE = 65536  # answers kept; the oldest go first
TEMPLATES = {
    ("single", "number"): "Rate the answer to the question from 0 to 10.\n\nQuestion: {prompt}\n\n"
                          "Answer: {completion}\n\nReply with the number alone.",
    ("single", "yes_no"): "Is the answer to the question right?\n\nQuestion: {prompt}\n\nAnswer: {completion}\n\n"
                          "Reply yes or no.",
    ("group", "number"): "Rank the answers to the question from best to worst.\n\nQuestion: {prompt}\n\n"
                         "{completions}\n\nReply with the answers' numbers, best first, separated by commas.",
}


def _text(value) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str)


def template_fields(template: str) -> set[str]:
    return {name.split(".")[0].split("[")[0] for _, name, _, _ in string.Formatter().parse(template) if name}


class JudgeReward:
    """A reward in this project's form whose scores come from a judge model (judge/model.py)."""

    __name__ = "judge"
    may_fail_to_score = True  # a completion it alone could have scored does not stop the run (registry.py)

    def __init__(self, judge, *, template: str = "", parse: str = "number", mode: str = "single",
                 max_new_tokens: int = 64, batch_size: int = 16, group_size: int = 1, warn=print,
                 setting: str = "rewards"):
        self.judge, self.parse, self.mode, self.group_size = judge, parse, mode, group_size
        self.template = template or TEMPLATES[(mode, parse)]
        self.max_new_tokens, self.batch_size, self.warn, self.setting = max_new_tokens, batch_size, warn, setting
        self.fields = template_fields(self.template)
        wrong = "completion" if mode == "group" else "completions"
        if wrong in self.fields:
            raise RewardError(f"{setting}.template: {{{wrong}}} is not a field in mode = {mode!r} "
                              f"(single: {{completion}}; group: {{completions}})")
        if mode == "single" and parse == "yes_no":
            judge.yes_no_tokens()  # a tokenizer without distinct yes/no tokens stops here, before step 1
        self.cache: dict[str, object] = {}
        self.warned = False
        self._reset()

    def _reset(self):
        self.seconds, self.peak, self.before = 0.0, 0.0, 0.0
        self.requests = self.hits = self.unparsed = 0

    def __call__(self, prompts, completions, answers, **kwargs) -> list[float | None]:
        tic, before = time.perf_counter(), mx.get_peak_memory()
        mx.reset_peak_memory()  # to measure the judge's own peak; the step adds `before` back
        n = len(completions)
        rows = [self._fields(i, prompts, completions, answers, kwargs) for i in range(n)]
        if self.mode == "group":
            G = self.group_size if n % self.group_size == 0 else 1
            groups = [list(range(lo, lo + G)) for lo in range(0, n, G)]
            requests = [self._fill(rows[g[0]], completions=_numbered([completions[i] for i in g])) for g in groups]
        else:
            groups, requests = [[i] for i in range(n)], [self._fill(row) for row in rows]
        scores: list[float | None] = [None] * n
        unread = []  # replies that gave no score
        for group, reply in zip(groups, self._answer(requests)):
            read = self._read(reply, len(group))
            unread += [reply] if None in read else []
            for i, s in zip(group, read):
                scores[i] = s
        self._count(scores, unread)
        self.seconds += time.perf_counter() - tic
        self.peak, self.before = max(self.peak, mx.get_peak_memory()), max(self.before, before)
        return scores

    def _fields(self, i, prompts, completions, answers, kwargs) -> dict:
        row = {k: v[i] for k, v in kwargs.items() if isinstance(v, list) and len(v) == len(completions)}
        row.pop("completion_ids", None)
        return {**{k: _text(v) for k, v in row.items()}, "prompt": _text(prompts[i]),
                "completion": completions[i], "answer": _text(answers[i])}

    def _fill(self, row: dict, **more) -> str:
        try:
            return self.template.format_map({**row, **more})
        except KeyError as e:
            known = ", ".join(sorted(k for k in row if k != "completion" or self.mode == "single"))
            raise RewardError(f"{self.setting}.template names {{{e.args[0]}}}, which is no field here "
                              f"(fields: {known})") from None
        except (IndexError, ValueError, AttributeError) as e:
            raise RewardError(f"{self.setting}.template cannot be filled: {e}") from None

    def _answer(self, requests: list[str]) -> list:
        """The judge's reply to each request: from the cache, or asked, all new ones together."""
        new = list(dict.fromkeys(r for r in requests if r not in self.cache))
        self.requests += len(requests)
        self.hits += len(requests) - len(new)
        if new:
            prompts = [self.judge.encode(r) for r in new]
            if self.parse == "yes_no" and self.mode == "single":
                replies = self.judge.yes_probabilities(prompts, self.batch_size)
            else:
                replies = self.judge.answers(prompts, self.max_new_tokens, self.batch_size)
            for request, reply in zip(new, replies):
                if len(self.cache) >= CACHE_SIZE:
                    del self.cache[next(iter(self.cache))]
                self.cache[request] = reply
        return [self.cache[r] for r in requests]

    def _read(self, reply, size: int) -> list[float | None]:
        """The scores a reply gives its `size` completions; None where it gives none."""
        if self.mode == "group":
            return rank_scores(reply, size)
        if self.parse == "yes_no":
            return [reply]
        number = extract_predicted_number(reply)
        return [float(number) if number is not None else None]

    def _count(self, scores, unread) -> None:
        missing = sum(s is None for s in scores)
        self.unparsed += missing
        if missing and not self.warned:  # once a run; the metric counts every step's
            self.warned = True
            self.warn(f"mlx-grpo: warning: the judge gave no score for {missing} of {len(scores)} completions "
                      f"(e.g. it answered {_short(unread[0])}); they score None, counted as judge/unparsed")

    def take_metrics(self) -> dict[str, float]:
        """The judge's share of the step since the last call, then the counters start again."""
        out = {"time/judge": self.seconds, "judge/peak_memory_gb": self.peak / GB,
               "judge/peak_before_gb": self.before / GB, "judge/requests": float(self.requests),
               "judge/cache_hits": float(self.hits), "judge/unparsed": float(self.unparsed)}
        self._reset()
        return out


def _numbered(completions: list[str]) -> str:
    return "\n\n".join(f"[{j}] {c}" for j, c in enumerate(completions, 1))


def _short(reply) -> str:
    text = repr(reply)
    return text if len(text) <= 60 else text[:57] + "..."


def rank_scores(reply: str, size: int) -> list[float | None]:
    """A ranking "2, 3, 1" (best first) as scores: the r-th (from 0) gets 1 - r / (size - 1).
    Numbers outside 1..size and repeats are skipped; not all of 1..size named: None for all."""
    order = list(dict.fromkeys(int(x) for x in re.findall(r"\d+", reply) if 1 <= int(x) <= size))
    if len(order) != size or size < 2:
        return [None] * size
    scores = [0.0] * size
    for r, j in enumerate(order):
        scores[j - 1] = 1.0 - r / (size - 1)
    return scores
