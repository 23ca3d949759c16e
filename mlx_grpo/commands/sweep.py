"""`mlx-grpo sweep`: short runs that differ in one config value each, then a table and the
overlaid report.

`--vary grpo.beta=0,0.04,0.1` makes one variant per value. With several `--vary`, the
default is an ablation (one key changed at a time, every other key as in the profile);
`--grid` runs the full product. Each variant trains in this process (`load_config` with the
value as a `--set` override, then `train`) into `<output_dir>/sweep/<key>=<value>/`.
Every variant's config is loaded and checked before the first one starts.
"""

from dataclasses import dataclass
import itertools
import json
from pathlib import Path
import re
import sys
import time

from mlx_grpo.commands.args import add_progress_arg
from mlx_grpo.commands.report import ReportError, fmt_cell, run_summary, write_report
from mlx_grpo.config import ConfigError, load_config
from mlx_grpo.run.log import read_metrics


@dataclass
class Variant:
    name: str  # "grpo.beta=0.04" or "grpo.beta=0.04,training.learning_rate=1e-5"
    overrides: list[str]  # the `--set` items that make it


def split_values(text: str) -> list[str]:
    """Split at top-level commas, so `[1, 2],[3]` and `"a,b",c` keep their inner commas."""
    items, depth, quote, cur = [], 0, "", ""
    for ch in text:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0:
            items.append(cur.strip())
            cur = ""
            continue
        cur += ch
    items.append(cur.strip())
    return items


def parse_vary(item: str) -> tuple[str, list[str]]:
    """`section.key=v1,v2,...` -> (key, [v1, v2, ...]), each value in TOML (or bare-word) syntax."""
    key, sep, text = (part.strip() for part in item.partition("="))
    values = split_values(text) if sep else []
    if not sep or not key or not all(values):
        raise ConfigError(f"--vary {item}: expected section.key=value1,value2,... e.g. grpo.beta=0,0.04,0.1")
    if len(set(values)) != len(values):
        raise ConfigError(f"--vary {item}: a value is listed twice")
    return key, values


def make_variants(vary: list[str], grid: bool = False) -> list[Variant]:
    """One variant per value (ablation), or per combination of values (grid)."""
    axes = [parse_vary(item) for item in vary]
    if not axes:
        raise ConfigError("sweep: give at least one --vary section.key=value1,value2,...")
    keys = [k for k, _ in axes]
    if len(set(keys)) != len(keys):
        raise ConfigError(f"sweep: --vary names a key twice ({', '.join(keys)}); list its values in one --vary")
    if grid:
        combos = itertools.product(*[[(k, v) for v in values] for k, values in axes])
    else:
        combos = [[(k, v)] for k, values in axes for v in values]
    return [Variant(",".join(f"{k}={v}" for k, v in combo), [f"{k}={v}" for k, v in combo]) for combo in combos]


def folder_name(name: str) -> str:
    """The variant's name as a safe folder name (quotes, slashes and spaces become _)."""
    return re.sub(r"[^A-Za-z0-9._=,+-]", "_", name)


def plan(config: str, vary: list[str], *, steps: int | None = None, grid: bool = False,
         overrides: list[str] = ()) -> tuple[Path, list[tuple[Variant, object]]]:
    """The sweep folder and each variant's checked config; raises before any training."""
    base = list(overrides) + ([f"training.max_steps={steps}"] if steps is not None else [])
    root = Path(load_config(config, base).output_dir) / "sweep"
    planned = []
    for v in make_variants(vary, grid):
        out = root / folder_name(v.name)
        cfg = load_config(config, base + v.overrides + [f"output_dir={json.dumps(str(out))}"])
        planned.append((v, cfg))
    return root, planned


def run_sweep(config: str, vary: list[str], *, steps: int | None = None, grid: bool = False,
              overrides: list[str] = (), overwrite: bool = False, progress: bool = True) -> list[dict]:
    """Train every variant in turn; returns one result row per variant (see `results_table`).

    A variant folder that holds an earlier run stops the sweep unless `overwrite`; `progress`
    False draws no progress bar."""
    from mlx_grpo.commands.train import train

    root, planned = plan(config, vary, steps=steps, grid=grid, overrides=overrides)
    print(f"mlx-grpo sweep: {len(planned)} runs into {root}")
    results = []
    for i, (variant, cfg) in enumerate(planned, 1):
        print(f"mlx-grpo sweep: run {i}/{len(planned)}: {variant.name}")
        tic = time.perf_counter()
        train(cfg, config_path=config, overwrite=overwrite, progress=progress)
        wall = time.perf_counter() - tic
        results.append({"name": variant.name, "dir": cfg.output_dir, "wall_time_s": wall,
                        **run_summary(read_metrics(cfg.output_dir))})
    return results


def results_table(results: list[dict]) -> str:
    """The comparison as aligned text; an eval column only where eval metrics were logged."""
    eval_keys = sorted({k for r in results for k in r["eval"]})
    if "eval/reward" in eval_keys:  # the one eval number; other eval/* keys stay in the report
        eval_keys = ["eval/reward"]
    header = ["run", "final reward", "best reward (step)", *eval_keys, "kl", "wall time (s)", "peak mem (GB)"]
    rows = [header]
    for r in results:
        best = "-" if r["best_reward"] is None else f"{r['best_reward']:.3f} ({r['best_step']})"
        rows.append([r["name"], fmt_cell(r["final_reward"], ".3f"), best,
                     *[fmt_cell(r["eval"].get(k), ".3f") for k in eval_keys],
                     fmt_cell(r["kl"], ".4g"), f"{r['wall_time_s']:.1f}", fmt_cell(r["peak_memory_gb"], ".2f")])
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
             for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def add_arguments(parser):
    parser.add_argument("--config", required=True, help="TOML profile the runs start from")
    parser.add_argument("--vary", action="append", default=[], required=True, metavar="KEY=V1,V2,...",
                        help="values to try for one key, e.g. --vary grpo.beta=0,0.04,0.1 (repeatable)")
    parser.add_argument("--steps", type=int, help="training.max_steps of every run")
    parser.add_argument("--grid", action="store_true", help="every combination of the --vary values, "
                        "instead of one key at a time")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config key in every run (repeatable)")
    parser.add_argument("--overwrite", action="store_true", help="replace runs of an earlier sweep")
    add_progress_arg(parser)


def main(args):
    results = run_sweep(args.config, args.vary, steps=args.steps, grid=args.grid, overrides=args.overrides,
                        overwrite=args.overwrite, progress=args.progress)
    print(results_table(results))
    try:
        print(f"mlx-grpo sweep: wrote {write_report([r['dir'] for r in results])}")
    except ReportError as e:  # the runs are done and tabulated; only the picture is missing
        print(f"mlx-grpo sweep: no report: {e}", file=sys.stderr)
