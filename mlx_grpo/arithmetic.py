"""The `builtin:arithmetic` data set: small addition and subtraction problems in GSM8K format.

It owns the problem space, its train/test partition and the R1-format target completion
used by the built-in model's supervised warm start. Nothing here touches the network.
"""

import random
import zlib

# Single digits: within its half-minute warm start, a ~1M-parameter model learns to copy them
# and partly to add them; with operands up to 20 it got under 15% of held-out answers right.
MAX_OPERAND = 9
SPLITS = ("train", "test")


def _split_of(question: str) -> str:
    # A fixed hash of the text (not Python's salted hash()) puts every question in exactly
    # one split, the same on every machine; about one question in four is held out.
    return "test" if zlib.crc32(question.encode()) % 4 == 0 else "train"


def _pool(split: str) -> list[tuple[str, int]]:
    """Every (question, answer) of a split; subtraction keeps results non-negative."""
    pool = []
    for a in range(MAX_OPERAND + 1):
        for b in range(MAX_OPERAND + 1):
            pool.append((f"What is {a} + {b}?", a + b))
            if a >= b:
                pool.append((f"What is {a} - {b}?", a - b))
    return [(q, n) for q, n in pool if _split_of(q) == split]


def _equation(question: str) -> str:
    return question.removeprefix("What is ").removesuffix("?")


def make_problems(n: int, seed: int, split: str = "train") -> list[dict]:
    """`n` rows {"question", "answer"}; the answer ends in "\\n#### N" like GSM8K.

    The split's pool is shuffled by a generator seeded from (seed, split) and cycled,
    so rows are unique until `n` exceeds the pool (118 train / 37 test questions).
    """
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; known splits: {', '.join(SPLITS)}")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    pool = _pool(split)
    random.Random(f"{seed}-{split}").shuffle(pool)
    rows = []
    for i in range(n):
        question, result = pool[i % len(pool)]
        rows.append({"question": question, "answer": f"{_equation(question)} = {result}\n#### {result}"})
    return rows


def final_answer(row: dict) -> str:
    """The number after "#### " in a GSM8K-format answer."""
    return row["answer"].rsplit("#### ", 1)[1].strip()


def format_completion(row: dict) -> str:
    """The assistant text the warm start imitates, in the format the rewards check."""
    work = row["answer"].rsplit("\n#### ", 1)[0]
    return f"<reasoning>\n{work}\n</reasoning>\n<answer>\n{final_answer(row)}\n</answer>"
