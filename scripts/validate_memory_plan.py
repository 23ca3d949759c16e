"""The memory planner (mlx_grpo/planner/) against real runs: predicted peak vs the
`peak_memory_gb` that metrics.jsonl records, per config.

    uv run python scripts/validate_memory_plan.py            # tiny and small
    uv run python scripts/validate_memory_plan.py tiny       # the cheap ones (as the test)
    uv run python scripts/validate_memory_plan.py tiny small --save runs.json
    uv run python scripts/validate_memory_plan.py --replan runs.json  # saved runs, today's planner
    uv run python scripts/validate_memory_plan.py --real --save real.json  # real shapes (slow: an hour)

--save keeps each run's measured peak and reached lengths; --replan predicts them again (the
measured peaks do not depend on the planner, so a changed constant needs no new trainings).

Each config runs on both update paths: training.shared_prefix=false (every row holds its prompt,
the update the constants were fitted on) and true (each group's prompt once, the default). Each
config trains 2 steps of 4 prompts x G 4 in its own process. `--real` runs shape:qwen2.5-0.5b and
shape:qwen3-0.6b at their published shapes (random weights), LoRA r16 and full, float32 and
bfloat16, on the default shared-prefix path: 2 prompts x G 4 with up to 64 new tokens in float32,
1 x 4 with up to 32 in bfloat16 (which trains about 6x slower on the CPU backend); with random
weights every completion runs to the limit. The plan is made for the
lengths the run reached (data.max_prompt_tokens = the longest prompt of the data, and
generation.max_new_tokens = the longest completion sampled), since the planner predicts the
longest shapes a run can see and a 2-step run may stop short of them.
"""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

BASE = ["training.max_steps=2", "training.prompts_per_step=4", "generation.num_generations=4",
        "generation.max_new_tokens=32", "checkpoint.save_every=1000", "logging.log_completions=0"]
PATHS = ("false", "true")  # training.shared_prefix
LONG_SYSTEM = 'data.system_prompt="' + " ".join(["What is 2 + 7 - 3? 2 + 7 = 9 and 9 - 3 = 6."] * 12) + '"'
CONFIGS = {  # name: --set items
    "full": [],
    "full, beta 0.04 (frozen reference)": ["grpo.beta=0.04"],
    "full, grad_checkpoint": ["training.grad_checkpoint=true"],
    "full, micro_batch_size 4": ["training.micro_batch_size=4"],
    "LoRA r8": ["lora.enabled=true"],
    "LoRA r8, grad_checkpoint": ["lora.enabled=true", "training.grad_checkpoint=true"],
    "QLoRA 4-bit": ["lora.enabled=true", "model.quantize_bits=4"],
    "full, long prompts (333 tokens)": [LONG_SYSTEM, "data.max_prompt_tokens=1024"],
    "LoRA, long prompts, grad_checkpoint": [LONG_SYSTEM, "data.max_prompt_tokens=1024", "lora.enabled=true",
                                            "training.grad_checkpoint=true"],
}


REAL_MODELS = ["shape:qwen2.5-0.5b", "shape:qwen3-0.6b"]
_F32, _BF16 = ["model.dtype=float32", "training.prompts_per_step=2", "generation.max_new_tokens=64"], [
    "model.dtype=bfloat16", "training.prompts_per_step=1", "generation.max_new_tokens=32"]
_LORA = ["lora.enabled=true", "lora.rank=16", "lora.alpha=32"]
REAL_CONFIGS = {
    "LoRA r16, float32": [*_LORA, *_F32],
    "full, float32": _F32,
    "LoRA r16, bfloat16": [*_LORA, *_BF16],
    "full, bfloat16": _BF16,
}


def _model_path(model: str) -> str:
    return model if model.startswith("shape:") else f"builtin:{model}"


def measured(model: str, sets: list[str], out: Path) -> tuple[float, int]:
    """(peak_memory_gb over the steps, longest completion) of a real run."""
    cmd = [sys.executable, "-m", "mlx_grpo", "train", "--config", "configs/smoke_test.toml", "--ignore-memory",
           "--overwrite", "--set", f'output_dir="{out}"', "--set", f'model.path="{_model_path(model)}"']
    for s in BASE + sets:
        cmd += ["--set", s]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return max(r["peak_memory_gb"] for r in rows), int(max(r["completions/max_length"] for r in rows))


def predicted(model: str, sets: list[str], longest_completion: int) -> float:
    from mlx_grpo.commands.plan import plan
    from mlx_grpo.config import load_config
    from mlx_grpo.data.examples import load_examples
    from mlx_grpo.models.load import resolve_model_path
    from mlx_lm.utils import load_tokenizer

    overrides = [f'model.path="{_model_path(model)}"', *BASE, *sets]
    cfg = load_config("configs/smoke_test.toml", overrides)
    tokenizer = load_tokenizer(Path(resolve_model_path(cfg.model.path)))
    longest_prompt = max(len(e.prompt_tokens) for e in load_examples(cfg.data, tokenizer))
    cfg.data.max_prompt_tokens, cfg.generation.max_new_tokens = longest_prompt, longest_completion
    return plan(cfg)["peak_gb"]


def table(models: list[str], configs: dict = CONFIGS, paths=PATHS, jobs: int = 1) -> list[dict]:
    """Each config on each path, trained and planned; `jobs` runs train side by side (each in its
    own process, so each measures only its own peak)."""
    from concurrent.futures import ThreadPoolExecutor

    runs = [(model, i, name, [*sets, f"training.shared_prefix={shared}"], shared == "true")
            for model in models for i, (name, sets) in enumerate(configs.items()) for shared in paths]
    name_of = {model: model.replace(":", "-") for model in models}
    rows = []
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(jobs) as pool:
        results = pool.map(lambda r: measured(r[0], r[3], Path(tmp) / f"{name_of[r[0]]}{r[1]}{r[4]}"), runs)
        for (model, _, name, run_sets, shared), (peak, longest) in zip(runs, results):
            rows.append(_row(model, name, shared, predicted(model, run_sets, longest), peak, longest))
    return rows


def _row(model: str, config: str, shared: bool, pred: float, peak: float, longest: int) -> dict:
    print(f"| {_model_path(model)} | {config} | {str(shared).lower()} | {pred:.3f} | {peak:.3f} | "
          f"{100 * (pred / peak - 1):+.1f}% |", flush=True)
    return {"model": model, "config": config, "shared_prefix": shared, "predicted_gb": pred, "measured_gb": peak,
            "error": pred / peak - 1, "longest_completion": longest}


def replan(saved: list[dict]) -> list[dict]:
    """The saved runs' measured peaks against the planner as it is now."""
    rows = []
    for r in saved:
        sets = [*{**CONFIGS, **REAL_CONFIGS}[r["config"]], f"training.shared_prefix={str(r['shared_prefix']).lower()}"]
        pred = predicted(r["model"], sets, r["longest_completion"])
        rows.append(_row(r["model"], r["config"], r["shared_prefix"], pred, r["measured_gb"], r["longest_completion"]))
    return rows


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("models", nargs="*", metavar="MODEL", help="builtin models to run (tiny, small; default both)")
    p.add_argument("--save", metavar="FILE", help="keep each run's measured peak and reached lengths as JSON")
    p.add_argument("--replan", metavar="FILE", help="predict the runs saved in FILE again; no training")
    p.add_argument("--real", action="store_true", help="the real shapes (shape:qwen2.5-0.5b, shape:qwen3-0.6b) instead")
    args = p.parse_args(argv)
    if bad := [m for m in args.models if m not in ("tiny", "small")]:
        p.error(f"unknown model {bad[0]!r}: give tiny or small")
    args.models = args.models or ["tiny", "small"]
    return args


if __name__ == "__main__":
    args = parse_args()
    print("| model | config | shared_prefix | predicted GB | measured GB | error |\n|---|---|---|---|---|---|")
    if args.replan:
        rows = replan(json.loads(Path(args.replan).read_text()))
    elif args.real:
        rows = table(REAL_MODELS, REAL_CONFIGS, paths=("true",))
    else:
        rows = table(args.models)
    if args.save:
        Path(args.save).write_text(json.dumps(rows, indent=1))
