"""Log-probs and entropies in chunks of completion positions (algorithm/chunked.py): the same
numbers and gradients as one chunk, on both scoring paths, and an update's peak memory that no
longer grows with rows x tokens x vocabulary."""

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten

from mlx_grpo.algorithm import chunked
from mlx_grpo.algorithm import loss as loss_module
from mlx_grpo.algorithm.prefix import batch_logprobs_and_entropies
from mlx_grpo.config import load_config
from mlx_grpo.models.load import add_adapters
from mlx_grpo.rollout.sample import Rollout
from mlx_grpo.update.batches import prepare_batches
from mlx_grpo.update.grad import make_grad_fn
from mlx_grpo.update.step import make_loss_fn

ROWS = 6  # the fixed rollout: 2 prompts x G=3, one micro-batch
WHOLE = 1 << 40  # a budget no batch here reaches: one chunk, the computation without chunks


def _qwen2(vocab, tied=True, hidden=32, layers=2):
    from mlx_lm.models import qwen2

    mx.random.seed(0)
    model = qwen2.Model(qwen2.ModelArgs(
        model_type="qwen2", hidden_size=hidden, num_hidden_layers=layers, intermediate_size=2 * hidden,
        num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6, vocab_size=vocab,
        tie_word_embeddings=tied,
    ))
    mx.eval(model.parameters())
    return model


def _cfg(shared, *extra):
    return load_config(None, [
        f"training.shared_prefix={shared}", "generation.num_generations=3", "training.prompts_per_step=2",
        "generation.max_new_tokens=12", "generation.temperature=0.7", "grpo.beta=0.04", *extra,
    ])


def _budget(monkeypatch, positions):
    """Chunks of `positions` completion positions for the fixed rollout's 6 rows at vocabulary 4096."""
    monkeypatch.setattr(chunked, "LOGITS_BUDGET", WHOLE if positions is None else ROWS * 4096 * positions)


def test_chunk_length_follows_the_budget():
    # 2^24 logit elements: Qwen's 151,936 tokens x 16 rows -> 6 positions (16 * 6 * 151936 =
    # 14.6M); builtin:tiny's 322 x 64 rows x 96 positions = 2.0M: one chunk of all 96.
    assert chunked.chunk_length(16, 256, 151_936) == 6
    assert chunked.chunk_length(64, 96, 322) == 96
    assert chunked.chunk_length(16, 256, 10**9) == 1


@pytest.mark.parametrize("shared", ["true", "false"])
@pytest.mark.parametrize("head", ["tied", "lm_head", "quantized"])
def test_chunked_logprobs_and_entropies_equal_one_chunk(monkeypatch, fixed_rollout, shared, head):
    model = _qwen2(4096, tied=head != "lm_head")
    if head == "quantized":  # QLoRA's base: the tied head is a QuantizedEmbedding's as_linear
        nn.quantize(model, group_size=32, bits=4)
    batch = prepare_batches(model, None, *fixed_rollout, _cfg(shared, "grpo.beta=0"))[0]
    _budget(monkeypatch, None)
    whole = batch_logprobs_and_entropies(model, batch, 0.7)
    for positions in (1, 3, 5):  # T = 32 (padded): 32, 11 and 7 chunks, the last one short
        _budget(monkeypatch, positions)
        assert chunked.chunk_length(ROWS, 32, 4096) == positions
        for a, b in zip(whole, batch_logprobs_and_entropies(model, batch, 0.7)):
            np.testing.assert_allclose(np.array(a), np.array(b), rtol=1e-5, atol=1e-5)


def _grads(model, batch, cfg, compiled):
    (loss, metrics), grads = make_grad_fn(model, make_loss_fn(cfg), compiled=compiled)(batch)
    return loss, metrics, dict(tree_flatten(grads))


@pytest.mark.parametrize(("shared", "compiled"), [("true", False), ("false", False), ("false", True)])
@pytest.mark.parametrize("extra", [[], ["grpo.top_entropy_quantile=0.5"], ["lora.enabled=true"], ["whole forward"]])
def test_chunked_gradients_equal_one_chunk(monkeypatch, fixed_rollout, shared, compiled, extra):
    """Full fine-tune (the tied head's gradient comes through the chunks) or LoRA (no head
    gradient), with the entropies' top-quantile mask or without, or a family scored from its whole
    forward's logits (no head to chunk: its logits' gradient comes through); both scoring paths."""
    if extra == ["whole forward"]:
        monkeypatch.setattr(loss_module, "_PLAIN_HEAD_TYPES", set())
        extra = []
    cfg = _cfg(shared, *extra)
    model = _qwen2(4096)
    if cfg.lora.enabled:
        add_adapters(model, cfg.lora)
    batch = prepare_batches(model, model, *fixed_rollout, cfg)[0]
    _budget(monkeypatch, None)
    loss, metrics, whole = _grads(model, batch, cfg, compiled)
    assert any(mx.abs(g).max().item() > 0 for g in whole.values())
    for positions in (1, 5):
        _budget(monkeypatch, positions)
        loss_c, metrics_c, parts = _grads(model, batch, cfg, compiled)
        assert loss_c.item() == pytest.approx(loss.item(), rel=1e-4, abs=1e-7)
        assert metrics_c["entropy"].item() == pytest.approx(metrics["entropy"].item(), rel=1e-5)
        assert parts.keys() == whole.keys()
        for k in whole:
            assert mx.allclose(parts[k], whole[k], rtol=1e-4, atol=1e-6).item(), k


def _update_peak(model, cfg, T: int) -> int:
    """Bytes an update's micro-batch adds at its peak: 2 completions of T tokens on a 16-token prompt."""
    rng = np.random.default_rng(0)
    rollout = Rollout(prompt_tokens=[[5] * 16] * 2, completion_tokens=[rng.integers(1, 65_536, T).tolist()] * 2,
                      texts=[""] * 2, truncated=[False] * 2, group_size=2)
    batch = prepare_batches(model, None, rollout, [1.0, 0.0], cfg)[0]
    grad_fn = make_grad_fn(model, make_loss_fn(cfg), compiled=False)
    mx.eval(model.parameters())
    mx.reset_peak_memory()
    base = mx.get_active_memory()
    mx.eval(grad_fn(batch))
    return mx.get_peak_memory() - base


def test_an_updates_peak_no_longer_grows_with_tokens_times_vocabulary(monkeypatch):
    # 2 rows at a 65,536-token vocabulary, T = 32 then 64 completion tokens (full fine-tune, tied
    # head). One float32 copy of the 32 added positions' logits is 2 x 32 x 65536 x 4 B = 16 MiB.
    # In one chunk the update keeps three more (measured 48 MiB more; 4 rows, T = 32 -> 128: 290
    # MiB); in chunks of 4 positions it holds a few chunks' whatever T (measured 0.35 MiB more; 4
    # rows, T = 32 -> 128, both paths, compiled or not, LoRA or full: 3-15 MiB).
    cfg = _cfg("false", "generation.num_generations=2", "training.prompts_per_step=1",
               "generation.max_new_tokens=64", "grpo.beta=0")
    model = _qwen2(65_536, hidden=32, layers=1)
    copy = 2 * 32 * 65_536 * 4
    growth = {}
    for name, budget in (("one chunk", WHOLE), ("chunks", 2 * 65_536 * 4)):
        monkeypatch.setattr(chunked, "LOGITS_BUDGET", budget)
        growth[name] = _update_peak(model, cfg, 64) - _update_peak(model, cfg, 32)
    assert growth["one chunk"] > 2 * copy, growth
    assert growth["chunks"] < copy / 4, growth


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("extra", [[], ["lora.enabled=true"]])
def test_chunks_cut_across_two_cpu_streams_give_the_same_bits(monkeypatch, fixed_rollout, compiled, extra):
    """Every chunk's logsumexp and logit gradient, and every MLP's swiglu, cut by rows onto two
    streams (mlx_grpo.streams, here forced for a small model): the loss, entropy and gradients of
    one stream, bit for bit."""
    from mlx_grpo import streams

    streams.split_swiglu()
    cfg = _cfg("false", *extra)
    model = _qwen2(4096)
    if cfg.lora.enabled:
        add_adapters(model, cfg.lora)
    batch = prepare_batches(model, model, *fixed_rollout, cfg)[0]
    _budget(monkeypatch, 5)
    with mx.stream(mx.cpu):
        loss, metrics, one = _grads(model, batch, cfg, compiled)
        monkeypatch.setattr(streams, "SPLIT_ELEMENTS", 1)
        cut = []
        monkeypatch.setattr(chunked, "split_rows", lambda fn, *a: cut.append(a[0].shape) or streams.split_rows(fn, *a))
        loss_s, metrics_s, two = _grads(model, batch, cfg, compiled)
    assert loss_s.item() == loss.item() and metrics_s["entropy"].item() == metrics["entropy"].item()
    assert two.keys() == one.keys()
    assert all(mx.array_equal(two[k], one[k]).item() for k in one)
    assert len(cut) >= 2 * 7 and all(shape[0] == ROWS for shape in cut)  # 7 chunks forward, 7 backward
