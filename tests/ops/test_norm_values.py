"""Normalisation commands against NumPy closed forms, and their error messages."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fnnc import ops
from fnnc.errors import CommandError, DTypeError, ShapeError
from tests.helpers import assert_close, rand, randint

X = rand([2, 3, 4, 6], seed=3)


def _bn_stats(c: int):
    return (
        rand([c], seed=1, lo=0.5, hi=1.5),
        rand([c], seed=2),
        rand([c], seed=4),
        rand([c], seed=5, lo=0.5, hi=2.0),
    )


def test_batch_norm_training_follows_nnc_running_stats() -> None:
    scale, bias, mean, var = _bn_stats(6)
    y, new_mean, new_var, saved_mean, saved_inv_std = ops.batch_norm(momentum=0.8, epsilon=1e-3)(
        X, scale, bias, mean, var
    )
    bm = X.mean(axis=(0, 1, 2))
    bv = X.var(axis=(0, 1, 2))  # biased, as NNC's CPU reference
    assert_close(saved_mean, bm)
    assert_close(saved_inv_std, 1 / np.sqrt(bv + 1e-3), rtol=1e-4)
    assert_close(new_mean, 0.8 * mean + 0.2 * bm)
    assert_close(new_var, 0.8 * var + 0.2 * bv)
    assert_close(y, (X - bm) / np.sqrt(bv + 1e-3) * scale + bias, rtol=1e-4, atol=1e-4)


def test_batch_norm_test_mode_uses_and_passes_running_stats() -> None:
    scale, bias, mean, var = _bn_stats(6)
    y, new_mean, new_var, _, inv_std = ops.batch_norm(is_test=True)(X, scale, bias, mean, var)
    assert_close(y, (X - mean) / np.sqrt(var + 1e-5) * scale + bias, rtol=1e-4, atol=1e-4)
    assert_close((new_mean, new_var), (mean, var))
    assert_close(inv_std, 1 / np.sqrt(var + 1e-5), rtol=1e-4)


def test_batch_norm_nchw_axes() -> None:
    x = rand([4, 3, 2, 2])
    scale, bias, mean, var = _bn_stats(3)
    y, *_ = ops.batch_norm(axes=(0, 2, 3))(x, scale, bias, mean, var)
    m = x.mean(axis=(0, 2, 3), keepdims=True)
    v = x.var(axis=(0, 2, 3), keepdims=True)
    want = (x - m) / np.sqrt(v + 1e-5) * scale.reshape(1, 3, 1, 1) + bias.reshape(1, 3, 1, 1)
    assert_close(y, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("groups", [1, 2, 3])
def test_group_norm_matches_numpy(groups) -> None:
    scale, bias = rand([6], seed=1), rand([6], seed=2)
    y, mean, inv_std = ops.group_norm(groups=groups, reduce_axes=None)(X, scale, bias)
    g = X.reshape(2, 3, 4, groups, 6 // groups)
    m = g.mean(axis=(1, 2, 4), keepdims=True)
    v = g.var(axis=(1, 2, 4), keepdims=True)
    want = ((g - m) / np.sqrt(v + 1e-5)).reshape(X.shape) * scale + bias
    assert_close(y, want, rtol=1e-4, atol=1e-4)
    assert mean.shape == inv_std.shape == (2, 1, 1, groups)
    assert_close(mean, m.reshape(2, 1, 1, groups))


def test_group_norm_nchw() -> None:
    x = rand([2, 4, 3, 3])
    y, mean, _ = ops.group_norm(groups=2, axis=1, reduce_axes=None)(x)
    g = x.reshape(2, 2, 2, 3, 3)
    want = (g - g.mean(axis=(2, 3, 4), keepdims=True)) / np.sqrt(
        g.var(axis=(2, 3, 4), keepdims=True) + 1e-5
    )
    assert_close(y, want.reshape(x.shape), rtol=1e-4, atol=1e-4)
    assert mean.shape == (2, 2, 1, 1)


def test_layer_and_rms_norm_match_numpy() -> None:
    x = rand([3, 8])
    scale, bias = rand([8], seed=1), rand([8], seed=2)
    y, mean, inv_std = ops.layer_norm()(x, scale, bias)
    m, v = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    assert_close(y, (x - m) / np.sqrt(v + 1e-5) * scale + bias, rtol=1e-4, atol=1e-4)
    assert_close((mean, inv_std), (m, 1 / np.sqrt(v + 1e-5)), rtol=1e-4)
    y, inv_rms = ops.rms_norm()(x, scale)
    r = 1 / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6)
    assert_close((y, inv_rms), (x * r * scale, r), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["layer_norm", "rms_norm"])
def test_nnc_layout_of_the_scale_and_bias(name) -> None:
    """NNC shapes a layer norm's scale and bias with x's rank and 1 off the normalized
    axes ([1, 4, 10] for axes (1, 2) of [2, 4, 10]); the values and the parameters'
    gradients (in that shape) are those of the [4, 10] layout."""
    x, g = rand([2, 4, 10]), rand([2, 4, 10], seed=3)
    params = [rand([4, 10], seed=1)] + ([rand([4, 10], seed=2)] if name == "layer_norm" else [])
    cmd = getattr(ops, name)(axes=(1, 2))
    flat, nnc = cmd(x, *params), cmd(x, *(p[None] for p in params))
    assert_close(nnc, flat)
    grads = [g] + [None] * (len(flat) - 1)
    backward = getattr(ops, name).definition.backward
    kw = dict(axes=(1, 2), epsilon=cmd.param("epsilon"))
    want = backward(grads, (x, *params), flat, **kw)
    got = backward(grads, (x, *(p[None] for p in params)), nnc, **kw)
    assert [np.shape(a) for a in got[1:]] == [(1, 4, 10)] * len(params)
    assert_close([np.reshape(a, np.shape(w)) for a, w in zip(got, want)], want)


@pytest.mark.parametrize(
    "cmd, inputs, error, match",
    [
        (
            ops.batch_norm(),
            (X, *_bn_stats(4)),
            ShapeError,
            r"scale float32\[4\] must have shape \[6\]",
        ),
        (ops.batch_norm(axes=(0, 5)), (X, *_bn_stats(6)), ShapeError, "out of range"),
        (ops.layer_norm(), (X, rand([4])), ShapeError, r"must have shape \[6\]"),
        (ops.layer_norm(), (randint([2, 3], 4),), DTypeError, "floating-point"),
        (ops.layer_norm(), (X, rand([6]).astype(np.float16)), DTypeError, "share one dtype"),
        (ops.group_norm(groups=4), (X,), CommandError, "must divide the 6 channels"),
        (ops.group_norm(groups=2, axis=0, reduce_axes=None), (X,), ShapeError, "batch axis"),
        (ops.group_norm(groups=2), (X, rand([3])), ShapeError, r"must have shape \[6\]"),
        (ops.rms_norm(axes=(-1,)), (X, rand([6, 1])), ShapeError, r"must have shape \[6\]"),
        (ops.rms_norm(axes=(-1,)), (X, rand([2, 6])), ShapeError, r"\[6\] or \[1, 1, 1, 6\]"),
    ],
)
def test_bad_inputs_raise_clear_errors(cmd, inputs, error, match) -> None:
    with pytest.raises(error, match=match):
        cmd(*inputs)


@pytest.mark.parametrize("cmd", [ops.layer_norm(axes=(1, 2)), ops.rms_norm(axes=(1, 2))])
def test_backward_without_statistics_gradients(cmd) -> None:
    """The usual case: only ``y`` gets a gradient; the saved statistics get None."""
    x, scale = rand([2, 3, 4]), rand([3, 4], seed=1)
    outs, pull = jax.vjp(lambda *a: cmd.definition.forward(*a, **cmd.kwargs), x, scale)
    g = rand([2, 3, 4], seed=2)
    want = pull((g, *(np.zeros(o.shape, o.dtype) for o in outs[1:])))
    got = cmd.definition.backward((g,) + (None,) * (len(outs) - 1), (x, scale), outs, **cmd.kwargs)
    assert_close(got, want, rtol=1e-4, atol=1e-5)


# --- float16: statistics in float32 ----------------------------------------------------


def _np_stats(x, axis, rms=False):
    """float64 NumPy oracle: (x - mean) * inv_std over ``axis`` (mean 0 for RMS)."""
    x = x.astype(np.float64)
    mu = 0.0 if rms else x.mean(axis, keepdims=True)
    return mu, 1 / np.sqrt(((x - mu) ** 2).mean(axis, keepdims=True) + (1e-6 if rms else 1e-5))


def _jnp_norm(name, x, scale, *rest):
    """An independent float32 jax.numpy oracle of the command's outputs."""
    jnp = jax.numpy
    xs = jnp.reshape(x, (x.shape[0], 2, -1)) if name == "group_norm" else x
    mu = 0.0 if name == "rms_norm" else jnp.mean(xs, -1, keepdims=True)
    eps = 1e-6 if name == "rms_norm" else 1e-5
    inv = jax.lax.rsqrt(jnp.mean(jnp.square(xs - mu), -1, keepdims=True) + eps)
    y = jnp.reshape((xs - mu) * inv, x.shape) * scale[None] + (rest[0][None] if rest else 0)
    if name == "group_norm":
        mu, inv = mu[..., 0], inv[..., 0]
    return (y, inv) if name == "rms_norm" else (y, mu, inv)


NORMS16 = {
    "layer_norm": ops.layer_norm(),
    "rms_norm": ops.rms_norm(),
    "group_norm": ops.group_norm(groups=2),
}
BIG16 = rand([2, 130], seed=7, lo=-300, hi=300).astype(np.float16)
CONST16 = np.full([3, 130], 3.0, np.float16)


@pytest.mark.parametrize("x", [BIG16, CONST16], ids=["large", "constant-rows"])
@pytest.mark.parametrize("name", list(NORMS16))
def test_float16_norms_compute_statistics_in_float32(name, x) -> None:
    """|x - mean| >= 256 squares past float16's range: y was silently 0, as inv_std."""
    cmd = NORMS16[name]
    params = [np.ones([130], np.float16), np.zeros([130], np.float16)]
    outs = cmd(x, *params[: 1 if name == "rms_norm" else 2])
    assert [o.dtype for o in outs] == [np.float16] * len(outs)
    rows = x.reshape(x.shape[0], 2, 65) if name == "group_norm" else x
    mu, inv = _np_stats(rows, -1, rms=name == "rms_norm")
    assert_close(outs[0], ((rows - mu) * inv).reshape(x.shape), rtol=2e-3, atol=2e-3)
    assert_close(outs[-1], inv.reshape(outs[-1].shape), rtol=2e-3)


@pytest.mark.parametrize("x", [BIG16, CONST16], ids=["large", "constant-rows"])
@pytest.mark.parametrize("name", list(NORMS16))
def test_float16_norm_backward_matches_float32_grad(name, x) -> None:
    """With every output's gradient given (saved_inv_std's too: inv_std**2 = 1e5 of a
    constant row overflowed float16 into NaN), as jax.vjp of a float32 oracle."""
    cmd = NORMS16[name]
    params = [rand([130], seed=s, lo=0.5, hi=1.5).astype(np.float16) for s in (1, 2)]
    params = params[:1] if name == "rms_norm" else params
    outs = cmd(x, *params)
    grads = [rand(o.shape, seed=9 + i).astype(np.float16) for i, o in enumerate(outs)]
    got = cmd.definition.backward(grads, (x, *params), outs, **cmd.kwargs)
    wide = [a.astype(np.float32) for a in (x, *params)]
    _, pull = jax.vjp(lambda *a: _jnp_norm(name, *a), *wide)
    want = pull(tuple(g.astype(np.float32) for g in grads))
    assert [g.dtype for g in got] == [np.float16] * len(got)
    assert not any(np.isnan(np.asarray(g, np.float32)).any() for g in got)
    for g, w in zip(got, want):
        scale = float(np.abs(w).max()) or 1.0
        assert_close(g, np.asarray(w).astype(np.float16), rtol=1e-2, atol=2e-3 * scale)


def test_float16_batch_norm_with_float16_parameters_computes_in_float32() -> None:
    x = rand([4, 2, 3], seed=3, lo=-300, hi=300).astype(np.float16)
    stats = [np.full([3], v, np.float16) for v in (1.0, 0.0, 0.0, 1.0)]
    y, *_, inv = ops.batch_norm(axes=(0, 1))(x, *stats)
    mu, want_inv = _np_stats(x, (0, 1))
    assert y.dtype == inv.dtype == np.float16
    assert_close(y, (x - mu) * want_inv, rtol=2e-3, atol=2e-3)
    assert_close(inv, want_inv.reshape(3), rtol=2e-3)


def test_float16_rmsnorm_gated_computes_in_float32() -> None:
    """x = [300, -300, 100, 0] in float16: x * x overflows past 256, so the statistics
    are taken in float32 (the result was all zeros); oracle in float64."""
    x = np.array([[300, -300, 100, 0]], np.float16)
    gate = np.array([[1.0, -2.0, 0.5, 3.0]], np.float16)
    got = ops.rmsnorm_gated()(x, gate)
    x64, g64 = x.astype(np.float64), gate.astype(np.float64)
    want = x64 / np.sqrt(np.mean(x64 * x64, -1, keepdims=True) + 1e-6) * g64 / (1 + np.exp(-g64))
    assert got.dtype == np.float16
    assert_close(got, want, rtol=2e-3, atol=1e-3)


def _np_norm_grads(x, gy, scale, split, reduced, channel):
    """float64 gradients of ``y = xhat * scale`` (x viewed as ``split``, normalised over
    ``reduced``; the scale per entry of ``channel`` axes of x): ``(dx, d_scale)``."""
    shape = x.shape
    xs, gs = x.reshape(split), (gy * scale).reshape(split)
    mu = xs.mean(reduced, keepdims=True)
    inv = 1 / np.sqrt(((xs - mu) ** 2).mean(reduced, keepdims=True) + 1e-5)
    xhat = (xs - mu) * inv
    m = lambda t: t.mean(reduced, keepdims=True)
    dx = (inv * (gs - m(gs) - xhat * m(gs * xhat))).reshape(shape)
    others = tuple(d for d in range(len(shape)) if d not in channel)
    return dx, (gy * xhat.reshape(shape)).sum(others)


_HALF_NORMS = {
    # name: (command, x shape, x viewed as, reduced axes of the view, channel axes)
    "layer_norm": (ops.layer_norm(axes=(-1,)), (4, 256), (4, 256), (1,), (1,)),
    "group_norm": (
        ops.group_norm(groups=2, reduce_axes=None),
        (2, 16, 8),
        (2, 16, 2, 4),
        (1, 3),
        (2,),
    ),
    "batch_norm": (ops.batch_norm(axes=(0,)), (256, 4), (256, 4), (0,), (1,)),
}


@pytest.mark.parametrize("dtype", [jnp.bfloat16, np.float16], ids=["bfloat16", "float16"])
@pytest.mark.parametrize("name", sorted(_HALF_NORMS))
def test_16_bit_norm_backward_does_not_read_rounded_statistics(name, dtype) -> None:
    """x of mean 100 and std 1 in a 16-bit type (parameters too, so batch_norm's
    statistics are 16-bit): the saved mean rounds by up to 0.25, and a backward that
    read it had scale gradients several percent off (bfloat16 layer_norm: 4.7%). dx and
    d_scale against float64 NumPy, within 3 roundings of their largest value."""
    cmd, shape, split, reduced, channel = _HALF_NORMS[name]
    rng = np.random.default_rng(0)
    x = jnp.asarray(100 + rng.standard_normal(shape), dtype)
    c = shape[channel[0]]
    scale = jnp.asarray(rng.uniform(0.5, 1.0, c), dtype)
    params = [scale, jnp.asarray(rng.standard_normal(c), dtype)]
    if name == "batch_norm":
        params += [jnp.zeros(c, dtype), jnp.ones(c, dtype)]
    gy = jnp.asarray(rng.standard_normal(shape), dtype)
    outs = list(cmd(x, *params))
    grads = [gy] + [None] * (len(outs) - 1)
    gx, g_scale = ops.lookup(name).backward(grads, [x, *params], outs, **cmd.kwargs)[:2]
    f64 = lambda a: np.asarray(jnp.asarray(a, jnp.float32), np.float64)
    want_dx, want_scale = _np_norm_grads(f64(x), f64(gy), f64(scale), split, reduced, channel)
    rounding = 3 * float(jnp.finfo(dtype).eps) / 2
    for got, want in ((gx, want_dx), (g_scale, want_scale)):
        assert got.dtype == dtype
        err = np.abs(f64(got) - want).max() / np.abs(want).max()
        assert err < rounding, (name, err, rounding)
