"""A rollout scored: the step's G completions per prompt with their rewards, and its metrics.

`sample_and_score` is the rollout and reward stages of one step, with DAPO's overlong penalty
added to the rewards when it is on. `ScoredRollout` is what every later stage takes: advantages,
dynamic sampling's group filtering, the update and the step's metrics.
"""

from dataclasses import dataclass, field

import numpy as np

from mlx_grpo.algorithm.advantages import group_stats
from mlx_grpo.algorithm.overlong import overlong_penalty
from mlx_grpo.distributed import SINGLE
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

    @classmethod
    def from_config(cls, cfg) -> "SamplingSettings":
        gen, g = cfg.generation, cfg.grpo
        return cls(gen.num_generations, gen.max_new_tokens, gen.batch_size, g.overlong_penalty, g.overlong_buffer,
                   gen.temperature, gen.top_p, gen.top_k, gen.min_p)


@dataclass
class ScoredRollout:
    """A rollout with its rewards (totals and per reward name), the prompt of each row and the
    id (Example.id) of each group's prompt."""

    rollout: Rollout
    rewards: list[float]
    per_name: dict[str, list[float]]
    questions: list[str]
    prompt_ids: list[int] = field(default_factory=list)

    @property
    def num_groups(self) -> int:
        return len(self.rewards) // self.rollout.group_size


def take_groups(batch: ScoredRollout, groups: list[int]) -> ScoredRollout:
    """The rows of `groups`, in that order."""
    G = batch.rollout.group_size
    rows = [g * G + j for g in groups for j in range(G)]
    pick = lambda xs: [xs[i] for i in rows]
    r = batch.rollout
    kept = None if r.sampling_logprobs is None else pick(r.sampling_logprobs)
    return ScoredRollout(
        Rollout(pick(r.prompt_tokens), pick(r.completion_tokens), pick(r.texts), pick(r.truncated), G, kept),
        pick(batch.rewards), {k: pick(v) for k, v in batch.per_name.items()}, pick(batch.questions),
        [batch.prompt_ids[g] for g in groups] if batch.prompt_ids else [],
    )


def concat(batches: list[ScoredRollout]) -> ScoredRollout:
    """The rows of all batches, one after the other (all share one group size)."""
    first = batches[0]
    cat = lambda get: [x for b in batches for x in get(b)]
    kept = all(b.rollout.sampling_logprobs is not None for b in batches)
    return ScoredRollout(
        Rollout(
            cat(lambda b: b.rollout.prompt_tokens), cat(lambda b: b.rollout.completion_tokens),
            cat(lambda b: b.rollout.texts), cat(lambda b: b.rollout.truncated), first.rollout.group_size,
            cat(lambda b: b.rollout.sampling_logprobs) if kept else None,
        ),
        cat(lambda b: b.rewards), {k: cat(lambda b: b.per_name[k]) for k in first.per_name},
        cat(lambda b: b.questions), cat(lambda b: b.prompt_ids),
    )


def sample_and_score(model, tokenizer, examples, reward_set, sampler, s: SamplingSettings,
                     on_progress=None) -> ScoredRollout:
    """G completions per example, scored; DAPO's overlong penalty added when it is on.

    `model` is the policy, or the quantized copy that samples for it (rollout/quantized.py);
    `sampler` is `make_rollout_sampler` of the settings' temperature, top_p, top_k and min_p;
    on_progress: as generate_completions takes it.
    """
    G = s.num_generations
    model.eval()
    rollout = generate_completions(
        model, tokenizer, [e.prompt_tokens for e in examples],
        num_generations=G, max_new_tokens=s.max_new_tokens, sampler=sampler, batch_size=s.batch_size,
        sampling_logprob=make_sampling_logprob(s.temperature, s.top_p, s.top_k, s.min_p),
        on_progress=on_progress,
    )
    questions = [e.question for e in examples for _ in range(G)]
    answers = [e.answer for e in examples for _ in range(G)]
    rewards, per_name = reward_set(questions, rollout.texts, answers)
    if s.overlong_penalty > 0:
        lengths = [len(c) for c in rollout.completion_tokens]
        penalty = overlong_penalty(lengths, s.max_new_tokens, s.overlong_buffer, s.overlong_penalty)
        rewards = [r + p for r, p in zip(rewards, penalty)]
        per_name = {**per_name, "overlong_penalty": penalty}
    return ScoredRollout(rollout, rewards, per_name, questions, [e.id for e in examples])


def rollout_metrics(drawn: ScoredRollout, scale_rewards: str, world=SINGLE) -> dict:
    """Reward and length metrics over the rows of every rank (whole groups stay together)."""
    cols = world.gather({
        "length": [len(c) for c in drawn.rollout.completion_tokens],
        "truncated": [float(cut) for cut in drawn.rollout.truncated], "reward": drawn.rewards,
        **{f"rewards/{name}": scores for name, scores in drawn.per_name.items()},
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
        scores = cols[f"rewards/{name}"]
        out[f"rewards/{name}/mean"] = float(np.mean(scores))
        out[f"rewards/{name}/std"] = float(np.std(scores, ddof=1)) if len(scores) > 1 else 0.0
    return out
