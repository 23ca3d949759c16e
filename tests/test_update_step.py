"""The update step: chunking, gradient checkpointing and mx.compile leave the gradients unchanged."""

import mlx.core as mx
import mlx.optimizers as optim
import numpy as np
import pytest
from mlx.utils import tree_flatten, tree_unflatten

from mlx_grpo.update.grad import make_grad_fn
from mlx_grpo.config import load_config
from mlx_grpo.algorithm.loss import LOSS_TYPES
from mlx_grpo.rollout.sample import Rollout
from mlx_grpo.models.load import checkpoint_layers
from mlx_grpo.commands.setup import build_policy
from mlx_grpo.update.batches import prepare_batches
from mlx_grpo.update.step import make_loss_fn, update


def _rollout():
    """2 prompts x G=3 completions of different lengths (vocabulary 64)."""
    rng = np.random.default_rng(0)
    prompts = [rng.integers(1, 64, 5).tolist(), rng.integers(1, 64, 9).tolist()]
    lengths = [3, 7, 12, 1, 5, 9]
    return Rollout(
        prompt_tokens=[prompts[i // 3] for i in range(6)],
        completion_tokens=[rng.integers(1, 64, n).tolist() for n in lengths],
        texts=[""] * 6, truncated=[False, False, True, False, False, False], group_size=3,
    )


def _cfg(loss_type, *extra):
    # The packed path: mx.compile takes only its array batches (tests/test_prefix.py checks the
    # shared-prefix path against it).
    return load_config(None, [
        "training.shared_prefix=false",
        "generation.num_generations=3", "training.prompts_per_step=2", "generation.max_new_tokens=12",
        f"grpo.loss_type={loss_type}", "grpo.beta=0.04", "generation.temperature=0.7", *extra,
    ])


def _applied_grads(model, cfg, compiled, rollout=None, rewards=(1.0, 0.0, 0.5, 0.0, 1.0, 1.0)):
    """The gradient `update` applies: an SGD step of rate 1 moves each parameter by -grad."""
    before = {k: mx.array(v) for k, v in tree_flatten(model.trainable_parameters())}
    rewards = list(rewards)
    batches = prepare_batches(model, model, rollout or _rollout(), rewards, cfg)
    grad_fn = make_grad_fn(model, make_loss_fn(cfg), compiled=compiled)
    loss, _, _ = update(model, optim.SGD(learning_rate=1.0), batches, grad_fn, cfg)
    after = dict(tree_flatten(model.trainable_parameters()))
    model.update(tree_unflatten(list(before.items())))  # undo, so calls compare on equal weights
    return loss, {k: before[k] - after[k] for k in before}


def _assert_same(a, b, rtol=1e-4, atol=1e-6):
    loss_a, grads_a = a
    loss_b, grads_b = b
    assert loss_a == pytest.approx(loss_b, rel=1e-4, abs=1e-7)
    assert any(mx.abs(g).max().item() > 0 for g in grads_a.values())
    for k in grads_a:
        assert mx.allclose(grads_a[k], grads_b[k], rtol=rtol, atol=atol).item(), k


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_micro_batches_and_accumulation_give_the_unchunked_gradient(random_qwen2, loss_type):
    # No clipping, so the applied step is the raw accumulated gradient.
    whole = _applied_grads(random_qwen2, _cfg(loss_type, "training.max_grad_norm=0"), compiled=False)
    chunked = _applied_grads(random_qwen2, _cfg(loss_type, "training.max_grad_norm=0",
                                                 "training.micro_batch_size=2"), compiled=False)
    _assert_same(whole, chunked)
    # Two accumulation parts of one group each, each chunked or not: same gradient. grpo and
    # dr_grpo divide by the part's sequences and by the part count (sum / 6 either way) and
    # dapo by the step's tokens, so they also equal the unsplit step; bnpo averages the two
    # parts' token means (as TRL does), which differs when the parts' token counts differ.
    parts = _applied_grads(random_qwen2, _cfg(loss_type, "training.max_grad_norm=0",
                                              "training.gradient_accumulation_steps=2",
                                              "training.prompts_per_step=1", "training.micro_batch_size=2"),
                           compiled=False)
    parts_whole = _applied_grads(random_qwen2, _cfg(loss_type, "training.max_grad_norm=0",
                                                    "training.gradient_accumulation_steps=2",
                                                    "training.prompts_per_step=1"), compiled=False)
    _assert_same(parts, parts_whole)
    if loss_type == "bnpo":
        assert parts[0] != pytest.approx(whole[0], rel=1e-3)
    else:
        _assert_same(parts, whole)


@pytest.mark.parametrize("loss_type", ["grpo", "dapo"])
def test_compiled_step_matches_uncompiled(random_qwen2, loss_type):
    cfg = _cfg(loss_type, "training.max_grad_norm=0", "training.micro_batch_size=4")
    _assert_same(_applied_grads(random_qwen2, cfg, compiled=False), _applied_grads(random_qwen2, cfg, compiled=True))


def test_compiled_step_reads_new_scalars_and_weights(random_qwen2):
    """A new normaliser value or new weights must not reuse a stale trace."""
    cfg = _cfg("bnpo")
    batch = prepare_batches(random_qwen2, random_qwen2, _rollout(), [1.0, 0, 0.5, 0, 1, 1], cfg)[0]
    grad_fn = make_grad_fn(random_qwen2, make_loss_fn(cfg), compiled=True)
    (first, _), _ = grad_fn(batch)
    batch.num_items = batch.num_items * 2
    (halved, _), _ = grad_fn(batch)
    assert halved.item() == pytest.approx(first.item() / 2, rel=1e-5)
    w = random_qwen2.model.norm.weight
    random_qwen2.model.norm.weight = w * 3.0
    (moved, _), _ = grad_fn(batch)
    random_qwen2.model.norm.weight = w
    (plain, _), _ = make_grad_fn(random_qwen2, make_loss_fn(cfg), compiled=False)(batch)
    assert halved.item() == pytest.approx(plain.item(), rel=1e-5)
    assert moved.item() != pytest.approx(halved.item(), rel=1e-3)


def test_grad_checkpoint_gives_the_same_gradients(random_qwen2):
    cfg = _cfg("grpo", "training.max_grad_norm=0")
    plain = _applied_grads(random_qwen2, cfg, compiled=False)
    checkpoint_layers(random_qwen2)
    assert all(type(layer).__name__.startswith("Checkpointed") for layer in random_qwen2.layers)
    _assert_same(plain, _applied_grads(random_qwen2, cfg, compiled=False))
    _assert_same(plain, _applied_grads(random_qwen2, cfg, compiled=True))


def test_grad_checkpoint_is_scoped_to_the_model_being_trained(monkeypatch):
    """training.grad_checkpoint checkpoints the policy's blocks once each, and no other model:
    not a model built afterwards in the same process, and a second checkpointed build does not
    wrap twice. Before, build_policy patched the block class (mlx-lm's grad_checkpoint), so a
    later plain model was checkpointed too and every build added a nested wrapper."""
    plain, ckpt = load_config(None), load_config(None, ["training.grad_checkpoint=true"])
    first = build_policy(plain)[0]
    block, call = type(first.layers[0]), type(first.layers[0]).__call__
    build_policy(ckpt)
    twice = build_policy(ckpt)[0]
    after = build_policy(plain)[0]
    assert block.__call__ is call and type(after.layers[0]) is block is type(first.layers[0])

    calls = []
    checkpoint = mx.checkpoint
    monkeypatch.setattr(mx, "checkpoint", lambda fn: calls.append(fn) or checkpoint(fn))
    tokens = mx.array([[1, 2, 3, 4]])
    mx.eval(after(tokens), first(tokens))
    assert calls == []
    mx.eval(twice(tokens))
    assert len(calls) == len(twice.layers)  # one checkpoint per block, not nested


def test_first_of_several_updates_has_ratio_one_under_lora_dropout(random_qwen2):
    """num_iterations = 2 with LoRA dropout 0.5: the first update's ratio is exactly 1 (no
    parameter has moved), so nothing is clipped even at epsilon = 1e-3, and grpo's loss is
    mean(-A) = 0 (advantages sum to 0 per group). Before, old_logp came from the eval-mode
    (dropout-free) pass while logp was computed with dropout, so the first update already
    clipped tokens; the second update, against the stored old_logp, still does here."""
    from mlx_grpo.config import LoraConfig
    from mlx_grpo.models.load import add_adapters
    from mlx_grpo.update.step import run_updates

    model = random_qwen2
    add_adapters(model, LoraConfig(rank=4, dropout=0.5))
    mx.random.seed(1)
    model.update(tree_unflatten([(k, 0.2 * mx.random.normal(v.shape)) for k, v in
                                 tree_flatten(model.trainable_parameters()) if k.endswith("lora_b")]))
    cfg = _cfg("grpo", "grpo.beta=0", "grpo.num_iterations=2", "grpo.epsilon=1e-3")
    model.eval()  # as the rollout leaves it: old_logp is the sampling policy's, without dropout
    batches = prepare_batches(model, None, _rollout(), [1.0, 0.0, 0.5, 0.0, 1.0, 1.0], cfg)
    inner, seen = make_grad_fn(model, make_loss_fn(cfg), compiled=False), []

    def grad_fn(batch):
        (loss, metrics), grads = inner(batch)
        seen.append((loss.item(), metrics["clip_ratio/region_mean"].item()))
        return (loss, metrics), grads

    run_updates(model, optim.SGD(learning_rate=1e-3), batches, grad_fn, cfg)
    (first_loss, first_clip), (_, second_clip) = seen
    assert first_clip == 0.0 and abs(first_loss) < 1e-6
    assert second_clip > 0.0


def test_mask_truncated_completions_leaves_truncated_rows_out_of_the_loss(random_qwen2):
    """Row 2 of the rollout hit max_new_tokens. With grpo.mask_truncated_completions its tokens
    carry no loss: other tokens in their place leave the gradient as it was. Without the key
    they change it. (On-policy with the policy as reference the loss value is 0 either way.)"""
    other = _rollout()
    other.completion_tokens[2] = [(t + 7) % 63 + 1 for t in other.completion_tokens[2]]  # same length
    rewards = [1.0, 0.0, 0.0, 0.0, 1.0, 1.0]  # row 2's advantage is -1/3 / std, not 0
    for masked in (True, False):
        cfg = _cfg("grpo", "training.max_grad_norm=0", f"grpo.mask_truncated_completions={str(masked).lower()}")
        a = _applied_grads(random_qwen2, cfg, compiled=False, rewards=rewards)
        b = _applied_grads(random_qwen2, cfg, compiled=False, rollout=other, rewards=rewards)
        if masked:
            _assert_same(a, b, rtol=1e-6, atol=1e-9)
        else:
            assert any(not mx.allclose(a[1][k], b[1][k], rtol=1e-4, atol=1e-6).item() for k in a[1])


def test_one_eval_per_micro_batch_gives_the_same_update_at_a_lower_peak(random_qwen2):
    """The reason for EVAL_EACH_MICRO_BATCH: built lazily, one eval per update holds every
    micro-batch's activations at once (6 micro-batches of one row here)."""
    cfg = _cfg("dapo", "training.micro_batch_size=1")
    batches = prepare_batches(random_qwen2, random_qwen2, _rollout(), [1.0, 0.0, 0.5, 0.0, 1.0, 1.0], cfg)
    grad_fn = make_grad_fn(random_qwen2, make_loss_fn(cfg), compiled=False)
    start = {k: mx.array(v) for k, v in tree_flatten(random_qwen2.parameters())}
    results = []
    for eval_each in (True, False):
        random_qwen2.update(tree_unflatten(list(start.items())))
        mx.eval(random_qwen2.parameters())
        mx.reset_peak_memory()
        held = mx.get_active_memory()  # what earlier tests left alive is not the update's
        loss, norm, metrics = update(random_qwen2, optim.SGD(learning_rate=0.1), batches, grad_fn, cfg,
                                     eval_each=eval_each)
        peak = mx.get_peak_memory() - held
        results.append((loss, norm, metrics, dict(tree_flatten(random_qwen2.parameters())), peak))
    (loss_a, norm_a, m_a, w_a, peak_each), (loss_b, norm_b, m_b, w_b, peak_once) = results
    assert (loss_a, norm_a, m_a) == (loss_b, norm_b, m_b)
    assert all(mx.array_equal(w_a[k], w_b[k]).item() for k in w_a)
    print(f"update's peak {peak_each} B evaluating each micro-batch, {peak_once} B once")
    assert peak_once > 1.5 * peak_each


class _Clock:
    """Fake perf_counter: returns the given times in order, counting the calls."""

    def __init__(self, times):
        self.times = list(times)

    def __call__(self):
        return self.times.pop(0)


@pytest.mark.parametrize("plain_s, compiled_s, faster", [(5.0, 2.0, "compiled"), (1.0, 3.0, "plain")])
def test_compile_decision_keeps_the_faster_per_shape(random_qwen2, plain_s, compiled_s, faster):
    from mlx_grpo.update.grad import FasterOf, shape_key

    cfg = _cfg("dapo", "training.micro_batch_size=4")
    batches = prepare_batches(random_qwen2, random_qwen2, _rollout(), [1.0, 0.0, 0.5, 0.0, 1.0, 1.0], cfg)
    assert [b.inputs.shape[0] for b in batches] == [4, 2]  # two shapes
    plain = make_grad_fn(random_qwen2, make_loss_fn(cfg), compiled=False)
    compiled = make_grad_fn(random_qwen2, make_loss_fn(cfg), compiled=True)
    # tic/toc of the tracing call, plain, then compiled, for each of the two shapes
    clock = _Clock([0.0, 7.0, 8.0, 8.0 + plain_s, 10.0, 10.0 + compiled_s] * 2)  # trace, plain, compiled
    grad_fn = FasterOf(plain, compiled, clock=clock)
    (loss, _), grads = grad_fn(batches[0])
    key = shape_key(batches[0])
    assert grad_fn.choice == {key: faster} and grad_fn.seconds[key] == {"plain": plain_s, "compiled": compiled_s}
    (again, _), _ = grad_fn(batches[0])  # decided: no timing, the chosen function alone
    assert len(clock.times) == 6 and again.item() == loss.item()
    grad_fn(batches[1])  # a new shape is measured once more
    assert not clock.times and set(grad_fn.choice.values()) == {faster} and len(grad_fn.choice) == 2
    # On the CPU backend the choice changes the speed, not the numbers.
    (ref_loss, _), ref_grads = plain(batches[0])
    assert mx.array_equal(loss, ref_loss).item()
    assert all(mx.array_equal(g, ref).item() for g, ref in
               zip(dict(tree_flatten(grads)).values(), dict(tree_flatten(ref_grads)).values()))
