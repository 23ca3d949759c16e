"""Tools and environments for multi-turn rollouts: schemas from typed functions (schema.py), the
run's checked tools and one episode per row (toolbox.py), calls on their own threads
(execute.py), and the family's call format and tool-message tokens (calls.py). Pure Python: the
rollout that drives them is rollout/episodes.py."""

from pathlib import Path

from mlx_grpo.tools.schema import ToolError, tool_schema
from mlx_grpo.tools.toolbox import Episode, Toolset

__all__ = ["Episode", "ToolError", "Toolset", "completion_cap", "episode_tokens", "make_toolset", "tool_schema",
           "uses_tools"]


def uses_tools(cfg) -> bool:
    return bool(cfg.tools.functions or cfg.tools.environment)


def episode_tokens(gen) -> int:
    """The episode budget: generation.max_episode_tokens, or max_new_tokens per turn times max_turns."""
    return gen.max_episode_tokens or gen.max_new_tokens * gen.max_turns


def completion_cap(cfg) -> int:
    """The most tokens one completion may have: generation.max_new_tokens, or with tools the
    episode budget (sampled and tool tokens). The memory plan and the worst-case probe size by it."""
    return episode_tokens(cfg.generation) if uses_tools(cfg) else cfg.generation.max_new_tokens


def make_toolset(cfg, config_path: str | None = None) -> Toolset | None:
    """The config's [tools], resolved and checked (before any weight loads), or None without tools.
    A file's relative path is tried against the profile's folder, then the working directory."""
    if not uses_tools(cfg):
        return None
    base_dir = Path(config_path).parent if config_path else None
    return Toolset(cfg.tools.functions, cfg.tools.environment or None, base_dir=base_dir,
                   timeout_s=cfg.tools.timeout_s)
