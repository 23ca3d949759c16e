"""GSPO's sequence-level ratio, TRL's clip metrics off-policy, entropies and the top-entropy mask."""

import math

import mlx.core as mx
import numpy as np
import pytest

from mlx_grpo.algorithm.loss import grpo_loss, high_entropy_mask, pack_sequences, token_logprobs, token_logprobs_and_entropies

KW = dict(beta=0.0, epsilon=0.2, epsilon_high=0.2, max_completion_length=3)

# Shared 2x3 batch, as after one update with num_iterations > 1 (old_logp != logp):
# log ratios row 0 = [0.6, 0.3, 0.0], row 1 = [-0.1, -0.3, (5.0 masked)]; A = [+1, -1].
OLD = mx.zeros((2, 3))
LOGP = mx.array([[0.6, 0.3, 0.0], [-0.1, -0.3, 5.0]])
MASK = mx.array([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
ADV = mx.array([1.0, -1.0])


def _np(x):
    return np.array(x, dtype=np.float64)


def test_token_level_clip_metrics_off_policy():
    # ratios row 0: e^.6 = 1.822, e^.3 = 1.350, 1 -> A = +1: -min(r, clip(r)) = -1.2, -1.2, -1
    # ratios row 1: e^-.1 = 0.905, e^-.3 = 0.741 -> A = -1: max(r, clip(r)) = 0.905, 0.8
    # grpo: mean of row means = (-3.4 / 3 + (0.904837 + 0.8) / 2) / 2
    loss, m = grpo_loss(LOGP, OLD, None, ADV, MASK, loss_type="grpo", **KW)
    assert loss.item() == pytest.approx((-3.4 / 3 + (math.exp(-0.1) + 0.8) / 2) / 2, rel=1e-6)
    # high: row 0 tokens 0, 1 (r > 1.2, A > 0) = 2 of 5 valid tokens; low: row 1 token 1
    # (r < 0.8, A < 0) = 1 of 5; region = 3 of 5. The masked token (r = e^5) counts nowhere.
    assert m["clip_ratio/high_mean"].item() == pytest.approx(2 / 5)
    assert m["clip_ratio/low_mean"].item() == pytest.approx(1 / 5)
    assert m["clip_ratio/region_mean"].item() == pytest.approx(3 / 5)


def test_sequence_level_ratio_is_gspo():
    # row 0: mean log ratio (0.6 + 0.3 + 0) / 3 = 0.3 -> r = e^.3 = 1.34986 > 1.2, A = +1: -1.2 per token
    # row 1: (-0.1 - 0.3) / 2 = -0.2 (masked 5.0 left out) -> r = e^-.2 = 0.81873, A = -1: +0.81873
    # grpo: (-1.2 + 0.81873) / 2 = -0.190635
    kw = {**KW, "importance_sampling_level": "sequence"}
    loss, m = grpo_loss(LOGP, OLD, None, ADV, MASK, loss_type="grpo", **kw)
    assert loss.item() == pytest.approx((-1.2 + math.exp(-0.2)) / 2, rel=1e-6)
    # one ratio per sequence, so TRL's metric is the mean over the 2 rows: row 0 high-clipped
    assert m["clip_ratio/high_mean"].item() == pytest.approx(0.5)
    assert m["clip_ratio/low_mean"].item() == pytest.approx(0.0)
    assert m["clip_ratio/region_mean"].item() == pytest.approx(0.5)
    # row 0 is clipped: no gradient. Row 1: loss = r1 / 2 rows; dr1/dlogp[1,t] = r1 * m_t / 2 tokens
    # -> r1 / 4 = 0.204683 on its two valid tokens, 0 on the masked one.
    grad = mx.grad(lambda lp: grpo_loss(lp, OLD, None, ADV, MASK, loss_type="grpo", **kw)[0])(LOGP)
    r1 = math.exp(-0.2)
    np.testing.assert_allclose(_np(grad), [[0, 0, 0], [r1 / 4, r1 / 4, 0]], atol=1e-6)


def test_sequence_level_kl_uses_sequence_ratio():
    # on-policy (ratio 1), A = 0: only beta * kl remains; kl of delta 1 = e - 2, bnpo over 3 tokens
    logp = mx.array([[-2.0, -1.0, -1.0]])
    ref = mx.array([[-1.0, -1.0, -1.0]])
    loss, m = grpo_loss(logp, None, ref, mx.array([0.0]), mx.ones((1, 3)), loss_type="bnpo",
                        **{**KW, "beta": 0.1, "importance_sampling_level": "sequence"})
    assert loss.item() == pytest.approx(0.1 * (math.e - 2) / 3, rel=1e-6)


def test_high_entropy_mask_hand_computed():
    e = mx.array([[0.1, 0.5, 0.9], [0.3, 0.7, 2.0]])  # 2.0 sits on a padding position
    # valid sorted: [0.1, 0.3, 0.5, 0.7, 0.9]; top 0.5 -> quantile 0.5 at position 0.5 * 4 = 2 -> 0.5
    assert high_entropy_mask(e, MASK, 0.5).tolist() == [[0, 1, 1], [0, 1, 0]]
    # top 0.3 -> quantile 0.7 at position 2.8: 0.5 + 0.8 (0.7 - 0.5) = 0.66 -> keeps 0.9 and 0.7
    assert high_entropy_mask(e, MASK, 0.3).tolist() == [[0, 0, 1], [0, 1, 0]]
    # no valid token: nothing kept
    assert high_entropy_mask(e, MASK * 0, 0.5).tolist() == [[0, 0, 0], [0, 0, 0]]


def test_top_entropy_quantile_masks_policy_loss_and_logs_entropy():
    # on-policy, A = [2, -1]: token losses -2 (row 0) and +1 (row 1). Mask at top 0.5 (above):
    # [[0,1,1],[0,1,0]] -> sum -2 - 2 + 1 = -3; bnpo still divides by the 5 valid tokens: -0.6
    e = mx.array([[0.1, 0.5, 0.9], [0.3, 0.7, 2.0]])
    logp = mx.array([[-1.0, -2.0, -0.5], [-0.2, -0.3, -9.0]])
    adv = mx.array([2.0, -1.0])
    loss, m = grpo_loss(logp, None, None, adv, MASK, loss_type="bnpo", top_entropy_quantile=0.5,
                        entropies=e, **KW)
    assert loss.item() == pytest.approx(-0.6, rel=1e-6)
    # entropy metric: mean over valid tokens (0.1 + 0.5 + 0.9 + 0.3 + 0.7) / 5 = 0.5
    assert m["entropy"].item() == pytest.approx(0.5, rel=1e-6)
    full, _ = grpo_loss(logp, None, None, adv, MASK, loss_type="bnpo", entropies=e, **KW)
    assert full.item() == pytest.approx((-6 + 2) / 5, rel=1e-6)


def test_bad_variant_arguments():
    x = mx.zeros((1, 1))
    with pytest.raises(ValueError, match="importance_sampling_level"):
        grpo_loss(x, None, None, mx.zeros(1), mx.ones((1, 1)), loss_type="grpo",
                  importance_sampling_level="seq", **KW)
    with pytest.raises(ValueError, match="entropies are required"):
        grpo_loss(x, None, None, mx.zeros(1), mx.ones((1, 1)), loss_type="grpo", top_entropy_quantile=0.2, **KW)


def test_entropies_match_full_softmax_from_one_forward(random_qwen2):
    inputs, positions, targets, mask = pack_sequences([[1, 2, 3], [4, 5]], [[6, 7], [8, 9, 10]])
    logp, ent = token_logprobs_and_entropies(random_qwen2, inputs, positions, targets, temperature=0.7)
    np.testing.assert_allclose(_np(logp), _np(token_logprobs(random_qwen2, inputs, positions, targets, 0.7)),
                               rtol=1e-6, atol=1e-6)
    for i, (p, c) in enumerate([([1, 2, 3], [6, 7]), ([4, 5], [8, 9, 10])]):
        logits = random_qwen2(mx.array([p + c]))[0] / 0.7
        lp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        h = -(mx.exp(lp) * lp).sum(-1)  # -sum p log p at each position
        expected = [h[len(p) - 1 + t].item() for t in range(len(c))]
        np.testing.assert_allclose(_np(ent[i, : len(c)]), expected, rtol=1e-4, atol=1e-5)
    # a 64-token vocabulary: 0 < H <= log 64
    assert 0 < float(ent.min()) and float(ent.max()) <= math.log(64) + 1e-5
