"""`mlx-grpo train`: the GRPO loop, top to bottom.

One step: take prompts_per_step * gradient_accumulation_steps prompts, sample G completions
for each (one batched decode) and score them (rollout/), turn the scores into group-relative
advantages (algorithm/), make num_iterations optimizer updates on those completions (update/),
then log the step and checkpoint it when due (run/). With grpo.dynamic_sampling, groups whose
rewards are all equal are dropped and more prompts drawn. `setup` (commands/setup.py) builds
what the loop runs on; this file only composes the stages.
"""

from pathlib import Path
import signal
import time

import mlx.core as mx
from mlx.utils import tree_flatten
from tqdm import tqdm

from mlx_grpo.algorithm.dynamic_sampling import fill_groups, fit_parts
from mlx_grpo.commands.evaluate import make_training_eval
from mlx_grpo.commands.setup import Trainer, make_rewards, setup
from mlx_grpo.config import save_config
from mlx_grpo.data.load import PromptStream
from mlx_grpo.distributed import allreduce_bytes, check_world, init_world, local_share, sampling_seed
from mlx_grpo.errors import NonFiniteError, TrainingError
from mlx_grpo.rng import capture_rng, restore_rng, seed_everything
from mlx_grpo.rollout.score import rollout_metrics, sample_and_score
from mlx_grpo.run.checkpoint import save_checkpoint
from mlx_grpo.run.layout import COMPLETIONS, CONFIG, METRICS, checkpoint_dir
from mlx_grpo.run.log import CompletionLog, MetricsLog, format_sample, format_step, truncate_jsonl
from mlx_grpo.run.resume import open_run, restore_training_state, share_resume_point
from mlx_grpo.run.stopping import RunStopped, StopRequest
from mlx_grpo.run.watch import RunWatcher
from mlx_grpo.update.batches import make_batches, step_advantages
from mlx_grpo.update.step import run_updates


def train(cfg, config_path: str | None = None, *, overwrite: bool = False, force: bool = False) -> Path:
    """Run GRPO as configured; returns the final checkpoint folder.

    With cfg.checkpoint.resume the run continues from the newest checkpoint in output_dir;
    `overwrite` replaces a run found there, `force` resumes despite config differences.
    Under `mlx.launch` this process is one rank of a data-parallel run (distributed.py):
    it samples its share of each step's prompts and only rank 0 writes anything.
    """
    out, world = Path(cfg.output_dir), init_world()
    check_world(cfg, world)
    seed_everything(cfg.seed)
    reward_set = make_rewards(cfg, config_path)
    start = open_run(cfg, overwrite=overwrite, force=force) if world.is_main else None  # before any write
    start = share_resume_point(start, out, world)
    t, g = cfg.training, cfg.grpo
    tr = setup(cfg, total_updates=t.max_steps * g.num_iterations, world=world)
    # None unless [eval] every > 0; rank 0 evaluates alone, its parameters equal every rank's.
    run_eval = make_training_eval(cfg, tokenizer=tr.tokenizer, reward_set=reward_set) if world.is_main else None
    groups = t.prompts_per_step * t.gradient_accumulation_steps  # prompts (groups) per step
    stream = prompt_stream(tr.examples, groups, cfg, start)
    log = StepLog(cfg, fresh=start is None) if world.is_main else None
    announce(cfg, tr, world)
    ckpt, first, bad_steps = resume(start, tr, cfg, world) if start else (None, 1, 0)

    def draw(n):  # n of this rank's prompts, taken from the same global stream on every rank
        examples = local_share(stream.take(n * world.size), t.prompts_per_step, world)
        return sample_and_score(tr.model, tr.tokenizer, examples, reward_set, tr.sampler, tr.sampling)

    stop = StopRequest()  # SIGINT/SIGTERM only set a flag, read once per step
    bar = tqdm(range(first, t.max_steps + 1), desc="grpo", dynamic_ncols=True, initial=first - 1,
               total=t.max_steps, disable=not world.is_main)
    for step in stop.watch(bar):
        tic = time.perf_counter()
        mx.reset_peak_memory()
        if g.dynamic_sampling:  # sample and score until enough groups have reward spread
            kept, drawn, sampling_metrics = fill_groups(draw, groups, g.max_resample_rounds)
            kept, parts = fit_parts(kept, t.gradient_accumulation_steps)
        else:  # sample and score
            kept = drawn = draw(groups // world.size)
            sampling_metrics, parts = {}, t.gradient_accumulation_steps
        update_metrics = {}
        if kept.rewards:
            settings = tr.settings.with_parts(parts)
            advantages = step_advantages(kept.rewards, kept.rollout.group_size, settings.scale_rewards, world)
            try:
                batches = make_batches(tr.model, tr.ref_model, kept.rollout, advantages, settings, world)
                update_metrics = run_updates(tr.model, tr.optimizer, batches, tr.grad_fn, settings, world)
            except NonFiniteError as e:  # the step's row then has no loss, as for a skipped update
                bad_steps = skip_or_stop(e, step, bad_steps, t.max_bad_steps, ckpt)
        else:
            tqdm.write(f"step {step}: no group had reward spread in "
                       f"{sampling_metrics['dynamic_sampling/rounds']} rounds; update skipped")
        step_time = world.max(time.perf_counter() - tic)
        metrics = {
            "step": step, **rollout_metrics(drawn, g.scale_rewards, world), **sampling_metrics, **update_metrics,
            "step_time": step_time,
            "tokens_per_second": world.sum([drawn.rollout.num_tokens])[0] / step_time,
            "peak_memory_gb": world.max(mx.get_peak_memory() / 1e9),
        }
        if run_eval and step % cfg.eval.every == 0:
            metrics.update(run_eval(tr.model))
        if log:  # the other ranks only take part in the reductions
            log.write(metrics, drawn, bar, trained=bool(update_metrics))
        requested = world.max(float(stop.requested)) > 0  # all ranks stop after the same step
        if world.is_main and (step % cfg.checkpoint.save_every == 0 or step == t.max_steps or requested):
            ckpt = save(tr, cfg, step, stream, bad_steps)
        if requested:
            stop.restore()
            raise RunStopped(stop.signum or signal.SIGTERM, step, ckpt)
    bar.close()
    if not world.is_main:
        return checkpoint_dir(out, t.max_steps)
    log.finish(ckpt)
    return ckpt


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
    print(f"mlx-grpo: {cfg.model.path} ({trainable:,} trainable parameters) -> {Path(cfg.output_dir)}")
    if world.size > 1:
        print(f"mlx-grpo: data-parallel over {world.size} ranks, "
              f"{allreduce_bytes(tr.model) / 1e6:.2f} MB all-reduced per update")


def resume(start, tr: Trainer, cfg, world) -> tuple[Path, int, int]:
    """Put a checkpoint's state back; returns (checkpoint, first step to run, bad steps so far)."""
    restore_training_state(start, tr.model, tr.optimizer, cfg.lora.enabled)
    if world.is_main:
        for name in (METRICS, COMPLETIONS):
            truncate_jsonl(Path(cfg.output_dir) / name, start.step)
    restore_rng(start.rng)  # last: model loading drew random numbers
    if not world.is_main:  # the checkpoint holds rank 0's PRNG state only
        mx.random.seed(sampling_seed(cfg.seed, world.rank, start.step))
    else:
        print(f"mlx-grpo: resumed from {start.checkpoint} (step {start.step} of {cfg.training.max_steps})")
    return start.checkpoint, start.step + 1, start.bad_steps


def save(tr: Trainer, cfg, step: int, stream: PromptStream, bad_steps: int) -> Path:
    return save_checkpoint(
        cfg.output_dir, step, model=tr.model, tokenizer=tr.tokenizer, optimizer=tr.optimizer, cfg=cfg,
        base_path=tr.base_path, num_layers=tr.num_layers, keep_last=cfg.checkpoint.keep_last,
        trainer_state={"data_position": stream.position, "bad_steps": bad_steps, "rng": capture_rng()},
    )


def skip_or_stop(error: NonFiniteError, step: int, bad_steps: int, max_bad: int, ckpt) -> int:
    """Count one bad step; past training.max_bad_steps stop, naming step, metric and checkpoint."""
    bad_steps += 1
    last = f"last good checkpoint {ckpt}" if ckpt else "no checkpoint written yet"
    if bad_steps > max_bad:
        raise TrainingError(
            f"step {step}: non-finite {error.metric} ({error.value}), the update was not applied; "
            f"{last}; training.max_bad_steps = {max_bad} allows skipping that many bad steps"
        ) from error
    tqdm.write(f"mlx-grpo: step {step}: non-finite {error.metric} ({error.value}); update skipped "
               f"({bad_steps} of training.max_bad_steps = {max_bad})")
    return bad_steps


class StepLog:
    """Rank 0's record of the run: config.toml, metrics.jsonl, completions.jsonl, the console
    and the live warnings."""

    def __init__(self, cfg, fresh: bool):
        out = Path(cfg.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        save_config(cfg, out / CONFIG)
        self.metrics, self.samples = MetricsLog(out, fresh=fresh), CompletionLog(out, fresh=fresh)
        self.watcher = RunWatcher.from_config(cfg.logging)
        self.every, self.completions = cfg.logging.log_every, cfg.logging.log_completions

    def write(self, metrics: dict, drawn, bar, trained: bool) -> None:
        self.metrics.write(metrics)
        for warning in self.watcher.update(metrics):
            tqdm.write(warning)
        bar.set_postfix(reward=f"{metrics['reward']:.3f}", step_time=f"{metrics['step_time']:.2f}s")
        step = metrics["step"]
        if step % self.every == 0 and trained:
            tqdm.write(format_step(metrics))
            for i in range(min(self.completions, len(drawn.rollout.texts))):
                tqdm.write(format_sample(drawn.questions[i], drawn.rollout.texts[i], drawn.rewards[i]))
            self.samples.write(step, drawn.questions, drawn.rollout.texts, drawn.rewards, drawn.per_name,
                               self.completions)

    def finish(self, ckpt) -> None:
        if self.watcher.summary():
            print(self.watcher.summary())
        print(f"mlx-grpo: done; final checkpoint {ckpt}")
