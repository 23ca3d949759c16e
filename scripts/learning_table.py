"""Does the smoke run learn on every float path? The table docs/benchmarks.md quotes.

    uv run python scripts/learning_table.py                       # 5 seeds x 4 float paths
    uv run python scripts/learning_table.py --seeds 0 --paths openblas
    uv run python scripts/learning_table.py --set training.shared_prefix=false   # any train override

For each seed and float path: `mlx-grpo train --config configs/smoke_test.toml` (seed and
output folder changed), then `mlx-grpo eval` of the base and of the trained run on the 200
held-out questions (greedy). A float path is a way MLX's CPU backend does its matmuls, which
changes every rounding and so every sampled token after a while, as Metal would:
`openblas` (OpenBLAS preloaded, its default threads), `openblas1` (OPENBLAS_NUM_THREADS=1),
`haswell` (OpenBLAS with its AVX2 kernels, OPENBLAS_CORETYPE=Haswell, on a CPU that would pick
AVX-512 ones), `reference` (mlx's own reference BLAS, nothing preloaded; Linux only). On small
matrices OpenBLAS may run one thread whatever it is told, so `openblas1` can equal `openblas`
bit for bit; the table shows it when it does.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

SMOKE = "configs/smoke_test.toml"
OPENBLAS = "/usr/lib/x86_64-linux-gnu/libopenblas.so.0"


def _env(path: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "OPENBLAS_NUM_THREADS")}
    if path != "reference":
        env["LD_PRELOAD"] = OPENBLAS
    if path == "openblas1":
        env["OPENBLAS_NUM_THREADS"] = "1"
    if path == "haswell":
        env["OPENBLAS_CORETYPE"] = "Haswell"
    return env


def _mlx_grpo(args: list[str], env: dict) -> None:
    cmd = [sys.executable, "-m", "mlx_grpo", *args]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-2000:]}")


def stepwise_share(result: dict) -> float:
    """Of the greedy answers to two-step questions, the share written as worked steps."""
    two = [s for s in result["samples"] if s["answer"].count("\n") == 2]
    return sum(s["completion"].split("</reasoning>")[0].count("\n") == 3 for s in two) / len(two)


def one_cell(seed: int, path: str, work: Path, overrides: list[str] = ()) -> dict:
    env = _env(path)
    run, before, after = work / f"{path}-{seed}", work / f"base-{path}.json", work / f"{path}-{seed}.json"
    extra = [arg for o in overrides for arg in ("--set", o)]
    start = time.perf_counter()
    _mlx_grpo(["train", "--config", SMOKE, "--set", f"seed={seed}", "--set", f'output_dir="{run}"', *extra], env)
    seconds = time.perf_counter() - start
    if not before.exists():
        _mlx_grpo(["eval", "--config", SMOKE, "--out", str(before)], env)
    _mlx_grpo(["eval", "--model", str(run), "--out", str(after)], env)
    b, a = json.loads(before.read_text()), json.loads(after.read_text())
    rewards = [json.loads(line)["reward"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {
        "seed": seed, "path": path, "train_seconds": round(seconds, 1),
        "accuracy": [b["metrics"]["accuracy"], a["metrics"]["accuracy"]],
        "stepwise": [round(stepwise_share(b), 3), round(stepwise_share(a), 3)],
        "reward": [round(float(np.mean(rewards[:10])), 3), round(float(np.mean(rewards[-10:])), 3)],
    }


def table(cells: list[dict]) -> str:
    rows = ["| seed | float path | held-out accuracy | worked steps | training reward, first 10 -> last 10 |",
            "|---|---|---|---|---|"]
    for c in cells:
        (b, a), (sb, sa), (r0, r1) = c["accuracy"], c["stepwise"], c["reward"]
        rows.append(f"| {c['seed']} | {c['path']} | {b:.3f} -> {a:.3f} ({a - b:+.3f}) | {sb:.2f} -> {sa:.2f} "
                    f"| {r0:.3f} -> {r1:.3f} ({r1 - r0:+.3f}) |")
    gains = [c["accuracy"][1] - c["accuracy"][0] for c in cells]
    rises = [c["reward"][1] - c["reward"][0] for c in cells]
    rows.append(f"\naccuracy gain: min {min(gains):+.3f}, median {np.median(gains):+.3f}, max {max(gains):+.3f}; "
                f"reward rise: min {min(rises):+.3f}, median {np.median(rises):+.3f}, max {max(rises):+.3f}")
    return "\n".join(rows)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--paths", nargs="+", default=["openblas", "openblas1", "haswell", "reference"],
                        choices=["openblas", "openblas1", "haswell", "reference"])
    parser.add_argument("--jobs", type=int, default=1, help="cells run at once")
    parser.add_argument("--json", help="write every cell to this file")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="passed to every training run (the base eval is the shipped model either way)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        # One base eval per path first, so parallel cells do not race to write it.
        for path in args.paths:
            _mlx_grpo(["eval", "--config", SMOKE, "--out", str(Path(tmp) / f"base-{path}.json")], _env(path))
        jobs = [(s, p) for p in args.paths for s in args.seeds]
        with ThreadPoolExecutor(args.jobs) as pool:
            cells = list(pool.map(lambda job: one_cell(*job, Path(tmp), args.overrides), jobs))
    for c in cells:
        print(json.dumps(c), file=sys.stderr)
    if args.json:
        Path(args.json).write_text(json.dumps(cells, indent=1) + "\n")
    print(table(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
