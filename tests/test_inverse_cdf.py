"""The inverse-CDF sampler draws from softmax(logits / T) and reports that distribution's log-prob."""

import mlx.core as mx
import numpy as np
import pytest

from mlx_grpo.rollout.inverse_cdf import PADDED_CHUNK, InverseCdfSampler, chunk_width, draw, pick
from mlx_grpo.rollout.sample import make_rollout_sampler, mlx_lm_sampler


def test_chunk_width_divides_the_vocabularies_of_the_families_users_train():
    assert chunk_width(151936) == 128  # Qwen2/2.5/3
    assert chunk_width(128256) == 334  # Llama 3: 128,256 = 334 x 384, sqrt 358
    assert chunk_width(262144) == 512  # Gemma 3
    assert chunk_width(131071) == PADDED_CHUNK  # a prime: padded


def test_pick_by_hand():
    weights = mx.array([[0.0, 1.0, 0.0, 3.0]] * 4)
    # masses by chunk of 4 (one chunk): cumulative 0, 1, 1, 4 of 4
    uniforms = mx.array([[0.0, 0.0], [0.0, 0.2], [0.0, 0.25], [0.0, 0.99]])
    index, total = pick(weights, uniforms)
    assert index.tolist() == [1, 1, 3, 3]
    assert total.tolist() == [4.0] * 4


def test_a_target_rounded_up_to_the_total_never_picks_a_token_of_no_weight():
    # 1000 is padded to 1024: the last chunk ends in padding, and the real tail has weight 0 too
    weights = mx.concatenate([mx.ones((1, 500)), mx.zeros((1, 500))], axis=1)
    index, _ = pick(weights, mx.array([[1.0, 1.0]]))  # u = 1 stands for u * total rounding up
    assert index.item() == 499


@pytest.mark.parametrize("vocab,temperature", [(1000, 1.0), (768, 0.7)])
def test_draws_follow_softmax_of_logits_over_temperature(vocab, temperature):
    mx.random.seed(3)
    logits = mx.random.normal((1, vocab)) * 2
    logits[0, 5] = -float("inf")  # a masked token is never drawn
    p = np.array(mx.softmax(logits / temperature, axis=-1)[0])
    rows, rounds = 2000, 100
    counts = np.zeros(vocab)
    for _ in range(rounds):
        tokens, _ = draw(mx.broadcast_to(logits, (rows, vocab)), temperature)
        counts += np.bincount(np.array(tokens), minlength=vocab)
    n = rows * rounds
    assert counts[5] == 0
    live = p > 0
    chi2 = ((counts[live] - n * p[live]) ** 2 / (n * p[live])).sum()
    dof = live.sum() - 1
    assert chi2 < dof + 5 * np.sqrt(2 * dof)  # a wrong distribution lands far above: see below
    skewed = p[live] ** 1.05 / (p[live] ** 1.05).sum()  # T 5% lower than drawn
    assert ((counts[live] - n * skewed) ** 2 / (n * skewed)).sum() > dof + 10 * np.sqrt(2 * dof)


def test_log_probs_are_the_tempered_log_softmax_of_the_drawn_token():
    mx.random.seed(0)
    logits = mx.random.normal((8, 151936)) * 4
    z64 = np.array(logits, dtype=np.float64)
    for t in (1.0, 0.6):
        tokens, lp = draw(logits, t)
        top = (z64 / t).max(axis=-1, keepdims=True)
        logsoftmax = z64 / t - top - np.log(np.exp(z64 / t - top).sum(axis=-1, keepdims=True))
        want = np.take_along_axis(logsoftmax, np.array(tokens)[:, None].astype(np.int64), axis=-1)[:, 0]
        # within 1e-5 of float64 (a float32 sum of the whole row, as mx.logsumexp's on the CPU, is
        # 2e-4 low at this width: the chunk masses are summed in two levels here)
        assert np.abs(np.array(lp) - want).max() < 1e-5


def test_rollout_sampler_is_ours_only_where_nothing_is_truncated():
    assert isinstance(make_rollout_sampler(1.0, 1.0, 0, 0.0), InverseCdfSampler)
    assert make_rollout_sampler(0.7, 1.0, 0, 0.0).temperature == 0.7
    for settings in ((1.0, 0.9, 0, 0.0), (1.0, 1.0, 20, 0.0), (1.0, 1.0, 0, 0.05), (0.0, 1.0, 0, 0.0)):
        assert not isinstance(make_rollout_sampler(*settings), InverseCdfSampler)
    assert not isinstance(mlx_lm_sampler(1.0, 1.0, 0, 0.0), InverseCdfSampler)


def test_called_as_mlx_lm_calls_a_sampler():
    logprobs = mx.log(mx.zeros((1, 5000)))
    logprobs[0, 4100] = 0.0
    tokens = InverseCdfSampler(1.0)(logprobs)
    assert tokens.shape == (1,) and tokens.item() == 4100


def test_narrow_vocabularies_keep_mlx_lms_own_draw_token_for_token():
    logits = mx.random.normal((16, 322), key=mx.random.key(4)) * 3
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    mx.random.seed(5)
    ours = InverseCdfSampler(0.8)(logprobs)
    mx.random.seed(5)
    theirs = mlx_lm_sampler(0.8, 1.0, 0, 0.0)(logprobs)
    assert ours.tolist() == theirs.tolist()
    assert not InverseCdfSampler.pays(322) and InverseCdfSampler.pays(151936)


@pytest.mark.parametrize("engine", ["compiled", "batch_generator"])
@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_a_rollout_drawn_by_the_inverse_cdf_has_the_scorers_logprobs(tiny, monkeypatch, engine, temperature):
    """Through the compiled decode step (`draw`: token and log-prob from one pass) and through
    BatchGenerator (`__call__`), with tiny's 322 entries made wide enough to take the inverse CDF."""
    from mlx_grpo.algorithm.loss import completion_logprobs
    from mlx_grpo.data.chat import render_prompt
    from mlx_grpo.rollout import inverse_cdf
    from mlx_grpo.rollout.sample import generate_completions, make_sampling_logprob

    model, tokenizer = tiny
    monkeypatch.setattr(inverse_cdf, "WIDE", 1)
    drawn = []
    real = inverse_cdf.draw
    monkeypatch.setattr(inverse_cdf, "draw", lambda logits, t: drawn.append(logits.shape) or real(logits, t))
    prompts = [tokenizer.encode(render_prompt(tokenizer, q, "Be brief."), add_special_tokens=False)
               for q in ("What is 2 + 3?", "What is 12 times 7 minus 5?")]
    mx.random.seed(7)
    r = generate_completions(model, tokenizer, prompts, num_generations=4, max_new_tokens=24,
                             sampler=make_rollout_sampler(temperature, 1.0, 0, 0.0),
                             sampling_logprob=make_sampling_logprob(temperature, 1.0, 0, 0.0), engine=engine)
    assert drawn  # the inverse CDF drew (traced once in the compiled step, called per step otherwise)
    scored = completion_logprobs(model, r.prompt_tokens, r.completion_tokens, temperature)
    for i, sampled in enumerate(r.sampling_logprobs):
        assert mx.allclose(scored[i, :len(sampled)], mx.array(sampled), atol=1e-4).item(), i
    assert len({tuple(c) for c in r.completion_tokens}) > 2  # sampled, not one answer repeated
