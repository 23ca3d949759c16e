"""`mlx-grpo train`: the GRPO loop, top to bottom.

One step: take prompts_per_step * gradient_accumulation_steps prompts, sample G completions
for each (one batched decode) and score them (rollout/), turn the scores into group-relative
advantages (algorithm/), make num_iterations optimizer updates on those completions (update/),
then log the step and checkpoint it when due (run/). With grpo.dynamic_sampling, groups whose
rewards are all equal are dropped and more prompts drawn; with training.skip_zero_signal_steps a
step where no group has spread (and beta = 0) makes no update. `setup` (commands/setup.py) builds
what the loop runs on; this file composes the stages, and its `main` is the command line's.
"""

from contextlib import nullcontext
import os
from pathlib import Path
import shlex
import signal
import sys
import time

import mlx.core as mx
from mlx.utils import tree_flatten

from mlx_grpo.algorithm.dynamic_sampling import fill_groups, fit_parts
from mlx_grpo.algorithm.zero_signal import zero_signal
from mlx_grpo.commands.args import add_progress_arg
from mlx_grpo.commands.evaluate import make_training_eval
from mlx_grpo.commands.plan import check_memory, memory_first
from mlx_grpo.commands.setup import Trainer, make_rewards, setup
from mlx_grpo.config import load_config
from mlx_grpo.data.load import PromptStream
from mlx_grpo.distributed import (
    RESUME_ENV, allreduce_bytes, check_world, init_world, local_share, lost_rank, sampling_seed,
)
from mlx_grpo.errors import NonFiniteError, TrainingError
from mlx_grpo.models.load import resolve_dtype
from mlx_grpo.rewards import RewardSet
from mlx_grpo.rng import capture_rng, restore_rng, seed_everything
from mlx_grpo.rollout.score import ScoredRollout, rollout_metrics, sample_and_score
from mlx_grpo.run.blas import warn_if_slow
from mlx_grpo.run.checkpoint import save_checkpoint
from mlx_grpo.run.layout import COMPLETIONS, DAMAGED_SUFFIX, METRICS, checkpoint_dir
from mlx_grpo.run.console import Console, say
from mlx_grpo.run.lock import lock_run_folder
from mlx_grpo.run.log import truncate_jsonl
from mlx_grpo.run.resume import open_run, restore_training_state, share_resume_point
from mlx_grpo.run.stopping import RunStopped, StepAbandoned, StopRequest, skip_or_stop
from mlx_grpo.run.step_log import StepLog
from mlx_grpo.run.trackers import check_installed
from mlx_grpo.update.movement import MovementCheck
from mlx_grpo.update.step import optimize


def train(cfg, config_path: str | None = None, *, overwrite: bool = False, force: bool = False,
          reward_set: RewardSet | None = None, rows: list[dict] | None = None, progress: bool = True) -> Path:
    """Run GRPO as configured; returns the final checkpoint folder.

    With cfg.checkpoint.resume the run continues from the newest checkpoint in output_dir;
    `overwrite` replaces a run found there, `force` resumes despite config differences.
    `reward_set` and `rows` (the Python API's) replace cfg.rewards and the training split.
    `progress` False draws no progress bar (none is drawn either where the output is not a terminal).
    Under `mlx.launch` this process is one rank of a data-parallel run (distributed.py):
    it samples its share of each step's prompts and only rank 0 writes anything.
    """
    world = init_world(cfg.distributed.timeout_s)
    check_world(cfg, world)
    try:
        # Rank 0 writes the run folder, so it alone holds its lock: a second process is refused.
        with lock_run_folder(cfg.output_dir) if world.is_main else nullcontext():
            return _train(cfg, config_path, world, overwrite, force, reward_set, rows, progress)
    except RuntimeError as e:  # another rank stopped: one line here, its own reason is in its output
        if (lost := lost_rank(e, world)) is None:
            raise
        raise lost from e


def _train(cfg, config_path, world, overwrite: bool, force: bool, reward_set, rows, progress: bool) -> Path:
    out = Path(cfg.output_dir)
    seed_everything(cfg.seed)
    reward_set = reward_set or make_rewards(cfg, config_path)
    if world.is_main:
        check_installed(cfg.logging.report_to)  # before any model loads
        warn_if_slow(say)  # Linux without OpenBLAS: one line
    start = open_run(cfg, overwrite=overwrite, force=force) if world.is_main else None  # before any write
    start = share_resume_point(start, out, world)
    t, g = cfg.training, cfg.grpo
    tr = setup(cfg, total_updates=t.max_steps * g.num_iterations, world=world, rows=rows)
    # None unless [eval] every > 0; rank 0 evaluates alone, its parameters equal every rank's.
    run_eval = make_training_eval(cfg, tokenizer=tr.tokenizer, reward_set=reward_set) if world.is_main else None
    groups = t.prompts_per_step * t.gradient_accumulation_steps  # prompts (groups) per step
    stream = prompt_stream(tr.examples, groups, cfg, start)
    log = StepLog(cfg, first=start.step + 1 if start else 1) if world.is_main else None
    announce(cfg, tr, world)
    ckpt, first, bad_steps = resume(start, tr, cfg, world) if start else (None, 1, 0)
    memory_first(cfg, tr, world)  # a run that cannot hold its longest samples stops here, not at step 600
    # rank 0 alone: every rank holds the same parameters
    moved = (MovementCheck(tr.model, tr.optimizer, cfg.logging.warn_unmoved_after, start and start.movement)
             if world.is_main else None)

    # SIGINT/SIGTERM set a flag, read once per step; a SIGTERM may abandon a step that cannot
    # finish soon (one rank alone cannot: the others would wait for it in the all-reduce)
    stop = StopRequest(can_abandon=world.size == 1, quiet=not world.is_main)
    console = Console(first, t.max_steps, enabled=world.is_main, progress=progress)  # the bar, the lines above it
    draw = make_draw(stream, tr, reward_set, t.prompts_per_step, world, console.sampling)
    for step in stop.watch(console):
        world.at_step(step)
        tic = time.perf_counter()
        mx.reset_peak_memory()
        try:
            with stop.abandonable():
                kept, drawn, sampling_metrics, parts = sample(draw, step, groups, t.gradient_accumulation_steps,
                                                              g.dynamic_sampling, g.max_resample_rounds, world)
                update_metrics = {}  # none when no group was kept or the update was skipped
                skipped = skip_zero_signal(kept, cfg, world)
                if kept.rewards and not skipped:
                    try:
                        update_metrics = update(tr, kept, parts, world, console.updating)
                    except NonFiniteError as e:  # the step's row then has no loss, as for a skipped update
                        bad_steps = skip_or_stop(e, step, bad_steps, t.max_bad_steps, ckpt)
        except StepAbandoned:  # nothing of the step was written; the last checkpoint stays
            stop.restore()
            if log:
                log.finish(ckpt, t.max_steps, stopped=True)
            raise RunStopped(signal.SIGTERM, step - 1, ckpt, abandoned=True) from None
        metrics = step_metrics(step, tic, drawn, g.scale_rewards, sampling_metrics, update_metrics, world)
        if t.skip_zero_signal_steps:
            metrics["zero_signal_skipped"] = float(skipped)
        if moved:
            metrics.update(moved(tr.model, tr.optimizer))
        world.step_done(metrics["step_time"])  # the collectives' deadline follows it
        if run_eval and step % cfg.eval.every == 0:
            console.evaluating()
            with world.busy("evaluating"):
                metrics.update(run_eval(tr.model))
        if log:  # the other ranks only take part in the reductions
            with world.busy("logging"):
                log.write(metrics, drawn, console, trained=bool(update_metrics))
        requested = world.max(float(stop.requested)) > 0  # all ranks stop after the same step
        if world.is_main and (step % cfg.checkpoint.save_every == 0 or step == t.max_steps or requested):
            with world.busy("writing a checkpoint"):
                ckpt = save(tr, cfg, step, stream, bad_steps, moved)
        if requested and step < t.max_steps:  # a stop asked for in the last step: the run is complete
            if log:
                log.finish(ckpt, t.max_steps, stopped=True)
            stop.restore()
            raise RunStopped(stop.signum or signal.SIGTERM, step, ckpt, quiet=not world.is_main)
    console.close()
    if not world.is_main:
        return checkpoint_dir(out, t.max_steps)
    log.finish(ckpt, t.max_steps)
    return ckpt


def make_draw(stream: PromptStream, tr: Trainer, reward_set, prompts_per_step: int, world, on_progress=None):
    """draw(n): n of this rank's prompts, taken from the same global stream on every rank, sampled
    and scored (on_progress: as generate_completions takes it)."""
    def draw(n: int) -> ScoredRollout:
        examples = local_share(stream.take(n * world.size), prompts_per_step, world)
        return sample_and_score(tr.rollout_model(), tr.tokenizer, examples, reward_set, tr.sampler, tr.sampling,
                                on_progress=on_progress)
    return draw


def sample(draw, step: int, groups: int, accumulation_steps: int, dynamic_sampling: bool, max_rounds: int, world):
    """Sample and score the step's completions: (kept to train on, drawn in all, sampling metrics,
    accumulation parts). With grpo.dynamic_sampling, rounds are drawn until enough groups have
    reward spread; when none has, the step trains on nothing and says so.
    """
    if not dynamic_sampling:
        drawn = draw(groups // world.size)
        return drawn, drawn, {}, accumulation_steps
    kept, drawn, metrics = fill_groups(draw, groups, max_rounds)
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
                 update_metrics: dict, world) -> dict:
    """The step's row of metrics.jsonl, reduced over the ranks."""
    step_time = world.max(time.perf_counter() - tic)
    return {
        "step": step, **rollout_metrics(drawn, scale_rewards, world), **sampling_metrics, **update_metrics,
        "step_time": step_time,
        "tokens_per_second": world.sum([drawn.rollout.num_tokens])[0] / step_time,
        "peak_memory_gb": world.max(mx.get_peak_memory() / 1e9),
        # the ids (Example.id) of the prompts each rank drew, rank 0's first: disjoint, and together the step's
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


def announce(cfg, tr: Trainer, world) -> None:
    if not world.is_main:
        return
    trainable = sum(v.size for _, v in tree_flatten(tr.model.trainable_parameters()))
    say(f"mlx-grpo: {cfg.model.path} ({trainable:,} trainable parameters) -> {Path(cfg.output_dir)}")
    if cfg.model.dtype == "auto":
        say(f"mlx-grpo: model.dtype = auto: {resolve_dtype('auto')} here "
            "(bfloat16 on Metal, float32 on the CPU backend)")
    if world.size > 1:
        say(f"mlx-grpo: data-parallel over {world.size} ranks, "
            f"{allreduce_bytes(tr.model, cfg.distributed.reduce_dtype) / 1e6:.2f} MB all-reduced per update")


def resume(start, tr: Trainer, cfg, world) -> tuple[Path, int, int]:
    """Put a checkpoint's state back; returns (checkpoint, first step to run, bad steps so far)."""
    restore_training_state(start, tr.model, tr.optimizer, cfg.lora.enabled)
    if world.is_main:
        for name in (METRICS, COMPLETIONS):
            if damaged := truncate_jsonl(Path(cfg.output_dir) / name, start.step):
                lines = ", ".join(map(str, damaged[:10])) + (", ..." if len(damaged) > 10 else "")
                print(f"mlx-grpo: warning: {name}: {len(damaged)} unreadable line(s) ({lines}) moved to "
                      f"{name}{DAMAGED_SUFFIX}; every readable row up to step {start.step} is kept",
                      file=sys.stderr)
    restore_rng(start.rng)  # last: model loading drew random numbers
    if not world.is_main:  # the checkpoint holds rank 0's PRNG state only
        mx.random.seed(sampling_seed(cfg.seed, world.rank, start.step))
    else:
        print(f"mlx-grpo: resumed from {start.checkpoint} (step {start.step} of {cfg.training.max_steps})")
    return start.checkpoint, start.step + 1, start.bad_steps


def save(tr: Trainer, cfg, step: int, stream: PromptStream, bad_steps: int, moved: MovementCheck) -> Path:
    return save_checkpoint(
        cfg.output_dir, step, model=tr.model, tokenizer=tr.tokenizer, optimizer=tr.optimizer, cfg=cfg,
        base_path=tr.base_path, num_layers=tr.num_layers, keep_last=cfg.checkpoint.keep_last,
        trainer_state={"data_position": stream.position, "bad_steps": bad_steps, "rng": capture_rng(),
                       "movement": moved.state()},
    )


def add_arguments(parser):
    parser.add_argument("--config", required=True, help="TOML profile, e.g. configs/smoke_test.toml")
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="override a config key with a TOML value, e.g. --set training.max_steps=20 (repeatable)",
    )
    start = parser.add_mutually_exclusive_group()
    start.add_argument("--resume", action="store_true",
                       help="continue from the newest checkpoint in output_dir (as checkpoint.resume = true)")
    start.add_argument("--overwrite", action="store_true", help="replace a run already in output_dir")
    parser.add_argument("--force", action="store_true",
                        help="resume even though the config differs from the run's")
    parser.add_argument("--ignore-memory", action="store_true",
                        help="train even when `mlx-grpo plan` predicts the profile does not fit in memory")
    parser.add_argument("--memory-gb", type=float, default=None, metavar="N",
                        help="check the memory plan against N GB instead of this device's memory")
    add_progress_arg(parser)


def main(args) -> int:
    """The exit code: 0, or a stopped run's (it prints the command that resumes it)."""
    cfg = load_config(args.config, args.overrides)
    cfg.checkpoint.resume = cfg.checkpoint.resume or args.resume
    if not args.ignore_memory:
        check_memory(cfg, args.memory_gb)
    try:
        train(cfg, config_path=args.config, overwrite=args.overwrite, force=args.force, progress=args.progress)
    except RunStopped as e:  # under `mlx-grpo launch`, rank 0 alone says so, with the launch's command
        again = os.environ.get(RESUME_ENV) or " ".join(
            ["mlx-grpo train --config", shlex.quote(args.config),
             *(f"--set {shlex.quote(o)}" for o in args.overrides), "--resume"])
        if not e.quiet:
            print(f"mlx-grpo: {e}\nmlx-grpo: resume with: {again}", file=sys.stderr)
        return e.exit_code
    return 0
