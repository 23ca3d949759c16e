"""generation.quantize_bits: rollouts from a quantized copy of the current policy, adapters fused,
rebuilt after each update, with the importance-sampling correction on."""

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten
from mlx_lm.tuner.lora import LoRALinear

from mlx_grpo.commands.setup import build_policy, make_rewards, setup
from mlx_grpo.config import load_config
from mlx_grpo.rollout.quantized import quantize_policy
from mlx_grpo.rollout.score import sample_and_score
from mlx_grpo.update.step import optimize

FAST = ["generation.num_generations=4", "generation.max_new_tokens=16", "training.prompts_per_step=2",
        "training.learning_rate=1e-3", "training.warmup_steps=0", 'training.lr_schedule="constant"']


@pytest.mark.parametrize("bits", [4, 8])
def test_copy_is_the_policy_with_its_adapters_fused(bits):
    cfg = load_config(None, ["lora.enabled=true", f"generation.quantize_bits={bits}"])
    policy = build_policy(cfg)[0]
    mx.random.seed(0)  # adapters that matter: B is zero at the start
    for name, p in tree_flatten(policy.trainable_parameters()):
        if name.endswith("lora_b"):
            policy.load_weights([(name, 0.5 * mx.random.normal(p.shape))], strict=False)
    copy = quantize_policy(policy, bits)
    layers = dict(copy.named_modules())
    adapted = [(n, m) for n, m in policy.named_modules() if isinstance(m, LoRALinear)]
    assert len(adapted) == 4 * 7  # every target module of the 4 layers
    for name, lora in adapted:
        q = layers[name]
        assert isinstance(q, nn.QuantizedLinear) and q.bits == bits
        fused = lora.linear.weight + lora.scale * (lora.lora_b.T @ lora.lora_a.T)  # W + s B^T A^T
        groups = fused.reshape(-1, q.group_size)
        step = ((groups.max(1) - groups.min(1)) / (2**bits - 1)).max().item()  # one quantization step
        err = mx.abs(mx.dequantize(q.weight, q.scales, q.biases, q.group_size, q.bits) - fused).max().item()
        assert err <= step, (name, err, step)  # the fused weight, rounded
        assert mx.abs(fused - lora.linear.weight).max().item() > 2 * step  # which the adapter moved
    # the rest: the (tied) embedding quantized too, the norms are the policy's own
    assert isinstance(layers["model.embed_tokens"], nn.QuantizedEmbedding)
    mine = dict(tree_flatten(policy.parameters()))
    norms = [(k, v) for k, v in tree_flatten(copy.parameters()) if "norm" in k]
    assert len(norms) == 4 * 2 + 1 and all(mx.array_equal(v, mine[k]).item() for k, v in norms)


def test_copy_samples_and_is_rebuilt_after_each_update(tmp_path):
    cfg = load_config(None, FAST + ["generation.quantize_bits=8", f'output_dir="{tmp_path}"'])
    tr = setup(cfg, total_updates=2)
    rewards = make_rewards(cfg)
    first = tr.rollout_model()
    assert tr.rollout_model() is first and tr.quantized.refreshes == 1  # no update yet: the same copy
    before = {k: np.array(v) for k, v in tree_flatten(first.parameters())}
    scored = sample_and_score(first, tr.tokenizer, tr.examples[:2], rewards, tr.sampler, tr.sampling)
    rollout = scored.rollout
    assert len(rollout.completion_tokens) == 8 and all(rollout.completion_tokens)
    assert [len(s) for s in rollout.sampling_logprobs] == [len(c) for c in rollout.completion_tokens]
    metrics = optimize(tr.model, tr.optimizer, tr.ref_model, rollout, scored.rewards, tr.settings,
                       grad_fn=tr.grad_fn)
    # auto turned the correction on; an 8-bit copy of a float policy samples a nearby distribution
    assert tr.settings.importance_sampling_correction == "token_truncate"
    assert 0 < metrics["sampling/logprob_diff_mean"] < 0.1
    assert 0.5 < metrics["sampling/importance_sampling_ratio/mean"] < 1.5
    second = tr.rollout_model()
    assert second is not first and tr.quantized.refreshes == 2
    after = dict(tree_flatten(second.parameters()))
    changed = [k for k in before if not np.array_equal(before[k], np.array(after[k]))]
    assert len(changed) > len(before) // 2, changed  # the update moved every weight matrix
    assert sample_and_score(second, tr.tokenizer, tr.examples[2:4], rewards, tr.sampler, tr.sampling).rewards


def test_building_a_copy_leaves_the_sampling_stream_alone():
    policy = build_policy(load_config(None, []))[0]
    mx.random.seed(7)
    plain = mx.random.uniform(shape=(4,))
    mx.random.seed(7)
    quantize_policy(policy, 8)
    assert mx.array_equal(mx.random.uniform(shape=(4,)), plain).item()


def test_a_run_samples_from_the_copy_and_logs_the_correction(tmp_path):
    from mlx_grpo.commands.train import train
    from mlx_grpo.run.log import read_metrics

    cfg = load_config("configs/smoke_test.toml", FAST + [
        "generation.quantize_bits=4", "training.max_steps=2", f'output_dir="{tmp_path}"'])
    train(cfg)
    rows = read_metrics(tmp_path)
    # a 4-bit copy samples: its gap to the float policy is there, and the weights answer it
    assert all(r["sampling/logprob_diff_mean"] > 1e-4 and r["sampling/importance_sampling_ratio/min"] < 1
               for r in rows)


def test_a_model_stored_quantized_is_refused(tiny_path, tmp_path):
    from mlx_grpo.errors import TrainingError
    from mlx_grpo.models.load import quantized_copy

    folder = quantized_copy(tiny_path, 4, 64, "float32")  # as a hub model stored in 4 bits would be
    cfg = load_config(None, [f'model.path="{folder}"', "lora.enabled=true", "generation.quantize_bits=8"])
    with pytest.raises(TrainingError, match="stored quantized.*generation.quantize_bits = 0"):
        setup(cfg, total_updates=1)
