"""Write the worked example's data, data/steps_train.jsonl and data/steps_test.jsonl (see
data/SOURCES.md and docs/data-and-rewards.md).

    uv run python scripts/make_steps_data.py [--out data]

Each split of builtin:arithmetic gives every one-step question it has and as many two-step
ones (drawn with random.Random(0)), shuffled together with the same generator, so that half
the rows are one-step. A row holds:
- question: the prompt, e.g. "What is 2 + 7 - 2?";
- answer: the result, an integer (the built-in correctness reward compares it numerically);
- steps: how many steps the question has, 1 or 2;
- max_chars: the length of its worked answer in the R1 format, plus 5 characters.
"""

import argparse
import json
import random
from pathlib import Path

from mlx_grpo.data.arithmetic import final_answer, format_completion, make_problems

SLACK = 5  # characters allowed past the worked answer's length


def steps_rows(split: str, seed: int = 0) -> list[dict]:
    """Half one-step, half two-step questions of a split, as rows with their extra fields."""
    # make_problems cycles its shuffled pool: 4000 rows hold all of it (995 train, 325 test questions)
    problems = list({p["question"]: p for p in make_problems(4000, seed=0, split=split)}.values())
    by_steps = {1: [], 2: []}
    for p in problems:
        by_steps[p["answer"].count("\n")].append(p)
    rng = random.Random(seed)
    chosen = by_steps[1] + rng.sample(by_steps[2], len(by_steps[1]))
    rng.shuffle(chosen)
    return [{"question": p["question"], "answer": int(final_answer(p)), "steps": p["answer"].count("\n"),
             "max_chars": len(format_completion(p)) + SLACK} for p in chosen]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="data", help="folder to write into (default data)")
    out = Path(parser.parse_args().out)
    for split in ("train", "test"):
        rows = steps_rows(split)
        path = out / f"steps_{split}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        print(f"{path}: {len(rows)} rows, {sum(r['steps'] == 1 for r in rows)} one-step")


if __name__ == "__main__":
    main()
