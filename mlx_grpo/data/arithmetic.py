"""The `builtin:arithmetic` data set: one- and two-step sums in GSM8K format.

It owns the problem space, its train/test partition and the R1-format target completions
used by the built-in model's supervised warm start. Nothing here touches the network.

A question is "What is 2 + 7?" or "What is 2 + 7 - 2?"; every number in it, the result
of its first step included, is a single digit. The answer is the worked steps, one line
each, then "#### N". A held-out two-step question is a new combination of steps that the
training split holds on their own, so a policy that learns to work step by step (rather
than guess the result of the whole line at once) does better on questions it never saw.
"""

import random
import zlib

# Single digits: within its warm start, a ~1M-parameter model learns to copy them and partly
# to add them; with operands up to 20 it got under 15% of held-out answers right.
MAX_VALUE = 9
SPLITS = ("train", "test")
_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b}


def _split_of(question: str) -> str:
    # A fixed hash of the text (not Python's salted hash()) puts every question in exactly
    # one split, the same on every machine; about one question in four is held out.
    return "test" if zlib.crc32(question.encode()) % 4 == 0 else "train"


def _steps_from(value: int) -> list[tuple[str, int, int]]:
    """Every (op, operand, result) that keeps the result a single digit."""
    return [
        (op, b, fn(value, b))
        for b in range(MAX_VALUE + 1)
        for op, fn in _OPS.items()
        if 0 <= fn(value, b) <= MAX_VALUE
    ]


def _pool(split: str) -> list[tuple[str, list[str], int]]:
    """Every (question, worked steps, result) of a split."""
    pool = []
    for a in range(MAX_VALUE + 1):
        for op, b, x in _steps_from(a):
            first = f"{a} {op} {b}"
            pool.append((f"What is {first}?", [f"{first} = {x}"], x))
            for op2, c, y in _steps_from(x):
                steps = [f"{first} = {x}", f"{x} {op2} {c} = {y}"]
                pool.append((f"What is {first} {op2} {c}?", steps, y))
    return [p for p in pool if _split_of(p[0]) == split]


def make_problems(n: int, seed: int, split: str = "train") -> list[dict]:
    """`n` rows {"question", "answer"}; the answer ends in "\\n#### N" like GSM8K.

    The split's pool is shuffled by a generator seeded from (seed, split) and cycled,
    so rows are unique until `n` exceeds the pool (995 train / 325 test questions).
    """
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; known splits: {', '.join(SPLITS)}")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    pool = _pool(split)
    random.Random(f"{seed}-{split}").shuffle(pool)
    rows = []
    for i in range(n):
        question, steps, result = pool[i % len(pool)]
        rows.append({"question": question, "answer": "\n".join(steps) + f"\n#### {result}"})
    return rows


def final_answer(row: dict) -> str:
    """The number after "#### " in a GSM8K-format answer."""
    return row["answer"].rsplit("#### ", 1)[1].strip()


def format_completion(row: dict, step_by_step: bool = True) -> str:
    """An assistant text in the format the rewards check: the worked steps, or one line.

    One line writes the whole question as a single equation ("2 + 7 - 2 = 7"); for a
    one-step question both are the same.
    """
    result = final_answer(row)
    if step_by_step:
        work = row["answer"].rsplit("\n#### ", 1)[0]
    else:
        work = f"{row['question'].removeprefix('What is ').removesuffix('?')} = {result}"
    return f"<reasoning>\n{work}\n</reasoning>\n<answer>\n{result}\n</answer>"
