"""Memory before the first step: MLX's buffer cache limit, and worst case first.

A run whose longest samples do not fit should run out of memory in its first minute, not at
step 600 when the longest prompt first meets a completion that runs to max_new_tokens. So,
before step 1, `worst_case_update` runs the update's scoring passes and one micro-batch's
forward and backward on dummy rows at the longest shapes the run can see: every row a
`data.max_prompt_tokens` prompt and a `generation.max_new_tokens` completion, in the largest
micro-batch. Its gradients are dropped, no weight or optimizer state changes, and the random
streams are put back as they were (LoRA dropout draws from them), so the run that follows is
bitwise the one without it. `worst_case_rollout` first fills the rollout's KV cache as far as
it can ever reach. The optimizer's update is not probed (it would change the weights).
"""

import time

import mlx.core as mx

from mlx_grpo.distributed import SINGLE
from mlx_grpo.errors import TrainingError
from mlx_grpo.rng import capture_rng, restore_rng
from mlx_grpo.rollout.sample import Rollout
from mlx_grpo.tools import completion_cap
from mlx_grpo.update.batches import prepare_batches

# MLX keeps freed buffers for reuse up to its cache limit: as much as the memory limit on Metal, where
# a step's freed activations then stay with the process (the memory that "creeps up" in Activity
# Monitor), and 32 MiB on the CPU backend, where every larger temporary then comes as fresh pages
# from the kernel (cpu_exp's polynomial at 4M floats: 8.4 ns a float faulting, 1.5 reused). An eighth
# of the device's memory, on both, still holds a step's temporaries for reuse on most runs; this is
# a choice, not a measurement.
CACHE_SHARE = 1 / 8


def limit_cache(device_bytes: float) -> int:
    """Set MLX's buffer cache to CACHE_SHARE of the device's memory (a cap on Metal, a raise on
    the CPU); returns it in bytes."""
    limit = int(device_bytes * CACHE_SHARE)
    mx.set_cache_limit(limit)
    return limit


KV_CHUNK = 32  # tokens per forward while filling the cache: attention scores stay near decoding's


def worst_case_rollout(model, cfg, world=SINGLE) -> tuple[int, int]:
    """The rollout's KV cache at its largest: `generation.batch_size` (or all) of this rank's
    sequences, each at max_prompt_tokens + max_new_tokens, filled KV_CHUNK tokens at a time in
    eval mode (no random numbers); only the cache is computed, not the logits. Returns
    (sequences, tokens each)."""
    from mlx_lm.models.cache import make_prompt_cache

    t, gen = cfg.training, cfg.generation
    n = t.prompts_per_step // world.size * t.gradient_accumulation_steps * gen.num_generations
    batch, tokens = min(gen.batch_size or n, n), cfg.data.max_prompt_tokens + completion_cap(cfg)
    was_training = model.training
    model.eval()
    try:
        cache = make_prompt_cache(model)
        for start in range(0, tokens, KV_CHUNK):
            model(mx.zeros((batch, min(KV_CHUNK, tokens - start)), dtype=mx.int32), cache=cache)
            mx.eval([c.state for c in cache])
    except RuntimeError as e:  # MLX's allocation failures
        raise probe_failed(f"the rollout's KV cache at the longest shapes ({batch} sequences x {tokens} tokens)",
                           e) from e
    finally:
        model.train(was_training)
    del cache
    return batch, tokens


def probe_failed(what: str, e: RuntimeError) -> TrainingError:
    """One line for a probe MLX could not allocate: what failed, MLX's reason, what to do."""
    return TrainingError(f"worst case first: {what} failed ({' '.join(str(e).split())[:200]}); "
                         "`mlx-grpo plan` suggests smaller settings")


def worst_case_rows(cfg, world=SINGLE) -> Rollout:
    """One accumulation part of this rank's rows, each at the longest prompt and completion.

    Each group has a prompt of its own, as real data does: with shared prefixes a micro-batch
    runs one prefix pass per distinct prompt, and one prompt for every row measured 0.64 GB
    where the real worst case was 0.99 GB."""
    g = cfg.generation.num_generations
    groups = cfg.training.prompts_per_step // world.size
    P, completion = cfg.data.max_prompt_tokens, [0] * completion_cap(cfg)
    prompts = [[k % 2] * P for k in range(groups) for _ in range(g)]  # neighbours differ: no two groups merge
    n = len(prompts)
    return Rollout(prompts, [completion] * n, [""] * n, [False] * n, g)


def worst_case_update(model, ref_model, grad_fn, settings, cfg, world=SINGLE) -> dict:
    """The scoring passes and one forward+backward of the largest micro-batch at the longest
    shapes; nothing kept. Returns {"rows", "tokens", "peak_gb", "seconds"} of the probe."""
    rollout = worst_case_rows(cfg, world)
    rewards = [float(i % 2) for i in range(len(rollout.completion_tokens))]  # some spread: real advantages
    rng = capture_rng()
    was_training = model.training
    tic = time.perf_counter()
    mx.reset_peak_memory()
    try:
        batch = prepare_batches(model, ref_model, rollout, rewards, settings.with_parts(1), world)[0]
        model.train()
        (loss, _), grads = grad_fn(batch)
        mx.eval(loss, grads)
    except RuntimeError as e:  # MLX's allocation failures
        raise probe_failed(f"one update at the longest shapes ({batch_shape(cfg, rollout)})", e) from e
    finally:
        model.train(was_training)
        restore_rng(rng)
    del batch, loss, grads
    return {"rows": batch_rows(cfg, rollout), "tokens": cfg.data.max_prompt_tokens + completion_cap(cfg),
            "peak_gb": mx.get_peak_memory() / 1e9, "seconds": time.perf_counter() - tic}


def batch_rows(cfg, rollout: Rollout) -> int:
    n = len(rollout.completion_tokens)
    return min(cfg.training.micro_batch_size or n, n)


def batch_shape(cfg, rollout: Rollout) -> str:
    return (f"{batch_rows(cfg, rollout)} rows x {cfg.data.max_prompt_tokens} prompt + "
            f"{completion_cap(cfg)} completion tokens")
