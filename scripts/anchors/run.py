"""Seconds per GRPO step of mlx-grpo and of other trainers on the same model, side by side.

Every tool trains builtin:tiny (or builtin:small) from the same local Qwen2 folder at the
same shapes: P = 2 prompts x G = 8 completions, at most 64 new tokens, full fine-tune,
float32, KL coefficient beta = 0.04 (so each keeps a reference model), on the same prompts
(builtin:arithmetic's training split, written to a .jsonl with mlx-grpo's system prompt).
The tools run interleaved, one process each (A B C D, A B C D, ...), and the table gives for
each the median over rounds of its per-run median, with the load average before and after
every run. Each tool's step is what its own training loop does per step; the drivers say
what their clock covers and what they exclude (model load, the first --warmup steps).

mlx-grpo itself runs `mlx-grpo bench --set grpo.beta=0.04` (the trainer's own step, after a
warm-up step) in this checkout and, with --before DIR, in another checkout (an older commit,
with its own .venv); each bench also measures MLX's plain limit on the same shapes.
`--bench-default` adds the bench at its own defaults (beta 0) for both checkouts.

The other tools need their own virtual environments (not this project's), for example:

    uv venv /tmp/anch-lora && uv pip install --python /tmp/anch-lora "mlx-lm-lora==5.10.2" "mlx[cpu]"
    uv venv /tmp/anch-trl && uv pip install --python /tmp/anch-trl "trl==1.16.*" torch peft  # peft: --lora-rank
    uv venv /tmp/anch-mlxgrpo && uv pip install --python /tmp/anch-mlxgrpo \\
        "mlx[cpu]==0.29.3" "mlx-lm==0.28.3" "transformers==4.57.1" "datasets==4.2.0"
    # MLX-GRPO (GitHub repository Doriandarko/MLX-GRPO) is a script, not a package: unpack the
    # repository anywhere and pass its mlx-grpo.py with --mlxgrpo-source. The pins above
    # are its uv.lock's.
    uv venv /tmp/anch-unsloth && uv pip install --python /tmp/anch-unsloth --no-deps \\
        "unsloth==2026.10.9" "unsloth_zoo==2026.10.9"
    uv pip install --python /tmp/anch-unsloth "mlx[cpu]==0.32.4" "mlx-lm==0.32.2" \\
        "transformers==5.17.0" "datasets==4.8.5"
    # Unsloth's MLX GRPO (unsloth_zoo's MLXGRPOTrainer): no torch; its Mac-only import is
    # answered as on a Mac while it imports (see unsloth_driver.py). These are its pins
    # for Apple Silicon (mlx, mlx-lm) and its bounds (transformers, datasets).

then, from this repository's root:

    uv run python scripts/anchors/run.py --size tiny --rounds 3 --steps 3 \\
        --before ../before-checkout --lora-venv /tmp/anch-lora --trl-venv /tmp/anch-trl \\
        --mlxgrpo-venv /tmp/anch-mlxgrpo --mlxgrpo-source /tmp/mlx-grpo-anchor/mlx-grpo.py \\
        --unsloth-venv /tmp/anch-unsloth --json anchors-tiny.json

and `--combine anchors-tiny.json anchors-small.json` prints one table of both sizes. At a real
shape with LoRA: `--size shape:qwen2.5-0.5b --lora-rank 8 --max-new-tokens 128` (each tool trains
its own LoRA: mlx-grpo's, TRL's and Unsloth's on every linear layer, mlx-lm-lora's on its default
layers).
A tool whose flag is missing is left out. Not part of the test suite: it needs the other
environments, and timings depend on the machine and its load.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
RESULT = "ANCHOR_RESULT "


def loadavg() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def write_prompts(path: Path) -> int:
    """builtin:arithmetic's training rows with mlx-grpo's system prompt; the answer is the final number."""
    from mlx_grpo.config.sections import DEFAULT_SYSTEM_PROMPT
    from mlx_grpo.data.arithmetic import final_answer
    from mlx_grpo.data.load import load_rows

    rows = load_rows("builtin:arithmetic", split="train")
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps({"question": r["question"], "answer": final_answer(r),
                                "answer_text": r["answer"], "system": DEFAULT_SYSTEM_PROMPT}) + "\n")
    return len(rows)


def model_folder(spec: str) -> str:
    """A local folder for every tool: a built-in size, shape:NAME (built into the cache), or a folder."""
    from mlx_grpo.models.builtin import builtin_model_path
    from mlx_grpo.models.shapes import shape_model_path

    if spec.startswith("shape:"):
        return str(shape_model_path(spec.removeprefix("shape:")))
    return str(builtin_model_path(spec)) if spec in ("tiny", "small") else spec


def commit_of(checkout: Path) -> str:
    out = subprocess.run(["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return out.stdout.strip() or "?"


def bench_tool(name: str, checkout: Path, model: str, steps: int, beta: float | None, new: int = 64, rank: int = 0):
    python = sys.executable if checkout == ROOT else str(checkout / ".venv" / "bin" / "python")

    def command(out: Path) -> list[str]:
        cmd = [python, "-m", "mlx_grpo", "bench", "--model", model, "--steps", str(steps), "--json", str(out),
               "--max-new-tokens", str(new)]
        lora = ["--set", "lora.enabled=true", "--set", f"lora.rank={rank}"] if rank else []
        return cmd + lora + (["--set", f"grpo.beta={beta}"] if beta is not None else [])

    return {"name": name, "kind": "bench", "command": command, "cwd": str(checkout), "env": {}}


def driver_tool(name: str, venv: str, script: str, extra: list[str], env: dict | None = None):
    def command(out: Path) -> list[str]:
        return [str(Path(venv) / "bin" / "python"), str(HERE / script), *extra]

    return {"name": name, "kind": "driver", "command": command, "cwd": str(HERE), "env": env or {}}


def installed(checkout: Path, dist: str) -> str:
    """The version of `dist` in the checkout's .venv (this process's own for this checkout)."""
    found = sorted(checkout.glob(f".venv/lib/python*/site-packages/{dist}-*.dist-info"))
    return found[-1].name[len(dist) + 1:-len(".dist-info")] if found else "?"


def parse_bench(path: Path, p: int, g: int, checkout: Path) -> dict:
    r = json.loads(path.read_text())
    steps = [row["step"]["total_s"] for row in r["per_step"]]
    limits = [row["limit"]["total_s"] for row in r["per_step"]]
    return {"step_s": steps, "median_s": statistics.median(steps), "limit_s": limits,
            "limit_median_s": statistics.median(limits), "step_over_limit": r["step_over_limit"],
            "mean_completion_tokens": r["step"]["completion_tokens"] / (p * g), "beta": r["beta"],
            "parts": {k: r["step"][k] for k in ("rollout_s", "rewards_s", "reference_s", "update_s")},
            "limit_parts": {k: r["limit"][k] for k in ("generation_s", "forward_backward_s")},
            "update_memory_over_forward_backward": r["update_memory_over_forward_backward"],
            "peak_memory_gb": r["peak_memory_gb"],
            "version": f"commit {commit_of(checkout)}", "mlx": installed(checkout, "mlx"),
            "mlx_lm": installed(checkout, "mlx_lm"),
            "covers": "bench step: rollout, rewards, reference pass, update (AdamW); after 1 warm-up step",
            "excluded": "model load, 1 warm-up step; the limit is measured between steps, outside the step's clock"}


def run_once(tool: dict, timeout: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "bench.json"
        env = {**os.environ, **tool["env"]}
        before = loadavg()
        tic = time.perf_counter()
        try:
            proc = subprocess.run(tool["command"](out), cwd=tool["cwd"], env=env, capture_output=True, text=True,
                                  timeout=timeout)
        except subprocess.TimeoutExpired:  # a lower bound is a result: say it, and go on to the next tool
            return {"tool": tool["name"], "loadavg_before": before, "loadavg_after": loadavg(), "returncode": -1,
                    "wall_s": timeout, "error": f"timed out after {timeout:.0f} s (--timeout)"}
        wall = time.perf_counter() - tic
        after = loadavg()
        rec = {"tool": tool["name"], "loadavg_before": before, "loadavg_after": after, "wall_s": wall,
               "returncode": proc.returncode}
        if proc.returncode != 0:
            rec["error"] = (proc.stdout + proc.stderr)[-3000:]
            return rec
        if tool["kind"] == "bench":
            rec.update(parse_bench(out, tool["p"], tool["g"], Path(tool["cwd"])))
        else:
            lines = [l for l in proc.stdout.splitlines() if l.startswith(RESULT)]
            if not lines:
                rec["error"] = "no result line: " + (proc.stdout + proc.stderr)[-3000:]
                rec["returncode"] = -1
                return rec
            rec.update(json.loads(lines[-1][len(RESULT):]))
            rec["tool"] = tool["name"]
    return rec


def table(runs: list[dict]) -> str:
    ok = [r for r in runs if r.get("returncode") == 0]
    names = list(dict.fromkeys(r["tool"] for r in runs))
    limits = [r["limit_median_s"] for r in ok if "limit_median_s" in r and r.get("beta", 0) > 0]
    limit = statistics.median(limits) if limits else None
    lines = ["| tool | s/step (median of runs) | runs' medians | / limit | tokens per completion | load avg (1 min) before-after |",
             "|---|---|---|---|---|---|"]
    for name in names:
        mine = [r for r in ok if r["tool"] == name]
        if not mine:
            err = next(r for r in runs if r["tool"] == name).get("error", "")[-200:].replace("\n", " ").replace("|", "/")
            lines.append(f"| {name} | failed | {err} | | | |")
            continue
        med = statistics.median(r["median_s"] for r in mine)
        each = ", ".join(f"{r['median_s']:.2f}" for r in mine)
        ratio = f"{med / limit:.2f}" if limit else ""
        toks = [r["mean_completion_tokens"] for r in mine if "mean_completion_tokens" in r]
        tok = f"{statistics.mean(toks):.1f}" if toks else "?"
        loads = [r["loadavg_before"][0] for r in mine] + [r["loadavg_after"][0] for r in mine]
        lines.append(f"| {name} | {med:.2f} | {each} | {ratio} | {tok} | {min(loads):.2f}-{max(loads):.2f} |")
    notes = []
    for name in names:
        r = next((r for r in ok if r["tool"] == name), None)
        if r:
            vers = ", ".join(f"{k} {r[k]}" for k in ("mlx", "mlx_lm", "torch", "transformers") if k in r)
            notes.append(f"- {name}: {r.get('version', '')}{'; ' + vers if vers else ''}. Step: {r['covers']}. "
                         f"Excluded: {r['excluded']}.{' Tokens: ' + r['tokens_note'] + '.' if 'tokens_note' in r else ''}")
    if limit:
        lines.append(f"| MLX's plain limit (BatchGenerator + one padded fwd+bwd; from the beta>0 bench runs) "
                     f"| {limit:.2f} | {', '.join(f'{x:.2f}' for x in limits)} | 1.00 | | |")
    return "\n".join(lines + [""] + notes)


def medians(runs: list[dict]) -> tuple[dict, float | None]:
    """{tool: median over its runs of the run's median s/step}, and the limit's median."""
    ok = [r for r in runs if r.get("returncode") == 0]
    out = {}
    for r in ok:
        out.setdefault(r["tool"], []).append(r["median_s"])
    limits = [r["limit_median_s"] for r in ok if "limit_median_s" in r and r.get("beta", 0) > 0]
    return {k: statistics.median(v) for k, v in out.items()}, (statistics.median(limits) if limits else None)


def combined(paths: list[str]) -> str:
    """One row per tool, two columns (s/step, / limit) per JSON file written by --json."""
    sizes, cols = [], []
    for p in paths:
        d = json.loads(Path(p).read_text())
        sizes.append(d["size"])
        cols.append(medians(d["runs"]))
    names = list(dict.fromkeys(n for m, _ in cols for n in m))
    head = "| s/step (/ limit) | " + " | ".join(sizes) + " |"
    lines = [head, "|---|" + "---|" * len(sizes)]
    for n in names:
        cells = []
        for m, lim in cols:
            cells.append(f"{m[n]:.2f}" + (f" ({m[n] / lim:.2f})" if lim else "") if n in m else "—")
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    lines.append("| MLX's plain limit | " + " | ".join(f"{lim:.2f}" if lim else "—" for _, lim in cols) + " |")
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="tiny", help="tiny, small, shape:NAME or a local model folder")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--lora-rank", type=int, default=0, help="LoRA on every linear layer; 0 = full fine-tune")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=3, help="measured steps per run (after --warmup)")
    ap.add_argument("--warmup", type=int, default=1, help="unmeasured first steps of each driver run")
    ap.add_argument("--beta", type=float, default=0.04)
    ap.add_argument("--before", type=Path, help="another mlx-grpo checkout (with .venv) to bench too")
    ap.add_argument("--bench-default", action="store_true", help="also the bench at its defaults (beta 0)")
    ap.add_argument("--lora-venv")
    ap.add_argument("--trl-venv")
    ap.add_argument("--trl-threads", default="1", help="torch threads, comma-separated runs, e.g. 1,2")
    ap.add_argument("--mlxgrpo-venv")
    ap.add_argument("--mlxgrpo-source", help="MLX-GRPO's mlx-grpo.py")
    ap.add_argument("--mlxgrpo-steps", type=int, help="measured steps of MLX-GRPO runs (default --steps)")
    ap.add_argument("--mlxgrpo-warmup", type=int, help="unmeasured first steps of MLX-GRPO runs (default --warmup)")
    ap.add_argument("--mlxgrpo-rounds", type=int, help="run MLX-GRPO in the first N rounds only (default all)")
    ap.add_argument("--mlxgrpo-no-nudge", action="store_true",
                    help="also MLX-GRPO without its '<reasoning>' prompt suffix (see mlxgrpo_driver.py)")
    ap.add_argument("--unsloth-venv", help="a venv with unsloth and unsloth_zoo (MLX), see above")
    ap.add_argument("--unsloth-grad-checkpoint", default="on",
                    help="Unsloth's gradient checkpointing: on (its default), off, or on,off for both runs")
    ap.add_argument("--only", action="append", help="a tool name to keep (repeatable; names hold commas)")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per run")
    ap.add_argument("--workdir", default=str(Path(tempfile.gettempdir()) / "anchors-work"))
    ap.add_argument("--json", dest="json_path")
    ap.add_argument("--combine", nargs="+", metavar="JSON", help="print one table from earlier --json files and stop")
    a = ap.parse_args(argv)
    if a.combine:
        print(combined(a.combine))
        return

    work = Path(a.workdir)
    work.mkdir(parents=True, exist_ok=True)
    data = work / "prompts.jsonl"
    n = write_prompts(data)
    model = model_folder(a.size)
    p, g, new = 2, 8, a.max_new_tokens
    common = ["--model", model, "--data", str(data), "--prompts", str(p), "--generations", str(g),
              "--max-new-tokens", str(new), "--beta", str(a.beta), "--steps", str(a.steps),
              "--warmup", str(a.warmup), "--workdir", str(work), "--lora-rank", str(a.lora_rank)]
    here = f"mlx-grpo {commit_of(ROOT)}"
    before = f"mlx-grpo {commit_of(a.before)}" if a.before else ""
    tools = [bench_tool(here, ROOT, model, a.steps, a.beta, new, a.lora_rank)]
    if a.before:
        tools.append(bench_tool(before, a.before.resolve(), model, a.steps, a.beta, new, a.lora_rank))
    if a.bench_default:
        tools.append(bench_tool(f"{here}, bench defaults (beta 0)", ROOT, model, a.steps, None, new, a.lora_rank))
        if a.before:
            tools.append(bench_tool(f"{before}, bench defaults (beta 0)", a.before.resolve(), model, a.steps, None, new, a.lora_rank))
    if a.lora_venv:
        tools.append(driver_tool("mlx-lm-lora", a.lora_venv, "lora_driver.py", common))
    if a.trl_venv:
        for t in a.trl_threads.split(","):
            tools.append(driver_tool(f"TRL, torch {t} thread(s)", a.trl_venv, "trl_driver.py",
                                     [*common, "--threads", t], {"OMP_NUM_THREADS": t, "MKL_NUM_THREADS": t}))
    if a.mlxgrpo_venv and a.mlxgrpo_source:
        mine = [*common, "--source", a.mlxgrpo_source]
        for flag, value in (("--steps", a.mlxgrpo_steps), ("--warmup", a.mlxgrpo_warmup)):
            if value is not None:
                mine[mine.index(flag) + 1] = str(value)
        for name, extra in [("MLX-GRPO", [])] + [("MLX-GRPO, no <reasoning> nudge", ["--no-nudge"])] * a.mlxgrpo_no_nudge:
            tools.append(driver_tool(name, a.mlxgrpo_venv, "mlxgrpo_driver.py", [*mine, *extra]))
            tools[-1]["rounds"] = a.mlxgrpo_rounds
    if a.unsloth_venv:
        for gc in a.unsloth_grad_checkpoint.split(","):
            if gc not in ("on", "off"):
                ap.error(f"--unsloth-grad-checkpoint: {gc!r} is not on or off")
            off = gc == "off"
            tools.append(driver_tool("Unsloth MLX GRPO" + (", no grad checkpoint" if off else ""), a.unsloth_venv,
                                     "unsloth_driver.py", [*common, *["--no-grad-checkpoint"] * off]))
    if a.only:
        keep = set(a.only)
        tools = [t for t in tools if t["name"] in keep]
    for t in tools:
        t["p"], t["g"] = p, g

    print(f"{model}: {n} prompts; tools in order: {', '.join(t['name'] for t in tools)}", file=sys.stderr)
    runs = []
    for rnd in range(a.rounds):
        for t in tools:
            if t.get("rounds") is not None and rnd >= t["rounds"]:
                continue
            rec = run_once(t, a.timeout)
            rec["round"] = rnd
            runs.append(rec)
            what = f"{rec['median_s']:.2f} s/step" if rec.get("returncode") == 0 else f"FAILED: {rec.get('error', '')[-400:]}"
            print(f"round {rnd + 1}/{a.rounds} {t['name']}: {what}; load {rec['loadavg_before'][0]:.2f} -> "
                  f"{rec['loadavg_after'][0]:.2f}; wall {rec['wall_s']:.0f} s", file=sys.stderr, flush=True)
            if a.json_path:
                Path(a.json_path).write_text(json.dumps({"size": a.size, "model": model, "runs": runs}, indent=1) + "\n")
    kind = f"LoRA rank {a.lora_rank}" if a.lora_rank else "full fine-tune"
    print(f"{a.size} ({model}), P={p} G={g}, {new} new tokens, {kind}, float32, beta {a.beta}; "
          f"{a.rounds} interleaved round(s), {a.steps} measured steps per run")
    print(table(runs))


if __name__ == "__main__":
    main()
