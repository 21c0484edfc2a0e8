"""Audit 12 (losses): op-level regressions found by the loss12 audit."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fnnc import ops
from fnnc.errors import ShapeError
from fnnc.ops.pallas import softmax_crossentropy as kernel


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_smooth_l1_16bit_quadratic_branch_does_not_overflow(dtype):
    # float16 summed (a - b)**2 in its own type: 300**2 = inf, while the loss is 45
    a = jnp.asarray([[300.0, 1.0], [2.0, -0.5]], dtype)
    b = jnp.zeros((2, 2), dtype)
    beta = 1000.0
    d = np.asarray(a, np.float64)
    oracle = 0.5 * (d * d).sum(1) / beta  # both samples' l1 < beta
    cmd = ops.smooth_l1(beta=beta)
    loss = cmd(a, b)
    assert loss.dtype == dtype
    np.testing.assert_allclose(np.asarray(loss, np.float64)[:, 0], oracle, rtol=1e-2)
    grad = jax.grad(lambda x: jnp.sum(cmd(x, b).astype(jnp.float32)))(a)
    np.testing.assert_allclose(np.asarray(grad, np.float64), d / beta, rtol=1e-2, atol=1e-6)


def test_shape_error_hints_a_reshape_only_for_size_1_axes():
    a = np.zeros((3, 2), np.float32)
    with pytest.raises(ShapeError) as e:
        ops.mse()(a, np.zeros((2, 3), np.float32))  # a transposed target: no reshape hint
    assert "reshape" not in str(e.value)
    with pytest.raises(ShapeError, match=r"reshape it to \[3, 2\].*y\.reshape\(-1, 2\)"):
        ops.binary_crossentropy()(a, np.zeros((3, 1, 2), np.float32))


def test_uint8_labels_over_256_classes_hit_one_class():
    # the one-hot compare counted classes in the label's type: a uint8 iota wraps at 256,
    # so with 300 classes label 10 also hit class 266 (softmax and categorical CE)
    rng = np.random.default_rng(0)
    c = 300
    x = rng.normal(size=(3, c)).astype(np.float32)
    y = np.array([10, 44, 255], np.uint8)
    x64 = x.astype(np.float64)
    m = x64.max(1)
    lse = m + np.log(np.exp(x64 - m[:, None]).sum(1))
    rows = np.arange(3)
    loss, _ = ops.softmax_crossentropy()(x, y)
    np.testing.assert_allclose(np.asarray(loss)[:, 0], lse - x64[rows, y], rtol=1e-5)
    t = np.full((3, c), 0.001)
    t[rows, y] = 0.701
    loss, _ = ops.softmax_crossentropy(trim0=0.001, trim1=0.701)(x, y)
    np.testing.assert_allclose(np.asarray(loss)[:, 0], lse - (t * x64).sum(1), rtol=1e-5)
    p = np.asarray(jax.nn.softmax(x))
    cce = ops.categorical_crossentropy()
    np.testing.assert_allclose(
        np.asarray(cce(p, y))[:, 0], -np.log(p[rows, y].astype(np.float64)), rtol=1e-5
    )
    grad = np.asarray(jax.grad(lambda q: jnp.sum(cce(q, y)))(p), np.float64)
    want = np.zeros((3, c))
    want[rows, y] = -1 / p[rows, y].astype(np.float64)
    np.testing.assert_allclose(grad, want, rtol=1e-5)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_16bit_float_labels_round_to_their_own_class(dtype):
    # (int)(label + 0.5) computed in the label's type: bfloat16 129 + 0.5 is 130 (ties to
    # even), float16 1025 + 0.5 is 1026, so a whole label hit the next class everywhere
    rng = np.random.default_rng(2)
    big = 1025 if dtype == jnp.float16 else 255
    c = big + 3
    ints = np.array([129, big, 7])
    label = jnp.asarray(ints.astype(np.float32), dtype)
    assert np.array_equal(np.asarray(label, np.float64), ints)  # each is exact in dtype
    x = rng.standard_normal((3, 2)).astype(np.float32)
    w = rng.standard_normal((c, 2)).astype(np.float32)
    z = x.astype(np.float64) @ w.T.astype(np.float64)
    rows = np.arange(3)
    want = np.log(np.exp(z).sum(-1)) - z[rows, ints]
    zf = z.astype(np.float32)
    got = {
        "reference": ops.softmax_crossentropy()(zf, label)[0],
        "pallas": jax.jit(lambda a: kernel.softmax_crossentropy(a, label))(zf)[0],
        "linear": ops.linear_softmax_crossentropy(class_chunk=128)(x, w, label)[0],
    }
    for name, loss in got.items():
        np.testing.assert_allclose(np.ravel(loss), want, rtol=1e-5, err_msg=name)
    p = np.asarray(jax.nn.softmax(zf))
    cce = np.asarray(ops.categorical_crossentropy()(p, label))[:, 0]
    np.testing.assert_allclose(cce, -np.log(p[rows, ints].astype(np.float64)), rtol=1e-5)


def test_nchw_scores_against_nhw_labels_say_to_move_the_classes_last():
    # the error listed the shapes that fit but not that the classes must be last
    x = np.random.default_rng(4).normal(size=(2, 5, 3, 4)).astype(np.float32)
    y = np.random.default_rng(5).integers(0, 5, (2, 3, 4)).astype(np.int32)
    with pytest.raises(ShapeError, match=r"if they are on axis 1.*perm=\[0, 2, 3, 1\]"):
        ops.softmax_crossentropy()(x, y)
    with pytest.raises(ShapeError) as e:
        ops.softmax_crossentropy()(x, y[:, :2])  # fits no axis: no hint
    assert "axis" not in str(e.value)
    # the hint's remedy gives NumPy's per-pixel cross-entropy
    z = np.moveaxis(x, 1, -1).astype(np.float64)
    want = np.log(np.exp(z).sum(-1)) - np.take_along_axis(z, y[..., None], -1)[..., 0]
    loss, _ = ops.softmax_crossentropy()(ops.transpose(perm=[0, 2, 3, 1])(x), y)
    np.testing.assert_allclose(np.asarray(loss)[..., 0], want, rtol=1e-5)
