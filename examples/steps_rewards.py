"""The worked example's rewards (configs/steps.toml), written as TRL's documentation writes
reward functions: keywords, one score per completion, None where a row is not theirs to score.
Each reads a field of the data (scripts/make_steps_data.py) that the project knows nothing of."""

import re

_REASONING = re.compile(r"<reasoning>(.*?)</reasoning>", re.DOTALL)


def shows_each_step(completions, steps, **kwargs):
    """A two-step question: 1.0 when the reasoning writes each step on a line of its own (two
    lines with an "="), else 0.0. A one-step question has nothing to show: None."""
    scores = []
    for completion, n in zip(completions, steps):
        if n < 2:
            scores.append(None)
            continue
        found = _REASONING.search(completion)
        lines = [line for line in (found.group(1) if found else "").splitlines() if "=" in line]
        scores.append(1.0 if len(lines) == n else 0.0)
    return scores


def within_budget(completions, max_chars, **kwargs):
    """1.0 when the completion is at most its row's max_chars long, less by the share it runs over."""
    return [max(0.0, 1.0 - max(0, len(c) - limit) / limit) for c, limit in zip(completions, max_chars)]
