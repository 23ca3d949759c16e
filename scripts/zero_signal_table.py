"""Does skipping the update of a step without signal help? The measurement behind the default
of `training.skip_zero_signal_steps`.

    uv run python scripts/zero_signal_table.py                        # 1 and 2 prompts a step, seeds 0-4
    uv run python scripts/zero_signal_table.py --prompts 1 --seeds 0 1 --steps 60

The smoke profile with few prompts a step (so that whole steps without reward spread happen),
trained with the option off and on for each seed, then `mlx-grpo eval` of each run on the 200
held-out questions of builtin:arithmetic (greedy; `accuracy`, and the format, strict and
lenient readings). Everything else is the smoke profile's; the shipped base scores 0.570.
"""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

SMOKE = "configs/smoke_test.toml"


def _mlx_grpo(args: list[str]) -> None:
    done = subprocess.run([sys.executable, "-m", "mlx_grpo", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"mlx-grpo {' '.join(args)} failed:\n{done.stderr[-2000:]}")


def one_run(prompts: int, steps: int, seed: int, skip: bool, work: Path) -> dict:
    run = work / f"p{prompts}-s{seed}-{'skip' if skip else 'keep'}"
    sets = [f"seed={seed}", f'output_dir="{run}"', f"training.prompts_per_step={prompts}",
            f"training.max_steps={steps}", f"training.skip_zero_signal_steps={str(skip).lower()}",
            "checkpoint.save_every=1000000", "logging.log_completions=0"]
    _mlx_grpo(["train", "--config", SMOKE, *[x for s in sets for x in ("--set", s)]])
    out = work / f"{run.name}.json"
    _mlx_grpo(["eval", "--model", str(run), "--out", str(out)])
    m = json.loads(out.read_text())["metrics"]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {"prompts": prompts, "steps": steps, "seed": seed, "skip": skip,
            "flat_steps": sum(r["frac_reward_zero_std"] == 1.0 for r in rows),
            "accuracy": m["accuracy"], "format": m.get("accuracy_format"), "strict": m.get("accuracy_strict"),
            "lenient": m.get("accuracy_lenient")}


def table(cells: list[dict]) -> str:
    rows = ["| prompts/step | seed | steps without signal | held-out accuracy, skip off | skip on | on - off |",
            "|---|---|---|---|---|---|"]
    pairs = {}
    for c in cells:
        pairs.setdefault((c["prompts"], c["seed"]), {})[c["skip"]] = c
    diffs = {}
    for (p, seed), pair in sorted(pairs.items()):
        off, on = pair[False], pair[True]
        d = on["accuracy"] - off["accuracy"]
        diffs.setdefault(p, []).append(d)
        rows.append(f"| {p} | {seed} | {off['flat_steps']} of {off['steps']} | {off['accuracy']:.3f} "
                    f"| {on['accuracy']:.3f} | {d:+.3f} |")
    for p, ds in sorted(diffs.items()):
        rows.append(f"\n{p} prompt(s) a step: on - off mean {np.mean(ds):+.3f}, min {min(ds):+.3f}, max {max(ds):+.3f}")
    return "\n".join(rows)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--json", help="write every run to this file")
    args = parser.parse_args(argv)
    cells = []
    with tempfile.TemporaryDirectory() as tmp:
        for p in args.prompts:
            for seed in args.seeds:
                for skip in (False, True):
                    cells.append(one_run(p, args.steps, seed, skip, Path(tmp)))
                    print(json.dumps(cells[-1]), file=sys.stderr, flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(cells, indent=1) + "\n")
    print(table(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
