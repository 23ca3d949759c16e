"""The stages of one training step that `train` composes: the step's prompts (`prompt_stream`,
`make_draw`: this rank's share, sampled and scored), dynamic sampling (`sample`), the update
(`update`), the zero-signal skip and the step's row of metrics.jsonl (`step_metrics`).
"""

import time

import mlx.core as mx

from mlx_grpo.algorithm.dynamic_sampling import fill_groups, fit_parts
from mlx_grpo.algorithm.zero_signal import zero_signal
from mlx_grpo.commands.setup import Trainer
from mlx_grpo.data.examples import PromptStream
from mlx_grpo.distributed import local_share
from mlx_grpo.errors import TrainingError
from mlx_grpo.rewards import TrainerState
from mlx_grpo.rollout.score import ScoredRollout, rollout_metrics, sample_and_score
from mlx_grpo.rollout.tool_rollout import tool_metrics
from mlx_grpo.run.console import say
from mlx_grpo.update.step import optimize


def make_draw(stream: PromptStream, tr: Trainer, reward_set, prompts_per_step: int, max_steps: int, world,
              on_progress=None):
    """draw(n, step): n of this rank's prompts, taken from the same global stream on every rank,
    sampled and scored (on_progress: as generate_completions takes it)."""
    def draw(n: int, step: int) -> ScoredRollout:
        state = TrainerState(step - 1, max_steps, epoch=stream.position / len(stream.examples))
        examples = local_share(stream.take(n * world.size), prompts_per_step, world)
        return sample_and_score(tr.rollout_model(), tr.tokenizer, examples, reward_set, tr.sampler, tr.sampling,
                                on_progress=on_progress, trainer_state=state, tools=tr.tools)
    return draw


def sample(draw, step: int, groups: int, accumulation_steps: int, dynamic_sampling: bool, max_rounds: int, world):
    """Sample and score the step's completions: (kept to train on, drawn in all, sampling metrics,
    accumulation parts). With grpo.dynamic_sampling, rounds are drawn until enough groups have
    reward spread; when none has, the step trains on nothing and says so.
    """
    if not dynamic_sampling:
        drawn = draw(groups // world.size, step)
        return drawn, drawn, {}, accumulation_steps
    kept, drawn, metrics = fill_groups(lambda n: draw(n, step), groups, max_rounds)
    kept, parts = fit_parts(kept, accumulation_steps)
    if not kept.rewards:
        say(f"step {step}: no group had reward spread in {metrics['dynamic_sampling/rounds']} rounds; "
            "update skipped")
    return kept, drawn, metrics, parts


def update(tr: Trainer, kept: ScoredRollout, parts: int, world, on_progress=None) -> dict:
    """Advantages, then num_iterations optimizer updates on the kept completions; their metrics."""
    return optimize(tr.model, tr.optimizer, tr.ref_model, kept.rollout, kept.rewards,
                    tr.settings.with_parts(parts), world, grad_fn=tr.grad_fn, on_progress=on_progress)


def skip_zero_signal(kept: ScoredRollout, cfg, world) -> bool:
    """With training.skip_zero_signal_steps: whether this step's update has a zero gradient on
    every rank (beta = 0, no group with reward spread), so AdamW is not called at all."""
    if not cfg.training.skip_zero_signal_steps or not kept.rewards:
        return False
    flat = zero_signal(kept.rewards, kept.rollout.group_size, cfg.grpo.beta)
    return world.sum([float(not flat)])[0] == 0  # all ranks skip together, or none does


def step_metrics(step: int, tic: float, drawn: ScoredRollout, scale_rewards: str, sampling_metrics: dict,
                 update_metrics: dict, world, timing: dict, tools=None) -> dict:
    """The step's row of metrics.jsonl, reduced over the ranks; `timing`: the rewards' (time/rewards, a judge's);
    `tools` (a ToolRollout) adds the tool metrics."""
    step_time = world.max(time.perf_counter() - tic)
    before_judge = timing.pop("judge/peak_before_gb", 0.0)  # a judge resets MLX's peak to measure its own
    tool = tool_metrics(drawn.rollout, tools.toolset.names, world) if tools and drawn.rollout.episodes else {}
    return {
        "step": step, **rollout_metrics(drawn, scale_rewards, world), **tool, **sampling_metrics, **update_metrics,
        "step_time": step_time, **timing,
        "tokens_per_second": world.sum([drawn.rollout.num_tokens])[0] / step_time,
        "peak_memory_gb": world.max(max(mx.get_peak_memory() / 1e9, before_judge)),
        # the data rows (Example.row) of the prompts each rank drew, rank 0's first: disjoint, and together the step's
        "data/prompt_ids": world.gather_ids(drawn.prompt_ids),
    }


def prompt_stream(examples, groups: int, cfg, start) -> PromptStream:
    """The walk over the training prompts, from where a resumed run left it."""
    if len(examples) < groups:
        raise TrainingError(
            f"data.dataset: {len(examples)} usable prompts, fewer than the "
            f"{groups} one step needs (training.prompts_per_step * gradient_accumulation_steps)"
        )
    return PromptStream(examples, cfg.data.shuffle, cfg.seed, position=start.data_position if start else 0)
