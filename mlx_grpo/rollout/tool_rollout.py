"""The rollout stage with tools: each row's episode started (an environment's `reset(**row)` may
give its first prompt), the episodes run (rollout/episodes.py), an environment's `reward()`
collected, and the tool metrics of a step.

Metrics (over the step's episodes): tools/call_frequency (calls per episode),
tools/failure_frequency (failed calls per call: malformed, unknown tool, raised, timed out),
tools/<name>/calls per episode, tools/turns_per_episode, tools/episode_tokens (sampled and tool
tokens), tools/tool_tokens, and the time spent in tools.
"""

from dataclasses import dataclass
import math

import numpy as np

from mlx_grpo.data.chat import prompt_messages, render_text
from mlx_grpo.distributed import SINGLE
from mlx_grpo.rollout.episodes import EpisodeLimits, generate_episodes
from mlx_grpo.rollout.sample import make_sampling_logprob
from mlx_grpo.tools import Toolset, episode_tokens
from mlx_grpo.tools.calls import ToolFormat

ENVIRONMENT_REWARD = "environment"  # the name an environment's reward() is logged under


@dataclass
class ToolRollout:
    """What a run with tools samples with: the tools, the call format, the limits, and how a
    prompt an environment gives is rendered (data.system_prompt, the chat template with the tools)."""

    toolset: Toolset
    fmt: ToolFormat
    limits: EpisodeLimits
    system_prompt: str
    template_kwargs: dict  # data.chat_template_kwargs with the schemas (tools/prompt.py)

    @classmethod
    def make(cls, toolset: Toolset, tokenizer, cfg, template_kwargs: dict) -> "ToolRollout":
        """`template_kwargs`: data.chat_template_kwargs with the schemas, as the prompts were rendered."""
        gen = cfg.generation
        limits = EpisodeLimits(gen.max_new_tokens, gen.max_turns, gen.max_tool_calls, episode_tokens(gen))
        return cls(toolset, ToolFormat.of(tokenizer), limits, cfg.data.system_prompt, template_kwargs)

    def prompt_tokens(self, tokenizer, prompt) -> list[int]:
        """An environment's first prompt (text, or a list of {role, content}) as token ids."""
        text = render_text(tokenizer, prompt_messages(prompt, self.system_prompt), self.template_kwargs)
        return tokenizer.encode(text, add_special_tokens=False)


def sample_episodes(model, tokenizer, examples, tools: ToolRollout, sampler, s, on_progress=None):
    """G episodes per example: (Rollout, the environment's reward per row or None without one)."""
    G = s.num_generations
    episodes, prompts = [], []
    for e in examples:
        for _ in range(G):
            episode = tools.toolset.episode({"prompt": e.question, **e.columns})
            episodes.append(episode)
            prompts.append(e.prompt_tokens if episode.prompt is None else tools.prompt_tokens(tokenizer, episode.prompt))
    rollout = generate_episodes(
        model, tokenizer, prompts, episodes, limits=tools.limits, sampler=sampler, fmt=tools.fmt,
        schemas=tools.toolset.schemas, timeout_s=tools.toolset.timeout_s, group_size=G, batch_size=s.batch_size,
        sampling_logprob=make_sampling_logprob(s.temperature, s.top_p, s.top_k, s.min_p),
        template_kwargs=tools.template_kwargs, on_progress=on_progress,
    )
    has_reward = tools.toolset.environment is not None and callable(getattr(tools.toolset.environment, "reward", None))
    return rollout, ([float(ep.reward()) for ep in episodes] if has_reward else None)


def tool_metrics(rollout, names: list[str], world=SINGLE) -> dict:
    """The step's tool metrics over every rank's episodes (see the module docstring)."""
    eps = rollout.episodes
    cols = world.gather({
        "calls": [e["tool_calls"] for e in eps], "failures": [e["tool_failures"] for e in eps],
        "turns": [e["turns"] for e in eps], "tokens": [len(c) for c in rollout.completion_tokens],
        "tool_tokens": [e["tool_tokens"] for e in eps],
        **{f"tool/{n}": [e["tools"].get(n, 0) for e in eps] for n in names},
    })
    calls = float(np.sum(cols["calls"]))
    out = {
        "tools/call_frequency": float(np.mean(cols["calls"])),
        "tools/failure_frequency": float(np.sum(cols["failures"])) / calls if calls else 0.0,
        "tools/turns_per_episode": float(np.mean(cols["turns"])),
        "tools/episode_tokens": float(np.mean(cols["tokens"])),
        "tools/tool_tokens": float(np.mean(cols["tool_tokens"])),
        **{f"tools/{n}/calls": float(np.mean(cols[f"tool/{n}"])) for n in names},
    }
    if rollout.tool_time:
        out.update({k: world.max(v) for k, v in rollout.tool_time.items()})
    return {k: v for k, v in out.items() if not isinstance(v, float) or math.isfinite(v)}
