"""One step's updates: the loss of a micro-batch, accumulated gradients, clipping, the NaN
check, and `num_iterations` optimizer updates on the same completions.

grad_fn: batch -> ((loss, metrics), grads), from `make_update_grad_fn`, made once per run (a
compiled one keeps its traces).
"""

from dataclasses import replace
import math

import mlx.core as mx
import mlx.optimizers as optim
from mlx.utils import tree_map
import numpy as np

from mlx_grpo.algorithm.loss import DIVIDES_BY_ACCUMULATION, grpo_loss
from mlx_grpo.algorithm.prefix import batch_logprobs_and_entropies
from mlx_grpo.distributed import SINGLE
from mlx_grpo.errors import NonFiniteError
from mlx_grpo.update.batches import MicroBatch, prepare_batches
from mlx_grpo.update.grad import make_grad_fn
from mlx_grpo.update.optimizer import apply_update
from mlx_grpo.update.settings import UpdateSettings

# mx.compile on the micro-batch gradient where it measures faster: the CPU backend gave it
# slower once (builtin:tiny 0.89 s vs 0.74 s plain) and faster in medians of 3-4 runs (tiny
# 0.49 vs 0.51 s, small 4.63 vs 4.92 s), so a constant would be wrong somewhere; "auto" times
# both at each new shape and keeps the faster (update/grad.FasterOf).
COMPILE_STEP = "auto"

# One mx.eval per micro-batch, not one per update: built lazily, the whole update's graph keeps
# every micro-batch's activations alive until the single eval, so the peak grows with the number
# of micro-batches, and it was no faster. Measured (P=2 x G=8, 64-token completions on 60-token
# prompts, shared prefix, beta 0; 2-core CPU, load average 5-11, so times are rough): builtin:tiny
# at micro-batch 2 (8 parts) peak 26.1 MB per micro-batch vs 90.1 MB once, update median 0.78 s
# vs 1.29 s; at micro-batch 4, 36.4 vs 80.8 MB; builtin:small at micro-batch 4, 562 vs 878 MB,
# 6.98 vs 8.14 s. mx.async_eval per micro-batch kept the per-micro-batch peak but was not
# measurably faster (0.90 s vs 0.78 s on tiny). tests/test_update_step.py pins the peak.
EVAL_EACH_MICRO_BATCH = True

# Across ranks, evaluate the last micro-batch's backward pass together with the gradient
# all-reduce, whose buckets then go out while the rest of that backward pass runs (allreduce.py).
# On Metal, the case it is for: the backward runs on the GPU, the all-reduce on a CPU stream (not
# measured: no Mac here). Off on the CPU backend, where both compete for the same cores: measured
# slower, builtin:small full fine-tune, 2 ranks in network namespaces over a 25 MB/s tbf link on
# the 2-core CI machine (load 9), medians of 5 updates: 25.7 s overlapped, 17.8 s one after the
# other (scripts/link_scaling.py --overlap).
OVERLAP_ALLREDUCE = mx.metal.is_available()


def make_loss_fn(settings):
    """(model, batch) -> (loss, metrics): the GRPO loss of one micro-batch (settings: an
    UpdateSettings, or a Config)."""
    s = UpdateSettings.of(settings)

    def loss_fn(model, batch: MicroBatch):
        logp, entropies = batch_logprobs_and_entropies(model, batch, s.temperature)
        return grpo_loss(
            logp, batch.old_logp, batch.ref_logp, batch.advantages, batch.mask,
            beta=s.beta, epsilon=s.epsilon, epsilon_high=s.epsilon_high, loss_type=s.loss_type,
            max_completion_length=s.max_new_tokens,
            num_items=batch.num_items, num_sequences=batch.num_sequences,
            importance_sampling_level=s.importance_sampling_level,
            top_entropy_quantile=s.top_entropy_quantile, entropies=entropies,
            sampling_logp=batch.sampling_logp,
            importance_sampling_correction=s.importance_sampling_correction,
            importance_sampling_cap=s.importance_sampling_cap,
            importance_sampling_floor=s.importance_sampling_floor,
        )

    return loss_fn


def make_update_grad_fn(model, settings):
    """The run's grad_fn: the loss's gradient, compiled when COMPILE_STEP says so (shared-prefix
    micro-batches too: their prompts are padded to `prefix_columns`, so a run traces a few
    shapes, not one per prompt length)."""
    return make_grad_fn(model, make_loss_fn(UpdateSettings.of(settings)), compiled=COMPILE_STEP)


def update(model, optimizer, batches, grad_fn, settings, world=SINGLE, on_batch=None,
           eval_each=EVAL_EACH_MICRO_BATCH):
    """One optimizer update from the accumulated gradients of all micro-batches (of all ranks);
    returns (loss, grad_norm, loss metrics). A NaN or inf raises before the update is applied.

    on_batch() is called after each micro-batch's forward and backward. eval_each: evaluate after
    every micro-batch (see EVAL_EACH_MICRO_BATCH) or build the whole update lazily and evaluate
    it once."""
    s = UpdateSettings.of(settings)
    scale = 1.0 / s.accumulation_steps if DIVIDES_BY_ACCUMULATION[s.loss_type] else 1.0
    grads, parts = None, []
    for i, batch in enumerate(batches):
        (loss, metrics), g = grad_fn(batch)
        g = tree_map(lambda x: x * scale, g)
        grads = g if grads is None else tree_map(mx.add, grads, g)
        parts.append((loss, batch.mask.sum(), metrics))
        if eval_each and not (i == len(batches) - 1 and OVERLAP_ALLREDUCE and world.size > 1):
            mx.eval(grads, parts[-1])
        if on_batch:
            on_batch()
    grads = world.average_gradients(grads, s.reduce_dtype, pending=parts)  # evaluates grads and parts
    total_loss, tokens, sums, extremes = 0.0, 0.0, {}, {}
    for loss, n, metrics in parts:  # summed in Python floats, as the logged metrics always were
        total_loss += loss.item() * scale
        tokens += n.item()
        for key, v in metrics.items():
            if key.endswith(("_max", "/max", "/min")):
                _keep_extreme(extremes, key, v.item())
            else:
                sums[key] = sums.get(key, 0.0) + v.item() * n.item()
    total_loss, tokens, *totals = world.sum([total_loss / world.size, tokens, *sums.values()])
    sums = dict(zip(sums, totals))
    grad_norm = optim.clip_grad_norm(grads, float("inf"))[1]  # the norm before clipping
    mx.eval(grad_norm)
    for name, value in (("loss", total_loss), ("grad_norm", grad_norm.item())):
        if not math.isfinite(value):
            raise NonFiniteError(name, value)
    apply_update(model, optimizer, grads, grad_norm, s.max_grad_norm)
    mx.eval(model.parameters(), optimizer.state)
    metrics = {key: v / max(tokens, 1.0) for key, v in sums.items()}
    for key, v in extremes.items():  # over every rank: the min as minus the max of minus it
        v = -world.max(-v) if key.endswith("/min") else world.max(v)
        if math.isfinite(v):
            metrics[key] = v
    return total_loss, grad_norm.item(), metrics


def _keep_extreme(extremes: dict, key: str, value: float) -> None:
    """A max or min metric combined over micro-batches as a max or min, not a token mean. A
    micro-batch with no valid token reports +-inf, which loses to any real value (the key is
    dropped when no micro-batch of any rank had one)."""
    pick = min if key.endswith("/min") else max
    extremes[key] = pick(extremes[key], value) if key in extremes else value


def run_updates(model, optimizer, batches, grad_fn, settings, world=SINGLE, on_progress=None) -> dict:
    """num_iterations optimizer updates on prepared micro-batches; returns their metrics.
    on_progress(micro-batches done, micro-batches in all the updates) follows each micro-batch.

    The first update is on-policy, its ratio exp(logp - stop_gradient(logp)) exactly 1, as
    with num_iterations = 1: no parameter has moved yet. The stored old_logp (the sampling
    policy, scored in eval mode) serves the later updates. Against it, logp scored in train
    mode would put LoRA dropout's noise into the first ratio and clip tokens before any update.
    """
    s = UpdateSettings.of(settings)
    model.train()
    losses, norms = [], []
    on_policy = [replace(b, old_logp=None) for b in batches]
    done, total = 0, s.num_iterations * len(batches)
    if on_progress:  # the update has begun: its first micro-batch can take long
        on_progress(0, total)

    def on_batch():
        nonlocal done
        done += 1
        on_progress(done, total)

    for i in range(s.num_iterations):
        parts = on_policy if i == 0 else batches
        loss, grad_norm, loss_metrics = update(model, optimizer, parts, grad_fn, s, world,
                                               on_batch=on_batch if on_progress else None)
        lr = optimizer.learning_rate.item()  # the rate this update used
        losses.append(loss)
        norms.append(grad_norm)
    return {
        "loss": float(np.mean(losses)), **loss_metrics,
        "grad_norm": float(np.mean(norms)), "learning_rate": lr,
    }


def optimize(model, optimizer, ref_model, rollout, rewards, settings, world=SINGLE, grad_fn=None,
             on_progress=None) -> dict:
    """The whole update stage on one step's scored completions: advantages, micro-batches and
    their constants, then num_iterations updates; returns the update's metrics (on_progress: as
    run_updates takes it)."""
    s = UpdateSettings.of(settings)
    grad_fn = grad_fn or make_update_grad_fn(model, s)
    batches = prepare_batches(model, ref_model, rollout, rewards, s, world)
    return run_updates(model, optimizer, batches, grad_fn, s, world, on_progress)
