"""`mlx-grpo train`: the GRPO loop, top to bottom.

One step: take prompts_per_step * gradient_accumulation_steps prompts, sample G completions
for each (one batched decode) and score them (rollout/), turn the scores into group-relative
advantages (algorithm/), make num_iterations optimizer updates on those completions (update/),
then log the step and checkpoint it when due (run/). With grpo.dynamic_sampling, groups whose
rewards are all equal are dropped and more prompts drawn; with training.skip_zero_signal_steps a
step where no group has spread (and beta = 0) makes no update. `setup` (commands/setup.py) builds
what the loop runs on, commands/step.py holds a step's stages; this file composes them, and its
`main` is the command line's.
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

from mlx_grpo.commands.args import add_progress_arg
from mlx_grpo.commands.evaluate import make_training_eval
from mlx_grpo.commands.plan import check_memory, memory_first
from mlx_grpo.commands.setup import Trainer, make_rewards, setup
from mlx_grpo.commands.step import make_draw, prompt_stream, sample, skip_zero_signal, step_metrics, update
from mlx_grpo.config import ConfigError, load_config
from mlx_grpo.data.examples import PromptStream
from mlx_grpo.distributed import (
    RESUME_ENV, allreduce_bytes, check_world, init_world, lost_rank, sampling_seed,
)
from mlx_grpo.errors import NonFiniteError
from mlx_grpo.models.load import resolve_dtype
from mlx_grpo.rewards import RewardSet
from mlx_grpo.rng import capture_rng, restore_rng, seed_everything
from mlx_grpo.tools import make_toolset
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


def train(cfg, config_path: str | None = None, *, overwrite: bool = False, force: bool = False,
          reward_set: RewardSet | None = None, rows: list[dict] | None = None, progress: bool = True,
          toolset=None) -> Path:
    """Run GRPO as configured; returns the final checkpoint folder.

    With cfg.checkpoint.resume the run continues from the newest checkpoint in output_dir;
    `overwrite` replaces a run found there, `force` resumes despite config differences.
    `reward_set`, `rows` and `toolset` (the Python API's) replace cfg.rewards, the training split and [tools].
    `progress` False draws no progress bar (none is drawn either where the output is not a terminal).
    Under `mlx.launch` this process is one rank of a data-parallel run (distributed.py):
    it samples its share of each step's prompts and only rank 0 writes anything.
    """
    world = init_world(cfg.distributed.timeout_s)
    check_world(cfg, world)
    try:
        # Rank 0 writes the run folder, so it alone holds its lock: a second process is refused.
        with lock_run_folder(cfg.output_dir) if world.is_main else nullcontext():
            return _train(cfg, config_path, world, overwrite, force, reward_set, rows, progress, toolset)
    except RuntimeError as e:  # another rank stopped: one line here, its own reason is in its output
        if (lost := lost_rank(e, world)) is None:
            raise
        raise lost from e


def _train(cfg, config_path, world, overwrite: bool, force: bool, reward_set, rows, progress: bool,
           toolset=None) -> Path:
    out = Path(cfg.output_dir)
    seed_everything(cfg.seed)
    reward_set = reward_set or make_rewards(cfg, config_path)
    toolset = checked_tools(cfg, config_path, toolset)  # a bad tool stops the run before any weight loads
    if world.is_main:
        check_installed(cfg.logging.report_to)  # before any model loads
        warn_if_slow(say)  # Linux without OpenBLAS: one line
    start = open_run(cfg, overwrite=overwrite, force=force) if world.is_main else None  # before any write
    start = share_resume_point(start, out, world)
    t, g = cfg.training, cfg.grpo
    tr = setup(cfg, total_updates=t.max_steps * g.num_iterations, world=world, rows=rows, toolset=toolset)
    # None unless [eval] every > 0; rank 0 evaluates alone, its parameters equal every rank's.
    run_eval = make_training_eval(cfg, tr.tokenizer, reward_set, model=tr.model) if world.is_main else None
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
    draw = make_draw(stream, tr, reward_set, t.prompts_per_step, t.max_steps, world, console.sampling)
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
        metrics = step_metrics(step, tic, drawn, g.scale_rewards, sampling_metrics, update_metrics, world,
                               reward_set.take_timing(), tr.tools)
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


def checked_tools(cfg, config_path, toolset):
    """The Python API's toolset, else the config's [tools] resolved (None without tools); with
    tools, [eval] during training is refused (it samples single-turn completions)."""
    toolset = toolset or make_toolset(cfg, config_path)
    if toolset and cfg.eval.every:
        raise ConfigError("eval.every: evaluation during training samples single-turn completions, not episodes "
                          "with tools; set eval.every = 0 (scripts/tools_learning.py evaluates episodes)")
    return toolset


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
