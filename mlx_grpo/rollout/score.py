"""A rollout scored: the step's G completions per prompt with their rewards, and its metrics.

`sample_and_score` is the rollout and reward stages of one step, with DAPO's overlong penalty
added to the rewards when it is on; `reward_batch` hands the rewards every field of each
completion's data row. `ScoredRollout` is what every later stage takes: advantages, dynamic
sampling's group filtering, the update and the step's metrics.
"""

from dataclasses import dataclass, field
import math

import numpy as np

from mlx_grpo.algorithm.advantages import group_stats
from mlx_grpo.algorithm.overlong import overlong_penalty
from mlx_grpo.distributed import SINGLE
from mlx_grpo.rewards.call import RewardBatch, TrainerState
from mlx_grpo.rollout.sample import Rollout, generate_completions, make_sampling_logprob


@dataclass(frozen=True)
class SamplingSettings:
    """The values the rollout and scoring read, taken from the config once."""

    num_generations: int  # G: the one place the group size is read; the rollout carries it on
    max_new_tokens: int
    batch_size: int  # sequences decoded at once; 0 = all
    overlong_penalty: float  # 0 = off
    overlong_buffer: int
    # the sampler's settings, to keep each sampled token's log-prob under the distribution drawn from
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    engine: str = "batch_generator"  # generation.engine as setup resolved it for the model

    @classmethod
    def from_config(cls, cfg) -> "SamplingSettings":
        gen, g = cfg.generation, cfg.grpo
        return cls(gen.num_generations, gen.max_new_tokens, gen.batch_size, g.overlong_penalty, g.overlong_buffer,
                   gen.temperature, gen.top_p, gen.top_k, gen.min_p, gen.engine)


@dataclass
class ScoredRollout:
    """A rollout with its rewards (totals and per reward name), the prompt of each row and the
    data row (Example.row) of each group's prompt."""

    rollout: Rollout
    rewards: list[float]
    per_name: dict[str, list[float | None]]  # None: that reward did not score that completion
    questions: list[str]
    prompt_ids: list[int] = field(default_factory=list)

    @property
    def num_groups(self) -> int:
        return len(self.rewards) // self.rollout.group_size


# Rollout's per-row fields (None where a rollout has not kept them); group_size and tool_time are not per row.
_ROW_FIELDS = ("prompt_tokens", "completion_tokens", "texts", "truncated", "sampling_logprobs", "trainable",
               "episodes")


def take_groups(batch: ScoredRollout, groups: list[int]) -> ScoredRollout:
    """The rows of `groups`, in that order."""
    G = batch.rollout.group_size
    rows = [g * G + j for g in groups for j in range(G)]
    pick = lambda xs: [xs[i] for i in rows]
    r = batch.rollout
    kept = {k: None if getattr(r, k) is None else pick(getattr(r, k)) for k in _ROW_FIELDS}
    return ScoredRollout(
        Rollout(**kept, group_size=G, tool_time=r.tool_time),
        pick(batch.rewards), {k: pick(v) for k, v in batch.per_name.items()}, pick(batch.questions),
        [batch.prompt_ids[g] for g in groups] if batch.prompt_ids else [],
    )


def concat(batches: list[ScoredRollout]) -> ScoredRollout:
    """The rows of all batches, one after the other (all share one group size)."""
    first = batches[0]
    cat = lambda get: [x for b in batches for x in get(b)]
    rollouts = [b.rollout for b in batches]
    kept = {k: None if any(getattr(r, k) is None for r in rollouts) else [x for r in rollouts for x in getattr(r, k)]
            for k in _ROW_FIELDS}
    times = [r.tool_time for r in rollouts if r.tool_time]
    tool_time = {k: sum(t[k] for t in times) for k in times[0]} if times else None
    return ScoredRollout(
        Rollout(**kept, group_size=first.rollout.group_size, tool_time=tool_time),
        cat(lambda b: b.rewards), {k: cat(lambda b: b.per_name[k]) for k in first.per_name},
        cat(lambda b: b.questions), cat(lambda b: b.prompt_ids),
    )


def reward_batch(examples, texts: list[str], group_size: int, completion_ids=None,
                 trainer_state: TrainerState | None = None) -> RewardBatch:
    """What the rewards read of `group_size` completions per example (prompt-major): each row's
    prompt, answer, conversation and every other field, repeated for each of its completions."""
    rep = lambda get: [get(e) for e in examples for _ in range(group_size)]  # noqa: E731
    fields = dict.fromkeys(k for e in examples for k in e.columns)  # every field any row has, in order
    conversational = any(e.messages is not None for e in examples)
    return RewardBatch(
        prompts=rep(lambda e: e.question), completions=list(texts), answers=rep(lambda e: e.answer),
        completion_ids=completion_ids, columns={k: rep(lambda e: e.columns.get(k)) for k in fields},
        messages=rep(lambda e: e.messages) if conversational else None, rows=rep(lambda e: e.row),
        trainer_state=trainer_state or TrainerState(), group_size=group_size,
    )


def sample_and_score(model, tokenizer, examples, reward_set, sampler, s: SamplingSettings,
                     on_progress=None, trainer_state: TrainerState | None = None, tools=None) -> ScoredRollout:
    """G completions per example, scored; DAPO's overlong penalty added when it is on.

    `model` is the policy, or the quantized copy that samples for it (rollout/quantized.py);
    `sampler` is `make_rollout_sampler` of the settings' temperature, top_p, top_k and min_p;
    on_progress: as generate_completions takes it; `trainer_state` is what the rewards get as theirs.
    `tools` (rollout/tool_rollout.ToolRollout): G multi-turn episodes instead; the rewards read the
    whole episode's text, and its messages as the `episode` keyword; an environment's reward()
    is added to the total as the `environment` reward.
    """
    G = s.num_generations
    model.eval()
    env_rewards = None
    if tools is not None:
        from mlx_grpo.rollout.tool_rollout import sample_episodes

        rollout, env_rewards = sample_episodes(model, tokenizer, examples, tools, sampler, s, on_progress)
    else:
        rollout = generate_completions(
            model, tokenizer, [e.prompt_tokens for e in examples],
            num_generations=G, max_new_tokens=s.max_new_tokens, sampler=sampler, batch_size=s.batch_size,
            sampling_logprob=make_sampling_logprob(s.temperature, s.top_p, s.top_k, s.min_p),
            on_progress=on_progress, engine=s.engine,
        )
    batch = reward_batch(examples, rollout.texts, G, rollout.completion_tokens, trainer_state)
    if rollout.episodes is not None:
        batch.columns["episode"] = [e["messages"] for e in rollout.episodes]
    rewards, per_name = reward_set.score(batch)
    if env_rewards is not None:
        rewards = [r + e for r, e in zip(rewards, env_rewards)]
        per_name = {**per_name, "environment": env_rewards}
    if s.overlong_penalty > 0:
        lengths = [len(c) for c in rollout.completion_tokens]
        cap = s.max_new_tokens if tools is None else tools.limits.max_tokens  # with tools: the episode budget
        penalty = overlong_penalty(lengths, cap, s.overlong_buffer, s.overlong_penalty)
        rewards = [r + p for r, p in zip(rewards, penalty)]
        per_name = {**per_name, "overlong_penalty": penalty}
    return ScoredRollout(rollout, rewards, per_name, batch.prompts, [e.row for e in examples])


def rollout_metrics(drawn: ScoredRollout, scale_rewards: str, world=SINGLE) -> dict:
    """Reward and length metrics over the rows of every rank (whole groups stay together)."""
    cols = world.gather({
        "length": [len(c) for c in drawn.rollout.completion_tokens],
        "truncated": [float(cut) for cut in drawn.rollout.truncated], "reward": drawn.rewards,
        # None (not scored) travels as NaN and is left out of the means, as TRL's nanmean does
        **{f"rewards/{name}": [math.nan if s is None else s for s in scores]
           for name, scores in drawn.per_name.items()},
    })
    lengths, rewards = cols["length"], cols["reward"]
    out = {
        "reward": float(np.mean(rewards)),
        **group_stats(rewards, drawn.rollout.group_size, scale_rewards),
        "completions/mean_length": float(np.mean(lengths)),
        "completions/min_length": float(min(lengths)),
        "completions/max_length": float(max(lengths)),
        "completions/clipped_ratio": float(np.mean(cols["truncated"])),
        # cut at max_new_tokens (never reached EOS) and still paid: tripwires.py watches it
        "completions/clipped_rewarded_ratio": float(np.mean([c > 0 and r > 0 for c, r in zip(cols["truncated"], rewards)])),
    }
    for name in drawn.per_name:
        every = np.array(cols[f"rewards/{name}"], dtype=np.float64)
        scores = every[~np.isnan(every)]
        out[f"rewards/{name}/mean"] = float(np.mean(scores)) if len(scores) else math.nan
        out[f"rewards/{name}/std"] = float(np.std(scores, ddof=1)) if len(scores) > 1 else 0.0
        out[f"rewards/{name}/none_frac"] = 1.0 - len(scores) / len(every)
    return out
