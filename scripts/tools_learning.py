"""Learning evidence for the tools task: configs/tools_smoke.toml trained from several seeds, and
for each the tool-call rate and held-out accuracy before and after.

    uv run python scripts/tools_learning.py --seeds 0 1 2 --out /tmp/tools_learning

Per seed: training reward and tools/call_frequency, mean of the first 10 logged steps against
the last 10 (metrics.jsonl); greedy and sampled (temperature 1) accuracy and call rate on the
held-out questions (data/sums_test.jsonl, first --limit of them) of builtin:tiny-tools and of the
final checkpoint, with real calculator calls (scripts/build_tiny_tools.fingerprint). Prints a
markdown table; --json writes the numbers.
"""

import argparse
import json
import sys
import time
from pathlib import Path

import mlx_lm

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from build_tiny_tools import fingerprint  # noqa: E402
from make_sums_data import sums_rows  # noqa: E402

from mlx_grpo.commands.train import train  # noqa: E402
from mlx_grpo.config import load_config  # noqa: E402
from mlx_grpo.models.builtin import builtin_model_path  # noqa: E402
from mlx_grpo.run.log import read_metrics  # noqa: E402

PROFILE = ROOT / "configs" / "tools_smoke.toml"


def window(rows: list[dict], key: str, w: int = 10) -> tuple[float, float]:
    values = [r[key] for r in rows if isinstance(r.get(key), (int, float))]
    return sum(values[:w]) / len(values[:w]), sum(values[-w:]) / len(values[-w:])


def run_seed(seed: int, out: Path, held_out: list[dict], overrides: list[str]) -> dict:
    cfg = load_config(PROFILE, [f"seed={seed}", f"output_dir={json.dumps(str(out / f'seed{seed}'))}",
                                "logging.log_completions=0", *overrides])
    tic = time.perf_counter()
    checkpoint = train(cfg, config_path=str(PROFILE), overwrite=True, progress=False)
    seconds = time.perf_counter() - tic
    rows = read_metrics(cfg.output_dir)
    model, tokenizer = mlx_lm.load(str(checkpoint))
    return {"seed": seed, "train_seconds": round(seconds, 1), "reward": window(rows, "reward"),
            "call_frequency": window(rows, "tools/call_frequency"), "after": fingerprint(model, tokenizer, held_out)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--out", default="runs/tools_learning")
    parser.add_argument("--limit", type=int, default=200, help="held-out questions evaluated")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--json", dest="json_path")
    args = parser.parse_args(argv)
    held_out = sums_rows("test")[: args.limit]
    model, tokenizer = mlx_lm.load(str(builtin_model_path("tiny-tools")))
    before = fingerprint(model, tokenizer, held_out)
    results = [run_seed(s, Path(args.out), held_out, args.overrides) for s in args.seeds]
    lines = [f"builtin:tiny-tools before training, {len(held_out)} held-out questions: "
             f"greedy accuracy {before['greedy_accuracy']:.3f}, call rate {before['greedy_call_rate']:.3f}; "
             f"sampled accuracy {before['sampled_accuracy']:.3f}, call rate {before['sampled_call_rate']:.3f}",
             "", "| seed | train s | reward (first 10 -> last 10) | call frequency | greedy acc | greedy calls "
             "| sampled acc | sampled calls |", "|---|---|---|---|---|---|---|---|"]
    for r in results:
        a = r["after"]
        lines.append(f"| {r['seed']} | {r['train_seconds']:.0f} | {r['reward'][0]:.3f} -> {r['reward'][1]:.3f} | "
                     f"{r['call_frequency'][0]:.3f} -> {r['call_frequency'][1]:.3f} | {a['greedy_accuracy']:.3f} | "
                     f"{a['greedy_call_rate']:.3f} | {a['sampled_accuracy']:.3f} | {a['sampled_call_rate']:.3f} |")
    print("\n".join(lines))
    if args.json_path:
        Path(args.json_path).write_text(json.dumps({"before": before, "runs": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
