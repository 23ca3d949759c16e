"""Make the tools task's data (configs/tools_smoke.toml): sums of two 3-digit numbers, which
builtin:tiny-tools cannot do in its head and its calculator tool can.

    uv run python scripts/make_sums_data.py     # rewrites data/sums_train.jsonl, data/sums_test.jsonl

Each row is {"question": "What is 347 + 586?", "answer": 933}. A fixed hash of the question puts
about one in ten in the test split; the rows are the first of a seeded shuffle, the same bytes on
every machine (tests/test_tools_task.py checks the shipped files against this script).
"""

import argparse
import json
import random
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SIZES = {"train": 2000, "test": 200}


def sums_rows(split: str) -> list[dict]:
    rng = random.Random(f"sums-{split}")
    rows, seen = [], set()
    while len(rows) < SIZES[split]:
        a, b = rng.randint(100, 999), rng.randint(100, 999)
        question = f"What is {a} + {b}?"
        if question in seen or ("test" if zlib.crc32(question.encode()) % 10 == 0 else "train") != split:
            continue
        seen.add(question)
        rows.append({"question": question, "answer": a + b})
    return rows


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    for split in SIZES:
        path = ROOT / "data" / f"sums_{split}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in sums_rows(split)))
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
