"""Tool tokens are context, not the policy's: the update's gradient equals that of a loss masked
by hand to the sampled tokens, on the padded and the shared-prefix paths, with the KL term on."""

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten

from mlx_grpo.algorithm.advantages import group_advantages
from mlx_grpo.algorithm.loss import completion_logprobs
from mlx_grpo.config import load_config
from mlx_grpo.rollout.sample import Rollout
from mlx_grpo.update.batches import prepare_batches
from mlx_grpo.update.grad import make_grad_fn
from mlx_grpo.update.step import make_loss_fn

BETA, T = 0.04, 0.7
REWARDS = [1.0, 0.0, 0.25, 1.0]


def _episodes():
    """2 prompts x G=2 episodes; 0 marks the tokens a tool appended between two sampled turns."""
    rng = np.random.default_rng(1)
    prompts = [rng.integers(1, 64, 6).tolist(), rng.integers(1, 64, 4).tolist()]
    trainable = [[1, 1, 1, 0, 0, 0, 1, 1], [1, 1, 1, 1, 1], [1, 1, 0, 0, 0, 0, 1, 1, 1, 1], [1, 0, 0, 1]]
    return Rollout(
        prompt_tokens=[prompts[i // 2] for i in range(4)],
        completion_tokens=[rng.integers(1, 64, len(m)).tolist() for m in trainable],
        texts=[""] * 4, truncated=[False] * 4, group_size=2,
        trainable=[[float(x) for x in m] for m in trainable],
    )


def _hand_loss(ref_model, rollout, trainable):
    """dapo, on-policy: sum over the tokens marked 1 of -A r + beta KL r, over their count."""
    m = mx.array([list(t) + [0.0] * (10 - len(t)) for t in trainable])  # (4, 10)
    adv = group_advantages(REWARDS, 2, "group")[:, None]
    ref = completion_logprobs(ref_model, rollout.prompt_tokens, rollout.completion_tokens, T)

    def loss(model):
        logp = completion_logprobs(model, rollout.prompt_tokens, rollout.completion_tokens, T)  # (4, 10)
        ratio = mx.exp(logp - mx.stop_gradient(logp))
        kl = mx.exp(ref - logp) - (ref - logp) - 1
        return ((-adv * ratio + BETA * kl * ratio) * m).sum() / m.sum()

    return loss


@pytest.mark.parametrize("shared_prefix", [False, True])
def test_the_gradient_is_the_hand_masked_loss(random_qwen2, shared_prefix):
    from mlx_lm.models import qwen2

    mx.random.seed(5)
    ref_model = qwen2.Model(random_qwen2.args)  # a different reference, so the KL term is not 0
    mx.eval(ref_model.parameters())
    cfg = load_config(None, [
        f"training.shared_prefix={str(shared_prefix).lower()}", "generation.num_generations=2",
        "training.prompts_per_step=2", "grpo.loss_type=dapo", f"grpo.beta={BETA}", f"generation.temperature={T}",
    ])
    rollout = _episodes()
    (batch,) = prepare_batches(random_qwen2, ref_model, rollout, REWARDS, cfg)
    assert batch.mask.sum().item() == sum(map(sum, rollout.trainable)) == 18
    (loss, metrics), grads = make_grad_fn(random_qwen2, make_loss_fn(cfg), compiled=False)(batch)
    hand = _hand_loss(ref_model, rollout, rollout.trainable)
    want_loss, want = nn.value_and_grad(random_qwen2, hand)(random_qwen2)
    assert loss.item() == pytest.approx(want_loss.item(), rel=1e-5)
    got, want = dict(tree_flatten(grads)), dict(tree_flatten(want))
    for k in want:
        assert mx.allclose(got[k], want[k], rtol=1e-4, atol=1e-6).item(), k
    # the same loss over every token (tool tokens scored too) has another gradient: the mask matters
    unmasked = nn.value_and_grad(random_qwen2, _hand_loss(ref_model, rollout, [[1.0] * len(t) for t in rollout.trainable]))
    other = dict(tree_flatten(unmasked(random_qwen2)[1]))
    assert max(mx.abs(other[k] - want[k]).max().item() for k in want) > 1e-4
    # the KL and the entropy are token means over the sampled tokens alone
    logp_ref = completion_logprobs(ref_model, rollout.prompt_tokens, rollout.completion_tokens, T)
    logp = completion_logprobs(random_qwen2, rollout.prompt_tokens, rollout.completion_tokens, T)
    m = mx.array([t + [0.0] * (10 - len(t)) for t in rollout.trainable])
    kl = ((mx.exp(logp_ref - logp) - (logp_ref - logp) - 1) * m).sum() / m.sum()
    assert metrics["kl"].item() == pytest.approx(kl.item(), rel=1e-4)
