"""Mean reward of reference summaries vs. simple baselines on a TL;DR file, as a table.

    uv run python scripts/tldr_baselines.py [--data data/tldr_test.jsonl] [--config configs/tldr.toml]

Candidates for each post: `reference` (its own summary), `lead-3` (the post's first three
sentences, the classic extractive baseline), `other post` (the next row's summary, the last row
taking the first: fluent and well-sized but about something else), `whole post` (the post
itself). Each column is the mean of one reward over the rows; `total` is the weighted sum of the
config's rewards and `total (no ref)` the same without rouge_l (training on posts without a
summary). Rows need `post` and `summary` fields.
"""

import argparse
import json
from pathlib import Path

from mlx_grpo.config import load_config
from mlx_grpo.rewards import REWARDS
from mlx_grpo.rewards.summary import split_sentences

REPO = Path(__file__).resolve().parent.parent


def load_rows(path: Path) -> list[dict]:
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    for i, row in enumerate(rows):
        for key in ("post", "summary"):
            if not isinstance(row.get(key), str) or not row[key].strip():
                raise SystemExit(f"{path}: row {i} needs a non-empty text field {key!r}")
    return rows


def candidates(rows: list[dict]) -> dict[str, list[str]]:
    summaries = [r["summary"] for r in rows]
    return {
        "reference": summaries,
        "lead-3": [" ".join(split_sentences(r["post"])[:3]) for r in rows],
        "other post": summaries[1:] + summaries[:1],
        "whole post": [r["post"] for r in rows],
    }


def score_table(rows: list[dict], weights: dict[str, float]) -> dict[str, dict[str, float]]:
    """candidate -> {reward name: mean score, 'total': weighted, 'total (no ref)': without rouge_l}."""
    posts, refs = [r["post"] for r in rows], [r["summary"] for r in rows]
    table = {}
    for name, texts in candidates(rows).items():
        means = {k: sum(REWARDS[k](posts, texts, refs)) / len(rows) for k in weights}
        means["total"] = sum(w * means[k] for k, w in weights.items())
        means["total (no ref)"] = sum(w * means[k] for k, w in weights.items() if k != "rouge_l")
        table[name] = means
    return table


def format_table(table: dict[str, dict[str, float]]) -> str:
    columns = list(next(iter(table.values())))
    lines = ["| candidate | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for name, means in table.items():
        lines.append(f"| {name} | " + " | ".join(f"{means[c]:.3f}" for c in columns) + " |")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=REPO / "data" / "tldr_test.jsonl")
    parser.add_argument("--config", type=Path, default=REPO / "configs" / "tldr.toml",
                        help="profile whose [[rewards]] (built-in names) give the columns and weights")
    args = parser.parse_args(argv)
    weights = {r.name: r.weight for r in load_config(args.config).rewards}
    unknown = [k for k in weights if k not in REWARDS]
    if unknown:
        raise SystemExit(f"{args.config}: only built-in rewards can be tabled, not {', '.join(unknown)}")
    rows = load_rows(args.data)
    print(f"{args.data}: {len(rows)} posts; weights from {args.config}: {weights}")
    print(format_table(score_table(rows, weights)))


if __name__ == "__main__":
    main()
