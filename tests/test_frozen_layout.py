"""rollout/frozen_layout.py: a LoRA base's frozen weights, laid out for the decode, keep every
value, sampled token, log-prob and gradient to the bit; a trained weight is never laid out."""

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx.utils import tree_flatten
from mlx_lm.tuner.utils import linear_to_lora_layers

from mlx_grpo.algorithm.loss import completion_logprobs
from mlx_grpo.config.sections import ModelConfig
from mlx_grpo.data.chat import render_prompt
from mlx_grpo.models.load import load_base
from mlx_grpo.rollout import engine
from mlx_grpo.rollout.frozen_layout import as_loaded, frozen_weights, lay_out_frozen
from mlx_grpo.rollout.sample import generate_completions, make_rollout_sampler, make_sampling_logprob


def _lora_tiny(tiny_path, dora=False):
    """builtin:tiny with rank-4 adapters on every layer, their B set (not zero): the base and the
    adapters both shape what it samples."""
    model, tokenizer, _ = load_base(ModelConfig(path=tiny_path, dtype="float32"))
    model.freeze()
    mx.random.seed(1)  # the adapters' A and B alike in every copy
    linear_to_lora_layers(model, 4, {"rank": 4, "scale": 20.0, "dropout": 0.0}, use_dora=dora)
    b = [(name, mx.random.normal(p.shape) * 0.01) for name, p in tree_flatten(model.trainable_parameters())
         if name.endswith("lora_b")]
    model.load_weights(b, strict=False)
    mx.eval(model.parameters())
    return model, tokenizer


def _in_column_order(weight) -> bool:
    return memoryview(weight).f_contiguous and not memoryview(weight).c_contiguous


def test_the_wide_frozen_weights_and_the_tied_head_are_chosen(tiny_path):
    model, _ = _lora_tiny(tiny_path)
    names = [name for name, _ in frozen_weights(model)]
    # builtin:tiny: hidden 128, q (with a bias) and o 128 x 128, k and v 64 x 128, gate and up
    # 384 x 128, down 128 x 384
    assert sorted(n for n in names if ".layers.0." in n) == [
        "model.layers.0.mlp.gate_proj.linear.weight", "model.layers.0.mlp.up_proj.linear.weight",
        "model.layers.0.self_attn.o_proj.linear.weight"]
    assert "model.embed_tokens.weight" in names and len(names) == 4 * 3 + 1  # its embedding is its head


def test_a_full_fine_tune_lays_out_nothing(tiny_path):
    model, _, _ = load_base(ModelConfig(path=tiny_path, dtype="float32"))
    assert frozen_weights(model) == []
    assert lay_out_frozen(model) == 0
    assert not any(_in_column_order(w) for _, w in tree_flatten(model.parameters()))


def test_an_untied_head_is_laid_out_as_a_linear_layer_and_its_embedding_left():
    class Untied(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(50, 8)
            self.lm_head = nn.Linear(8, 50, bias=False)

    model = Untied()
    model.freeze()
    assert [name for name, _ in frozen_weights(model)] == ["lm_head.weight"]


@pytest.mark.parametrize("dora", [False, True], ids=["lora", "dora"])
def test_laid_out_weights_decode_and_train_to_the_bit(tiny_path, monkeypatch, dora):
    laid, tokenizer = _lora_tiny(tiny_path, dora)
    plain, _ = _lora_tiny(tiny_path, dora)
    values = {name: mx.array(w) for name, w in tree_flatten(laid.parameters())}
    assert lay_out_frozen(laid) == 13 and lay_out_frozen(laid) == 0  # once per model
    chosen = {name for name, _ in frozen_weights(laid)}
    for name, w in tree_flatten(laid.parameters()):
        assert mx.array_equal(w, values[name]).item(), name
        assert _in_column_order(w) == (name in chosen), name

    prompts = [tokenizer.encode(render_prompt(tokenizer, q, "Be brief."), add_special_tokens=False)
               for q in ("What is 2 + 3?", "What is 12 times 7 minus 5?")]

    def sampled(model):
        mx.random.seed(5)
        return generate_completions(model, tokenizer, prompts, num_generations=4, max_new_tokens=24,
                                    sampler=make_rollout_sampler(1.0, 1.0, 0, 0.0),
                                    sampling_logprob=make_sampling_logprob(1.0, 1.0, 0, 0.0), engine="compiled")

    ours = sampled(laid)
    monkeypatch.setattr(engine, "lay_out_frozen", lambda model: 0)
    theirs = sampled(plain)
    assert not any(_in_column_order(w) for _, w in tree_flatten(plain.parameters()))
    assert ours.completion_tokens == theirs.completion_tokens
    assert ours.sampling_logprobs == theirs.sampling_logprobs
    assert len({tuple(c) for c in ours.completion_tokens}) > 4  # sampled, not one answer eight times

    def grads(model):
        loss = lambda m: completion_logprobs(m, ours.prompt_tokens, ours.completion_tokens).sum()
        return nn.value_and_grad(model, loss)(model)

    (loss_a, grad_a), (loss_b, grad_b) = grads(laid), grads(plain)
    assert loss_a.item() == loss_b.item()
    for (name, a), (_, b) in zip(tree_flatten(grad_a), tree_flatten(grad_b)):
        assert mx.array_equal(a, b).item(), name


def test_the_benchs_limit_sees_the_weights_as_loaded_and_the_decode_laid_out(tiny_path):
    model, _ = _lora_tiny(tiny_path)
    values = {name: mx.array(w) for name, w in tree_flatten(model.parameters())}
    lay_out_frozen(model)
    laid = lambda: {name for name, w in tree_flatten(model.parameters()) if _in_column_order(w)}
    assert len(laid()) == 13
    with as_loaded(model):
        assert laid() == set()
        assert all(mx.array_equal(w, values[name]).item() for name, w in tree_flatten(model.parameters()))
    assert len(laid()) == 13
