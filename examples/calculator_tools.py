"""The tools task's tool and reward (configs/tools_smoke.toml, docs/tools.md): a calculator the
model may call, and a reward on the answer its last turn gives."""

import re

_ANSWER = re.compile(r"<answer>\s*(-?\d+)\s*</answer>")


def calculator(expression: str) -> str:
    """Evaluate a sum or difference of whole numbers, e.g. "347 + 586".

    Args:
        expression: Whole numbers with + or - between them.
    """
    total, sign, expect_number = 0, 1, True
    for part in expression.replace("+", " + ").replace("-", " - ").split():
        if expect_number and part.isdigit():
            total += sign * int(part)
        elif not expect_number and part in "+-":
            sign = 1 if part == "+" else -1
        else:
            raise ValueError(f"cannot read {expression!r}: expected numbers with + or - between them")
        expect_number = not expect_number
    if expect_number:
        raise ValueError(f"cannot read {expression!r}: it ends with an operator")
    return str(total)


def last_answer(messages: list[dict]) -> str | None:
    """The number in the <answer> of the episode's last model turn, or None."""
    turns = [m["content"] for m in messages if m["role"] == "assistant"]
    found = _ANSWER.search(turns[-1]) if turns else None
    return found.group(1) if found else None


def correct_answer(completions, answer, episode, **kwargs):
    """1.0 when the last turn's <answer> is the row's answer, else 0.0."""
    return [float(last_answer(e) == str(a)) for e, a in zip(episode, answer)]
