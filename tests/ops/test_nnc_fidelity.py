"""Commands against NNC's own numbers (test/unit/nnc/*.tests.c) or an independent oracle:
min / max ties, gemm's vectors, group_norm's reduce axes, float index_select,
reduce_isnan, attention's fused output projection, and eager ``None`` inputs."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from fnnc import ops
from fnnc.core.dispatch import Backend, register_backend, unregister_backend
from fnnc.errors import CommandError, DTypeError, ShapeError
from fnnc.ops.pallas import scaled_dot_product_attention as sdpa_kernel
from tests.helpers import assert_close, rand

# -- min / max: a tie sends the gradient to both inputs (compare.tests.c) ----------------


@pytest.mark.parametrize("name", ["min", "max"])
def test_min_max_backward_ties_feed_both_inputs(name) -> None:
    """NNC's "min of two tensors backward": a = i, b = i (i < 3) else i - 1 (max: i + 1),
    g = -1, so ha = -1 for the three ties and 0 after, hb = -1 everywhere."""
    i = np.arange(12, dtype=np.float32).reshape(2, 2, 3)
    a = i
    b = np.where(i < 3, i, i - 1 if name == "min" else i + 1)
    cmd = getattr(ops, name)()
    g = np.full(a.shape, -1, np.float32)
    ha, hb = cmd.definition.backward((g,), (a, b), (cmd(a, b),))
    np.testing.assert_array_equal(ha, np.where(i < 3, -1, 0))
    np.testing.assert_array_equal(hb, np.full(a.shape, -1))


@pytest.mark.parametrize("name", ["min", "max"])
def test_min_max_split_ties_give_half_to_each_input_as_jax(name) -> None:
    """The same tensors with ``ties="split"`` (what trace asks for): half of g to each
    side of the three ties, as jax.vjp of lax.min / lax.max; the rest as NNC."""
    i = np.arange(12, dtype=np.float32).reshape(2, 2, 3)
    a, b = i, np.where(i < 3, i, i - 1 if name == "min" else i + 1)
    cmd = getattr(ops, name)(ties="split")
    g = np.full(a.shape, -1, np.float32)
    ha, hb = cmd.definition.backward((g,), (a, b), (cmd(a, b),), None, **cmd.kwargs)
    np.testing.assert_array_equal(ha, np.where(i < 3, -0.5, 0))
    np.testing.assert_array_equal(hb, np.where(i < 3, -0.5, -1))
    pick = lax.min if name == "min" else lax.max
    want = jax.vjp(pick, a, b)[1](g)
    assert_close((ha, hb), want)
    assert_close(jax.vjp(cmd, a, b)[1](g), want)  # the forward's own derivative agrees
    with pytest.raises(CommandError, match=r"expected 'both'.*or 'split'"):
        getattr(ops, name)(ties="half")(a, b)


def test_min_backward_ties_broadcast() -> None:
    a = np.array([[1.0, 5.0], [2.0, 2.0]], np.float32)
    b = np.array([2.0, 5.0], np.float32)
    ha, hb = ops.min().definition.backward((np.ones((2, 2), np.float32),), (a, b), (None,))
    np.testing.assert_array_equal(ha, [[1, 1], [1, 1]])
    np.testing.assert_array_equal(hb, [1, 1])  # [2, 2] ties in row 1, [5] ties in row 0


# -- gemm: rank-1 operands (gemm.tests.c, ccv_nnc_blas.c) ---------------------------------

B = np.array([[7, 8, 9], [10, 11, 12]], np.float32)


def test_gemm_vector_times_matrix_is_nnc_s_vector() -> None:
    """NNC's "[1, 2] * [[7, 8, 9], [10, 11, 12]]" gives [1*7 + 2*10, ...] = [27, 30, 33]."""
    a = np.array([1, 2], np.float32)
    assert ops.gemm().shape(jax.ShapeDtypeStruct((2,), np.float32), B)[0].shape == (3,)
    np.testing.assert_array_equal(ops.gemm()(a, B), [27, 30, 33])
    # The dense path: weight [out, in] = B^T, and a bias [-1, 0, 1] as in gemm.tests.c.
    dense = ops.gemm(transpose_b=True)(a, B.T.copy(), np.array([-1, 0, 1], np.float32))
    np.testing.assert_array_equal(dense, [26, 30, 34])


def test_gemm_vector_shapes_follow_nnc_s_rule() -> None:
    def shape(a, b, **kw):
        specs = [jax.ShapeDtypeStruct(s, np.float32) for s in (a, b)]
        return ops.gemm(**kw).shape(*specs)[0].shape

    assert shape((1,), (4,)) == (4,)  # [1, 1] x [1, 4]: both vectors give a vector
    assert shape((3, 1), (4,)) == (3, 4)  # b is the row [1, 4]
    assert shape((2,), (5, 2, 4)) == (5, 1, 4)  # batched: the row axis stays
    for kw, a, b in (({"transpose_a": True}, (2,), (2, 3)), ({"transpose_b": True}, (3, 1), (4,))):
        with pytest.raises(ShapeError, match="rank-1 operand is the row"):
            shape(a, b, **kw)


def test_gemm_vector_backward_matches_numpy() -> None:
    x, w, bias = rand([3]), rand([4, 3], seed=1), rand([4], seed=2)
    cmd = ops.gemm(transpose_b=True)
    y = cmd(x, w, bias)
    assert_close(y, w @ x + bias)
    g = rand([4], seed=3)
    gx, gw, gb = cmd.definition.backward((g,), (x, w, bias), (y,), **cmd.kwargs)
    assert_close(gx, w.T @ g)
    assert_close(gw, np.outer(g, x))
    assert_close(gb, g)


# -- group_norm: reduce axes and no scale / bias (group.norm.tests.c) ---------------------


def _nnc_group_norm(x, groups, group_axis, reduce_axes, epsilon):
    """NNC's reference graph: split the group axis, mean / biased variance over the
    group's channels and the reduce axes, (x - mean) / sqrt(var + epsilon)."""
    c = x.shape[group_axis]
    split = x.reshape(*x.shape[:group_axis], groups, c // groups, *x.shape[group_axis + 1 :])
    axes = (group_axis + 1, *(a + (a > group_axis) for a in reduce_axes))
    m = split.mean(axis=axes, keepdims=True)
    v = ((split - m) ** 2).mean(axis=axes, keepdims=True)
    return ((split - m) / np.sqrt(v + epsilon)).reshape(x.shape)


def test_group_norm_like_layer_norm_nnc_config() -> None:
    """CMD_GROUP_NORM_FORWARD(3, 1, 0, 1) on [8, 4, 4, 10], scale 1 / bias 0 shaped
    [1, 4, 4, 10]: no reduce axes, so each position over its 10 channels."""
    x = rand([8, 4, 4, 10], lo=0.0, hi=1.0)
    scale, bias = np.ones((1, 4, 4, 10), np.float32), np.zeros((1, 4, 4, 10), np.float32)
    y, mean, inv_std = ops.group_norm(groups=1, axis=3, epsilon=0.0, reduce_axes=())(x, scale, bias)
    assert mean.shape == inv_std.shape == (8, 4, 4, 1)
    assert_close(y, _nnc_group_norm(x, 1, 3, (), 0.0), rtol=1e-4, atol=1e-5)
    assert_close(y, (x - x.mean(-1, keepdims=True)) / x.std(-1, keepdims=True), atol=1e-4)


@pytest.mark.parametrize("affine", [True, False])
def test_group_norm_nnc_groups_without_reduce_axes(affine) -> None:
    """CMD_GROUP_NORM_FORWARD(1, 4, 0, affine) on [8, 16, 5]: statistics [8, 4, 5], one
    per sample, group and position on axis 2 (NNC's test reduces a [8, 4, 4, 5] view over
    its axis 2)."""
    x = rand([8, 16, 5], lo=0.0, hi=1.0)
    cmd = ops.group_norm(groups=4, axis=1, epsilon=0.0, reduce_axes=())
    params = (np.ones((1, 16, 5), np.float32), np.zeros((1, 16, 5), np.float32)) if affine else ()
    y, mean, _ = cmd(x, *params)
    assert mean.shape == (8, 4, 5)
    assert_close(mean, x.reshape(8, 4, 4, 5).mean(axis=2), rtol=1e-5)
    assert_close(y, _nnc_group_norm(x, 4, 1, (), 0.0), rtol=1e-4, atol=1e-4)


def test_group_norm_reduce_axes_and_default() -> None:
    x = rand([2, 3, 4, 6])
    scale, bias = rand([6], seed=1), rand([6], seed=2)
    y, mean, _ = ops.group_norm(groups=3, reduce_axes=(2,))(x, scale, bias)
    assert mean.shape == (2, 3, 1, 3)
    assert_close(y, _nnc_group_norm(x, 3, 3, (2,), 1e-5) * scale + bias, rtol=1e-4, atol=1e-4)
    default, default_mean, _ = ops.group_norm(groups=3)(x)  # NNC: no reduce axes listed
    assert default_mean.shape == (2, 3, 4, 3)
    assert_close(default, _nnc_group_norm(x, 3, 3, (), 1e-5), rtol=1e-4, atol=1e-4)
    usual = ops.group_norm(groups=3, reduce_axes=None)(x)[0]  # every axis but the batch
    assert_close(usual, _nnc_group_norm(x, 3, 3, (1, 2), 1e-5), rtol=1e-4, atol=1e-4)
    assert_close(usual, ops.group_norm(groups=3, reduce_axes=(1, 2))(x)[0])


def test_group_norm_bias_only_eager_and_backward() -> None:
    x, bias = rand([2, 4, 3]), rand([4], seed=1)
    cmd = ops.group_norm(groups=2, axis=1, reduce_axes=None)
    y, *_ = cmd(x, None, bias)
    assert_close(y, _nnc_group_norm(x, 2, 1, (2,), 1e-5) + bias[:, None], atol=1e-5)
    g = rand([2, 4, 3], seed=2)
    outs = cmd(x, None, bias)
    got = cmd.definition.backward((g, None, None), (x, None, bias), outs, **cmd.kwargs)
    _, pullback = jax.vjp(lambda a, c: cmd.definition.forward(a, None, c, **cmd.kwargs)[0], x, bias)
    want = pullback(jnp.asarray(g))
    assert got[1] is None
    assert_close(got[0], want[0], atol=1e-5)
    assert_close(got[2], want[1], atol=1e-5)


def test_group_norm_bad_reduce_axes_and_params() -> None:
    x = jax.ShapeDtypeStruct((2, 4, 6), np.float32)
    with pytest.raises(ShapeError, match="include the group axis"):
        ops.group_norm(groups=2, reduce_axes=(2,)).shape(x)
    with pytest.raises(ShapeError, match="out of range"):
        ops.group_norm(groups=2, reduce_axes=(3,)).shape(x)
    with pytest.raises(ShapeError, match=r"must have shape \[6\].*NNC's form"):
        ops.group_norm(groups=2).shape(x, jax.ShapeDtypeStruct((4, 6), np.float32))


# -- index_select with float positions (index.tests.c) -----------------------------------

ROWS = np.array([[1, 2], [2, 3], [3, 4]], np.float32)


def test_index_select_float_positions_interpolate() -> None:
    """NNC's "index select a tensor with float": rows at [1.5, 0.4] -> [[2.5, 3.5], [1.4, 2.4]]."""
    got = ops.index_select()(ROWS, np.array([1.5, 0.4], np.float32))
    assert_close(got, np.array([[2.5, 3.5], [1.4, 2.4]], np.float32), rtol=1e-5)
    # The last row has no successor: position 2.5 reads row 2 (NNC's min(j + 1, n - 1)).
    assert_close(ops.index_select()(ROWS, np.array([2.5], np.float32)), ROWS[2:])


def test_index_select_float_backward_spreads_by_the_weights() -> None:
    idx = np.array([1.5, 0.4, 2.0], np.float32)
    g = np.array([[1, 10], [100, 1000], [5, 7]], np.float32)
    cmd = ops.index_select()
    gx, gi = cmd.definition.backward((g,), (ROWS, idx), (None,), **cmd.kwargs)
    want = np.zeros((3, 2), np.float32)
    for pos, row in zip(idx, g):
        j = int(pos)
        want[j] += (1 - (pos - j)) * row
        want[min(j + 1, 2)] += (pos - j) * row
    assert_close(gx, want, rtol=1e-5)
    assert gi is None


def test_index_select_float_positions_need_a_float_x() -> None:
    with pytest.raises(DTypeError, match="x must be floating"):
        ops.index_select()(np.arange(3, dtype=np.int32), np.array([0.5], np.float32))


# -- reduce_isnan (reduce.tests.c) -------------------------------------------------------


def test_reduce_isnan_nnc_numbers() -> None:
    """NNC's "isnan for [[1, 2, 3], [4, 5, 6]] on axis 1", a[0] = NaN: int32 [[1], [0]]."""
    a = np.array([[np.nan, 2, 3], [4, 5, 6]], np.float32)
    got = ops.reduce_isnan(axes=(1,))(a)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, [[1], [0]])
    np.testing.assert_array_equal(ops.reduce_isnan(axes=(0, 1))(a), [[1]])
    assert not ops.reduce_isnan(axes=(0,)).definition.attributes.differentiable


# -- scaled_dot_product_attention: unify head (attention.tests.c) ------------------------


def _nnc_unify_head(q, k, v, w, bias, scale):
    """NNC's fine-grained graph: per head softmax(scale q k^T) v, heads joined back to
    [B, S, H * Dv], then gemm with w transposed plus the bias."""
    logits = np.einsum("bshd,bthd->bhst", q, k) * scale
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    c = np.einsum("bhst,bthd->bshd", p, v)
    joined = c.reshape(*c.shape[:2], -1)
    return joined @ w.T + (0 if bias is None else bias), c


def test_sdpa_unify_head_matches_nnc_s_graph() -> None:
    """The test's layout, smaller: q, k [B, S, 8, D], v [B, S, 8, Dv], w [8 Dv, 8 Dv],
    bias [8 Dv], scale 1/8, no mask (NO_TENSOR_SYMBOL there, None here)."""
    q, k = rand([2, 6, 8, 4], lo=0, hi=1), rand([2, 6, 8, 4], seed=1, lo=0, hi=1)
    v = rand([2, 6, 8, 3], seed=2, lo=0, hi=1)
    w, bias = rand([24, 24], seed=3, lo=0, hi=1), rand([24], seed=4, lo=0, hi=1)
    cmd = ops.scaled_dot_product_attention(scale=1 / 8)
    y, c = cmd(q, k, v, None, w, bias)
    want_y, want_c = _nnc_unify_head(q, k, v, w, bias, 1 / 8)
    assert y.shape == (2, 6, 24)
    assert_close(y, want_y, rtol=1e-5)
    assert_close(c, want_c, rtol=1e-5)
    y_no_bias, _ = cmd(q, k, v, None, w)
    assert_close(y_no_bias, _nnc_unify_head(q, k, v, w, None, 1 / 8)[0], rtol=1e-5)


def test_sdpa_unify_head_backward_matches_vjp() -> None:
    q, k, v = rand([1, 3, 2, 4]), rand([1, 5, 2, 4], seed=1), rand([1, 5, 2, 3], seed=2)
    w, bias = rand([4, 6], seed=3), rand([4], seed=4)
    cmd = ops.scaled_dot_product_attention(is_causal=True)
    ins = (q, k, v, None, w, bias)
    outs = cmd(*ins)
    gy, gc = rand([1, 3, 4], seed=5), rand([1, 3, 2, 3], seed=6)
    # Both sides jitted: eagerly, each small op of the attention backward compiles alone.
    got = jax.jit(lambda c, i, o: cmd.definition.backward(c, i, o, **cmd.kwargs))(
        (gy, gc), ins, outs
    )
    assert got[3] is None and len(got) == 6

    def f(q, k, v, w, bias):
        return cmd.definition.forward(q, k, v, None, w, bias, **cmd.kwargs)

    @jax.jit
    def pullback(cts):
        return jax.vjp(f, q, k, v, w, bias)[1](cts)

    for g, want in zip((*got[:3], *got[4:]), pullback((jnp.asarray(gy), jnp.asarray(gc)))):
        assert_close(g, want, rtol=1e-4, atol=1e-5)


def test_sdpa_projection_errors() -> None:
    q = jax.ShapeDtypeStruct((1, 3, 2, 4), np.float32)
    cmd = ops.scaled_dot_product_attention()
    w = jax.ShapeDtypeStruct((5, 7), np.float32)
    with pytest.raises(ShapeError, match=r"\[E, H \* Dv\] = \[E, 8\]"):
        cmd.shape(q, q, q, None, w)
    with pytest.raises(ShapeError, match="without weights"):
        cmd.shape(q, q, q, None, None, jax.ShapeDtypeStruct((5,), np.float32))


def test_the_kernel_declines_the_projection() -> None:
    spec = jax.ShapeDtypeStruct((1, 16, 2, 16), np.float32)
    w = jax.ShapeDtypeStruct((8, 32), np.float32)
    cmd = ops.scaled_dot_product_attention()
    assert sdpa_kernel.supports(cmd, [spec] * 3) is None
    assert sdpa_kernel.supports(cmd, [spec] * 3 + [None]) is None
    assert "output projection" in sdpa_kernel.supports(cmd, [spec] * 3 + [None, w])


# -- eager calls with None for optional inputs (core/dispatch.py) ------------------------


def test_eager_none_leaves_an_optional_input_out() -> None:
    q = rand([1, 3, 2, 4])
    cmd = ops.scaled_dot_product_attention()
    assert_close(cmd(q, q, q, None), cmd(q, q, q))
    x, b = rand([2, 3]), rand([3], seed=1)
    assert_close(ops.layer_norm()(x, None, b)[0], ops.layer_norm()(x)[0] + b[None])


def test_eager_none_before_a_given_input_runs_the_reference() -> None:
    calls = []

    def fast(x, scale=None, bias=None, **params):
        calls.append(1)
        return ops.layer_norm().definition.forward(x, scale, bias, **params)

    # compiled where eager calls choose (JAX's default platform), so it wins there
    register_backend("layer_norm", Backend("probe", fast, (jax.default_backend(),), priority=99))
    try:
        x, b = rand([2, 3]), rand([3], seed=1)
        ops.layer_norm()(x, b)
        assert calls  # the probe runs when no input is left out
        calls.clear()
        ops.layer_norm()(x, None, b)
        assert not calls
    finally:
        unregister_backend("layer_norm", "probe")


def test_eager_none_for_a_required_input_is_an_error() -> None:
    with pytest.raises(CommandError, match="input 1 is None, but it is required"):
        ops.ewdiv()(rand([2]), None)
    with pytest.raises(CommandError, match="required"):
        ops.ewsum()(rand([2]), None, rand([2]))
