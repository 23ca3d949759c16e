"""Sampling G completions per prompt with mlx-lm's batched generator.

Each prompt is prefilled once; its KV cache is handed to all G of its completions, which
then decode together with every other sequence of the step (up to `batch_size` at once).
The EOS token that ends a completion is kept: the policy must be scored on it, or it
never learns to stop. With `sampling_logprob` the log-prob of every sampled token under the
distribution the sampler drew it from is kept too, to measure (and correct) the gap between
that distribution and the one the loss scores.
"""

from dataclasses import dataclass

import mlx.core as mx
from mlx_lm.generate import BatchGenerator
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p, make_sampler

from mlx_grpo.cpu_exp import logsumexp
from mlx_grpo.rollout import engine as compiled_engine
from mlx_grpo.rollout.inverse_cdf import InverseCdfSampler


@dataclass
class Rollout:
    """N = P * G completions in prompt-major order."""

    prompt_tokens: list[list[int]]  # the prompt of each row (repeated G times)
    completion_tokens: list[list[int]]  # sampled ids, EOS included when it was sampled
    texts: list[str]  # decoded completions, without the EOS token
    truncated: list[bool]  # stopped by max_new_tokens rather than by EOS
    group_size: int
    # per completion token, the log-prob under the distribution it was sampled from; None = not kept
    sampling_logprobs: list[list[float]] | None = None
    # tool episodes (rollout/episodes.py): per completion token 1 if sampled, 0 if a tool's (None: all sampled)
    trainable: list[list[float]] | None = None
    episodes: list[dict] | None = None  # per row: turns, tool calls, failures, per-tool counts, messages
    tool_time: dict | None = None  # tools/seconds, tools/idle_seconds of the rollout

    @property
    def num_tokens(self) -> int:
        """Tokens the policy sampled (a tool's tokens are not)."""
        if self.trainable is not None:
            return int(sum(sum(t) for t in self.trainable))
        return sum(len(c) for c in self.completion_tokens)


def make_rollout_sampler(temperature: float, top_p: float, top_k: int, min_p: float):
    """The sampler of these settings: with nothing to truncate at T > 0 an inverse-CDF draw
    (rollout/inverse_cdf.py: the same distribution, 4 ms against 30 ms for 8 rows at Qwen's
    vocabulary), else mlx-lm's."""
    if temperature > 0 and top_p >= 1.0 and top_k == 0 and min_p == 0.0:
        return InverseCdfSampler(temperature)
    return mlx_lm_sampler(temperature, top_p, top_k, min_p)


def mlx_lm_sampler(temperature: float, top_p: float, top_k: int, min_p: float):
    """mlx-lm's own sampler of these settings (the bench's MLX limit draws with it)."""
    # mlx-lm reads top_p == 0 as "off"; our config uses 1.0 for that, as HF does.
    return make_sampler(temp=temperature, top_p=top_p if top_p < 1.0 else 0.0, min_p=min_p, top_k=top_k)


def make_sampling_logprob(temperature: float, top_p: float, top_k: int, min_p: float):
    """(logprobs (B, V), tokens (B,)) -> (B,): each token's log-prob under the distribution that
    `make_rollout_sampler` draws from, given the untempered log-softmax it was handed.

    mlx-lm's sampler truncates first (top_p, then min_p, then top_k, in make_sampler's order and
    with its own functions) and divides by the temperature last; the loss scores
    softmax(logits / T) over the whole vocabulary, so the two differ whenever a truncation is
    on. Greedy decoding (T = 0) puts all mass on the sampled token: log-prob 0.
    """
    steps = []
    if 0 < top_p < 1.0:
        steps.append(lambda x: apply_top_p(x, top_p))
    if min_p != 0.0:
        steps.append(lambda x: apply_min_p(x, min_p))
    if top_k > 0:
        steps.append(lambda x: apply_top_k(x, top_k))

    def logprob(logprobs: mx.array, tokens: mx.array) -> mx.array:
        if temperature == 0:
            return mx.zeros(tokens.shape, dtype=mx.float32)
        for step in steps:
            logprobs = step(logprobs)
        z = (logprobs * (1.0 / temperature)).astype(mx.float32)  # categorical_sampling's scaling
        picked = mx.take_along_axis(z, tokens[:, None], axis=-1).squeeze(-1)
        if temperature == 1.0 and not steps:  # already a log-softmax: its logsumexp is 0
            return picked
        return picked - logsumexp(z)

    return logprob


def _prefill(model, prompt: list[int]):
    """A KV cache holding prompt[:-1]; decoding then starts from the last prompt token."""
    cache = make_prompt_cache(model)
    if len(prompt) > 1:
        model(mx.array(prompt[:-1])[None], cache=cache)
        mx.eval([c.state for c in cache])
    return cache


def generate_completions(
    model,
    tokenizer,
    prompts: list[list[int]],
    *,
    num_generations: int,
    max_new_tokens: int,
    sampler,
    batch_size: int = 0,
    sampling_logprob=None,
    on_progress=None,
    engine: str = "batch_generator",
) -> Rollout:
    """Sample `num_generations` completions for each prompt, all decoded in one batch.

    `sampling_logprob` (from `make_sampling_logprob`, with the sampler's settings) keeps each
    sampled token's log-prob in `Rollout.sampling_logprobs`; it draws no random numbers, so the
    tokens are the same with or without it. on_progress(tokens sampled, sequences finished,
    sequences) is called after each decode step. `engine`: "compiled" decodes with
    rollout/engine.py (the model must be one it supports), "auto" there where it can, else (and
    for "batch_generator", or a batch_size that is not a multiple of num_generations) with mlx-lm's
    BatchGenerator.
    """
    # the compiled loop decodes whole groups: a batch_size that splits one is BatchGenerator's to keep
    whole_groups = batch_size % num_generations == 0
    if engine != "batch_generator" and whole_groups and (engine == "compiled" or compiled_engine.unsupported(model) is None):
        return _compiled_rollout(model, tokenizer, prompts, num_generations, max_new_tokens, sampler,
                                 batch_size, sampling_logprob, on_progress)
    eos = sorted(tokenizer.eos_token_ids)
    n = len(prompts) * num_generations
    gen = BatchGenerator(
        model,
        max_tokens=max_new_tokens,
        stop_tokens=[[t] for t in eos],
        sampler=sampler,
        completion_batch_size=batch_size or n,
        prefill_batch_size=min(batch_size or n, 64),
    )
    uids = []
    try:
        for prompt in prompts:
            cache = _prefill(model, prompt)
            caches = [cache] * num_generations if len(prompt) > 1 else None
            uids += gen.insert([prompt[-1:]] * num_generations, caches=caches)
        tokens = {uid: [] for uid in uids}
        finish, sampled = {}, 0
        picked = []  # (uids, log-probs (B,)) of each decode step, evaluated asynchronously
        while responses := gen.next_generated():
            if sampling_logprob is not None:
                lp = sampling_logprob(mx.stack([r.logprobs for r in responses]),
                                      mx.array([r.token for r in responses]))
                mx.async_eval(lp)  # evaluated now, so the (B, V) inputs are not kept alive
                picked.append(([r.uid for r in responses], lp))
            for r in responses:
                tokens[r.uid].append(r.token)
                if r.finish_reason is not None:
                    finish[r.uid] = r.finish_reason
            if on_progress:
                sampled += len(responses)
                on_progress(sampled, len(finish), n)
    finally:
        gen.close()
    sampling_logprobs = None
    if sampling_logprob is not None:
        by_uid = {uid: [] for uid in uids}
        for step_uids, lp in picked:
            for uid, v in zip(step_uids, lp.tolist()):
                by_uid[uid].append(v)
        sampling_logprobs = [by_uid[u] for u in uids]
    return _rollout(tokenizer, prompts, num_generations, [tokens[u] for u in uids],
                    [finish[u] == "length" for u in uids], sampling_logprobs)


def _compiled_rollout(model, tokenizer, prompts, num_generations, max_new_tokens, sampler, batch_size,
                      sampling_logprob, on_progress) -> Rollout:
    # batch_size bounds the rows decoded at once, as BatchGenerator's does: whole groups at a time
    per_batch = (batch_size or len(prompts) * num_generations) // num_generations
    tokens, logprobs, truncated = [], [], []
    for i in range(0, len(prompts), per_batch):
        t, lp, tr = compiled_engine.decode(
            model, prompts[i:i + per_batch], group_size=num_generations, max_new_tokens=max_new_tokens,
            sampler=sampler, eos=tokenizer.eos_token_ids, logprob=sampling_logprob, on_progress=on_progress)
        tokens += t
        logprobs += lp
        truncated += tr
    return _rollout(tokenizer, prompts, num_generations, tokens, truncated,
                    logprobs if sampling_logprob is not None else None)


def _rollout(tokenizer, prompts, num_generations, completions, truncated, sampling_logprobs) -> Rollout:
    eos = set(tokenizer.eos_token_ids)
    return Rollout(
        prompt_tokens=[p for p in prompts for _ in range(num_generations)],
        completion_tokens=completions,
        texts=[tokenizer.decode(c[:-1] if c and c[-1] in eos else c) for c in completions],
        truncated=truncated,
        group_size=num_generations,
        sampling_logprobs=sampling_logprobs,
    )
