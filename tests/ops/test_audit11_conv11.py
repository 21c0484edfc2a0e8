"""Audit 11 (conv11): spatial commands against NNC's CPU reference kernels and JAX."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fnnc import ops
from fnnc.errors import ShapeError


@pytest.mark.parametrize(
    "kw", [dict(strides=1), dict(strides=2), dict(strides=2, padding="SAME"), dict(strides=3)]
)
@pytest.mark.parametrize("x_shape", [(1, 0, 3, 4), (1, 3, 0, 4), (0, 4)])
def test_convolution_transpose_of_an_empty_spatial_axis_is_refused(kw, x_shape) -> None:
    """No convolution outputs an empty spatial axis (its window never fits one), so a
    transpose of one has nothing to be the adjoint of: stride 1 had made a 2x5 output of
    zeros from [1, 0, 3, 4] and strides 2 failed as 'the shape rule disagrees with its
    forward'. The oracle: the convolution refuses the matching empty input too."""
    w = jnp.ones((4, 3, 3, 3)) if len(x_shape) == 4 else jnp.ones((4, 3, 3))
    x = jnp.zeros(x_shape)
    with pytest.raises(ShapeError, match="empty spatial axis"):
        ops.convolution_transpose(**kw)(x, w)
    back = jnp.zeros((*x_shape[:-1], 3))
    with pytest.raises(ShapeError):
        ops.convolution(**kw)(back, w)


def test_convolution_transpose_keeps_nnc_values_on_a_one_cell_input() -> None:
    """The smallest input still works: a 1x1 input scatters the weight (NNC's loop)."""
    w = np.arange(18, dtype=np.float32).reshape(2, 3, 3, 1)
    x = np.array([[[[1.0, 2.0]]]], np.float32)
    y = np.asarray(ops.convolution_transpose(strides=2)(jnp.asarray(x), jnp.asarray(w)))
    want = (w[0, :, :, 0] * 1.0 + w[1, :, :, 0] * 2.0)[None, :, :, None]
    np.testing.assert_array_equal(y, want)


def _nnc_nearest(a: np.ndarray, ho: int, wo: int, align: bool) -> np.ndarray:
    """Port of ccv_nnc_upsample_cpu_ref.c's nearest forward (NHWC): the ratio is a float
    division, ``(int)(xd * rwidth + 0.5)`` multiplies in float and adds a double 0.5,
    ``(int)((xd + 0.5) * rwidth)`` is all double."""
    _, h, w, _ = a.shape

    def index(n_in: int, n_out: int) -> list[int]:
        if align:
            r = np.float32(np.float32(n_in - 1) / np.float32(max(1, n_out - 1)))
            src = [float(np.float32(np.float32(x) * r)) + 0.5 for x in range(n_out)]
        else:
            r = np.float32(np.float32(n_in) / np.float32(n_out))
            src = [(x + 0.5) * float(r) for x in range(n_out)]
        return [min(int(s), n_in - 1) for s in src]

    return a[:, index(h, ho)][:, :, index(w, wo)]


@pytest.mark.parametrize("align", [True, False])
def test_upsample_nearest_indices_follow_nnc_float_arithmetic(align) -> None:
    """With align_corners, NNC rounds xd * rwidth to float before adding 0.5: 15 -> 45
    rows (scale 3) took row 4 for output rows 14 and 42, where NNC takes row 5 (200 of
    45 x 57 pixels differed); the product is now rounded to float32 first."""
    a = np.arange(15 * 19, dtype=np.float32).reshape(1, 15, 19, 1)
    y = ops.upsample(scale=3, mode="nearest", align_corners=align)(jnp.asarray(a))
    np.testing.assert_array_equal(np.asarray(y), _nnc_nearest(a, 45, 57, align))


@pytest.mark.parametrize(("scale", "want"), [(2.1, (31, 52)), ((2.0, 1.06), (30, 26))])
def test_upsample_output_size_multiplies_in_float32_as_nnc(scale, want) -> None:
    """NNC's size is (int)(n * scale + 0.5) with a C float scale: 15 * 2.1f is 31.499998,
    so 31 rows (a double product gave 32), 25 * 1.06f is 26.499998, so 26 (was 27)."""
    a = np.arange(15 * 25, dtype=np.float32).reshape(1, 15, 25, 1)
    y = np.asarray(ops.upsample(scale=scale, mode="nearest")(jnp.asarray(a)))
    sh, sw = scale if isinstance(scale, tuple) else (scale, scale)
    sizes = tuple(int(float(np.float32(n) * np.float32(s)) + 0.5) for n, s in ((15, sh), (25, sw)))
    assert sizes == want
    np.testing.assert_array_equal(y, _nnc_nearest(a, *want, align=False))


@pytest.mark.parametrize("mode", ["nearest", "bilinear"])
def test_upsample_of_an_empty_axis_warns_nothing(mode) -> None:
    """[1, 0, 3, 2] upsampled is [1, 0, 6, 2] (np.repeat's shape for nearest), without
    NumPy's 'invalid value in divide' RuntimeWarning from the ratio 0 / 0."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y = ops.upsample(mode=mode)(jnp.zeros((1, 0, 3, 2)))
    assert y.shape == np.repeat(np.repeat(np.zeros((1, 0, 3, 2)), 2, 1), 2, 2).shape


def _bf16(shape, seed):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), jnp.bfloat16)


@pytest.mark.parametrize("name", ["convolution", "convolution_transpose", "avg_pool", "upsample"])
def test_backward_takes_a_float32_gradient_of_a_bfloat16_command(name) -> None:
    """As max_pool's backward and the CPU convolution backends' do, a float32 output
    gradient of a bfloat16 command is taken in the input's type: convolution's raised
    lax's 'requires arguments to have the same dtypes', avg_pool's (and sum_pool's, the
    same code) 'cotangent type does not match', and upsample's returned a float32 input
    gradient. Oracle: jax.vjp of the float32 forward, within bfloat16 rounding."""
    x = _bf16((1, 4, 4, 2), 0)
    w = _bf16((2, 3, 3, 2), 1)
    cmd = {
        "convolution": ops.convolution(padding=1),
        "convolution_transpose": ops.convolution_transpose(padding=1),
        "avg_pool": ops.avg_pool(window=3, strides=1, padding=1),
        "upsample": ops.upsample(),
    }[name]
    inputs = (x, w) if name.startswith("conv") else (x,)
    d = cmd.definition

    @jax.jit
    def both(g, *inputs):
        wide = [t.astype(jnp.float32) for t in inputs]
        want = jax.vjp(lambda *a: d.forward(*a, **cmd.kwargs), *wide)[1](g)
        return d.backward((g,), inputs, (None,), **cmd.kwargs), want

    y_shape = jax.eval_shape(lambda *a: d.forward(*a, **cmd.kwargs), *inputs).shape
    g = jnp.asarray(np.random.default_rng(2).standard_normal(y_shape), jnp.float32)
    got, want = both(g, *inputs)
    for a, b in zip(got, want):
        assert a.dtype == jnp.bfloat16
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b), rtol=2e-2, atol=4e-2)


@pytest.mark.parametrize("platform", ["cpu", "other"])
def test_max_pool_backward_sums_16_bit_shares_in_float32(platform, monkeypatch) -> None:
    """A peak that is the maximum of 25 overlapping windows (window 5, stride 1) gets 25
    gradient shares; summed in bfloat16 they were up to 1.8 ulps off. Oracle: a float64
    scatter of each window's gradient to its maximum (no ties), rounded once. 'other'
    is the reduce_window path of non-CPU platforms."""
    from fnnc.ops import pool

    monkeypatch.setattr(pool.jax, "default_backend", lambda: platform)
    rng = np.random.default_rng(0)
    n, c = 10, 4
    x = rng.uniform(-0.01, 0.01, (1, n, n, c)).astype(np.float32)
    x[:, 2::5, 2::5, :] = 10.0
    xb = jnp.asarray(x, jnp.bfloat16)
    cmd = ops.max_pool(window=5, strides=1, padding=2)
    g = jnp.asarray(rng.uniform(0.5, 1.5, (1, n, n, c)), jnp.bfloat16)
    (got,) = jax.jit(lambda g, x: cmd.definition.backward((g,), (x,), (None,), **cmd.kwargs))(g, xb)
    assert got.dtype == jnp.bfloat16
    xp = np.pad(np.asarray(xb, np.float64), ((0, 0), (2, 2), (2, 2), (0, 0)), constant_values=-1)
    g64 = np.asarray(g, np.float64)
    want = np.zeros((n + 4, n + 4, c))
    for i in range(n):
        for j in range(n):
            top = xp[0, i : i + 5, j : j + 5].reshape(25, c).argmax(0)
            want[i + top // 5, j + top % 5, np.arange(c)] += g64[0, i, j]
    want = np.asarray(jnp.asarray(want[2:-2, 2:-2], jnp.bfloat16), np.float64)
    np.testing.assert_array_equal(np.asarray(got, np.float64)[0], want)
