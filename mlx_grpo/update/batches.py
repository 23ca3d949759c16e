"""A step's completions as the micro-batches of its updates, with the constants they need.

The step is cut into `accumulation_steps` parts of whole groups, each part into chunks of
`micro_batch_size` sequences; with shared prefixes under grad_checkpoint and LoRA a chunk never
spans two groups (`_chunks`). Every chunk carries its part's normalisers (dapo: the whole
step's token count), so the summed chunk losses equal the loss of the unsplit part. Across
ranks each token count is the mean over ranks (see distributed.py), so the averaged
gradients equal the one-process ones.
"""

from dataclasses import dataclass

import mlx.core as mx

from mlx_grpo.algorithm.advantages import group_advantages
from mlx_grpo.algorithm.loss import pack_sequences
from mlx_grpo.algorithm.prefix import batch_logprobs, pack_groups
from mlx_grpo.distributed import SINGLE
from mlx_grpo.models.reference import has_reference, reference_logprobs
from mlx_grpo.update.settings import UpdateSettings

PAD_TO = 32  # few distinct shapes, so compiled kernels are reused


@dataclass
class MicroBatch:
    """The sequences of one forward/backward pass, with the normalisers of the loss."""

    inputs: mx.array  # (n, L) right-padded prompt + completion; shared prefix: (n, T) completion inputs
    positions: mx.array | None  # (n, T) logit positions that predict each completion token; None if shared
    targets: mx.array  # (n, T) completion token ids
    mask: mx.array  # (n, T) 1 on scored tokens
    advantages: mx.array  # (n,)
    num_items: float  # tokens the loss is divided by (bnpo, dapo)
    num_sequences: int  # sequences the loss is divided by (grpo, dr_grpo)
    ref_logp: mx.array | None = None
    old_logp: mx.array | None = None
    prefix: mx.array | None = None  # shared prefix: (groups, C) each run of rows' prompt[:-1], left-padded
    prefix_pad: mx.array | None = None  # shared prefix: (groups,) padding columns of each
    row_group: mx.array | None = None  # shared prefix: each row's group, (n,) or (groups, n / groups)
    sampling_logp: mx.array | None = None  # (n, T) the sampler's log-prob of each token; 0 on padding


def step_advantages(rewards, group_size: int, scale: str, world=SINGLE) -> mx.array:
    """This rank's rows of the advantages taken over every rank's rewards, so that
    scale_rewards = "batch" sees the whole step."""
    everyone = world.gather({"r": rewards})["r"]
    n = len(rewards)
    return group_advantages(everyone, group_size, scale)[world.rank * n:(world.rank + 1) * n]


def make_micro_batches(rollout, advantages, s: UpdateSettings, world=SINGLE) -> list[MicroBatch]:
    """Split a step's rows into the forward/backward chunks of its accumulation parts."""
    n = len(rollout.completion_tokens)
    part = n // s.accumulation_steps
    size = s.micro_batch_size or part
    drop = [s.mask_truncated and cut for cut in rollout.truncated]
    # tokens the loss scores: a tool's tokens (rollout.trainable 0) are context, not the policy's
    scored = [len(c) for c in rollout.completion_tokens] if rollout.trainable is None else [
        sum(t) for t in rollout.trainable]
    kept = [0 if d else n for d, n in zip(drop, scored)]
    starts = range(0, n, part)
    local = [float(sum(kept[s0:s0 + part])) for s0 in starts] + [float(sum(kept))]
    *part_tokens, step_tokens = world.mean(local)
    batches = []
    by_group = s.shared_prefix and s.one_group_per_pass
    for start, tokens in zip(starts, part_tokens):
        for rows in _chunks(rollout.prompt_tokens, start, start + part, size, by_group):
            prompts = [rollout.prompt_tokens[i] for i in rows]
            completions = [rollout.completion_tokens[i] for i in rows]
            shared = {}
            if s.shared_prefix:  # a chunk holding part of a group shares the prefix among its rows
                shared["prefix"], shared["prefix_pad"], shared["row_group"], inputs, targets, mask = pack_groups(
                    prompts, completions, pad_to=PAD_TO)
                positions = None
            else:
                inputs, positions, targets, mask = pack_sequences(prompts, completions, pad_to=PAD_TO)
            if any(drop[i] for i in rows):
                mask = mask * mx.array([0.0 if drop[i] else 1.0 for i in rows])[:, None]
            if rollout.trainable is not None:  # tool tokens out of the loss, the KL, the entropy and the weights
                T = mask.shape[1]
                mask = mask * mx.array([list(rollout.trainable[i]) + [0.0] * (T - len(rollout.trainable[i]))
                                        for i in rows])
            if rollout.sampling_logprobs is not None:
                T = mask.shape[1]
                shared["sampling_logp"] = mx.array(
                    [list(rollout.sampling_logprobs[i]) + [0.0] * (T - len(rollout.sampling_logprobs[i])) for i in rows])
            batches.append(MicroBatch(
                inputs, positions, targets, mask, advantages[rows.start:rows.stop],
                num_items=step_tokens if s.loss_type == "dapo" else tokens,
                num_sequences=part, **shared,
            ))
    return batches


def _chunks(prompts, start: int, stop: int, size: int, by_group: bool) -> list[range]:
    """The rows of a part's micro-batches: `size` at a time from its start, or, `by_group`, each
    group's (run of equal prompts') rows `size` at a time.

    A shared-prefix pass holds its groups' prompts at once, and under grad_checkpoint so does each
    recomputed layer. Measured (4 groups of 4, 2 steps, validate_memory_plan.py's configs): LoRA
    r8 builtin:tiny on 333-token prompts peaked at 0.127 GB as one pass and 0.036 GB a group at a
    time, builtin:small 0.657 and 0.243 GB (its step 7.68 and 7.65 s), on short prompts 0.231 and
    0.140 GB (2.11 and 2.48 s). A full fine-tune pays for it with the gradient summed over the
    micro-batches, a model-sized array beside the next one's: builtin:small 0.488 GB as one pass,
    0.565 GB a group at a time. So only LoRA's micro-batches are cut by group
    (UpdateSettings.one_group_per_pass)."""
    if not by_group:
        return [range(lo, min(lo + size, stop)) for lo in range(start, stop, size)]
    chunks, lo = [], start
    while lo < stop:
        hi = next((i for i in range(lo, stop) if prompts[i] != prompts[lo]), stop)
        chunks += [range(a, min(a + size, hi)) for a in range(lo, hi, size)]
        lo = hi
    return chunks


def make_batches(model, ref_model, rollout, advantages, s: UpdateSettings, world=SINGLE) -> list[MicroBatch]:
    """The micro-batches of a step with their constant log-probs: the reference's (only with a
    KL term) and the sampling policy's (only when num_iterations > 1, for the later updates)."""
    batches = make_micro_batches(rollout, advantages, s, world)
    for b in batches:
        if has_reference(s.beta):
            b.ref_logp = reference_logprobs(model, ref_model, b, s.temperature)
        if s.num_iterations > 1:
            b.old_logp = mx.stop_gradient(
                batch_logprobs(model, b, s.temperature)
            )
        mx.eval(b.ref_logp, b.old_logp)
    return batches


def prepare_batches(model, ref_model, rollout, rewards, settings, world=SINGLE) -> list[MicroBatch]:
    """`make_batches` from one step's rewards: their advantages first.

    `rollout` and `rewards` are this rank's rows; `settings` an UpdateSettings (or a Config).
    """
    s = UpdateSettings.of(settings)
    advantages = step_advantages(rewards, rollout.group_size, s.scale_rewards, world)
    return make_batches(model, ref_model, rollout, advantages, s, world)
