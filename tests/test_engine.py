"""The compiled decode loop (rollout/engine.py) against mlx-lm's BatchGenerator: greedy decoding
gives the same tokens, sampled tokens' log-probs equal the scorer's, weights changed after the
first trace are the ones decoded with, and models it cannot run are named and left to
BatchGenerator."""

import mlx.core as mx
import mlx.optimizers as optim
import pytest
from mlx.utils import tree_map
from mlx_lm.tuner.utils import linear_to_lora_layers

from mlx_grpo.algorithm.loss import completion_logprobs
from mlx_grpo.commands.setup import rollout_engine
from mlx_grpo.config import load_config
from mlx_grpo.config.sections import ModelConfig
from mlx_grpo.data.chat import render_prompt
from mlx_grpo.errors import TrainingError
from mlx_grpo.models.caches import layer_windows
from mlx_grpo.models.load import load_base
from mlx_grpo.models.shapes import build_shape
from mlx_grpo.rollout import engine
from mlx_grpo.rollout.sample import generate_completions, make_rollout_sampler, make_sampling_logprob

QUESTIONS = ["What is 2 + 3?", "What is 12 times 7 minus 5, and then plus 40?"]
GREEDY = make_rollout_sampler(0.0, 1.0, 0, 0.0)


def _prompts(tokenizer, extra_short=True):
    prompts = [tokenizer.encode(render_prompt(tokenizer, q, "Be brief."), add_special_tokens=False)
               for q in QUESTIONS]
    return prompts + [prompts[0][-1:]] if extra_short else prompts  # a one-token prompt: nothing to prefill


def _both(model, tokenizer, prompts, sampler=GREEDY, **kw):
    return [generate_completions(model, tokenizer, prompts, sampler=sampler, engine=e, **kw)
            for e in ("batch_generator", "compiled")]


def test_greedy_tokens_equal_batch_generators_across_prompt_lengths(tiny):
    model, tokenizer = tiny
    prompts = _prompts(tokenizer)
    assert len({len(p) for p in prompts}) == 3  # left padding differs per row
    bg, ours = _both(model, tokenizer, prompts, num_generations=2, max_new_tokens=40)
    assert ours.completion_tokens == bg.completion_tokens
    assert ours.texts == bg.texts and ours.truncated == bg.truncated
    assert any(bg.truncated) and not all(bg.truncated)  # rows that end and rows cut at the limit


def _short_answers(tokenizer):
    """Four questions tiny answers in about 20 tokens (greedy), and one it does not."""
    questions = ["What is 9 - 4?", "What is 8 - 2?", "What is 7 + 2?", "What is 6 - 5?", QUESTIONS[1]]
    return [tokenizer.encode(render_prompt(tokenizer, q, "Be brief."), add_special_tokens=False) for q in questions]


def _recording_kept(monkeypatch):
    """engine._kept, with every batch it shrank to kept in a list."""
    shrunk, kept = [], engine._kept

    def recording(live, finished):
        keep = kept(live, finished)
        if keep is not None:
            shrunk.append([live[p] for p in keep])
        return keep

    monkeypatch.setattr(engine, "_kept", recording)
    return shrunk


def test_finished_rows_leave_the_batch_and_the_tokens_stay_batch_generators(tiny, monkeypatch):
    model, tokenizer = tiny
    prompts = _short_answers(tokenizer)
    bg = generate_completions(model, tokenizer, prompts, sampler=GREEDY, num_generations=2, max_new_tokens=40)
    assert sorted(len(c) for c in bg.completion_tokens)[-3:] == [20, 40, 40]  # four answers end early, one runs on
    shrunk = _recording_kept(monkeypatch)
    ours = generate_completions(model, tokenizer, prompts, sampler=GREEDY, num_generations=2, max_new_tokens=40,
                                engine="compiled")
    assert shrunk[-1] == [8, 9]  # 10 rows, at last the two still decoding
    assert all(len(b) in (1, 2, 4, 8) and set(b) <= set(a) for a, b in zip([range(10)] + shrunk, shrunk))
    assert ours.completion_tokens == bg.completion_tokens and ours.truncated == bg.truncated


def test_sampled_logprobs_equal_the_scorers_after_finished_rows_leave(tiny, monkeypatch):
    model, tokenizer = tiny
    shrunk = _recording_kept(monkeypatch)
    mx.random.seed(5)
    r = generate_completions(model, tokenizer, _short_answers(tokenizer), num_generations=4,
                             max_new_tokens=40, sampler=make_rollout_sampler(0.5, 1.0, 0, 0.0),
                             sampling_logprob=make_sampling_logprob(0.5, 1.0, 0, 0.0), engine="compiled")
    assert shrunk, [len(c) for c in r.completion_tokens]  # at temperature 0.5 most answers end by ~20 tokens
    scored = completion_logprobs(model, r.prompt_tokens, r.completion_tokens, 0.5)
    for i, sampled in enumerate(r.sampling_logprobs):
        assert len(sampled) == len(r.completion_tokens[i])
        assert mx.allclose(scored[i, :len(sampled)], mx.array(sampled), atol=1e-4).item(), i
    eos = set(tokenizer.eos_token_ids)
    assert all((c[-1] not in eos) == cut and not eos & set(c[:-1]) for c, cut in zip(r.completion_tokens, r.truncated))


def test_attention_reads_the_written_columns_a_bucket_at_a_time(tiny, monkeypatch):
    """With a bucket of 8 columns, 40 tokens cross five buckets (five traces): the greedy tokens
    stay BatchGenerator's and the sampled log-probs the scorer's."""
    model, tokenizer = tiny
    monkeypatch.setattr(engine, "READ_BUCKET", 8)
    limits, compiled = [], engine._compiled_step
    monkeypatch.setattr(engine, "_compiled_step",
                        lambda m, s, lp, limit: limits.append(limit) or compiled(m, s, lp, limit))
    prompts = _prompts(tokenizer)
    bg, ours = _both(model, tokenizer, prompts, num_generations=2, max_new_tokens=40)
    assert ours.completion_tokens == bg.completion_tokens and ours.truncated == bg.truncated
    start = limits[0] - 8  # the prompt columns, a multiple of PROMPT_BUCKET
    assert start % engine.PROMPT_BUCKET == 0 and sorted(set(limits)) == [start + 8 * i for i in range(1, 6)]
    assert limits == sorted(limits) and limits.count(start + 8) == 8
    mx.random.seed(4)
    r = generate_completions(model, tokenizer, prompts[:2], num_generations=4, max_new_tokens=24,
                             sampler=make_rollout_sampler(1.0, 1.0, 0, 0.0),
                             sampling_logprob=make_sampling_logprob(1.0, 1.0, 0, 0.0), engine="compiled")
    scored = completion_logprobs(model, r.prompt_tokens, r.completion_tokens)
    for i, sampled in enumerate(r.sampling_logprobs):
        assert mx.allclose(scored[i, :len(sampled)], mx.array(sampled), atol=1e-4).item(), i


def test_progress_counts_the_tokens_of_a_shrinking_batch(tiny, monkeypatch):
    model, tokenizer = tiny
    shrunk, calls = _recording_kept(monkeypatch), []
    r = generate_completions(model, tokenizer, _short_answers(tokenizer), sampler=GREEDY, num_generations=2,
                             max_new_tokens=40, engine="compiled", on_progress=lambda *a: calls.append(a))
    assert shrunk  # 10 rows, then fewer decode: the counts follow the batch
    sampled, finished, total = zip(*calls[:-1])
    assert set(total) == {10} and list(sampled) == sorted(sampled) and list(finished) == sorted(finished)
    assert sampled[:3] == (10, 20, 30) and sampled[-1] - sampled[-2] == len(shrunk[-1])
    assert calls[-1] == (sum(len(c) for c in r.completion_tokens), 10, 10)


@pytest.mark.parametrize("finished, kept", [
    ({0, 1, 2, 3, 4, 5}, [6, 7]),  # 2 of 8 left: a batch of 2
    ({0, 1, 2, 3, 4}, [0, 5, 6, 7]),  # 3 left: topped up with a finished row to 4
    ({0, 1, 2}, None),  # 5 left: a batch of 8 would not halve it
])
def test_the_batch_shrinks_to_a_power_of_two_once_it_halves(finished, kept):
    assert engine._kept(list(range(8)), finished) == kept
    live = [10, 11, 12, 13, 14, 15, 16, 17]  # positions, not row numbers, are returned
    assert engine._kept(live, {r + 10 for r in finished}) == kept


def test_batch_size_decodes_whole_groups_at_a_time(tiny):
    model, tokenizer = tiny
    prompts = _prompts(tokenizer)
    whole = generate_completions(model, tokenizer, prompts, num_generations=2, max_new_tokens=24,
                                 sampler=GREEDY, engine="compiled")
    parts = generate_completions(model, tokenizer, prompts, num_generations=2, max_new_tokens=24,
                                 sampler=GREEDY, engine="compiled", batch_size=2)
    assert parts.completion_tokens == whole.completion_tokens


def test_sampled_logprobs_equal_the_scorers(tiny):
    model, tokenizer = tiny
    mx.random.seed(3)
    r = generate_completions(model, tokenizer, _prompts(tokenizer, extra_short=False), num_generations=4,
                             max_new_tokens=24, sampler=make_rollout_sampler(1.0, 1.0, 0, 0.0),
                             sampling_logprob=make_sampling_logprob(1.0, 1.0, 0, 0.0), engine="compiled")
    scored = completion_logprobs(model, r.prompt_tokens, r.completion_tokens)
    for i, sampled in enumerate(r.sampling_logprobs):
        assert len(sampled) == len(r.completion_tokens[i])
        assert mx.allclose(scored[i, :len(sampled)], mx.array(sampled), atol=1e-4).item(), i
    assert len({tuple(c) for c in r.completion_tokens}) > 4  # sampled, not one answer repeated


def test_a_sampler_cut_across_two_cpu_streams_keeps_greedy_tokens_and_sampled_logprobs(tiny_path, monkeypatch):
    """The sampler and the log-softmax by halves of rows on two streams (mlx_grpo.streams, here
    forced for tiny's small vocabulary; a fresh model, so no step traced unsplit is reused)."""
    from mlx_grpo import streams

    model, tokenizer = load_base(ModelConfig(path=tiny_path), tiny_path)[:2]
    prompts = _prompts(tokenizer, extra_short=False)
    monkeypatch.setattr(streams, "SPLIT_ELEMENTS", 1)
    halves = []
    monkeypatch.setattr(engine, "split_rows", lambda fn, x: halves.append(x.shape[0]) or streams.split_rows(fn, x))
    with mx.stream(mx.cpu):
        bg, ours = _both(model, tokenizer, prompts, num_generations=2, max_new_tokens=30)
        assert ours.completion_tokens == bg.completion_tokens
        mx.random.seed(3)
        r = generate_completions(model, tokenizer, prompts, num_generations=4, max_new_tokens=24,
                                 sampler=make_rollout_sampler(1.0, 1.0, 0, 0.0),
                                 sampling_logprob=make_sampling_logprob(1.0, 1.0, 0, 0.0), engine="compiled")
        scored = completion_logprobs(model, r.prompt_tokens, r.completion_tokens)
    for i, sampled in enumerate(r.sampling_logprobs):
        assert mx.allclose(scored[i, :len(sampled)], mx.array(sampled), atol=1e-4).item(), i
    assert len({tuple(c) for c in r.completion_tokens}) > 4
    assert halves and min(halves) >= 2  # traced through the split, every batch of at least two rows


def test_an_update_after_the_first_trace_is_decoded_with(tiny_path):
    """The compiled step reads the weights at each call: after an optimizer step the LoRA policy's
    greedy tokens are the updated model's, as BatchGenerator decodes them."""
    model, tokenizer, _ = load_base(ModelConfig(path=tiny_path, dtype="float32"))
    model.freeze()
    linear_to_lora_layers(model, 4, {"rank": 4, "scale": 20.0, "dropout": 0.0})
    prompts = _prompts(tokenizer)
    before = generate_completions(model, tokenizer, prompts, num_generations=1, max_new_tokens=16,
                                  sampler=GREEDY, engine="compiled")
    mx.random.seed(0)
    grads = tree_map(lambda p: mx.random.normal(p.shape), model.trainable_parameters())
    optim.Adam(learning_rate=0.05).update(model, grads)
    mx.eval(model.parameters())
    bg, ours = _both(model, tokenizer, prompts, num_generations=1, max_new_tokens=16)
    assert ours.completion_tokens == bg.completion_tokens
    assert ours.completion_tokens != before.completion_tokens  # the update changed what is decoded


@pytest.mark.parametrize("name", ["qwen3-0.6b", "llama-3.2-1b"])
def test_other_families_decode_the_same(tmp_path, name):
    folder = build_shape(tmp_path, name, shrunk=True)
    model, tokenizer, _ = load_base(ModelConfig(path=str(folder), dtype="float32"))
    assert engine.unsupported(model) is None
    bg, ours = _both(model, tokenizer, _prompts(tokenizer), num_generations=2, max_new_tokens=12)
    assert ours.completion_tokens == bg.completion_tokens


def test_a_sliding_window_model_decodes_as_batch_generator_past_its_window(tmp_path, capsys, monkeypatch):
    # Gemma 3's shrunk copy: one layer of an 8-token window (a RotatingKVCache), one global one
    folder = build_shape(tmp_path, "gemma-3-1b", shrunk=True)
    model, tokenizer, _ = load_base(ModelConfig(path=str(folder), dtype="float32"))
    assert engine.unsupported(model) is None and 8 in layer_windows(model)
    cfg = load_config(None, overrides=[f'model.path="{folder}"', 'generation.engine="auto"'])
    assert rollout_engine(cfg, model) == "compiled" and "BatchGenerator" not in capsys.readouterr().out
    prompts = _prompts(tokenizer)
    assert sorted(len(p) for p in prompts)[1] > 8  # prompts that are longer than the window, and one that is not
    bg, ours = _both(model, tokenizer, prompts, num_generations=2, max_new_tokens=24)
    assert max(len(c) for c in bg.completion_tokens) > 8  # decoding past the window too
    assert ours.completion_tokens == bg.completion_tokens and ours.truncated == bg.truncated
    # the same loop with no window (every key seen) decodes other tokens: the window is what matches
    monkeypatch.setattr(engine, "window_of", lambda asked, kept: None)
    model._decode_steps = {}
    unwindowed = generate_completions(model, tokenizer, prompts, sampler=GREEDY, num_generations=2,
                                      max_new_tokens=24, engine="compiled")
    assert unwindowed.completion_tokens != bg.completion_tokens


def test_a_window_shows_the_last_keys_the_rotating_cache_would_hold():
    """The decode mask of a row left-padded by 2 whose token goes to column 6: a plain layer sees
    columns 2-6; a window of 3 (its RotatingKVCache's max_size) sees 4-6; the model asking for 2 of
    them, 5-6 (the smaller wins, as mlx-lm's rotating cache masks)."""
    def seen(window, asked=None):
        cache = engine.StaticKVCache(None, None, mx.array(6), mx.array([4]), mx.array([2]), 8, window)
        return cache.make_mask(1, window_size=asked)[0, 0, 0].tolist()

    assert seen(None) == [False, False, True, True, True, True, True, False]
    assert seen(3) == [False] * 4 + [True] * 3 + [False]
    assert seen(3, asked=2) == seen(None, asked=2) == [False] * 5 + [True] * 2 + [False]


def test_a_model_with_other_layer_state_is_named_and_left_to_batch_generator(tmp_path, capsys):
    folder = build_shape(tmp_path, "lfm2-350m", shrunk=True)  # convolution layers keep an ArraysCache
    model, tokenizer, _ = load_base(ModelConfig(path=str(folder), dtype="float32"))
    assert "ArraysCache" in engine.unsupported(model)
    cfg = load_config(None, overrides=[f'model.path="{folder}"', 'generation.engine="auto"'])
    assert rollout_engine(cfg, model) == "batch_generator"
    said = " ".join(capsys.readouterr().out.split())
    assert ("decodes with mlx-lm's BatchGenerator (its layers keep ArraysCache, not only KVCache or a sliding "
            "window's RotatingKVCache)") in said
    cfg = load_config(None, overrides=[f'model.path="{folder}"', 'generation.engine="compiled"'])
    with pytest.raises(TrainingError, match='generation.engine = "compiled": .* cannot use it'):
        rollout_engine(cfg, model)


def test_auto_is_the_default_and_compiles_a_plain_model_unless_a_quantized_copy_samples(tiny, capsys):
    model, _ = tiny
    assert rollout_engine(load_config(None), model) == "compiled"
    assert rollout_engine(load_config(None, overrides=['generation.engine="batch_generator"']), model) == "batch_generator"
    quantized = load_config(None, overrides=["generation.quantize_bits=4", "lora.enabled=true"])
    assert rollout_engine(quantized, model) == "batch_generator"
    assert "quantized copy is rebuilt after every update" in " ".join(capsys.readouterr().out.split())
    asked = load_config(None, overrides=["generation.quantize_bits=4", "lora.enabled=true", 'generation.engine="compiled"'])
    assert rollout_engine(asked, model) == "compiled"  # asked for: allowed, traced once a step


def test_a_batch_size_that_splits_a_group_is_left_to_batch_generator(tiny, monkeypatch):
    model, tokenizer = tiny
    monkeypatch.setattr(engine, "decode", None)  # any call to the compiled loop would fail
    r = generate_completions(model, tokenizer, _prompts(tokenizer), num_generations=2, max_new_tokens=8,
                             sampler=GREEDY, engine="compiled", batch_size=3)
    assert len(r.completion_tokens) == 6


def test_a_training_run_decodes_with_the_compiled_loop(tmp_path, monkeypatch):
    """`generation.engine = "compiled"` through `train`: every rollout goes through the compiled loop."""
    from mlx_grpo import cli
    from mlx_grpo.run.log import read_metrics

    calls = []
    decode = engine.decode
    monkeypatch.setattr(engine, "decode", lambda *a, **k: calls.append(1) or decode(*a, **k))
    run = tmp_path / "run"
    assert cli.main(["train", "--config", "configs/smoke_test.toml", "--set", f'output_dir="{run}"',
                     "--set", "training.max_steps=2", "--set", 'generation.engine="compiled"']) == 0
    rows = read_metrics(run)
    assert len(rows) == 2 and len(calls) >= 2
    assert all(r["loss"] == r["loss"] and r["completions/mean_length"] > 0 for r in rows)


def test_a_model_decoded_with_is_freed_with_its_compiled_steps(tiny):
    import gc
    import weakref

    from mlx.utils import tree_flatten

    from mlx_grpo.models.builtin import builtin_model_path

    model, tokenizer, _ = load_base(ModelConfig(path="builtin:tiny"), str(builtin_model_path("tiny")))
    names = [k for k, _ in tree_flatten(model.parameters())]
    generate_completions(model, tokenizer, _prompts(tokenizer, False), sampler=GREEDY, engine="compiled",
                         num_generations=2, max_new_tokens=4)
    assert [k for k, _ in tree_flatten(model.parameters())] == names  # the steps are no part of the module tree
    ref = weakref.ref(model)
    del model
    gc.collect()
    assert ref() is None
