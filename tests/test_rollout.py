import mlx.core as mx

from mlx_grpo.data.chat import render_prompt
from mlx_grpo.data.chat import DEFAULT_SYSTEM_PROMPT
from mlx_grpo.rollout.sample import generate_completions, make_rollout_sampler


def _prompts(tokenizer, questions):
    return [tokenizer.encode(render_prompt(tokenizer, q, DEFAULT_SYSTEM_PROMPT), add_special_tokens=False)
            for q in questions]


def test_shapes_eos_and_truncation(tiny):
    model, tokenizer = tiny
    prompts = _prompts(tokenizer, ["What is 3 + 4?", "What is 12 - 5?"])
    mx.random.seed(0)
    r = generate_completions(model, tokenizer, prompts, num_generations=3, max_new_tokens=40,
                             sampler=make_rollout_sampler(1.0, 1.0, 0, 0.0))
    assert len(r.completion_tokens) == len(r.texts) == len(r.truncated) == 6
    assert r.prompt_tokens == [prompts[0]] * 3 + [prompts[1]] * 3
    eos = set(tokenizer.eos_token_ids)
    for tokens, text, cut in zip(r.completion_tokens, r.texts, r.truncated):
        assert 1 <= len(tokens) <= 40
        if cut:  # stopped by the cap: exactly max_new_tokens and no EOS
            assert len(tokens) == 40 and tokens[-1] not in eos
        else:  # stopped by EOS, which is kept in the ids but not in the text
            assert tokens[-1] in eos and not any(t in eos for t in tokens[:-1])
            assert text == tokenizer.decode(tokens[:-1])
    assert not all(r.truncated)


def test_short_cap_truncates_everything(tiny):
    model, tokenizer = tiny
    r = generate_completions(model, tokenizer, _prompts(tokenizer, ["What is 1 + 1?"]), num_generations=2,
                             max_new_tokens=3, sampler=make_rollout_sampler(1.0, 1.0, 0, 0.0))
    assert all(r.truncated) and [len(c) for c in r.completion_tokens] == [3, 3]


def test_shared_prefill_and_batch_size_do_not_change_greedy_output(tiny):
    """Greedy decoding from the shared prompt cache equals plain one-at-a-time decoding."""
    from mlx_lm.generate import generate_step

    model, tokenizer = tiny
    prompts = _prompts(tokenizer, ["What is 6 + 2?", "What is 15 - 9?"])
    greedy = make_rollout_sampler(0.0, 1.0, 0, 0.0)
    together = generate_completions(model, tokenizer, prompts, num_generations=2, max_new_tokens=24, sampler=greedy)
    small = generate_completions(model, tokenizer, prompts, num_generations=2, max_new_tokens=24, sampler=greedy,
                                 batch_size=1)
    assert together.completion_tokens == small.completion_tokens
    eos = set(tokenizer.eos_token_ids)
    for i, p in enumerate(prompts):
        plain = []
        for tok, _ in generate_step(mx.array(p), model, max_tokens=24, sampler=greedy):
            plain.append(int(tok))
            if plain[-1] in eos:
                break
        assert together.completion_tokens[2 * i] == together.completion_tokens[2 * i + 1] == plain
