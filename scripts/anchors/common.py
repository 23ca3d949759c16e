"""What every anchor driver shares: its flags, the prompts file, the result line. Stdlib only,
since each driver runs in its own tool's virtual environment (see run.py)."""

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

RESULT = "ANCHOR_RESULT "  # run.py reads the one stdout line that starts with this


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--model", required=True, help="local Hugging Face-format Qwen2 folder")
    p.add_argument("--data", required=True, help="prompts .jsonl written by run.py (question, answer, system)")
    p.add_argument("--prompts", type=int, default=2, help="P, prompts per step")
    p.add_argument("--generations", type=int, default=8, help="G, completions per prompt")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--beta", type=float, default=0.04, help="KL coefficient (a reference model)")
    p.add_argument("--lora-rank", type=int, default=0, help="LoRA rank on every linear layer; 0 = full fine-tune")
    p.add_argument("--steps", type=int, default=3, help="measured steps")
    p.add_argument("--warmup", type=int, default=1, help="steps run first and not measured")
    p.add_argument("--workdir", default="/tmp/anchors-work", help="scratch folder for outputs the tools write")
    return p


def linked_model(src: str, dst: Path, edits: dict[str, dict]) -> Path:
    """A scratch model folder: links to `src`'s files, but each JSON file named in `edits`
    (e.g. config.json) rewritten with those keys set. The weights stay the same bytes."""
    dst = Path(dst)
    dst.mkdir(parents=True)
    for f in Path(src).iterdir():
        if f.name in edits:
            d = json.loads(f.read_text())
            d.update(edits[f.name])
            (dst / f.name).write_text(json.dumps(d, indent=1))
        else:
            (dst / f.name).symlink_to(f.resolve())
    return dst


def read_rows(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def chat_rows(path: str) -> list[dict]:
    """The prompts file as TRL-style rows: a system and a user message, and the answer."""
    return [{"prompt": [{"role": "system", "content": r["system"]}, {"role": "user", "content": r["question"]}],
             "answer": r["answer"]} for r in read_rows(path)]


def report(tool: str, version: str, seconds: list[float], warmup: int, covers: str,
           completion_tokens: list[float] | None = None, **extra) -> None:
    """Print the result line: the measured steps' seconds (warm-up steps dropped) and their median."""
    measured = seconds[warmup:]
    if not measured:
        sys.exit(f"{tool}: no measured steps (got {len(seconds)} steps, warm-up {warmup})")
    out = {"tool": tool, "version": version, "step_s": measured, "median_s": statistics.median(measured),
           "warmup_s": seconds[:warmup], "covers": covers, "pid": os.getpid(), **extra}
    if completion_tokens:
        out["mean_completion_tokens"] = statistics.mean(completion_tokens[warmup:] or completion_tokens)
    print(RESULT + json.dumps(out), flush=True)


def step_clock(base=object):
    """(callback, stamps, tokens): a trainer callback of the Hugging Face kind (on_train_begin,
    on_step_end, on_log), made from `base`, that stamps the start of training and the end of each
    optimizer step and keeps each logged mean completion length."""
    stamps, tokens = [], []

    class Clock(base):
        def on_train_begin(self, args, state, control, **kw):
            stamps.append(time.perf_counter())

        def on_step_end(self, args, state, control, **kw):
            stamps.append(time.perf_counter())
            print(f"anchor: step {state.global_step}: {stamps[-1] - stamps[-2]:.3f} s", file=sys.stderr, flush=True)

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "completions/mean_length" in logs:
                tokens.append(float(logs["completions/mean_length"]))

    return Clock(), stamps, tokens
