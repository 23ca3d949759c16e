"""Sampling softmax(logits / T) by its inverse CDF, in two levels: a chunk of the vocabulary by the
chunks' masses, then a token of that chunk by the tokens' masses, with two uniforms a row.

mx.random.categorical (what mlx-lm's sampler calls) adds Gumbel noise to every logit: per row two
logs and a threefry hash for each of the vocabulary's 151,936 entries. On a 2-core EPYC with
OpenBLAS, 8 rows took 30-31 ms that way (with the log-softmax before it and the sampled token's
log-prob after it), against 4 ms here, where one exp pass gives the weights, and their chunk sums
give both the draw and the log-prob. Two levels keep float32's resolution: a one-level cumulative
sum over the whole vocabulary has an ulp of 6e-8 near 1, where a tail token's mass is smaller;
here a chunk's tokens are drawn relative to the chunk's own mass.

Used where the sampler has nothing to truncate (top_p 1, top_k 0, min_p 0), T > 0 and the
vocabulary has at least cpu_exp.WIDE entries; mlx-lm's draw otherwise (16 rows of builtin:tiny's
322: 0.15-0.16 ms either way, and its tokens stay mlx-lm's; 2,048: 0.23 against 0.64 ms). The same seed
gives other tokens than mlx-lm's sampler; the distribution is the same (tests/test_inverse_cdf.py).
"""

import mlx.core as mx
from mlx_lm.sample_utils import categorical_sampling

from mlx_grpo.cpu_exp import WIDE, divisor_near_root, exp

PADDED_CHUNK = 256  # the chunk width where no divisor of the vocabulary fits


def chunk_width(vocab: int) -> int:
    """A divisor of `vocab` near its square root (no padded copy of the weights: 128 for Qwen's
    151,936, 4.0 ms against 5.2 ms padded to 256), else PADDED_CHUNK."""
    return divisor_near_root(vocab) or PADDED_CHUNK


def _first_above(cumulative, target, weights):
    """Per row, the first index whose cumulative weight passes `target`, never one of weight 0 (a
    target rounded up to the total picks the last index that has weight)."""
    passed = (cumulative <= target).sum(axis=-1)
    width = weights.shape[-1]
    last = width - 1 - mx.argmax(weights[:, ::-1] > 0, axis=-1)
    return mx.minimum(passed, last)


def pick(weights, uniforms):
    """Index per row of `weights` (rows, vocab; >= 0, each row some positive), drawn with chance
    proportional to the weight from `uniforms` (rows, 2) in [0, 1); returns (index, row sums)."""
    rows, vocab = weights.shape
    width = chunk_width(vocab)
    pad = -vocab % width
    if pad:
        weights = mx.concatenate([weights, mx.zeros((rows, pad), weights.dtype)], axis=1)
    chunks = weights.reshape(rows, -1, width)
    masses = chunks.sum(axis=-1)
    cumulative = mx.cumsum(masses, axis=-1)
    total = cumulative[:, -1:]
    chunk = _first_above(cumulative, uniforms[:, :1] * total, masses)
    inner = mx.take_along_axis(chunks, chunk[:, None, None], axis=1)[:, 0]
    within = mx.cumsum(inner, axis=-1)
    token = _first_above(within, uniforms[:, 1:] * within[:, -1:], inner)
    return chunk * width + token, total[:, 0]


def draw(logits, temperature: float):
    """(tokens (rows,) uint32, their log-probs under softmax(logits / temperature)) for logits
    (rows, vocab): one exp pass for both."""
    z = logits.astype(mx.float32)
    z = z * (1.0 / temperature) if temperature != 1.0 else z  # T = 1, the default: no pass for it
    top = z.max(axis=-1, keepdims=True)
    index, total = pick(exp(z - top), mx.random.uniform(shape=(z.shape[0], 2)))
    picked = mx.take_along_axis(z, index[:, None], axis=-1)[:, 0]
    return index.astype(mx.uint32), picked - top[:, 0] - mx.log(total)


class InverseCdfSampler:
    """mlx-lm's sampler interface (log-probs (rows, vocab) -> tokens (rows,)) at temperature T with
    no truncation: the inverse CDF where it `pays`, else mlx-lm's own draw; `draw` also gives the
    sampled tokens' log-probs (rollout/engine.py)."""

    def __init__(self, temperature: float):
        self.temperature = temperature

    @staticmethod
    def pays(vocab: int) -> bool:
        return vocab >= WIDE

    def __call__(self, logprobs):
        if not self.pays(logprobs.shape[-1]):
            return categorical_sampling(logprobs, self.temperature)
        return self.draw(logprobs)[0]

    def draw(self, logits):
        return draw(logits, self.temperature)
