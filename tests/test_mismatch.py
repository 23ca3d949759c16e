"""Sampler/trainer mismatch: the sampler's own log-probs, the gap metrics and the
importance-sampling correction (algorithm/mismatch.py), against hand-computed numbers."""

import math

import mlx.core as mx
import numpy as np
import pytest

from mlx_grpo.algorithm.loss import completion_logprobs, grpo_loss
from mlx_grpo.algorithm.mismatch import importance_weights, mismatch_metrics
from mlx_grpo.config import load_config
from mlx_grpo.data.chat import DEFAULT_SYSTEM_PROMPT, render_prompt
from mlx_grpo.rollout.sample import generate_completions, make_rollout_sampler, make_sampling_logprob
from mlx_grpo.update.settings import UpdateSettings

LN2 = math.log(2.0)
# trainer - sampler log-prob per token: row 0 [0, ln 2, ln 4], row 1 [-ln 2, ln 8, padding]
D = [[0.0, LN2, 2 * LN2], [-LN2, 3 * LN2, 0.0]]
MASK = mx.array([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
TRAINER = mx.array([[-1.0, -1.0, -1.0], [-2.0, -2.0, -2.0]])
SAMPLER = TRAINER - mx.array(D)


def test_token_truncate_weights_by_hand():
    # exp(d) = [1, 2, 4], [0.5, 8]; capped at 3: [1, 2, 3], [0.5, 3]
    w, m = importance_weights(TRAINER, SAMPLER, MASK, "token_truncate", cap=3.0)
    np.testing.assert_allclose(np.array(w * MASK), [[1, 2, 3], [0.5, 3, 0]], rtol=1e-6)
    # over the 5 tokens: mean (1 + 2 + 3 + 0.5 + 3) / 5 = 1.9, min 0.5, max 3
    assert m["sampling/importance_sampling_ratio/mean"].item() == pytest.approx(1.9, rel=1e-6)
    assert m["sampling/importance_sampling_ratio/min"].item() == pytest.approx(0.5, rel=1e-6)
    assert m["sampling/importance_sampling_ratio/max"].item() == pytest.approx(3.0, rel=1e-6)
    # a floor of 0.75 lifts the 0.5 (TRL's clip_min)
    w, _ = importance_weights(TRAINER, SAMPLER, MASK, "token_truncate", cap=3.0, floor=0.75)
    assert w[1, 0].item() == pytest.approx(0.75)


def test_sequence_mask_weights_by_hand():
    """TRL's sequence_mask: rho = exp(sum_t d), kept as the weight where clip_min <= rho <= clip_max,
    0 where rho < clip_min or rho > clip_max (grpo_trainer.py masks the ratio, it does not binarize it)."""
    # a third row d = [-ln 2, -ln 2, 0]. Sequence sums of d: 3 ln 2, 2 ln 2, -2 ln 2; rho = 8, 4, 1/4.
    d = mx.array(D + [[-LN2, -LN2, 0.0]])
    mask = mx.concatenate([MASK, mx.array([[1.0, 1.0, 1.0]])])
    trainer = mx.zeros((3, 3))
    # band [0.5, 5]: 8 > 5 -> 0; 0.5 <= 4 <= 5 -> 4; 1/4 < 0.5 -> 0
    w, m = importance_weights(trainer, trainer - d, mask, "sequence_mask", cap=5.0, floor=0.5)
    assert w.shape == (3, 1)
    np.testing.assert_allclose(np.array(w).reshape(-1), [0.0, 4.0, 0.0], rtol=1e-6)
    # over the 3 completions: mean (0 + 4 + 0) / 3, min 0, max 4; 2 of 3 masked
    assert m["sampling/importance_sampling_ratio/mean"].item() == pytest.approx(4 / 3, rel=1e-6)
    assert m["sampling/importance_sampling_ratio/min"].item() == 0.0
    assert m["sampling/importance_sampling_ratio/max"].item() == pytest.approx(4.0, rel=1e-6)
    assert m["sampling/importance_sampling_masked_frac"].item() == pytest.approx(2 / 3)
    # band [0.2, 4.5]: 8 -> 0; 4 -> 4; 1/4 -> 1/4 (inside, so it keeps its ratio: not 1, not 0)
    w, m = importance_weights(trainer, trainer - d, mask, "sequence_mask", cap=4.5, floor=0.2)
    np.testing.assert_allclose(np.array(w).reshape(-1), [0.0, 4.0, 0.25], rtol=1e-6)
    assert m["sampling/importance_sampling_masked_frac"].item() == pytest.approx(1 / 3)
    # floor 0 (TRL's clip_min None): a ratio that underflows to 0 is inside the band, not masked
    w, m = importance_weights(mx.zeros((1, 1)), mx.array([[200.0]]), mx.ones((1, 1)), "sequence_mask", cap=3.0)
    assert w.item() == 0.0 and m["sampling/importance_sampling_masked_frac"].item() == 0.0


def test_mismatch_metrics_by_hand():
    m = mismatch_metrics(TRAINER, SAMPLER, MASK)
    # |d| over 5 tokens: (0 + 1 + 2 + 1 + 3) ln 2 / 5 = 1.4 ln 2; max 3 ln 2
    assert m["sampling/logprob_diff_mean"].item() == pytest.approx(1.4 * LN2, rel=1e-6)
    assert m["sampling/logprob_diff_max"].item() == pytest.approx(3 * LN2, rel=1e-6)
    # k1 = -d: 0, -ln 2, -2 ln 2, ln 2, -3 ln 2; sum -5 ln 2, mean / 5 = -ln 2 (one batch may read < 0)
    assert m["sampling/kl"].item() == pytest.approx(-LN2, rel=1e-6)


def _k3(trainer, sampler):
    d = trainer - sampler
    return (mx.exp(d) - d - 1).mean().item()


def test_sampling_kl_under_top_p_and_top_k_is_exact_where_k3_reads_low():
    """Truncation of the trainer's own distribution: s = t / t(S) on the kept set S, so d = log t(S)
    on every drawn token and KL(s || t) = -log t(S) exactly, whatever was drawn."""
    probs = [0.5, 0.3, 0.15, 0.05]  # PROBS, T = 1
    for flags, drawn, kept in (({"top_p": 0.7}, [0, 1, 0], 0.8), ({"top_k": 1}, [0, 0], 0.5)):
        sampler = mx.array([[_sampling_logprob(x, 1.0, **flags) for x in drawn]])
        trainer = mx.log(mx.array([[probs[x] for x in drawn]]))
        kl = mismatch_metrics(trainer, sampler, mx.ones(trainer.shape))["sampling/kl"].item()
        assert kl == pytest.approx(-math.log(kept), rel=1e-5)
        # k3 reads KL - (1 - t(S)): top_p 0.7: 0.2231 - 0.2 = 0.0231 (9.6x low);
        # top_k 1: 0.6931 - 0.5 = 0.1931 (3.6x low)
        assert _k3(trainer, sampler) == pytest.approx(-math.log(kept) - (1 - kept), rel=1e-4)


def test_sampling_kl_is_unbiased_under_top_k_of_other_logits():
    """A sampler with its own logits (as a quantized copy has), cut to its top 2: the trainer's
    t = [0.4, 0.3, 0.2, 0.1], the sampler's q = [0.45, 0.45, 0.05, 0.05] -> s = [0.5, 0.5, 0, 0].
    KL(s || t) = 0.5 ln(0.5 / 0.4) + 0.5 ln(0.5 / 0.3) = 0.5 (0.22314 + 0.51083) = 0.36698.
    -d is 0.22314 or 0.51083 with probability 1/2 each: std (0.51083 - 0.22314) / 2 = 0.14384,
    so over 20000 draws the standard error is 0.14384 / sqrt(20000) = 0.00102.
    k3's mean is KL - (1 - t(S)) = 0.36698 - 0.3 = 0.06698, 5.5x low (k3 is 0.8 + 0.22314 - 1 =
    0.02314 or 0.6 + 0.51083 - 1 = 0.11083: standard error (0.11083 - 0.02314) / 2 / sqrt(20000) = 0.00031)."""
    t = mx.log(mx.array([0.4, 0.3, 0.2, 0.1]))
    q = mx.log(mx.array([[0.45, 0.45, 0.05, 0.05]]))
    draws = np.random.default_rng(0).choice(4, size=20000, p=[0.5, 0.5, 0.0, 0.0])
    sampler_logprob = make_sampling_logprob(1.0, 0.0, 2, 0.0)  # top_k 2
    tokens = mx.array(draws)
    sampler = sampler_logprob(mx.broadcast_to(q, (len(draws), 4)), tokens)[None]  # (1, 20000)
    trainer = t[tokens][None]
    np.testing.assert_allclose(np.exp(np.array(sampler[0, :2])), [0.5, 0.5], rtol=1e-5)
    kl = mismatch_metrics(trainer, sampler, mx.ones(trainer.shape))["sampling/kl"].item()
    exact = 0.5 * math.log(0.5 / 0.4) + 0.5 * math.log(0.5 / 0.3)
    assert abs(kl - exact) < 4 * 0.00102
    assert _k3(trainer, sampler) == pytest.approx(exact - 0.3, abs=4 * 0.00031)  # far below exact


def _loss(logp, correction, cap=3.0, **kw):
    return grpo_loss(
        logp, None, None, mx.array([1.0, -1.0]), MASK, beta=0.0, epsilon=0.2, epsilon_high=0.2,
        loss_type="bnpo", max_completion_length=3, sampling_logp=SAMPLER,
        importance_sampling_correction=correction, importance_sampling_cap=cap, **kw,
    )


def test_weights_multiply_the_policy_term_and_carry_no_gradient():
    # On-policy ratio 1: token loss -A w. Weights [1, 2, 3], [0.5, 3]; A = [1, -1]; bnpo / 5 tokens:
    # (-(1 + 2 + 3) + (0.5 + 3)) / 5 = -0.5. Without the correction (-3 + 2) / 5 = -0.2.
    loss, metrics = _loss(TRAINER, "token_truncate")
    assert loss.item() == pytest.approx(-0.5, rel=1e-6)
    assert _loss(TRAINER, "none")[0].item() == pytest.approx(-0.2, rel=1e-6)
    assert "sampling/importance_sampling_ratio/mean" in metrics and "sampling/kl" in metrics
    # d loss / d logp = -A w / 5: the weights are constants, as TRL computes them without gradient
    grad = mx.grad(lambda lp: _loss(lp, "token_truncate")[0])(TRAINER)
    np.testing.assert_allclose(np.array(grad), [[-0.2, -0.4, -0.6], [0.1, 0.6, 0.0]], rtol=1e-5, atol=1e-7)
    # sequence_mask with cap 3: both sequence ratios (8 and 4) leave [0, 3]; nothing is trained on
    assert _loss(TRAINER, "sequence_mask")[0].item() == 0.0


def test_sequence_mask_multiplies_the_policy_term_by_the_sequence_ratio():
    # cap 5: row 0's rho = 8 is masked, row 1's rho = exp(-ln 2 + 3 ln 2) = 4 is kept as its weight.
    # On-policy ratio 1, A = [1, -1], bnpo over 5 tokens: row 1's two tokens give -(-1) * 4 each,
    # loss (4 + 4) / 5 = 1.6 (a 0/1 mask would give (1 + 1) / 5 = 0.4).
    loss, metrics = _loss(TRAINER, "sequence_mask", cap=5.0)
    assert loss.item() == pytest.approx(1.6, rel=1e-6)
    assert metrics["sampling/importance_sampling_masked_frac"].item() == pytest.approx(0.5)
    # d loss / d logp = -A w / 5: 0 on row 0, 4 / 5 on row 1's two tokens; w carries no gradient
    grad = mx.grad(lambda lp: _loss(lp, "sequence_mask", cap=5.0)[0])(TRAINER)
    np.testing.assert_allclose(np.array(grad), [[0.0, 0.0, 0.0], [0.8, 0.8, 0.0]], rtol=1e-5, atol=1e-7)


def test_correction_needs_the_sampling_logprobs():
    with pytest.raises(ValueError, match="sampling_logp"):
        grpo_loss(TRAINER, None, None, mx.array([1.0, -1.0]), MASK, beta=0.0, epsilon=0.2, epsilon_high=0.2,
                  loss_type="bnpo", max_completion_length=3, importance_sampling_correction="token_truncate")


# One position, four tokens with probabilities 0.5, 0.3, 0.15, 0.05.
PROBS = mx.log(mx.array([[0.5, 0.3, 0.15, 0.05]]))


def _sampling_logprob(token, temperature, top_p=1.0, top_k=0, min_p=0.0):
    top_p = top_p if top_p < 1.0 else 0.0  # as make_rollout_sampler passes it to mlx-lm
    return make_sampling_logprob(temperature, top_p, top_k, min_p)(PROBS, mx.array([token])).item()


def test_sampling_logprob_by_hand():
    # full vocabulary: log softmax(log p / T); T = 1 gives log p
    assert _sampling_logprob(1, 1.0) == pytest.approx(math.log(0.3), rel=1e-5)
    # T = 2: p0 = sqrt(.5) / (sqrt(.5) + sqrt(.3) + sqrt(.15) + sqrt(.05)) = 0.70711 / 1.86574
    assert _sampling_logprob(0, 2.0) == pytest.approx(math.log(0.378997), abs=1e-5)
    # top_p = 0.7 keeps {0.5, 0.3} (mass 0.8) before the temperature; T = 1: 0.3 / 0.8
    assert _sampling_logprob(1, 1.0, top_p=0.7) == pytest.approx(math.log(0.3 / 0.8), rel=1e-5)
    # then T = 2: sqrt(.5) / (sqrt(.5) + sqrt(.3)) = 0.563508, where the loss scores 0.378997
    assert _sampling_logprob(0, 2.0, top_p=0.7) == pytest.approx(math.log(0.563508), abs=1e-5)
    # min_p = 0.4 keeps p >= 0.4 * 0.5: the same two tokens; top_k = 1 keeps the first alone
    assert _sampling_logprob(1, 1.0, min_p=0.4) == pytest.approx(math.log(0.3 / 0.8), rel=1e-5)
    assert _sampling_logprob(0, 1.7, top_k=1) == pytest.approx(0.0, abs=1e-6)
    assert _sampling_logprob(2, 1.0, top_p=0.7) == -math.inf  # a token the sampler cannot draw
    assert _sampling_logprob(2, 0.0) == 0.0  # greedy: all mass on the token it picked


def _prompts(tokenizer, questions):
    return [tokenizer.encode(render_prompt(tokenizer, q, DEFAULT_SYSTEM_PROMPT), add_special_tokens=False)
            for q in questions]


def _sample(tiny, temperature, top_p=1.0, top_k=0, min_p=0.0, keep=True, seed=3):
    model, tokenizer = tiny
    prompts = _prompts(tokenizer, ["What is 3 + 4?", "What is 17 - 8?"])
    mx.random.seed(seed)
    r = generate_completions(
        model, tokenizer, prompts, num_generations=3, max_new_tokens=24,
        sampler=make_rollout_sampler(temperature, top_p, top_k, min_p),
        sampling_logprob=make_sampling_logprob(temperature, top_p if top_p < 1 else 0.0, top_k, min_p) if keep else None,
    )
    trainer = completion_logprobs(model, r.prompt_tokens, r.completion_tokens, temperature)
    T = trainer.shape[1]
    sampler = mx.array([s + [0.0] * (T - len(s)) for s in r.sampling_logprobs]) if keep else None
    mask = mx.array([[1.0] * len(c) + [0.0] * (T - len(c)) for c in r.completion_tokens])
    return r, trainer, sampler, mask


@pytest.mark.parametrize("temperature", [0.6, 1.0, 1.7])
def test_full_vocabulary_weights_are_one(tiny, temperature):
    """top_p = 1, top_k = 0, min_p = 0: the sampler draws from softmax(logits / T), the
    distribution the loss scores, so every weight is 1 within float noise."""
    r, trainer, sampler, mask = _sample(tiny, temperature)
    assert all(len(s) == len(c) for s, c in zip(r.sampling_logprobs, r.completion_tokens))
    w, m = importance_weights(trainer, sampler, mask, "token_truncate", cap=3.0)
    assert abs(m["sampling/importance_sampling_ratio/min"].item() - 1) < 1e-4
    assert abs(m["sampling/importance_sampling_ratio/max"].item() - 1) < 1e-4
    assert mismatch_metrics(trainer, sampler, mask)["sampling/logprob_diff_max"].item() < 1e-4


def test_top_p_makes_a_mismatch(tiny):
    """At T = 1 a kept token's sampler probability is p / (kept mass) >= p: the trainer's
    log-prob is never above the sampler's, and is below it wherever top_p cut something."""
    r, trainer, sampler, mask = _sample(tiny, 1.0, top_p=0.7)
    d = np.array((trainer - sampler) * mask)
    assert d.max() < 1e-5 and d.min() < -0.05
    m = mismatch_metrics(trainer, sampler, mask)
    assert m["sampling/logprob_diff_mean"].item() > 0.01 and m["sampling/kl"].item() > 0.001


def test_keeping_the_logprobs_leaves_the_tokens_alone(tiny):
    kept = _sample(tiny, 1.0, top_p=0.7, keep=True)[0]
    plain = _sample(tiny, 1.0, top_p=0.7, keep=False)[0]
    assert kept.completion_tokens == plain.completion_tokens and plain.sampling_logprobs is None


@pytest.mark.parametrize("overrides, mode", [
    ([], "none"),
    (["generation.top_p=0.9"], "token_truncate"),
    (["generation.top_k=20"], "token_truncate"),
    (["generation.min_p=0.05"], "token_truncate"),
    (["generation.quantize_bits=8"], "token_truncate"),
    (["generation.top_p=0.9", "grpo.importance_sampling_correction=none"], "none"),
    (["grpo.importance_sampling_correction=sequence_mask"], "sequence_mask"),
])
def test_auto_turns_the_correction_on_only_when_the_distributions_differ(overrides, mode):
    assert UpdateSettings.from_config(load_config(None, overrides)).importance_sampling_correction == mode


def test_update_combines_micro_batches_into_step_means_and_extremes(tiny):
    """Split into micro-batches of 2 sequences, the step still logs the token mean of |d| over
    all tokens, and the max (and the weights' min and max) over all of them."""
    from mlx_grpo.commands.setup import build_policy
    import mlx.optimizers as optim
    from mlx_grpo.update.step import optimize

    r, trainer, sampler, mask = _sample(tiny, 1.0, top_p=0.7)
    cfg = load_config(None, ["generation.top_p=0.7", "generation.num_generations=3", "training.prompts_per_step=2",
                             "training.micro_batch_size=2", "generation.max_new_tokens=24"])
    policy = build_policy(cfg)[0]  # a fresh copy of the fixture's model: the update moves it
    metrics = optimize(policy, optim.SGD(learning_rate=0.0), None, r, [1.0, 0.0, 0.5, 0.0, 1.0, 1.0], cfg)
    whole = {**mismatch_metrics(trainer, sampler, mask),
             **importance_weights(trainer, sampler, mask, "token_truncate", cap=3.0)[1]}
    for key in ("sampling/logprob_diff_mean", "sampling/logprob_diff_max", "sampling/kl",
                "sampling/importance_sampling_ratio/mean", "sampling/importance_sampling_ratio/min",
                "sampling/importance_sampling_ratio/max"):
        assert metrics[key] == pytest.approx(whole[key].item(), rel=1e-4, abs=1e-6), key
