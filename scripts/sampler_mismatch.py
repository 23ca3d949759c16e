"""Rollout speed and sampler/trainer mismatch: the float policy, its 8- and 4-bit copies
(generation.quantize_bits), and top_p truncation, on one batch of built-in arithmetic prompts.

    uv run python scripts/sampler_mismatch.py --model builtin:tiny
    uv run python scripts/sampler_mismatch.py --model builtin:small --json small.json

Per setting: decode tokens per second (median of --repeats rollouts after one warm-up, each
from its own seed; building the copy is timed apart), and against the float policy's
softmax(logits / T), the step metrics `sampling/logprob_diff_mean`, `_max`, `sampling/kl` and
the token_truncate weights (cap 3) that training would log.
"""

import argparse
import json
import statistics
import time

import mlx.core as mx

from mlx_grpo.algorithm.loss import completion_logprobs
from mlx_grpo.algorithm.mismatch import importance_weights, mismatch_metrics
from mlx_grpo.commands.setup import build_policy
from mlx_grpo.config import load_config
from mlx_grpo.data.examples import load_examples
from mlx_grpo.rollout.quantized import quantize_policy
from mlx_grpo.rollout.sample import generate_completions, make_rollout_sampler, make_sampling_logprob


def measure(policy, sampler_model, tokenizer, prompts, args, temperature, top_p) -> dict:
    sampler = make_rollout_sampler(temperature, top_p, 0, 0.0)
    logprob = make_sampling_logprob(temperature, top_p if top_p < 1 else 0.0, 0, 0.0)
    speeds, rollout = [], None
    for seed in range(args.repeats + 1):  # the first is a warm-up
        mx.random.seed(seed)
        tic = time.perf_counter()
        rollout = generate_completions(sampler_model, tokenizer, prompts, num_generations=args.group,
                                       max_new_tokens=args.max_new_tokens, sampler=sampler, sampling_logprob=logprob)
        if seed:
            speeds.append(rollout.num_tokens / (time.perf_counter() - tic))
    trainer = completion_logprobs(policy, rollout.prompt_tokens, rollout.completion_tokens, temperature)
    T = trainer.shape[1]
    sampled = mx.array([s + [0.0] * (T - len(s)) for s in rollout.sampling_logprobs])
    mask = mx.array([[1.0] * len(c) + [0.0] * (T - len(c)) for c in rollout.completion_tokens])
    metrics = {**mismatch_metrics(trainer, sampled, mask),
               **importance_weights(trainer, sampled, mask, "token_truncate", cap=3.0)[1]}
    return {"tokens_per_second": statistics.median(speeds), "tokens": rollout.num_tokens,
            **{k: v.item() for k, v in metrics.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="builtin:tiny")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    cfg = load_config(None, [f'model.path="{args.model}"'])
    policy, tokenizer, _, _ = build_policy(cfg)
    policy.eval()
    prompts = [e.prompt_tokens for e in load_examples(cfg.data, tokenizer, seed=0)[:args.prompts]]
    rows = []
    for name, bits, temperature, top_p in [("float", 0, 1.0, 1.0), ("8-bit copy", 8, 1.0, 1.0),
                                           ("4-bit copy", 4, 1.0, 1.0), ("top_p 0.7, T 1", 0, 1.0, 0.7),
                                           ("top_p 0.7, T 2", 0, 2.0, 0.7)]:
        tic = time.perf_counter()
        sampler_model = quantize_policy(policy, bits) if bits else policy
        build = time.perf_counter() - tic
        row = {"setting": name, "copy_seconds": build if bits else 0.0,
               **measure(policy, sampler_model, tokenizer, prompts, args, temperature, top_p)}
        rows.append(row)
        print(f"{name:16s} {row['tokens_per_second']:8.1f} tok/s  copy {row['copy_seconds']:.2f} s  "
              f"diff mean {row['sampling/logprob_diff_mean']:.2e} max {row['sampling/logprob_diff_max']:.3f}  "
              f"kl {row['sampling/kl']:.2e}  weights {row['sampling/importance_sampling_ratio/min']:.3f}"
              f"/{row['sampling/importance_sampling_ratio/mean']:.3f}/{row['sampling/importance_sampling_ratio/max']:.3f}",
              flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, **vars(args), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
