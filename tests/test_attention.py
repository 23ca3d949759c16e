"""Attention with cpu_exp's softmax (mlx_grpo/attention.py): mlx-lm's attention to float precision
for every mask mlx-lm's layers pass, its gradients, and MLX's own wherever cpu_exp steps aside."""

import mlx.core as mx
import numpy as np
import pytest

from mlx_grpo import attention as attn
from mlx_grpo import cpu_exp, streams


def _qkv(heads=4, kv_heads=2, n=5, keys=7, d=8, dv=8):
    r = [mx.random.key(i) for i in range(3)]
    return (mx.random.normal((2, heads, n, d), key=r[0]), mx.random.normal((2, kv_heads, keys, d), key=r[1]),
            mx.random.normal((2, kv_heads, keys, dv), key=r[2]))


def _masks():
    r = [mx.random.key(i) for i in range(10, 13)]
    return {
        "none": None,
        "causal": "causal",  # 5 queries over 7 keys: lower-right aligned
        "bool (n, keys)": mx.random.uniform(shape=(5, 7), key=r[0]) > 0.3,
        "bool (B, 1, n, keys)": mx.random.uniform(shape=(2, 1, 5, 7), key=r[1]) > 0.3,
        "additive (B, heads, n, keys)": mx.random.normal((2, 4, 5, 7), key=r[2]),
    }


@pytest.mark.parametrize("name", list(_masks()))
@pytest.mark.parametrize("shape", [dict(), dict(kv_heads=4), dict(kv_heads=1, dv=6)], ids=["gqa", "mha", "mqa-dv"])
def test_equals_mlx_lms_attention_and_its_gradients(name, shape):
    q, k, v = _qkv(**shape)
    mask = _masks()[name]

    def loss(fn):
        return lambda q, k, v: (fn(q, k, v, None, scale=0.3, mask=mask) * mx.arange(v.shape[-1])).sum()

    ours = attn.attention(q, k, v, None, scale=0.3, mask=mask)
    theirs = attn._SDPA(q, k, v, None, scale=0.3, mask=mask)
    np.testing.assert_allclose(np.array(ours), np.array(theirs), atol=1e-6, rtol=1e-5)
    got = mx.grad(loss(attn.attention), argnums=(0, 1, 2))(q, k, v)
    want = mx.grad(loss(attn._SDPA), argnums=(0, 1, 2))(q, k, v)
    for a, b in zip(got, want):
        np.testing.assert_allclose(np.array(a), np.array(b), atol=1e-5, rtol=1e-4)


def test_a_query_with_every_key_masked_averages_the_values_as_mlx_does():
    q, k, v = _qkv()
    mask = mx.ones((5, 7), dtype=mx.bool_)
    mask[1] = False
    ours = attn.attention(q, k, v, None, scale=0.3, mask=mask)
    assert not mx.isnan(ours).any().item()
    np.testing.assert_allclose(np.array(ours[:, :, 1]), np.array(mx.repeat(v.mean(axis=2), 2, axis=1)), atol=1e-6)
    np.testing.assert_allclose(np.array(ours), np.array(attn._SDPA(q, k, v, None, scale=0.3, mask=mask)), atol=1e-6)


class _Spy:
    def __init__(self, monkeypatch):
        self.calls = 0
        real = attn._SDPA

        def counted(*a, **kw):
            self.calls += 1
            return real(*a, **kw)
        monkeypatch.setattr(attn, "_SDPA", counted)


class _QuantizedCache:
    bits, group_size = 8, 64


def test_mlx_own_runs_where_cpu_exp_steps_aside_or_the_call_is_not_plain_attention(monkeypatch):
    q, k, v = _qkv()
    spy = _Spy(monkeypatch)
    attn.attention(q, k, v, None, scale=0.3, mask=None)
    assert spy.calls == 0
    attn.attention(q.astype(mx.bfloat16), k.astype(mx.bfloat16), v.astype(mx.bfloat16), None, scale=0.3, mask=None)
    with streams.as_shipped():  # the bench's limit
        attn.attention(q, k, v, None, scale=0.3, mask=None)
    with cpu_exp.plain():  # checkpointed blocks
        attn.attention(q, k, v, None, scale=0.3, mask=None)
    attn.attention(q, k, v, None, scale=0.3, mask=None, sinks=mx.zeros((4,)))
    with pytest.raises(Exception):  # mlx-lm's quantized attention, handed keys that are not quantized
        attn.attention(q, k, v, _QuantizedCache(), scale=0.3, mask=None)
    assert spy.calls == 5
    monkeypatch.setattr(cpu_exp.mx, "default_device", lambda: mx.Device(mx.gpu))
    attn.attention(q, k, v, None, scale=0.3, mask=None)
    assert spy.calls == 6


def test_loading_a_model_puts_it_in_every_family_and_the_forward_keeps_its_numbers(tiny_path):
    from mlx_lm.models import base, llama, qwen2

    from mlx_grpo.config.sections import ModelConfig
    from mlx_grpo.models.load import load_base

    model = load_base(ModelConfig(path=tiny_path))[0]
    assert qwen2.scaled_dot_product_attention is llama.scaled_dot_product_attention is attn.attention
    assert base.scaled_dot_product_attention is attn.attention
    tokens = mx.random.randint(0, 300, (3, 40), key=mx.random.key(0))
    with mx.stream(mx.cpu):
        ours = model(tokens)
        with cpu_exp.plain():
            theirs = model(tokens)
    np.testing.assert_allclose(np.array(ours), np.array(theirs), atol=2e-5, rtol=1e-5)


class _SharedCache:
    def __init__(self, keys, values, seen):
        self.shared_prefix, self.attended = (keys, values, seen), False


@pytest.mark.parametrize("shape", [dict(), dict(kv_heads=4), dict(kv_heads=1, dv=6)], ids=["gqa", "mha", "mqa-dv"])
def test_over_a_shared_prompt_equals_each_row_over_its_own_copy_and_the_gradients(shape):
    heads, kv_heads, dv = 4, shape.get("kv_heads", 2), shape.get("dv", 8)
    groups, rows, T, C, d = 2, 3, 5, 6, 8
    r = [mx.random.key(i) for i in range(20, 25)]
    q = mx.random.normal((groups * rows, heads, T, d), key=r[0])
    k, v = mx.random.normal((groups * rows, kv_heads, T, d), key=r[1]), mx.random.normal((groups * rows, kv_heads, T, dv), key=r[2])
    pk, pv = mx.random.normal((groups, kv_heads, C, d), key=r[3]), mx.random.normal((groups, kv_heads, C, dv), key=r[4])
    seen = mx.array([[True] * C, [False] * 2 + [True] * 4])  # the second prompt left-padded by 2
    row_group = mx.array([0] * rows + [1] * rows)
    mask = mx.concatenate([mx.broadcast_to(seen[row_group][:, None, None], (groups * rows, 1, T, C)),
                           mx.broadcast_to(mx.tril(mx.ones((T, T), dtype=mx.bool_)), (groups * rows, 1, T, T))], axis=-1)
    weights = mx.arange(dv) - 2.0

    def shared(q, k, v, pk, pv):
        cache = _SharedCache(pk, pv, seen)
        out = attn.attention(q, k, v, cache, scale=0.3, mask=None)
        assert cache.attended
        return out

    def gathered(q, k, v, pk, pv):
        keys, values = mx.concatenate([pk[row_group], k], axis=2), mx.concatenate([pv[row_group], v], axis=2)
        return attn._SDPA(q, keys, values, None, scale=0.3, mask=mask)

    args = (q, k, v, pk, pv)
    np.testing.assert_allclose(np.array(shared(*args)), np.array(gathered(*args)), atol=1e-6, rtol=1e-5)
    got = mx.grad(lambda *a: (shared(*a) * weights).sum(), argnums=tuple(range(5)))(*args)
    want = mx.grad(lambda *a: (gathered(*a) * weights).sum(), argnums=tuple(range(5)))(*args)
    for a, b in zip(got, want):
        np.testing.assert_allclose(np.array(a), np.array(b), atol=1e-5, rtol=1e-4)
