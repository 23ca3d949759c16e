"""The bench's work counts (commands/roofline.py), against builtin:tiny's config by hand."""

import mlx.core as mx
import pytest

from mlx_grpo.commands import roofline
from mlx_grpo.rollout.sample import Rollout

# builtin:tiny: hidden 128, 4 layers, 4 heads (head_dim 32), 2 KV heads, intermediate 384, vocabulary 322, tied
LAYER = 128 * 128 + 2 * (128 * 64) + 128 * 128 + 3 * (128 * 384)  # q, k and v, o, gate/up/down
BODY, HEAD = 2 * 4 * LAYER, 2 * 322 * 128


@pytest.fixture
def model(tiny_path):
    """A fresh copy (one test quantizes it)."""
    import mlx_lm

    return mlx_lm.load(tiny_path)[0]


def test_model_flops_counts_the_blocks_linear_layers_and_the_tied_head(model):
    assert LAYER == 196_608
    assert roofline.model_flops(model) == {"body_per_token": BODY, "head_per_position": HEAD}


def test_a_quantized_model_counts_its_layers_at_their_unpacked_size(model):
    import mlx.nn as nn

    nn.quantize(model, group_size=32, bits=4)
    assert roofline.model_flops(model) == {"body_per_token": BODY, "head_per_position": HEAD}


def test_update_and_rollout_flops_by_hand():
    flops = {"body_per_token": 10, "head_per_position": 3}
    # 7 tokens through the blocks, 4 scored: forward 82; full fine-tune 3x, LoRA 2x
    assert roofline.update_flops(flops, 7, 4, lora=False) == 3 * 82
    assert roofline.update_flops(flops, 7, 4, lora=True) == 2 * 82
    assert roofline.rollout_flops(flops, prompt_tokens=5, sampled=4) == 10 * 9 + 3 * 4


def test_achieved_counts_a_shared_prompt_once_and_reads_the_weights_each_decode_step(model):
    rollout = Rollout(prompt_tokens=[[1, 2, 3]] * 2, completion_tokens=[[4, 5], [6]], texts=["", ""],
                      truncated=[False, False], group_size=2)
    step = {"update_s": 2.0, "rollout_s": 4.0}
    limits = {"matmul_float32_flops": 1e9, "copy_bytes_per_s": 1e9}
    shared = roofline.achieved(model, rollout, step, lora=False, shared_prefix=True, limits=limits)
    padded = roofline.achieved(model, rollout, step, lora=False, shared_prefix=False, limits=limits)
    assert shared["update_flops"] == 3 * (BODY * (3 + 3) + HEAD * 3)
    assert padded["update_flops"] == 3 * (BODY * (6 + 3) + HEAD * 3)
    assert shared["rollout_flops"] == BODY * (3 + 3) + HEAD * 3
    weight_bytes = 4 * (4 * LAYER + 322 * 128 + 9 * 128 + 4 * (128 + 64 + 64))  # + 9 norms, q/k/v biases
    assert weight_bytes == 4 * 829_824  # every parameter, read once a decode step
    assert shared["rollout_weight_bytes"] == weight_bytes * 2
    assert shared["update_share_of_matmul"] == shared["update_flops"] / 2.0 / 1e9
    assert roofline.compute_dtype(model) == mx.float32


def test_the_copy_probe_writes_into_a_reused_buffer_and_leaves_the_cache_limit():
    # Fresh pages for every repeat made the probe time the kernel's page faults (3.3 GB/s on this
    # machine's CPU backend, 29 GB/s reused); a reused output faults nothing after the warm-up.
    import resource

    before = mx.set_cache_limit(32 << 20)  # MLX's own limit on the CPU backend
    pages = (64 << 20) // resource.getpagesize()
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    roofline.copy_rate(mbytes=64, repeats=4)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    assert faults < 3 * pages, faults  # the input and the first output: 2 x; fresh outputs: 6 x
    assert mx.set_cache_limit(before) == 32 << 20
