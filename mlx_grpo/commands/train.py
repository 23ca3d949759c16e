"""The GRPO loop, top to bottom: config -> data -> rollout -> rewards -> advantages ->
loss and update -> checkpoint and log.

One step: take prompts_per_step * gradient_accumulation_steps prompts, sample G
completions for each (one batched decode), score them, turn the scores into
group-relative advantages, and make num_iterations optimizer updates on those
completions, each accumulating the gradients of gradient_accumulation_steps
micro-batches. With grpo.dynamic_sampling, groups whose rewards are all equal are
dropped and more prompts drawn (dynamic_sampling.py). Every module named here owns its
stage; this file only composes them.
"""

from dataclasses import dataclass, replace
import math
from pathlib import Path
import signal
import time

import mlx.core as mx
import mlx.optimizers as optim
from mlx.utils import tree_flatten, tree_map
import numpy as np
from tqdm import tqdm

from mlx_grpo.models.adapters import load_adapter_weights
from mlx_grpo.algorithm.advantages import group_advantages, group_stats
from mlx_grpo.run.checkpoint import checkpoint_dir, save_checkpoint
from mlx_grpo.update.grad import make_grad_fn
from mlx_grpo.config import save_config
from mlx_grpo.data.load import PromptStream, load_examples
from mlx_grpo.distributed import (
    SINGLE, allreduce_bytes, check_world, init_world, local_share, sampling_seed, share_resume_point,
    sync_parameters,
)
from mlx_grpo.algorithm.dynamic_sampling import ScoredRollout, accumulation_parts, fill_groups, take_groups
from mlx_grpo.errors import NonFiniteError, TrainingError
from mlx_grpo.commands.evaluate import make_training_eval
from mlx_grpo.run.log import CompletionLog, MetricsLog, format_sample, format_step, truncate_jsonl
from mlx_grpo.algorithm.loss import (
    DIVIDES_BY_ACCUMULATION, grpo_loss, pack_sequences, token_logprobs, token_logprobs_and_entropies,
)
from mlx_grpo.models.load import add_adapters, adapters_disabled, checkpoint_layers, load_base
from mlx_grpo.algorithm.overlong import overlong_penalty
from mlx_grpo.run.resume import open_run, restore_training_state
from mlx_grpo.rng import capture_rng, restore_rng, seed_everything
from mlx_grpo.rewards import RewardSet
from mlx_grpo.rollout.sample import generate_completions, make_rollout_sampler
from mlx_grpo.run.stopping import RunStopped, StopRequest
from mlx_grpo.run.watch import RunWatcher

PAD_TO = 32  # few distinct shapes, so compiled kernels are reused
# mx.compile on the micro-batch gradient: correct (tests/test_update_step.py) but measured
# slower on the CPU backend (builtin:tiny fwd+bwd 0.74 s plain vs 0.89 s compiled; `mlx-grpo
# bench` prints both), so off; rerun the bench on Metal before turning it on there.
COMPILE_STEP = False


def make_lr_schedule(tcfg, total_updates: int):
    """Linear warmup from lr/warmup (never 0) to lr, then linear or cosine decay to 0 at
    `total_updates` (transformers' formulas), or constant.

    `warmup_steps` counts optimizer updates; a value in (0, 1) is that share of all updates.
    """
    lr = tcfg.learning_rate
    w = tcfg.warmup_steps
    warmup = round(w * total_updates) if 0 < w < 1 else int(w)
    decay_steps = max(total_updates - warmup, 1)

    def schedule(step):
        step = step.astype(mx.float32)
        warm = lr * mx.minimum((step + 1) / max(warmup, 1), 1.0)
        if tcfg.lr_schedule == "constant":
            return warm
        progress = mx.clip((step - warmup) / decay_steps, 0.0, 1.0)
        if tcfg.lr_schedule == "cosine":
            decayed = lr * 0.5 * (1 + mx.cos(math.pi * progress))
        else:
            decayed = lr * (1 - progress)
        return mx.where(step < warmup, warm, decayed)

    return schedule


def make_optimizer(tcfg, total_updates: int):
    """AdamW with bias correction, as PyTorch's (and TRL's): MLX's default leaves it off, which
    makes the first updates 1.85-2.1x larger at the same learning rate."""
    return optim.AdamW(
        learning_rate=make_lr_schedule(tcfg, total_updates), betas=list(tcfg.adam_betas),
        weight_decay=tcfg.weight_decay, bias_correction=True,
    )


@dataclass
class MicroBatch:
    """The sequences of one forward/backward pass, with the normalisers of the loss."""

    inputs: mx.array  # (n, L) right-padded prompt + completion
    positions: mx.array  # (n, T) logit positions that predict each completion token
    targets: mx.array  # (n, T) completion token ids
    mask: mx.array  # (n, T) 1 on scored tokens
    advantages: mx.array  # (n,)
    num_items: float  # tokens the loss is divided by (bnpo, dapo)
    num_sequences: int  # sequences the loss is divided by (grpo, dr_grpo)
    ref_logp: mx.array | None = None
    old_logp: mx.array | None = None


def build_policy(cfg):
    """The trainable model, its tokenizer, the base's local path, adapted layer count."""
    if cfg.model.quantize_bits and not cfg.lora.enabled:
        raise TrainingError(
            "model.quantize_bits: quantized weights cannot be trained directly; "
            "set lora.enabled = true (QLoRA) or quantize_bits = 0"
        )
    model, tokenizer, base_path = load_base(cfg.model)
    num_layers = len(model.layers)
    if cfg.lora.enabled:
        num_layers = add_adapters(model, cfg.lora, use_dora=getattr(cfg.lora, "method", "lora") == "dora")
        if cfg.lora.resume_adapter:
            load_adapter_weights(model, cfg.lora.resume_adapter)
    if cfg.training.grad_checkpoint:
        checkpoint_layers(model)
    return model, tokenizer, base_path, num_layers


def reference_logprobs(cfg, policy, ref_model, batch: MicroBatch, temperature: float):
    """One no-grad pass of the reference: the frozen copy, or the policy without adapters."""
    if ref_model is not None:
        out = token_logprobs(ref_model, batch.inputs, batch.positions, batch.targets, temperature)
    else:
        with adapters_disabled(policy):
            out = token_logprobs(policy, batch.inputs, batch.positions, batch.targets, temperature)
    return mx.stop_gradient(out)


def make_micro_batches(rollout, advantages, cfg, world=SINGLE) -> list[MicroBatch]:
    """Split a step's rows into the forward/backward chunks of its accumulation steps.

    The step is cut into gradient_accumulation_steps parts of whole groups, each part into
    chunks of micro_batch_size sequences. Every chunk carries its part's normalisers
    (dapo: the whole step's token count), so the summed chunk losses equal the loss of
    the unsplit part. Across ranks each token count is the mean over ranks (see
    distributed.py), so the averaged gradients equal the one-process ones.
    """
    t = cfg.training
    n = len(rollout.completion_tokens)
    part = n // t.gradient_accumulation_steps
    size = t.micro_batch_size or part
    drop = [cfg.grpo.mask_truncated_completions and cut for cut in rollout.truncated]
    kept = [0 if d else len(c) for d, c in zip(drop, rollout.completion_tokens)]
    starts = range(0, n, part)
    local = [float(sum(kept[s:s + part])) for s in starts] + [float(sum(kept))]
    *part_tokens, step_tokens = world.mean(local)
    batches = []
    for start, tokens in zip(starts, part_tokens):
        for lo in range(start, start + part, size):
            rows = range(lo, min(lo + size, start + part))
            inputs, positions, targets, mask = pack_sequences(
                [rollout.prompt_tokens[i] for i in rows],
                [rollout.completion_tokens[i] for i in rows], pad_to=PAD_TO,
            )
            if any(drop[i] for i in rows):
                mask = mask * mx.array([0.0 if drop[i] else 1.0 for i in rows])[:, None]
            batches.append(MicroBatch(
                inputs, positions, targets, mask, advantages[lo:rows.stop],
                num_items=step_tokens if cfg.grpo.loss_type == "dapo" else tokens,
                num_sequences=part,
            ))
    return batches


def make_loss_fn(cfg):
    g, temperature = cfg.grpo, cfg.generation.temperature

    def loss_fn(model, batch: MicroBatch):
        logp, entropies = token_logprobs_and_entropies(
            model, batch.inputs, batch.positions, batch.targets, temperature
        )
        return grpo_loss(
            logp, batch.old_logp, batch.ref_logp, batch.advantages, batch.mask,
            beta=g.beta, epsilon=g.epsilon, epsilon_high=g.epsilon_high, loss_type=g.loss_type,
            max_completion_length=cfg.generation.max_new_tokens,
            num_items=batch.num_items, num_sequences=batch.num_sequences,
            importance_sampling_level=g.importance_sampling_level,
            top_entropy_quantile=g.top_entropy_quantile, entropies=entropies,
        )

    return loss_fn


def update(model, optimizer, batches, grad_fn, cfg, world=SINGLE):
    """One optimizer update from the accumulated gradients of all micro-batches (of all ranks).

    grad_fn: batch -> ((loss, metrics), grads), from `make_grad_fn`.
    """
    k = cfg.training.gradient_accumulation_steps
    scale = 1.0 / k if DIVIDES_BY_ACCUMULATION[cfg.grpo.loss_type] else 1.0
    total_loss, grads, sums, tokens = 0.0, None, {}, 0.0
    for batch in batches:
        (loss, metrics), g = grad_fn(batch)
        g = tree_map(lambda x: x * scale, g)
        grads = g if grads is None else tree_map(mx.add, grads, g)
        n = batch.mask.sum()
        mx.eval(loss, grads, metrics, n)
        total_loss += loss.item() * scale
        tokens += n.item()
        for key, v in metrics.items():
            sums[key] = sums.get(key, 0.0) + v.item() * n.item()
    grads = world.average_gradients(grads)
    total_loss, tokens, *totals = world.sum([total_loss / world.size, tokens, *sums.values()])
    sums = dict(zip(sums, totals))
    if cfg.training.max_grad_norm > 0:
        grads, grad_norm = optim.clip_grad_norm(grads, cfg.training.max_grad_norm)
    else:
        grad_norm = optim.clip_grad_norm(grads, float("inf"))[1]
    mx.eval(grad_norm)
    for name, value in (("loss", total_loss), ("grad_norm", grad_norm.item())):
        if not math.isfinite(value):
            raise NonFiniteError(name, value)
    optimizer.update(model, grads)
    mx.eval(model.parameters(), optimizer.state)
    metrics = {key: v / max(tokens, 1.0) for key, v in sums.items()}
    return total_loss, grad_norm.item(), metrics


def sample_and_score(model, tokenizer, examples, reward_set, sampler, cfg) -> ScoredRollout:
    """G completions per example, scored; DAPO's overlong penalty added when it is on."""
    gen, g = cfg.generation, cfg.grpo
    model.eval()
    rollout = generate_completions(
        model, tokenizer, [e.prompt_tokens for e in examples],
        num_generations=gen.num_generations, max_new_tokens=gen.max_new_tokens,
        sampler=sampler, batch_size=gen.batch_size,
    )
    questions = [e.question for e in examples for _ in range(gen.num_generations)]
    answers = [e.answer for e in examples for _ in range(gen.num_generations)]
    rewards, per_name = reward_set(questions, rollout.texts, answers)
    if g.overlong_penalty > 0:
        lengths = [len(c) for c in rollout.completion_tokens]
        penalty = overlong_penalty(lengths, gen.max_new_tokens, g.overlong_buffer, g.overlong_penalty)
        rewards = [r + p for r, p in zip(rewards, penalty)]
        per_name = {**per_name, "overlong_penalty": penalty}
    return ScoredRollout(rollout, rewards, per_name, questions)


def prepare_batches(model, ref_model, rollout, rewards, cfg, world=SINGLE) -> list[MicroBatch]:
    """Advantages, micro-batches, and the constant log-probs they need: the reference's
    (only when beta > 0) and the sampling policy's (only when num_iterations > 1).

    Across ranks, `rollout` and `rewards` are this rank's rows; advantages are taken over
    every rank's rewards, so that scale_rewards = "batch" sees the whole step.
    """
    gen, g = cfg.generation, cfg.grpo
    everyone = world.gather({"r": rewards})["r"]
    advantages = group_advantages(everyone, gen.num_generations, g.scale_rewards)
    n = len(rewards)
    advantages = advantages[world.rank * n:(world.rank + 1) * n]
    batches = make_micro_batches(rollout, advantages, cfg, world)
    for b in batches:
        if g.beta > 0:
            b.ref_logp = reference_logprobs(cfg, model, ref_model, b, gen.temperature)
        if g.num_iterations > 1:
            b.old_logp = mx.stop_gradient(
                token_logprobs(model, b.inputs, b.positions, b.targets, gen.temperature)
            )
        mx.eval(b.ref_logp, b.old_logp)
    return batches


def run_updates(model, optimizer, batches, grad_fn, cfg, world=SINGLE) -> dict:
    """num_iterations optimizer updates on prepared micro-batches; returns their metrics.

    The first update is on-policy, its ratio exp(logp - stop_gradient(logp)) exactly 1, as
    with num_iterations = 1: no parameter has moved yet. The stored old_logp (the sampling
    policy, scored in eval mode) serves the later updates. Against it, logp scored in train
    mode would put LoRA dropout's noise into the first ratio and clip tokens before any update.
    """
    model.train()
    losses, norms = [], []
    on_policy = [replace(b, old_logp=None) for b in batches]
    for i in range(cfg.grpo.num_iterations):
        parts = on_policy if i == 0 else batches
        loss, grad_norm, loss_metrics = update(model, optimizer, parts, grad_fn, cfg, world)
        lr = optimizer.learning_rate.item()  # the rate this update used
        losses.append(loss)
        norms.append(grad_norm)
    return {
        "loss": float(np.mean(losses)), **loss_metrics,
        "grad_norm": float(np.mean(norms)), "learning_rate": lr,
    }


def optimize(model, optimizer, ref_model, rollout, rewards, cfg, world=SINGLE, grad_fn=None) -> dict:
    """num_iterations updates on one step's completions; returns the update's metrics.

    grad_fn: from `make_grad_fn`, made once per run (a compiled one keeps its traces).
    """
    grad_fn = grad_fn or make_grad_fn(model, make_loss_fn(cfg), compiled=COMPILE_STEP)
    batches = prepare_batches(model, ref_model, rollout, rewards, cfg, world)
    return run_updates(model, optimizer, batches, grad_fn, cfg, world)


def step_groups(scored: ScoredRollout, cfg, world=SINGLE):
    """The groups one update trains on and the config it runs with.

    Dynamic sampling can come back short of groups: train on what there is, in fewer
    accumulation parts (see `accumulation_parts`); none at all means no update.
    """
    t = cfg.training
    if scored.num_groups * world.size == t.prompts_per_step * t.gradient_accumulation_steps:
        return scored, cfg
    used, parts = accumulation_parts(scored.num_groups, t.gradient_accumulation_steps)
    step_cfg = replace(cfg, training=replace(t, gradient_accumulation_steps=max(parts, 1)))
    return take_groups(scored, list(range(used))), step_cfg


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
    }
    for name in drawn.per_name:
        scores = cols[f"rewards/{name}"]
        out[f"rewards/{name}/mean"] = float(np.mean(scores))
        out[f"rewards/{name}/std"] = float(np.std(scores, ddof=1)) if len(scores) > 1 else 0.0
    return out


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


def train(cfg, config_path: str | None = None, *, overwrite: bool = False, force: bool = False) -> Path:
    """Run GRPO as configured; returns the final checkpoint folder.

    With cfg.checkpoint.resume the run continues from the newest checkpoint in output_dir;
    `overwrite` replaces a run found there, `force` resumes despite config differences.
    Under `mlx.launch` this process is one rank of a data-parallel run (distributed.py):
    it samples its share of each step's prompts and only rank 0 writes anything.
    """
    out = Path(cfg.output_dir)
    world = init_world()
    check_world(cfg, world)
    main = world.is_main
    seed_everything(cfg.seed)
    base_dir = Path(config_path).parent if config_path else None
    reward_set = RewardSet.from_config(cfg.rewards, base_dir=base_dir, group_size=cfg.generation.num_generations)
    start = open_run(cfg, overwrite=overwrite, force=force) if main else None  # before any write
    start = share_resume_point(start, out, world)
    model, tokenizer, base_path, num_layers = build_policy(cfg)
    ref_model = None
    if cfg.grpo.beta > 0 and not cfg.lora.enabled:
        ref_model = load_base(cfg.model, base_path)[0]
        ref_model.freeze()
    sync_parameters(model, world)
    # Loading models draws random numbers (layer init before the weights arrive), and how many
    # depends on beta, LoRA and the reference; sampling starts from the seed whatever they are.
    mx.random.seed(sampling_seed(cfg.seed, world.rank))
    examples = load_examples(cfg.data, tokenizer, seed=cfg.seed)
    # None unless [eval] every > 0; rank 0 evaluates alone, its parameters equal every rank's.
    run_eval = make_training_eval(cfg, tokenizer, reward_set) if main else None
    t, gen, g = cfg.training, cfg.generation, cfg.grpo
    prompts_per_update = t.prompts_per_step * t.gradient_accumulation_steps
    if len(examples) < prompts_per_update:
        raise TrainingError(
            f"data.dataset: {len(examples)} usable prompts, fewer than the "
            f"{prompts_per_update} one step needs (training.prompts_per_step * gradient_accumulation_steps)"
        )
    stream = PromptStream(examples, cfg.data.shuffle, cfg.seed, position=start.data_position if start else 0)
    sampler = make_rollout_sampler(gen.temperature, gen.top_p, gen.top_k, gen.min_p)
    optimizer = make_optimizer(t, t.max_steps * g.num_iterations)
    if main:
        out.mkdir(parents=True, exist_ok=True)
        save_config(cfg, out / "config.toml")
        log = MetricsLog(out, fresh=start is None)
        samples_log = CompletionLog(out, fresh=start is None)
    watcher = RunWatcher.from_config(cfg.logging)
    trainable = sum(v.size for _, v in tree_flatten(model.trainable_parameters()))
    if main:
        print(f"mlx-grpo: {cfg.model.path} ({trainable:,} trainable parameters) -> {out}")
    if main and world.size > 1:
        print(f"mlx-grpo: data-parallel over {world.size} ranks, "
              f"{allreduce_bytes(model) / 1e6:.2f} MB all-reduced per update")

    grad_fn = make_grad_fn(model, make_loss_fn(cfg), compiled=COMPILE_STEP)

    def draw(n):  # n of this rank's prompts, taken from the same global stream on every rank
        examples = local_share(stream.take(n * world.size), t.prompts_per_step, world)
        return sample_and_score(model, tokenizer, examples, reward_set, sampler, cfg)

    ckpt, first, bad_steps = None, 1, 0
    if start is not None:
        restore_training_state(start, model, optimizer, cfg.lora.enabled)
        for name in ("metrics.jsonl", "completions.jsonl"):
            if main:
                truncate_jsonl(out / name, start.step)
        ckpt, first, bad_steps = start.checkpoint, start.step + 1, start.bad_steps
        restore_rng(start.rng)  # last: model loading above drew random numbers
        if not main:  # the checkpoint holds rank 0's PRNG state only
            mx.random.seed(sampling_seed(cfg.seed, world.rank, start.step))
        if main:
            print(f"mlx-grpo: resumed from {ckpt} (step {start.step} of {t.max_steps})")

    def save(step):
        return save_checkpoint(
            out, step, model=model, tokenizer=tokenizer, optimizer=optimizer, cfg=cfg,
            base_path=base_path, num_layers=num_layers, keep_last=cfg.checkpoint.keep_last,
            trainer_state={"data_position": stream.position, "bad_steps": bad_steps, "rng": capture_rng()},
        )

    stop = StopRequest()  # SIGINT/SIGTERM only set a flag, read once per step in end_of_step

    def end_of_step(step, ckpt):
        """Checkpoint when due or when a signal asked to stop; then stop if asked."""
        requested = world.max(float(stop.requested)) > 0  # all ranks stop after the same step
        if main and (step % cfg.checkpoint.save_every == 0 or step == t.max_steps or requested):
            ckpt = save(step)
        if requested:
            stop.restore()
            raise RunStopped(stop.signum or signal.SIGTERM, step, ckpt)
        return ckpt

    def log_step(metrics, drawn, step, update_metrics):
        log.write(metrics)
        for warning in watcher.update(metrics):
            tqdm.write(warning)
        bar.set_postfix(reward=f"{metrics['reward']:.3f}", step_time=f"{metrics['step_time']:.2f}s")
        if step % cfg.logging.log_every == 0 and update_metrics:
            tqdm.write(format_step(metrics))
            for i in range(min(cfg.logging.log_completions, len(drawn.rollout.texts))):
                tqdm.write(format_sample(drawn.questions[i], drawn.rollout.texts[i], drawn.rewards[i]))
            samples_log.write(step, drawn.questions, drawn.rollout.texts, drawn.rewards, drawn.per_name,
                              cfg.logging.log_completions)

    bar = tqdm(range(first, t.max_steps + 1), desc="grpo", dynamic_ncols=True, initial=first - 1,
               total=t.max_steps, disable=not main)
    for step in stop.watch(bar):
        tic = time.perf_counter()
        mx.reset_peak_memory()
        if g.dynamic_sampling:
            scored, drawn, sampling_metrics = fill_groups(draw, prompts_per_update, g.max_resample_rounds)
        else:
            scored = drawn = draw(prompts_per_update // world.size)
            sampling_metrics = {}
        scored, step_cfg = step_groups(scored, cfg, world)
        if scored.rewards:
            try:
                update_metrics = optimize(
                    model, optimizer, ref_model, scored.rollout, scored.rewards, step_cfg, world, grad_fn
                )
            except NonFiniteError as e:  # the step's row then has no loss, as for a skipped update
                bad_steps = skip_or_stop(e, step, bad_steps, t.max_bad_steps, ckpt)
                update_metrics = {}
        else:
            update_metrics = {}
            tqdm.write(f"step {step}: no group had reward spread in "
                       f"{sampling_metrics['dynamic_sampling/rounds']} rounds; update skipped")
        rollout_stats = rollout_metrics(drawn, g.scale_rewards, world)
        step_time = world.max(time.perf_counter() - tic)
        metrics = {
            "step": step,
            **rollout_stats,
            **sampling_metrics,
            **update_metrics,
            "step_time": step_time,
            "tokens_per_second": world.sum([drawn.rollout.num_tokens])[0] / step_time,
            "peak_memory_gb": world.max(mx.get_peak_memory() / 1e9),
        }
        if run_eval and step % cfg.eval.every == 0:
            metrics.update(run_eval(model))
        if main:  # the other ranks only take part in the reductions
            log_step(metrics, drawn, step, update_metrics)
        ckpt = end_of_step(step, ckpt)
    bar.close()
    if not main:
        return checkpoint_dir(out, t.max_steps)
    if watcher.summary():
        print(watcher.summary())
    print(f"mlx-grpo: done; final checkpoint {ckpt}")
    return ckpt
