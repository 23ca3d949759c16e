"""Write the small real-data samples shipped in data/ (see data/SOURCES.md).

    uv run python scripts/sample_data.py SOURCE_DIR [--out data] [--rows 200] [--seed 0]

SOURCE_DIR holds the four source files named in SAMPLES: GSM8K's train and test sets (MIT)
and the Reddit TL;DR validation and test splits (CC-BY-4.0). Each source gives one shipped
file, a training file and a held-out file per task that share no row: the TL;DR training
sample comes from the validation split (no train split is at hand) and its test sample from
the test split. From each source, `--rows` line numbers are drawn with
random.Random(seed).sample, sorted, and those lines are copied byte for byte (never
re-encoded), so every shipped row is identical to a source row and the sample is the same on
every run.
"""

import argparse
import hashlib
import random
from pathlib import Path

SAMPLES = {  # source file -> shipped file
    "gsm8k_train.jsonl": "gsm8k_train.jsonl",
    "gsm8k_test.jsonl": "gsm8k_test.jsonl",
    "tldr_validation.jsonl": "tldr_train.jsonl",
    "tldr_test.jsonl": "tldr_test.jsonl",
}


def sample_lines(lines: list[bytes], rows: int, seed: int) -> list[bytes]:
    """`rows` of the lines, drawn with a seeded RNG and kept in source order."""
    if rows > len(lines):
        raise SystemExit(f"--rows {rows} is more than the {len(lines)} rows of the source")
    return [lines[i] for i in sorted(random.Random(seed).sample(range(len(lines)), rows))]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("source_dir", type=Path)
    parser.add_argument("--out", type=Path, default=Path("data"))
    parser.add_argument("--rows", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for src_name, out_name in SAMPLES.items():
        src = args.source_dir / src_name
        if not src.is_file():
            raise SystemExit(f"{src}: not found (expected the {src_name} described in data/SOURCES.md)")
        # Split on b"\n" only (JSON Lines): each row keeps its exact bytes plus its newline.
        lines = [ln + b"\n" for ln in src.read_bytes().split(b"\n") if ln.strip()]
        chosen = sample_lines(lines, args.rows, args.seed)
        dst = args.out / out_name
        dst.write_bytes(b"".join(chosen))
        print(f"{dst}: {len(chosen)} of {len(lines)} rows, sha1 {hashlib.sha1(dst.read_bytes()).hexdigest()}")


if __name__ == "__main__":
    main()
