"""Rollouts from a quantized copy of the current policy (`generation.quantize_bits`).

Decoding is memory-bound on Apple GPUs, so sampling from 4- or 8-bit weights is the classic way
to speed rollouts up. The copy is the policy with every LoRA/DoRA adapter fused into the layer
it wraps, quantized with mlx's `nn.quantize` under mlx-lm's rule (layers whose input size the
group size divides, and the model's own `quant_predicate` where it has one). It is rebuilt
whenever the optimizer has made an update since the last copy, so each step samples from the
policy as it is now. The loss still scores the float policy; the gap between the two is what
the importance-sampling correction (algorithm/mismatch.py) weights away.
"""

from contextlib import contextmanager

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from mlx_grpo.models.load import _ADAPTER_TYPES

GROUP_SIZE = 64  # mlx-lm's default for affine quantization


def fused_weights(policy) -> dict:
    """The policy's parameters with each adapter fused into the layer it wraps (float, lazy)."""
    weights = dict(tree_flatten(policy.parameters()))
    for name, module in policy.named_modules():
        if isinstance(module, _ADAPTER_TYPES):
            prefix = name + "."
            weights = {k: v for k, v in weights.items() if not k.startswith(prefix)}
            weights.update({prefix + k: v for k, v in tree_flatten(module.fuse().parameters())})
    return weights


@contextmanager
def _sampling_stream_kept():
    """Building a model splits MLX's global key for its initial weights even though they are never
    computed; putting the key back keeps the rollouts' random stream independent of how many
    copies were built (an MLX key [hi, lo] is the key that seed(hi << 32 | lo) makes)."""
    key = mx.random.state[0]
    mx.eval(key)
    hi, lo = key.tolist()
    try:
        yield
    finally:
        mx.random.seed((hi << 32) | lo)


def quantize_policy(policy, bits: int, group_size: int = GROUP_SIZE):
    """A new model of the policy's architecture holding its fused weights, quantized, in eval mode.

    The new model's random initial weights (and those of the quantized layers that replace its
    linear ones) are never computed: MLX is lazy and they are replaced before anything is
    evaluated; nor do they move the sampling stream.
    """
    own = getattr(policy, "quant_predicate", None)

    def predicate(path, module):
        if not hasattr(module, "to_quantized") or module.weight.shape[-1] % group_size:
            return False
        return own(path, module) if own is not None else True

    with _sampling_stream_kept():
        copy = type(policy)(policy.args)
        copy.load_weights(list(fused_weights(policy).items()))
        nn.quantize(copy, group_size, bits, class_predicate=predicate)
    copy.freeze()
    copy.eval()
    mx.eval(copy.parameters())
    return copy


class QuantizedRollouts:
    """The quantized copy that samples for the policy, rebuilt after each optimizer update."""

    def __init__(self, bits: int, group_size: int = GROUP_SIZE):
        self.bits, self.group_size = bits, group_size
        self.model, self.version = None, None
        self.refreshes = 0

    def model_for(self, policy, optimizer):
        """The copy of `policy` as it is after `optimizer`'s updates so far."""
        version = int(optimizer.step.item())
        if self.model is None or version != self.version:
            self.model = None  # the old copy's memory is free before the new one is built
            self.model = quantize_policy(policy, self.bits, self.group_size)
            self.version = version
            self.refreshes += 1
        return self.model
