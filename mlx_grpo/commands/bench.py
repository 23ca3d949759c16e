"""`mlx-grpo bench`: the trainer's seconds per step against MLX's own limit on the same work.

After a warm-up step (which also traces the compiled gradient), each measured step runs
the trainer's own functions, timed one by one: rollout (`generate_completions`), rewards (a
judge reward's share beside), reference pass (`prepare_batches`: the no-grad log-probs) and
update (`run_updates`).
Then, on the same model and that step's shapes, the limit:

- generation: mlx-lm's `BatchGenerator` decoding the same P*G sequences with no stop
  token and each one's `max_tokens` set to the length the trainer sampled, so it makes
  exactly the same tokens in the same batch; each prompt is prefilled once into a cache
  that its G sequences share (less work than prefilling P*G prompts, so it stays a lower
  bound); no Python work per token beyond draining the generator.
- update: one forward+backward of a plain token log-likelihood over the same rows as padded
  prompt+completion micro-batches (never shared-prefix), timed plain and compiled, the
  faster taken; no optimizer update. A trainer that shares each group's prompt
  (training.shared_prefix) does less work than this limit and can beat it.
- both with the weights in the order mlx-lm loaded them, where the trainer's decode laid out a
  frozen LoRA base for itself (rollout/frozen_layout.py).

`--prompt-tokens N` lengthens each prompt to about N tokens (filler text before it), to
measure the long-prompt case; the report gives the prompt share of the padded rows' tokens.

And the physical limit (commands/roofline.py): this backend's matmul FLOP/s and copy bytes/s,
measured once, against the FLOPs and weight bytes the step's rollout and update moved.

Reported: medians over the measured steps, the ratio step / limit, tokens per second
and peak memory (MLX's counters). Timings are wall-clock and noisy on a shared machine.
"""

from dataclasses import replace
import json
import statistics
import time
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_map
from mlx_lm.generate import BatchGenerator
from mlx_lm.models.cache import make_prompt_cache

from mlx_grpo.commands import roofline
from mlx_grpo.commands.bench_report import format_report, host_shares
from mlx_grpo.commands.bench_tools import add_tools_arguments, tools_report
from mlx_grpo.commands.plan import device_memory_gb
from mlx_grpo.commands.setup import make_rewards, setup
from mlx_grpo.config import ConfigError, load_config
from mlx_grpo.config.paths import is_local_path
from mlx_grpo.data.examples import PromptStream
from mlx_grpo.algorithm.loss import token_logprobs
from mlx_grpo.rng import seed_everything
from mlx_grpo.rollout.frozen_layout import as_loaded
from mlx_grpo.rollout.sample import generate_completions, mlx_lm_sampler
from mlx_grpo.rollout.score import reward_batch
from mlx_grpo.streams import as_shipped
from mlx_grpo.run.blas import warn_if_slow
from mlx_grpo.run.console import say
from mlx_grpo.update.batches import make_micro_batches, prepare_batches
from mlx_grpo.update.grad import make_grad_fn
from mlx_grpo.update.worst_case import limit_cache
from mlx_grpo.update.step import COMPILE_STEP, run_updates

SIZES = {"tiny": "builtin:tiny", "small": "builtin:small"}
GB = 1e9


def bench_config(model_path: str, prompts: int, generations: int, max_new_tokens: int, overrides=()):
    """The trainer's defaults (full fine-tune; beta 0, so no reference pass, unless overridden) at the
    benchmark's shapes."""
    return load_config(None, [
        f"model.path={json.dumps(model_path)}", f"training.prompts_per_step={prompts}",
        f"generation.num_generations={generations}", f"generation.max_new_tokens={max_new_tokens}",
        *overrides,
    ])


class _Bench:
    """The trainer's own state (`setup`), its prompts and rewards."""

    def __init__(self, cfg, prompt_tokens: int = 0):
        seed_everything(cfg.seed)
        self.reward_set = make_rewards(cfg)
        self.tr = setup(cfg, total_updates=1_000_000)
        limit_cache(device_memory_gb() * GB)  # MLX's buffer cache as a training run sets it
        examples = self.tr.examples
        if prompt_tokens > 0:
            examples = [lengthen(e, self.tr.tokenizer, prompt_tokens) for e in examples]
        self.stream = PromptStream(examples, cfg.data.shuffle, cfg.seed)
        self.prompts = cfg.training.prompts_per_step * cfg.training.gradient_accumulation_steps
        self.trainable = sum(v.size for _, v in tree_flatten(self.tr.model.trainable_parameters()))


FILLER = "Read the question below carefully, think step by step and give the final answer. "


def lengthen(example, tokenizer, n: int):
    """The example with filler tokens before its prompt, so the prompt has about n tokens."""
    need = n - len(example.prompt_tokens)
    if need <= 0:
        return example
    ids = tokenizer.encode(FILLER, add_special_tokens=False)
    filler = (ids * (need // len(ids) + 1))[:need]
    return replace(example, prompt_tokens=filler + list(example.prompt_tokens))


def prefix_share(rollout) -> dict:
    """Prompt tokens as a share of the rows' prompt+completion tokens, and the tokens a
    shared-prefix pass runs over those a padded full-sequence pass runs (padding aside)."""
    g = rollout.group_size
    prompt = sum(len(p) for p in rollout.prompt_tokens)
    completion = sum(len(c) for c in rollout.completion_tokens)
    return {"prompt_share": prompt / (prompt + completion),
            "shared_over_full_tokens": (prompt / g + completion) / (prompt + completion)}


def _timed_step(b: _Bench) -> tuple[dict, object, list]:
    tr, s = b.tr, b.tr.sampling
    examples = b.stream.take(b.prompts)
    mx.reset_peak_memory()
    h0 = time.thread_time()
    t0 = time.perf_counter()
    tr.model.eval()
    rollout = generate_completions(
        tr.model, tr.tokenizer, [e.prompt_tokens for e in examples], num_generations=s.num_generations,
        max_new_tokens=s.max_new_tokens, sampler=tr.sampler, batch_size=s.batch_size, engine=s.engine,
    )
    t1, h1 = time.perf_counter(), time.thread_time()
    rewards, _ = b.reward_set.score(reward_batch(examples, rollout.texts, s.num_generations, rollout.completion_tokens))
    t2 = time.perf_counter()
    judge_s = b.reward_set.take_timing().get("time/judge", 0.0)
    h2 = time.thread_time()
    batches = prepare_batches(tr.model, tr.ref_model, rollout, rewards, tr.settings)
    t3, h3 = time.perf_counter(), time.thread_time()
    before_update = mx.get_peak_memory()
    mx.reset_peak_memory()
    run_updates(tr.model, tr.optimizer, batches, tr.grad_fn, tr.settings)
    t4, h4 = time.perf_counter(), time.thread_time()
    update_peak = mx.get_peak_memory()
    return {
        **prefix_share(rollout), "total_s": t4 - t0, "rollout_s": t1 - t0, "rewards_s": t2 - t1, "judge_s": judge_s,
        "reference_s": t3 - t2,
        "update_s": t4 - t3, "completion_tokens": rollout.num_tokens,
        "scored_tokens": sum(float(x.mask.sum().item()) for x in batches),
        "peak_memory_gb": max(before_update, update_peak) / GB, "update_peak_memory_gb": update_peak / GB,
        # the main thread's CPU seconds: Python, graph building and dispatch (MLX computes on its own threads)
        "host_s": h4 - h0, "rollout_host_s": h1 - h0, "reference_host_s": h3 - h2, "update_host_s": h4 - h3,
    }, rollout, make_micro_batches(rollout, mx.zeros(len(rewards)), replace(tr.settings, shared_prefix=False))


def generation_limit(model, prompts, lengths, group_size: int, sampler, batch_size: int = 0) -> float:
    """Seconds mlx-lm's BatchGenerator takes to decode exactly `lengths` tokens per sequence.

    prompts: the P distinct prompts; lengths: P*G completion lengths, prompt-major.
    """
    n = len(lengths)
    gen = BatchGenerator(model, max_tokens=max(lengths), stop_tokens=None, sampler=sampler,
                         completion_batch_size=batch_size or n, prefill_batch_size=min(batch_size or n, 64))
    made = 0
    tic = time.perf_counter()
    try:
        for i, prompt in enumerate(prompts):
            cache = make_prompt_cache(model)
            model(mx.array(prompt[:-1])[None], cache=cache)
            mx.eval([c.state for c in cache])
            gen.insert([prompt[-1:]] * group_size, max_tokens=lengths[i * group_size:(i + 1) * group_size],
                       caches=[cache] * group_size)
        while responses := gen.next_generated():
            made += len(responses)
    finally:
        gen.close()
    seconds = time.perf_counter() - tic
    assert made == sum(lengths), (made, sum(lengths))
    return seconds


def _likelihood(model, b):
    return -(token_logprobs(model, b.inputs, b.positions, b.targets) * b.mask).sum()


def forward_backward_limit(model, batches, grad_fns) -> tuple[list[float], float]:
    """(seconds of each grad_fn, peak GB) of one forward+backward over `batches`, summing grads."""
    times, peak = [], 0.0
    for grad_fn in grad_fns:
        mx.reset_peak_memory()
        tic = time.perf_counter()
        grads = None
        for b in batches:
            loss, g = grad_fn(b)
            grads = g if grads is None else tree_map(mx.add, grads, g)
            mx.eval(loss, grads)
        times.append(time.perf_counter() - tic)
        peak = max(peak, mx.get_peak_memory() / GB)
        del grads
    return times, peak


def _limit(tr, rollout, batches, fb_fns) -> dict:
    g = rollout.group_size
    prompts = rollout.prompt_tokens[::g]
    lengths = [len(c) for c in rollout.completion_tokens]
    # nothing cut onto a second stream (mlx_grpo.streams), the weights as loaded: MLX's own limit
    with as_shipped(), as_loaded(tr.model):
        tr.model.eval()
        s = tr.sampling
        shipped = mlx_lm_sampler(s.temperature, s.top_p, s.top_k, s.min_p)  # mlx-lm's draw, not ours
        gen_s = generation_limit(tr.model, prompts, lengths, g, shipped, s.batch_size)
        tr.model.train()
        (plain_s, compiled_s), fb_peak = forward_backward_limit(tr.model, batches, fb_fns)
    fb_s = min(plain_s, compiled_s)  # the limit is the faster of the two
    return {"total_s": gen_s + fb_s, "generation_s": gen_s, "forward_backward_s": fb_s,
            "forward_backward_plain_s": plain_s, "forward_backward_compiled_s": compiled_s,
            "forward_backward_peak_memory_gb": fb_peak}


def _compile_choices(grad_fn) -> list[dict]:
    """The trainer's measured compile decisions (update/grad.FasterOf), one per shape; [] if none."""
    return [{"shapes": [list(k[1]) for k in key[1:] if k[0] == "inputs"], "choice": grad_fn.choice[key],
             "seconds": grad_fn.seconds[key]} for key in getattr(grad_fn, "choice", {})]


def run_bench(cfg, steps: int = 5, label: str = "", prompt_tokens: int = 0) -> dict:
    """Warm-up step, then `steps` measured steps each followed by its limit; the report as a dict."""
    bench = _Bench(cfg, prompt_tokens)
    tr = bench.tr
    plain = nn.value_and_grad(tr.model, _likelihood)
    fb_fns = [lambda b: plain(tr.model, b), make_grad_fn(tr.model, _likelihood, compiled=True)]
    rows, machine = [], roofline.machine_limits(roofline.compute_dtype(tr.model))
    for i in range(steps + 1):
        step, rollout, batches = _timed_step(bench)
        limit = _limit(tr, rollout, batches, fb_fns)
        work = roofline.achieved(tr.model, rollout, step, cfg.lora.enabled, tr.settings.shared_prefix, machine)
        if i > 0:  # step 0 warms up: first traces, caches, allocator
            rows.append({"step": step, "limit": limit, "achieved": work})
    med = lambda part, key: statistics.median(r[part][key] for r in rows)
    step, limit, work = ({k: med(part, k) for k in rows[0][part]} for part in ("step", "limit", "achieved"))
    return {
        "model": cfg.model.path, "label": label, "trainable_parameters": bench.trainable,
        "lora": cfg.lora.enabled, "prompts": cfg.training.prompts_per_step,
        "generations": cfg.generation.num_generations, "max_new_tokens": cfg.generation.max_new_tokens,
        "micro_batch_size": cfg.training.micro_batch_size, "beta": cfg.grpo.beta,
        "rollout_engine": tr.sampling.engine, "compiled_step": COMPILE_STEP, "compile_choices": _compile_choices(tr.grad_fn),
        "measured_steps": steps, "shared_prefix": cfg.training.shared_prefix,
        "prompt_tokens": prompt_tokens,
        "step": step, "limit": limit, "machine": machine, "achieved": work,
        "step_over_limit": step["total_s"] / limit["total_s"],
        "rollout_tokens_per_s": step["completion_tokens"] / step["rollout_s"],
        "raw_generation_tokens_per_s": step["completion_tokens"] / limit["generation_s"],
        "update_tokens_per_s": step["scored_tokens"] / step["update_s"],
        "forward_backward_tokens_per_s": step["scored_tokens"] / limit["forward_backward_s"],
        "peak_memory_gb": step["peak_memory_gb"],
        "host_share": host_shares(step),
        "update_memory_over_forward_backward": step["update_peak_memory_gb"] / limit["forward_backward_peak_memory_gb"],
        "per_step": rows,
    }


def add_arguments(parser):
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny", help="built-in model (default tiny)")
    parser.add_argument("--model", help="any model path or hub id instead of --size")
    parser.add_argument("--steps", type=int, default=5, help="measured steps after the warm-up (default 5)")
    parser.add_argument("--prompts", type=int, default=2, help="prompts per step, P (default 2)")
    parser.add_argument("--generations", type=int, default=8, help="completions per prompt, G (default 8)")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="default 64")
    parser.add_argument("--prompt-tokens", type=int, default=0, metavar="N",
                        help="lengthen each prompt to about N tokens with filler text (default 0: as is)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="config override, e.g. --set lora.enabled=true (repeatable)")
    parser.add_argument("--json", dest="json_path", metavar="FILE", help="also write the report as JSON")
    add_tools_arguments(parser)


def main(args) -> dict:
    """Run the benchmark from parsed `add_arguments` options; prints the table."""
    if args.steps < 1:
        raise ConfigError(f"--steps must be >= 1, got {args.steps}")
    if args.model and is_local_path(args.model) and not Path(args.model).expanduser().exists():
        raise ConfigError(f"--model {args.model}: no such folder")  # a path, never a hub id
    path = args.model or SIZES[args.size]
    cfg = bench_config(path, args.prompts, args.generations, args.max_new_tokens, args.overrides)
    if args.prompt_tokens < 0:
        raise ConfigError(f"--prompt-tokens must be >= 0, got {args.prompt_tokens}")
    warn_if_slow(say)  # Linux without OpenBLAS: steps then take about 4x as long as with it
    report = (tools_report(args, generation_limit) if args.tools else  # --tools: commands/bench_tools.py
              run_bench(cfg, steps=args.steps, label=args.model or args.size, prompt_tokens=args.prompt_tokens))
    if not args.tools:
        print(format_report(report))
    if args.json_path:
        Path(args.json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_path).write_text(json.dumps(report, indent=2) + "\n")
    return report
