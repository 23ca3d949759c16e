"""Large elementwise work cut in two by rows on two CPU streams (mlx_grpo/streams.py): the same
bits as one call, each half on a stream of its own, small or non-CPU work left whole."""

import mlx.core as mx
import pytest

from mlx_grpo import streams


def _recording(calls):
    def fn(x, t):
        calls.append((x.shape[0], mx.default_stream(mx.cpu)))
        return mx.logsumexp(x, axis=-1), mx.take_along_axis(x, t[:, None], axis=-1)[:, 0]
    return fn


def _logits(rows, vocab):
    mx.random.seed(0)
    return mx.random.normal((rows, vocab)) * 3, mx.random.randint(0, vocab, (rows,))


def test_large_cpu_work_runs_its_halves_on_two_streams_with_the_same_bits():
    with mx.stream(mx.cpu):
        x, t = _logits(5, streams.SPLIT_ELEMENTS // 4)  # 1.25 x the threshold, an odd row count
        whole = _recording([])(x, t)
        calls = []
        split = streams.split_rows(_recording(calls), x, t)
        mx.eval(whole, split)
    assert [n for n, _ in calls] == [2, 3]
    assert calls[0][1] != calls[1][1]
    for a, b in zip(whole, split):
        assert a.shape == b.shape and mx.array_equal(a, b).item()


@pytest.mark.parametrize("rows", [1, 4])
def test_small_work_stays_one_call(rows):
    with mx.stream(mx.cpu):
        x, t = _logits(rows, streams.SPLIT_ELEMENTS // 8 if rows > 1 else streams.SPLIT_ELEMENTS)
        calls = []
        mx.eval(streams.split_rows(_recording(calls), x, t))
    assert [n for n, _ in calls] == [rows]


def test_other_backends_are_left_whole(monkeypatch):
    x, t = _logits(8, streams.SPLIT_ELEMENTS // 4)
    monkeypatch.setattr(streams.mx, "default_device", lambda: mx.Device(mx.gpu))
    calls = []
    streams.split_rows(_recording(calls), x, t)
    assert [n for n, _ in calls] == [8]


def test_loading_a_model_cuts_mlx_lms_swiglu_in_every_family_and_as_shipped_cuts_nothing(tiny_path):
    from mlx_lm.models import activations, llama, qwen2

    from mlx_grpo.config.sections import ModelConfig
    from mlx_grpo.models.load import load_base

    load_base(ModelConfig(path=tiny_path))
    assert qwen2.swiglu is llama.swiglu is activations.swiglu is streams._swiglu_by_rows
    with streams.as_shipped(), mx.stream(mx.cpu):  # the bench's limit: nothing cut
        calls = []
        x, t = _logits(4, streams.SPLIT_ELEMENTS)
        streams.split_rows(_recording(calls), x, t)
        assert [n for n, _ in calls] == [4]
    with mx.stream(mx.cpu):
        streams.split_rows(_recording(calls), x, t)
    assert [n for n, _ in calls] == [4, 2, 2]


def _cache_limit() -> int:
    limit = mx.set_cache_limit(0)
    mx.set_cache_limit(limit)
    return limit


def test_as_shipped_runs_under_mlx_own_cache_limit_and_puts_ours_back():
    before = _cache_limit()
    try:
        mx.set_cache_limit(3 << 30)  # as update/worst_case.py's limit_cache sets it on a 24 GB machine
        with streams.as_shipped():
            assert _cache_limit() == streams._SHIPPED_CACHE != 3 << 30  # 32 MiB on the CPU backend
        assert _cache_limit() == 3 << 30
    finally:
        mx.set_cache_limit(before)


def test_a_forward_cut_by_rows_gives_the_same_bits(tiny, monkeypatch):
    model = tiny[0]
    streams.split_swiglu()
    mx.random.seed(0)
    tokens = mx.random.randint(0, 300, (3, 40))
    rows, split_rows = [], streams.split_rows
    monkeypatch.setattr(streams, "split_rows", lambda fn, *a: rows.append(a[0].shape[0]) or split_rows(fn, *a))
    with mx.stream(mx.cpu):
        whole = model(tokens)
        monkeypatch.setattr(streams, "SPLIT_ELEMENTS", 1)
        split = model(tokens)
    assert mx.array_equal(whole, split).item()
    assert rows == [3] * len(model.model.layers)  # every layer's MLP, in the second pass


def test_a_cut_swiglus_gradients_are_the_wholes_bit_for_bit_and_cut_too(monkeypatch):
    mx.random.seed(1)
    gate, x, weights = (mx.random.normal((6, 5, streams.SPLIT_ELEMENTS // 24)) * 3 for _ in range(3))
    rows, split_rows = [], streams.split_rows
    monkeypatch.setattr(streams, "split_rows", lambda fn, *a: rows.append(a[0].shape[0]) or split_rows(fn, *a))

    def grads(swiglu):
        return mx.grad(lambda g, u: (swiglu(g, u) * weights).sum(), argnums=(0, 1))(gate, x)

    with mx.stream(mx.cpu):
        whole, cut = grads(streams._swiglu), grads(streams._swiglu_by_rows)
        mx.eval(whole, cut)
    assert rows == [6, 6]  # the forward and the backward
    for a, b in zip(whole, cut):
        assert mx.array_equal(a, b).item()
