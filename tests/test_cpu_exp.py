"""cpu_exp: exp, logsumexp and SwiGLU from multiplies and adds, against MLX's own on the CPU."""

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from mlx_grpo import cpu_exp, streams

pytestmark = pytest.mark.skipif(mx.default_device().type != mx.cpu, reason="the polynomial runs on the CPU only")


def _relative(a, b):
    a, b = np.array(a, dtype=np.float64), np.array(b, dtype=np.float64)
    return np.max(np.abs(a - b) / np.abs(b))


def test_exp_is_within_three_ulps_of_mlx_over_the_float_range():
    x = mx.linspace(-87.0, 88.0, 1_000_001)
    assert _relative(cpu_exp.exp(x), mx.exp(x)) < 2.5e-7
    # the polynomial is what ran: some values differ from mx.exp in their last bits
    assert not mx.array_equal(cpu_exp.exp(x), mx.exp(x))


def test_exp_keeps_infinities_nans_zero_and_one():
    x = mx.array([-float("inf"), float("inf"), float("nan"), 0.0, -200.0, 200.0, 1.0])
    got = np.array(cpu_exp.exp(x))
    assert got[0] == 0.0 and got[1] == np.inf and np.isnan(got[2]) and got[3] == 1.0
    assert got[4] == 0.0 and got[5] == np.inf
    assert got[6] == pytest.approx(np.e, rel=2e-7)


def test_exp_of_a_large_array_the_shape_kept():
    x = mx.random.normal((3, 5, 4099), key=mx.random.key(1)) * 10
    got = cpu_exp.exp(x)
    assert got.shape == x.shape and _relative(got, mx.exp(x)) < 2.5e-7


def test_the_gradient_of_exp_is_exp():
    x = mx.array([-3.0, -0.5, 0.0, 0.25, 2.0])
    grad = mx.grad(lambda v: (cpu_exp.exp(v) * mx.array([1.0, 2.0, 3.0, 4.0, 5.0])).sum())(x)
    np.testing.assert_allclose(np.array(grad), np.exp(np.array(x, dtype=np.float64)) * [1, 2, 3, 4, 5], rtol=3e-7)


def test_logsumexp_and_its_gradient_the_softmax():
    z = mx.random.normal((4, 3, 1000), key=mx.random.key(2)) * 5
    z64 = np.array(z, dtype=np.float64)
    softmax = np.exp(z64 - z64.max(-1, keepdims=True))
    softmax /= softmax.sum(-1, keepdims=True)
    np.testing.assert_allclose(np.array(cpu_exp.logsumexp(z)), np.log(np.exp(z64).sum(-1)), rtol=1e-6)
    grad = mx.grad(lambda v: cpu_exp.logsumexp(v).sum())(z)
    np.testing.assert_allclose(np.array(grad), softmax, atol=1e-7, rtol=5e-6)  # mx.softmax: 4.9e-6


def test_logsumexp_over_qwens_vocabulary_is_within_1e_5_of_float64():
    # summed in chunks of 128, then the chunk sums: one float32 running sum of the row was 2e-4 low
    x = mx.random.normal((4, 151936), key=mx.random.key(0)) * 4
    want = np.log(np.exp(np.array(x, dtype=np.float64)).sum(-1))
    assert np.abs(np.array(cpu_exp.logsumexp(x)) - want).max() < 1e-5
    assert cpu_exp.divisor_near_root(151936) == 128 and cpu_exp.divisor_near_root(131071) is None
    odd = x[:, :131071]  # no divisor: summed as one row
    assert np.abs(np.array(cpu_exp.logsumexp(odd)) - np.array(mx.logsumexp(odd, axis=-1))).max() < 1e-3


def test_logsumexp_of_a_row_of_minus_infinity_is_minus_infinity_and_nan_stays():
    z = mx.array([[-float("inf")] * 4, [1.0, float("nan"), 0.0, 2.0], [0.0, -float("inf"), 0.0, 0.0]])
    got = np.array(cpu_exp.logsumexp(z))
    assert got[0] == -np.inf and np.isnan(got[1]) and got[2] == pytest.approx(np.log(3), rel=1e-6)


def test_swiglu_and_its_gradients_match_mlx_lm():
    from mlx_lm.models.activations import swiglu

    gate = mx.concatenate([mx.linspace(-100.0, 100.0, 2001), mx.random.normal((5000,), key=mx.random.key(3))])
    x = mx.random.normal(gate.shape, key=mx.random.key(5))
    np.testing.assert_allclose(np.array(cpu_exp.swiglu(gate, x)), np.array(swiglu(gate, x)), atol=2e-6, rtol=1e-6)
    weights = mx.random.normal(gate.shape, key=mx.random.key(6))
    got = mx.grad(lambda g, v: (cpu_exp.swiglu(g, v) * weights).sum(), argnums=(0, 1))(gate, x)
    want = mx.grad(lambda g, v: (swiglu(g, v) * weights).sum(), argnums=(0, 1))(gate, x)
    for a, b in zip(got, want):
        np.testing.assert_allclose(np.array(a), np.array(b), atol=2e-6, rtol=1e-5)


def test_other_dtypes_and_as_shipped_run_mlx_own():
    x = mx.random.normal((1000,), key=mx.random.key(4))
    assert not cpu_exp.fast(x.astype(mx.bfloat16))
    assert mx.array_equal(cpu_exp.exp(x.astype(mx.bfloat16)), mx.exp(x.astype(mx.bfloat16)))
    with streams.as_shipped():
        assert not cpu_exp.fast(x)
        assert mx.array_equal(cpu_exp.exp(x), mx.exp(x))
        assert mx.array_equal(cpu_exp.logsumexp(x[None]), mx.logsumexp(x[None], axis=-1))
        assert mx.array_equal(cpu_exp.swiglu(x, x), nn.silu(x) * x)
    assert cpu_exp.fast(x)


def test_checkpointed_blocks_run_mlx_own_swiglu_forward_and_recomputed(tiny_path, monkeypatch):
    # the custom vjps inside mx.checkpoint raised builtin:tiny's peak 16-20% (tests/test_memory_plan.py)
    from mlx_grpo.config.sections import ModelConfig
    from mlx_grpo.models.load import checkpoint_layers, load_base

    model = load_base(ModelConfig(path=tiny_path))[0]
    seen = []
    real = cpu_exp.swiglu
    monkeypatch.setattr(cpu_exp, "swiglu", lambda g, x: seen.append("ours") or real(g, x))
    tokens = mx.array([[5, 6, 7, 8, 9]])
    loss = lambda m: m(tokens).sum()
    mx.eval(nn.value_and_grad(model, loss)(model))
    assert seen  # our SwiGLU without checkpoints
    seen.clear()
    checkpoint_layers(model)
    mx.eval(nn.value_and_grad(model, loss)(model))
    assert seen == []


def test_softmax_and_its_gradient_equal_mlx_own_keeping_only_its_output():
    z = mx.random.normal((3, 5, 300), key=mx.random.key(7)) * 4
    z[0, 0, :100] = -mx.inf  # masked keys
    np.testing.assert_allclose(np.array(cpu_exp.softmax(z)), np.array(mx.softmax(z, axis=-1, precise=True)),
                               atol=1e-7, rtol=2e-6)
    weights = mx.random.normal(z.shape, key=mx.random.key(8))
    got = mx.grad(lambda x: (cpu_exp.softmax(x) * weights).sum())(z)
    want = mx.grad(lambda x: (mx.softmax(x, axis=-1, precise=True) * weights).sum())(z)
    np.testing.assert_allclose(np.array(got), np.array(want), atol=1e-7, rtol=1e-5)


@pytest.mark.parametrize("fast", [True, False], ids=["cpu_exp", "mlx"])
def test_softmax_pair_is_the_softmax_of_the_joined_rows_and_its_gradient(fast):
    a = mx.random.normal((2, 3, 4, 9), key=mx.random.key(3)) * 4
    b = mx.random.normal((2, 3, 4, 5), key=mx.random.key(4)) * 4
    a[0, 0, 0] = -mx.inf  # a row whose prompt part is all masked
    wa, wb = (mx.random.normal(x.shape, key=mx.random.key(5 + i)) for i, x in enumerate((a, b)))

    def pair(a, b):
        if fast:
            return cpu_exp.softmax_pair(a, b)
        with cpu_exp.plain():
            return cpu_exp.softmax_pair(a, b)

    joined = mx.softmax(mx.concatenate([a, b], axis=-1), axis=-1, precise=True)
    pa, pb = pair(a, b)
    np.testing.assert_allclose(np.array(mx.concatenate([pa, pb], axis=-1)), np.array(joined), atol=1e-7, rtol=2e-6)
    assert pa[0, 0, 0].sum().item() == 0.0 and abs(pb[0, 0, 0].sum().item() - 1.0) < 1e-6
    got = mx.grad(lambda a, b: sum((p * w).sum() for p, w in zip(pair(a, b), (wa, wb))), argnums=(0, 1))(a, b)
    w = mx.concatenate([wa, wb], axis=-1)
    want = mx.grad(lambda x: (mx.softmax(x, axis=-1, precise=True) * w).sum())(mx.concatenate([a, b], axis=-1))
    np.testing.assert_allclose(np.array(mx.concatenate(got, axis=-1)), np.array(want), atol=1e-7, rtol=1e-5)
