"""Shared-prefix scoring (training.shared_prefix) gives the padded full-sequence path's numbers."""

import mlx.core as mx
import mlx.optimizers as optim
import numpy as np
import pytest
from mlx.utils import tree_flatten, tree_unflatten

from mlx_grpo.algorithm.loss import LOSS_TYPES, pack_sequences, token_logprobs
from mlx_grpo.algorithm.columns import prefix_columns
from mlx_grpo.algorithm.prefix import grouped_token_logprobs_and_entropies, pack_groups
from mlx_grpo.config import LoraConfig, load_config
from mlx_grpo.models.load import add_adapters, checkpoint_layers
from mlx_grpo.rollout.sample import Rollout
from mlx_grpo.update.batches import prepare_batches
from mlx_grpo.update.grad import make_grad_fn
from mlx_grpo.update.settings import UpdateSettings
from mlx_grpo.update.step import make_loss_fn, run_updates, update


def _rollout():
    """3 prompts (9, 1 and 5 tokens) x G=3 completions of different lengths (vocabulary 64)."""
    rng = np.random.default_rng(0)
    prompts = [rng.integers(1, 64, n).tolist() for n in (9, 1, 5)]
    lengths = [3, 7, 12, 1, 5, 9, 4, 4, 2]
    return Rollout(
        prompt_tokens=[prompts[i // 3] for i in range(9)],
        completion_tokens=[rng.integers(1, 64, n).tolist() for n in lengths],
        texts=[""] * 9, truncated=[False] * 9, group_size=3,
    )


REWARDS = [1.0, 0.0, 0.5, 0.0, 1.0, 1.0, 0.2, 0.9, 0.4]


def _cfg(shared, loss_type="grpo", *extra):
    return load_config(None, [
        "generation.num_generations=3", "training.prompts_per_step=3", "generation.max_new_tokens=12",
        f"grpo.loss_type={loss_type}", "grpo.beta=0.04", "generation.temperature=0.7",
        "training.max_grad_norm=0", "grpo.num_iterations=2", f"training.shared_prefix={str(shared).lower()}",
        *extra,
    ])


def _lora(model):
    add_adapters(model, LoraConfig(rank=4, dropout=0.0))
    mx.random.seed(1)  # nonzero lora_b, so the reference (adapters off) differs from the policy
    model.update(tree_unflatten([(k, 0.2 * mx.random.normal(v.shape)) for k, v in
                                 tree_flatten(model.trainable_parameters()) if k.endswith("lora_b")]))
    return model


def test_shared_prefix_logprobs_and_entropies_equal_the_packed_ones(random_qwen2):
    r = _rollout()
    inputs, positions, targets, mask = pack_sequences(r.prompt_tokens, r.completion_tokens, pad_to=8)
    packed = token_logprobs(random_qwen2, inputs, positions, targets, 0.7) * mask
    prefix, pad, row_group, shared_inputs, shared_targets, shared_mask = pack_groups(
        r.prompt_tokens, r.completion_tokens, pad_to=8)
    assert prefix.shape == (3, 8) and pad.tolist() == [0, 8, 4] and row_group.tolist() == [[0, 0, 0], [1, 1, 1], [2, 2, 2]]
    assert prefix[2, 4:].tolist() == r.prompt_tokens[6][:-1] and prefix[2, :4].tolist() == [0] * 4
    assert mx.array_equal(shared_targets, targets) and mx.array_equal(shared_mask, mask)

    class Batch:
        pass

    b = Batch()
    b.prefix, b.prefix_pad, b.row_group, b.inputs, b.targets = prefix, pad, row_group, shared_inputs, shared_targets
    logp, entropies = grouped_token_logprobs_and_entropies(random_qwen2, b, 0.7)
    assert mx.abs(logp * mask - packed).max().item() < 1e-5
    from mlx_grpo.algorithm.loss import token_logprobs_and_entropies

    _, packed_entropies = token_logprobs_and_entropies(random_qwen2, inputs, positions, targets, 0.7)
    assert mx.abs((entropies - packed_entropies) * mask).max().item() < 1e-5


def _applied_grads(model, cfg, ref_model):
    """The gradient `update` applies (SGD of rate 1 moves each parameter by -grad), weights restored."""
    before = {k: mx.array(v) for k, v in tree_flatten(model.trainable_parameters())}
    batches = prepare_batches(model, ref_model, _rollout(), REWARDS, cfg)
    assert all((b.prefix is not None) == UpdateSettings.of(cfg).shared_prefix for b in batches)
    grad_fn = make_grad_fn(model, make_loss_fn(cfg), compiled=False)
    loss, _, metrics = update(model, optim.SGD(learning_rate=1.0), batches, grad_fn, cfg)
    after = dict(tree_flatten(model.trainable_parameters()))
    model.update(tree_unflatten(list(before.items())))
    return loss, metrics, {k: before[k] - after[k] for k in before}


@pytest.fixture(params=["ours", "mlx-lm's"])
def family_attention(request, monkeypatch):
    """The attention qwen2's layers call: attention.py's (which takes a shared prompt's keys as
    they are), counting those calls, or mlx-lm's own (which cannot: the rows' keys are gathered)."""
    from mlx_lm.models import qwen2

    from mlx_grpo import attention as attn

    calls = []
    if request.param == "ours":
        real = attn._over_shared_prefix
        monkeypatch.setattr(attn, "_over_shared_prefix", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setattr(qwen2, "scaled_dot_product_attention", attn.attention if request.param == "ours" else attn._SDPA)
    return request.param, calls


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize("checkpoint", [False, True], ids=["plain", "grad_checkpoint"])
def test_shared_prefix_gives_the_packed_gradients(random_qwen2, loss_type, lora, checkpoint, family_attention):
    """Chunks of 2 rows with G = 3: some hold parts of two groups, each part sharing its prompt.
    With beta > 0 and num_iterations = 2 the reference and old log-probs take the same path.
    Whole groups under attention.py share each prompt's keys as they are, except in recomputed
    (checkpointed) layers; everywhere else the rows' keys are gathered."""
    model = _lora(random_qwen2) if lora else random_qwen2
    if checkpoint:
        checkpoint_layers(model)
    ref_model = None if lora else model
    for extra in ((), ("training.micro_batch_size=2",)):
        extra += ("training.grad_checkpoint=true",) * checkpoint + ("lora.enabled=true",) * lora  # LoRA: a group a pass
        packed = _applied_grads(model, _cfg(False, loss_type, *extra), ref_model)
        shared = _applied_grads(model, _cfg(True, loss_type, *extra), ref_model)
        assert shared[0] == pytest.approx(packed[0], rel=1e-4, abs=1e-7)
        assert shared[1] == pytest.approx(packed[1], rel=1e-4, abs=1e-6)
        assert any(mx.abs(g).max().item() > 0 for g in packed[2].values())
        for k, g in packed[2].items():  # padded prompts move RoPE's positions: rounding, near-zero entries too
            assert mx.allclose(shared[2][k], g, rtol=1e-4, atol=1e-5 * mx.abs(g).max().item()).item(), k
    attention, calls = family_attention
    assert bool(calls) == (attention == "ours" and not checkpoint)


@pytest.mark.parametrize("micro, plain, checkpointed", [
    (0, [(9, 3)], [(3, 1)] * 3),
    (2, [(2, 1), (2, 2), (2, 1), (2, 1), (1, 1)], [(2, 1), (1, 1)] * 3),
])
def test_under_grad_checkpoint_a_shared_prefix_lora_micro_batch_holds_one_group(micro, plain, checkpointed):
    """(rows, prompts) of each micro-batch: a recomputed layer then holds one group's prompt. Not
    for a full fine-tune, whose accumulated gradient would cost more than that saves."""
    from mlx_grpo.update.batches import make_micro_batches

    ckpt, lora = "training.grad_checkpoint=true", "lora.enabled=true"
    for extra, want in (((), plain), ((ckpt,), plain), ((lora,), plain), ((ckpt, lora), checkpointed)):
        s = UpdateSettings.of(_cfg(True, "grpo", f"training.micro_batch_size={micro}", *extra))
        batches = make_micro_batches(_rollout(), mx.array(REWARDS), s)
        assert [(b.inputs.shape[0], b.prefix.shape[0]) for b in batches] == want
        assert mx.concatenate([b.advantages for b in batches]).tolist() == pytest.approx(REWARDS)


def test_shared_prefix_run_metrics_equal_the_packed_ones(random_qwen2):
    """Two optimizer updates (num_iterations = 2): same loss, KL, entropy, clip ratios and gradient
    norm, and the same weights after. SGD, not Adam: Adam's first step is about lr * sign(g), so
    it turns rounding noise in near-zero gradients (k_proj.bias's is 0 in exact arithmetic)
    into full-size differences."""
    results = []
    start = {k: mx.array(v) for k, v in tree_flatten(random_qwen2.parameters())}
    for shared in (False, True):
        random_qwen2.update(tree_unflatten(list(start.items())))
        cfg = _cfg(shared, "dapo", "training.micro_batch_size=2")
        optimizer = optim.SGD(learning_rate=0.1)
        batches = prepare_batches(random_qwen2, random_qwen2, _rollout(), REWARDS, cfg)
        grad_fn = make_grad_fn(random_qwen2, make_loss_fn(cfg), compiled=False)
        metrics = run_updates(random_qwen2, optimizer, batches, grad_fn, cfg)
        results.append((metrics, dict(tree_flatten(random_qwen2.parameters()))))
    (packed, packed_w), (shared, shared_w) = results
    assert packed.keys() == shared.keys() and "kl" in packed and "entropy" in packed
    for key in packed:
        assert shared[key] == pytest.approx(packed[key], rel=1e-4, abs=1e-6), key
    for k in packed_w:
        assert mx.allclose(shared_w[k], packed_w[k], rtol=1e-4, atol=1e-6).item(), k


def _shared_batch(model, prompt_lengths, seed):
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(1, 64, n).tolist() for n in prompt_lengths]
    rollout = Rollout(prompt_tokens=[p for p in prompts for _ in range(3)],
                      completion_tokens=[rng.integers(1, 64, 5).tolist() for _ in range(3 * len(prompts))],
                      texts=[""] * 6, truncated=[False] * 6, group_size=3)
    return prepare_batches(model, None, rollout, REWARDS[:6], _cfg(True, "grpo", "training.prompts_per_step=2"))


def test_a_compiled_shared_prefix_step_is_traced_once_per_prompt_bucket(random_qwen2):
    """Prompts of 30 and 5 tokens, then 27 and 12: one padded prefix shape, so one trace; the
    compiled gradients equal the plain ones."""
    traces = []

    def loss(model, batch):
        traces.append(1)  # Python runs here only while tracing the compiled function
        return make_loss_fn(_cfg(True))(model, batch)

    compiled = make_grad_fn(random_qwen2, loss, compiled=True)
    plain = make_grad_fn(random_qwen2, make_loss_fn(_cfg(True)), compiled=False)
    for seed, lengths in enumerate([(30, 5), (27, 12)]):
        (batch,) = _shared_batch(random_qwen2, lengths, seed)
        assert batch.prefix.shape == (2, 32)
        (loss_c, _), grads_c = compiled(batch)
        (loss_p, _), grads_p = plain(batch)
        assert loss_c.item() == pytest.approx(loss_p.item(), rel=1e-5, abs=1e-7)
        for (k, g), (_, h) in zip(tree_flatten(grads_p), tree_flatten(grads_c)):
            assert mx.allclose(h, g, rtol=1e-4, atol=1e-6).item(), k
    assert len(traces) == 1


@pytest.mark.parametrize("n, columns", [(0, 0), (1, 8), (8, 8), (9, 16), (31, 32), (33, 40), (40, 40),
                                        (129, 160), (150, 160), (600, 640), (1023, 1024)])
def test_prefix_columns_pad_a_prompt_by_less_than_a_quarter_or_8_columns(n, columns):
    assert prefix_columns(n) == columns
    assert 0 <= columns - n < max(8, n / 4)


@pytest.fixture
def random_gemma3():
    """A 2-layer random Gemma 3: a sliding-window layer of 4 keys (a RotatingKVCache), then a global one."""
    from mlx_lm.models import gemma3_text

    mx.random.seed(0)
    args = gemma3_text.ModelArgs(
        model_type="gemma3_text", hidden_size=32, num_hidden_layers=2, intermediate_size=64,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, query_pre_attn_scalar=8, vocab_size=64,
        sliding_window=4, sliding_window_pattern=2,
    )
    model = gemma3_text.Model(args)
    mx.eval(model.parameters())
    return model


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize("checkpoint", [False, True], ids=["plain", "grad_checkpoint"])
@pytest.mark.parametrize("attention", ["ours", "mlx-lm's"])
def test_a_sliding_window_shares_the_prefix_with_the_packed_gradients(random_gemma3, monkeypatch, lora, checkpoint,
                                                                      attention):
    """Gemma 3's window of 4 is shorter than the 9-token prompt and most completions: the shared
    prefix's masks (and attention.py's, keys as they are) show each query the last 4 keys, as the
    packed sequences' masks do; without the window the gradients differ."""
    from mlx_lm.models import gemma3_text

    from mlx_grpo import attention as attn
    from mlx_grpo.algorithm import prefix
    from mlx_grpo.algorithm.prefix import unshared_cache_kinds

    assert unshared_cache_kinds(random_gemma3) == []
    calls = []
    real = attn._over_shared_prefix
    monkeypatch.setattr(attn, "_over_shared_prefix", lambda *a, **k: calls.append(a[-1]) or real(*a, **k))
    monkeypatch.setattr(gemma3_text, "scaled_dot_product_attention", attn.attention if attention == "ours" else attn._SDPA)
    model = _lora(random_gemma3) if lora else random_gemma3
    if checkpoint:
        checkpoint_layers(model)
    ref_model = None if lora else model
    extra = ("training.grad_checkpoint=true",) * checkpoint + ("lora.enabled=true",) * lora
    packed = _applied_grads(model, _cfg(False, "grpo", *extra), ref_model)
    shared = _applied_grads(model, _cfg(True, "grpo", *extra), ref_model)
    assert shared[0] == pytest.approx(packed[0], rel=1e-4, abs=1e-7)
    for k, g in packed[2].items():
        assert mx.allclose(shared[2][k], g, rtol=1e-4, atol=1e-5 * mx.abs(g).max().item()).item(), k
    assert sorted(set(calls), key=str) == ([4, None] if attention == "ours" and not checkpoint else [])
    monkeypatch.setattr(prefix, "layer_windows", lambda model: [None] * len(model.layers))  # the window forgotten
    unwindowed = _applied_grads(model, _cfg(True, "grpo", *extra), ref_model)
    assert any(not mx.allclose(unwindowed[2][k], g, rtol=1e-3).item() for k, g in packed[2].items())
