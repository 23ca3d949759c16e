"""`mlx-grpo bench --tools [PROFILE]`: where a step with tools spends its time, and how well the
continuous batch keeps decoding while rows wait on tools.

Each measured step (after a warm-up) runs the trainer's own stages on the profile's [tools]:
the episodes (rollout/tool_rollout.sample_episodes), the rewards, and the update. Reported, as
medians over the steps:

- the step's share spent with every unfinished row waiting on a tool (`idle`, no decoding at
  all), and the tools' own seconds summed over calls (they overlap each other and the decoding);
- the batching efficiency: sampled tokens per second of decoding (the rollout's seconds less the
  idle ones) against mlx-lm's BatchGenerator decoding the same number of tokens per row in one
  turn, from the same prompts (commands/bench.generation_limit): 1.0 means rows paused on
  tools cost the others nothing.

`--tool-seconds S` makes each call sleep S seconds first, as a remote tool would.
"""

import functools
import statistics
import time

import mlx.core as mx

from mlx_grpo.commands.setup import make_rewards, setup
from mlx_grpo.config import ConfigError, load_config
from mlx_grpo.data.examples import PromptStream
from mlx_grpo.rng import seed_everything
from mlx_grpo.rollout.score import reward_batch
from mlx_grpo.rollout.tool_rollout import sample_episodes, tool_metrics
from mlx_grpo.tools import make_toolset
from mlx_grpo.update.batches import prepare_batches
from mlx_grpo.update.step import run_updates


def _delayed(fn, seconds: float):
    @functools.wraps(fn)
    def slow(*args, **kwargs):
        time.sleep(seconds)
        return fn(*args, **kwargs)
    return slow


def run_tools_bench(cfg, config_path: str, generation_limit, steps: int = 3, tool_seconds: float = 0.0) -> dict:
    """The report as a dict; `generation_limit` is commands/bench.py's single-turn decode."""
    seed_everything(cfg.seed)
    toolset = make_toolset(cfg, config_path)
    if toolset is None:
        raise ConfigError(f"{config_path}: bench --tools needs a profile with [tools] (functions or environment)")
    if tool_seconds > 0:
        toolset.functions = {k: _delayed(fn, tool_seconds) for k, fn in toolset.functions.items()}
    reward_set = make_rewards(cfg, config_path)
    tr = setup(cfg, total_updates=1_000_000, toolset=toolset)
    stream = PromptStream(tr.examples, cfg.data.shuffle, cfg.seed)
    G, P = cfg.generation.num_generations, cfg.training.prompts_per_step
    rows = []
    for i in range(steps + 1):
        examples = stream.take(P)
        t0 = time.perf_counter()
        rollout, env = sample_episodes(tr.rollout_model(), tr.tokenizer, examples, tr.tools, tr.sampler, tr.sampling)
        t1 = time.perf_counter()
        batch = reward_batch(examples, rollout.texts, G, rollout.completion_tokens)
        batch.columns["episode"] = [e["messages"] for e in rollout.episodes]
        rewards, _ = reward_set.score(batch)
        rewards = rewards if env is None else [r + e for r, e in zip(rewards, env)]
        t2 = time.perf_counter()
        run_updates(tr.model, tr.optimizer, prepare_batches(tr.model, tr.ref_model, rollout, rewards, tr.settings),
                    tr.grad_fn, tr.settings)
        t3 = time.perf_counter()
        sampled = [max(1, int(sum(t))) for t in rollout.trainable]
        tr.model.eval()
        single_s = generation_limit(tr.model, [e.prompt_tokens for e in examples], sampled, G, tr.sampler)
        idle = rollout.tool_time["tools/idle_seconds"]
        m = tool_metrics(rollout, toolset.names)
        if i > 0:
            rows.append({
                "step_s": t3 - t0, "rollout_s": t1 - t0, "rewards_s": t2 - t1, "update_s": t3 - t2,
                "idle_s": idle, "tool_s": rollout.tool_time["tools/seconds"], "sampled_tokens": sum(sampled),
                "decode_tokens_per_s": sum(sampled) / max(t1 - t0 - idle, 1e-9),
                "single_turn_tokens_per_s": sum(sampled) / single_s,
                "call_frequency": m["tools/call_frequency"], "turns_per_episode": m["tools/turns_per_episode"],
            })
        mx.clear_cache()
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    return {"model": cfg.model.path, "profile": config_path, "prompts": P, "generations": G,
            "tool_seconds": tool_seconds, "measured_steps": steps, **med,
            "idle_share": med["idle_s"] / med["step_s"], "tool_share": med["tool_s"] / med["step_s"],
            "batching_efficiency": med["decode_tokens_per_s"] / med["single_turn_tokens_per_s"], "per_step": rows}


def format_tools_report(r: dict) -> str:
    return "\n".join([
        f"{r['model']} with {r['profile']}: P={r['prompts']} G={r['generations']}, each call +{r['tool_seconds']:g} s, "
        f"median of {r['measured_steps']} steps",
        f"step {r['step_s']:.2f} s: rollout {r['rollout_s']:.2f}, rewards {r['rewards_s']:.3f}, update {r['update_s']:.2f}",
        f"tool calls per episode {r['call_frequency']:.2f}, turns per episode {r['turns_per_episode']:.2f}",
        f"every row waiting on tools: {r['idle_s']:.2f} s ({r['idle_share']:.1%} of the step); "
        f"tools' own seconds, summed: {r['tool_s']:.2f} ({r['tool_share']:.1%})",
        f"decoding {r['decode_tokens_per_s']:.1f} tokens/s with rows paused on tools, "
        f"{r['single_turn_tokens_per_s']:.1f} single-turn: batching efficiency {r['batching_efficiency']:.2f}",
    ])


def add_tools_arguments(parser) -> None:
    parser.add_argument("--tools", nargs="?", const="configs/tools_smoke.toml", metavar="PROFILE",
                        help="bench a profile's multi-turn tool rollouts instead (default configs/tools_smoke.toml)")
    parser.add_argument("--tool-seconds", type=float, default=0.0, help="with --tools: sleep this long in each call")


def tools_report(args, generation_limit) -> dict:
    """`bench --tools`: the profile with --set on top, measured and printed; the report."""
    report = run_tools_bench(load_config(args.tools, args.overrides), args.tools, generation_limit, args.steps,
                             args.tool_seconds)
    print(format_tools_report(report))
    return report
