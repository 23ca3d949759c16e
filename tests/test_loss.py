import math

import mlx.core as mx
import numpy as np
import pytest

from mlx_grpo.algorithm.loss import completion_logprobs, grpo_loss, pack_sequences, token_logprobs

KW = dict(beta=0.0, epsilon=0.2, epsilon_high=0.2, max_completion_length=4)


def _np(x):
    return np.array(x, dtype=np.float64)


@pytest.mark.parametrize(
    "loss_type, num_items, expected",
    [
        # on-policy: ratio = 1, token loss = -A: row 0 -> -2 on 3 tokens, row 1 -> +1 on 2 tokens
        ("grpo", None, (-2 + 1) / 2),  # mean of per-sequence means
        ("bnpo", None, (-6 + 2) / 5),  # token mean
        ("dr_grpo", None, (-6 + 2) / (2 * 4)),  # sum / (N * max_new_tokens)
        ("dapo", 10.0, (-6 + 2) / 10),  # sum / tokens of the whole step
    ],
)
def test_on_policy_aggregations(loss_type, num_items, expected):
    logp = mx.array([[-1.0, -2.0, -0.5], [-0.2, -0.3, -9.0]])
    mask = mx.array([[1, 1, 1], [1, 1, 0]])
    adv = mx.array([2.0, -1.0])
    loss, _ = grpo_loss(logp, None, None, adv, mask, loss_type=loss_type, num_items=num_items, **KW)
    assert loss.item() == pytest.approx(expected, rel=1e-6)


def test_clipping_value_gradient_and_metrics():
    # ratio = [1.5, 0.5]; eps 0.2 -> clip range [0.8, 1.2]
    # A = +1: -min(1.5, 1.2) = -1.2 ; -min(0.5, 0.8) = -0.5 -> bnpo mean -0.85
    # A = -1: -min(-1.5, -1.2) = 1.5 ; -min(-0.5, -0.8) = 0.8 -> mean 1.15
    old = mx.zeros((2, 2))
    logp = mx.array([[math.log(1.5), math.log(0.5)]] * 2)
    mask = mx.ones((2, 2))
    adv = mx.array([1.0, -1.0])
    loss, m = grpo_loss(logp, old, None, adv, mask, loss_type="grpo", **KW)
    assert loss.item() == pytest.approx((-0.85 + 1.15) / 2, rel=1e-6)
    # token 0 of row 0 (ratio above 1+eps, A > 0) and token 1 of row 1 (below 1-eps, A < 0)
    assert m["clip_ratio/high_mean"].item() == pytest.approx(0.25)
    assert m["clip_ratio/low_mean"].item() == pytest.approx(0.25)
    assert m["clip_ratio/region_mean"].item() == pytest.approx(0.5)

    # Clipped tokens pass no gradient; the others give d(-r A)/dlogp = -r A, / 2 tokens / 2 rows.
    grad = mx.grad(lambda lp: grpo_loss(lp, old, None, adv, mask, loss_type="grpo", **KW)[0])(logp)
    np.testing.assert_allclose(_np(grad), [[0.0, -0.5 / 4], [1.5 / 4, 0.0]], atol=1e-6)


def test_kl_term_k3_estimator():
    # delta = ref - logp = [0, 1]: kl = [0, e - 2]; A = 0, ratio = 1 -> L = beta * kl
    logp = mx.array([[-1.0, -2.0]])
    ref = mx.array([[-1.0, -1.0]])
    loss, m = grpo_loss(logp, None, ref, mx.array([0.0]), mx.ones((1, 2)), loss_type="bnpo",
                        **{**KW, "beta": 0.1})
    assert loss.item() == pytest.approx(0.1 * (math.e - 2) / 2, rel=1e-6)
    assert m["kl"].item() == pytest.approx((math.e - 2) / 2, rel=1e-6)


def test_kl_gradient_includes_ratio_correction():
    # L = beta * kl * r with r = exp(logp - sg(logp)): d/dlogp = beta * (dkl/dlogp + kl)
    # dkl/dlogp = -exp(delta) + 1 ; at delta = 1: 1 - e; kl = e - 2 -> total beta * (-1)
    logp = mx.array([[-2.0]])
    ref = mx.array([[-1.0]])
    f = lambda lp: grpo_loss(lp, None, ref, mx.array([0.0]), mx.ones((1, 1)), loss_type="bnpo",
                             **{**KW, "beta": 0.1})[0]
    assert mx.grad(f)(logp).item() == pytest.approx(-0.1, rel=1e-5)


def test_gspo_multiplies_the_kl_term_by_the_sequence_ratio():
    """With beta > 0, GSPO differs from token level even on-policy: the KL term is multiplied
    by the sequence ratio r = exp(mean_s(logp_s - sg(logp_s))) (TRL: per_token_kl * coef_1 when
    use_bias_correction_kl is on), whose gradient is 1/T at every token.
    logp = [-2, -1], ref = [-1, -1], A = 0, beta = 0.1, bnpo over T = 2 tokens:
    delta = ref - logp = [1, 0]; KL = [e - 2, 0]; dKL/dlogp = 1 - e^delta = [1 - e, 0];
    value (both levels, r = 1): 0.1 (e - 2) / 2.
    token:    dL/dlogp_t = 0.05 (dKL_t + KL_t)            = 0.05 [(1 - e) + (e - 2), 0] = [-0.05, 0]
    sequence: dL/dlogp_t = 0.05 (dKL_t + (KL_1 + KL_2) / 2) = 0.05 [1 - e + (e - 2) / 2, (e - 2) / 2]
                                                          = [-0.025 e, 0.025 (e - 2)]
    The README (now docs/algorithm.md) said GSPO only differs when num_iterations > 1."""
    from pathlib import Path

    logp, ref, mask = mx.array([[-2.0, -1.0]]), mx.array([[-1.0, -1.0]]), mx.ones((1, 2))

    def loss(lp, level):
        return grpo_loss(lp, None, ref, mx.array([0.0]), mask, loss_type="bnpo", importance_sampling_level=level,
                         **{**KW, "beta": 0.1})[0]

    for level in ("token", "sequence"):
        assert loss(logp, level).item() == pytest.approx(0.1 * (math.e - 2) / 2, rel=1e-6)
    np.testing.assert_allclose(_np(mx.grad(lambda lp: loss(lp, "token"))(logp)), [[-0.05, 0.0]], atol=1e-6)
    np.testing.assert_allclose(_np(mx.grad(lambda lp: loss(lp, "sequence"))(logp)),
                               [[-0.025 * math.e, 0.025 * (math.e - 2)]], rtol=1e-5)
    readme = (Path(__file__).parent.parent / "docs" / "algorithm.md").read_text()
    gspo = readme[readme.index("**GSPO"):].split("\n\n", 1)[0]
    assert "only differs" not in gspo and "with `beta > 0` the KL term still differs on-policy" in gspo


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
def test_padding_does_not_change_loss(loss_type):
    logp = mx.array([[-1.0, -2.0], [-0.5, -0.1]])
    old = logp - 0.1
    ref = logp + 0.3
    mask = mx.array([[1, 1], [1, 0]])
    adv = mx.array([0.7, -0.4])
    kw = {**KW, "beta": 0.05}
    base, _ = grpo_loss(logp, old, ref, adv, mask, loss_type=loss_type, **kw)
    junk = mx.full((2, 3), -7.0)
    pad = lambda x: mx.concatenate([x, junk], axis=1)
    wide_mask = mx.concatenate([mask, mx.zeros((2, 3))], axis=1)
    padded, _ = grpo_loss(pad(logp), pad(old), pad(ref), adv, wide_mask, loss_type=loss_type, **kw)
    assert padded.item() == pytest.approx(base.item(), rel=1e-6)


def test_unknown_loss_type():
    with pytest.raises(ValueError, match="loss_type"):
        grpo_loss(mx.zeros((1, 1)), None, None, mx.zeros(1), mx.ones((1, 1)), loss_type="ppo", **KW)


def test_completion_logprobs_match_full_log_softmax(random_qwen2):
    prompts = [[1, 2, 3], [4, 5]]
    completions = [[6, 7], [8, 9, 10]]
    lp = completion_logprobs(random_qwen2, prompts, completions, temperature=0.7)
    assert lp.shape == (2, 3)
    for i, (p, c) in enumerate(zip(prompts, completions)):
        logits = random_qwen2(mx.array([p + c]))[0] / 0.7
        ref = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        expected = [ref[len(p) - 1 + t, tok].item() for t, tok in enumerate(c)]
        np.testing.assert_allclose(_np(lp[i, : len(c)]), expected, rtol=1e-4, atol=1e-5)
        assert _np(lp[i, len(c):]).tolist() == [0.0] * (3 - len(c))


def test_pack_sequences_pads_to_multiple():
    inputs, positions, targets, mask = pack_sequences([[1, 2, 3], [4]], [[5, 6], [7, 8, 9]], pad_to=32)
    assert inputs.shape == (2, 32) and positions.shape == (2, 32)
    assert positions[0, :2].tolist() == [2, 3] and positions[1, :3].tolist() == [0, 1, 2]
    assert mask.sum().item() == 5 and targets[1, :3].tolist() == [7, 8, 9]


def test_extra_padding_does_not_change_logprobs(random_qwen2):
    args = pack_sequences([[1, 2, 3]], [[4, 5]], pad_to=1)
    wide = pack_sequences([[1, 2, 3]], [[4, 5]], pad_to=32)
    a = token_logprobs(random_qwen2, *args[:3])
    b = token_logprobs(random_qwen2, *wide[:3])[:, :2]
    np.testing.assert_allclose(_np(a), _np(b), rtol=1e-5, atol=1e-6)
