"""Audit 10: NNC cnnp layers fnnc lacked (ccv_cnnp_model_addons.c): the transposed
convolution layer (ccv_cnnp_convolution_transpose), checked against a NumPy port of NNC's
CPU reference kernel (ccv_nnc_conv_transpose_cpu_ref.c) and jax.vjp of
lax.conv_general_dilated."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from fnnc.errors import ModelError
from fnnc.models import Conv, ConvTranspose, Input, Model, Reshape, model_function

RNG = np.random.default_rng(10)


def _fn(layer, *xs):
    ins = [Input() for _ in xs]
    model = Model(ins, [layer(*ins)])
    model.compile(list(xs))
    return model, model_function(model, list(xs))


def _vjp(fn, params, xs, ct):
    """(y, dx of every input, d params) of ``fn`` at ``xs`` for the cotangent ``ct``."""

    def both(xs, params, ct):
        y, vjp = jax.vjp(lambda xs, p: fn(list(xs), p, [])[0][0], xs, params)
        return (y, *vjp(ct))

    return jax.jit(both)(tuple(jnp.asarray(x) for x in xs), params, jnp.asarray(ct))


def _nnc_conv_transpose(a, w, bias, groups, stride, border, dilation, out_hw):
    """NNC's NHWC CPU reference in float64 loops: output channel k of group k // (F/G)
    gets ``w[c, j0, j1, k % (F/G)] * a[i0, i1, c]`` at ``i * stride - border + j *
    dilation`` for the group's input channels c, cropped to ``out_hw``, plus the bias."""
    n, h, wd, cin = a.shape
    _, kh, kw, fg = w.shape
    out = np.zeros((n, *out_hw, fg * groups)) + bias
    icg = cin // groups
    for b in range(n):
        for k in range(fg * groups):
            g = k // fg
            for i0 in range(h):
                for i1 in range(wd):
                    for j0 in range(kh):
                        for j1 in range(kw):
                            y0 = i0 * stride[0] - border[0] + j0 * dilation[0]
                            y1 = i1 * stride[1] - border[1] + j1 * dilation[1]
                            if 0 <= y0 < out_hw[0] and 0 <= y1 < out_hw[1]:
                                cs = slice(g * icg, (g + 1) * icg)
                                out[b, y0, y1, k] += np.dot(
                                    w[cs, j0, j1, k % fg].astype(np.float64),
                                    a[b, i0, i1, cs].astype(np.float64),
                                )
    return out


def _adjoint(x, w, bias, groups, stride, pads, dilation, out_hw):
    """The transpose as jax.vjp of lax.conv_general_dilated (OHWI weight [in, k, F/G])
    with respect to its input of size ``out_hw``."""
    n = x.shape[0]
    zero = jnp.zeros((n, *out_hw, w.shape[-1] * groups), x.dtype)
    conv = lambda z: lax.conv_general_dilated(
        z, w, stride, pads, rhs_dilation=dilation,
        dimension_numbers=("NHWC", "OHWI", "NHWC"), feature_group_count=groups,
    )  # fmt: skip
    return jax.vjp(conv, zero)[1](x)[0] + jnp.reshape(bias, (1, 1, 1, -1))


def test_conv_transpose_matches_nnc_cpu_ref_and_conv_adjoint():
    """ConvTranspose(4, (3, 2), strides=2, padding=1, dilation=(1, 2), output_padding=1,
    groups=2) on [2, 3, 4, 6]: weight [6, 3, 2, 2] (NNC's [in, kh, kw, filters/groups]);
    forward == NNC's CPU reference port; forward and all gradients == jax.vjp of the
    convolution's input-adjoint (jax.grad oracle)."""
    x = RNG.standard_normal((2, 3, 4, 6)).astype(np.float32)
    layer = ConvTranspose(
        4, (3, 2), strides=2, padding=1, dilation=(1, 2), output_padding=1, groups=2, name="up"
    )
    model, fn = _fn(layer, x)
    params = model.parameters()
    assert params["t-up-0-0"].shape == (6, 3, 2, 2) and params["t-up-0-1"].shape == (4,)
    w = RNG.standard_normal((6, 3, 2, 2)).astype(np.float32)
    bias = RNG.standard_normal(4).astype(np.float32)
    p = {"t-up-0-0": jnp.asarray(w), "t-up-0-1": jnp.asarray(bias)}
    # (3 - 1) * 2 + 3 - 2 + 1 = 6 rows; (4 - 1) * 2 + 3 - 2 + 1 = 8 columns
    out_hw = (6, 8)
    ct = RNG.standard_normal((2, *out_hw, 4)).astype(np.float32)
    y, (dx,), dp = _vjp(fn, p, [x], ct)
    want = _nnc_conv_transpose(x, w, bias, 2, (2, 2), (1, 1), (1, 2), out_hw)
    np.testing.assert_allclose(np.asarray(y), want, rtol=1e-5, atol=1e-5)

    args = dict(groups=2, stride=(2, 2), pads=((1, 1), (1, 1)), dilation=(1, 2), out_hw=out_hw)
    ref = lambda x, w, b: _adjoint(x, w, b, **args)
    np.testing.assert_allclose(np.asarray(y), ref(x, w, bias), rtol=1e-5, atol=1e-5)
    gx, gw, gb = jax.jit(jax.grad(lambda *a: jnp.sum(ref(*a) * ct), argnums=(0, 1, 2)))(x, w, bias)
    np.testing.assert_allclose(np.asarray(dx), gx, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(np.asarray(dp["t-up-0-0"]), gw, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(np.asarray(dp["t-up-0-1"]), gb, rtol=1e-5, atol=1e-4)


def test_conv_transpose_same_padding_no_bias_one_dim():
    """The defaults (padding='SAME') give x * stride; no_bias makes one parameter; on
    [N, W, C] an int kernel is a width. Oracle: the NNC reference port with SAME's
    border (the convolution of the [N, 8] output pads (k - s) // 2 = 0 before)."""
    x = RNG.standard_normal((1, 4, 3)).astype(np.float32)
    model, fn = _fn(ConvTranspose(2, 3, strides=2, no_bias=True, name="t"), x)
    assert list(model.parameters()) == ["t-t-0-0"]
    w = RNG.standard_normal((3, 3, 2)).astype(np.float32)
    y = np.asarray(fn([x], {"t-t-0-0": jnp.asarray(w)}, [])[0][0])
    assert y.shape == (1, 8, 2)
    want = _nnc_conv_transpose(x[:, None], w[:, None], 0.0, 1, (1, 2), (0, 0), (1, 1), (1, 8))[:, 0]
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("kwargs", "shape", "match"),
    [
        (dict(output_padding=-1), (1, 4, 4, 2), "output_padding is -1"),
        (dict(output_padding="a"), (1, 4, 4, 2), "output_padding is 'a'"),
        (dict(groups=2, filters=3), (1, 4, 4, 2), "filters=3 do not split"),
        (dict(groups=2), (1, 4, 4, 3), "3 input channels .*do not split"),
        (dict(output_padding=(1, 1, 1), strides=2), (1, 4, 4, 2), "output_padding=.*2 spatial"),
        (dict(), (4, 2), "no spatial axis"),
        (dict(output_padding=2, strides=2), (1, 4, 4, 2), "smaller than strides"),
    ],
)
def test_conv_transpose_errors_name_the_layer(kwargs, shape, match):
    """Bad options and inputs are ModelErrors naming ConvTranspose('bad')."""
    kwargs = {"filters": 4, "kernel_size": 3, "padding": 1, **kwargs}
    with pytest.raises(ModelError, match=match) as info:
        _fn(ConvTranspose(name="bad", **kwargs), np.zeros(shape, np.float32))
    assert "ConvTranspose('bad')" in str(info.value)


def test_conv_nchw_format_matches_lax_nchw_oihw():
    """Conv(4, (3, 2), format='NCHW', strides=(2, 1), padding=1, groups=2): input and
    output [N, C, H, W], weight NNC's NCHW [filters, in/groups, kh, kw]. Oracle:
    lax.conv_general_dilated with ('NCHW', 'OIHW', 'NCHW') and jax.grad of it."""
    x = RNG.standard_normal((2, 4, 5, 3)).astype(np.float32)
    model, fn = _fn(Conv(4, (3, 2), format="NCHW", strides=(2, 1), padding=1, groups=2), x)
    (wid, w0), (bid, b0) = model.parameters().items()
    assert w0.shape == (4, 2, 3, 2) and b0.shape == (4,)
    w = RNG.standard_normal((4, 2, 3, 2)).astype(np.float32)
    bias = RNG.standard_normal(4).astype(np.float32)

    def ref(x, w, b):
        y = lax.conv_general_dilated(
            x, w, (2, 1), ((1, 1), (1, 1)),
            dimension_numbers=("NCHW", "OIHW", "NCHW"), feature_group_count=2,
        )  # fmt: skip
        return y + jnp.reshape(b, (1, -1, 1, 1))

    want = ref(x, w, bias)
    assert want.shape == (2, 4, 3, 4)
    ct = RNG.standard_normal(want.shape).astype(np.float32)
    y, (dx,), dp = _vjp(fn, {wid: jnp.asarray(w), bid: jnp.asarray(bias)}, [x], ct)
    np.testing.assert_allclose(np.asarray(y), want, rtol=1e-5, atol=1e-5)
    gx, gw, gb = jax.jit(jax.grad(lambda *a: jnp.sum(ref(*a) * ct), argnums=(0, 1, 2)))(x, w, bias)
    np.testing.assert_allclose(np.asarray(dx), gx, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(np.asarray(dp[wid]), gw, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(np.asarray(dp[bid]), gb, rtol=1e-5, atol=1e-4)


def test_conv_transpose_nchw_format_matches_nnc_cpu_ref():
    """ConvTranspose(4, 3, format=1) (NNC's CCV_TENSOR_FORMAT_NCHW) takes [N, C, H, W]
    and NNC's NCHW transpose weight [in, filters/groups, kh, kw] (its cpu ref's NCHW
    branch: w dim[1] * groups == filters). Oracle: the NHWC reference port on the
    transposed input and weight."""
    x = RNG.standard_normal((1, 2, 3, 3)).astype(np.float32)
    model, fn = _fn(ConvTranspose(4, 3, format=1, strides=2, padding=1, no_bias=True), x)
    ((wid, w0),) = model.parameters().items()
    assert w0.shape == (2, 4, 3, 3)
    w = RNG.standard_normal((2, 4, 3, 3)).astype(np.float32)
    y = np.asarray(fn([x], {wid: jnp.asarray(w)}, [])[0][0])
    # SAME-free: (3 - 1) * 2 + 3 - 2 = 5
    want = _nnc_conv_transpose(
        x.transpose(0, 2, 3, 1), w.transpose(0, 2, 3, 1), 0.0, 1, (2, 2), (1, 1), (1, 1), (5, 5)
    ).transpose(0, 3, 1, 2)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("bad", ["NWHC", True, 4, [1], None])
def test_conv_format_is_checked(bad):
    """A format other than NHWC / NCHW (or NNC's 0, 1, 2) is a ModelError naming the
    layer; NHWC stays the default."""
    with pytest.raises(ModelError, match=r"Conv\('c'\): format is"):
        Conv(4, 3, format=bad, name="c")
    assert Conv(4, 3).format == "NHWC" and Conv(4, 3, format="nchw").format == "NCHW"


def test_reshape_view_is_the_channel_slice_with_its_gradient():
    """Reshape((2, 3, 2), ofs=(0, 0, 2), stride=(12, 4, 1)) on [2, 2, 3, 4] is NNC's
    alias of the last two channels: == x[..., 2:], and dx is ct in those channels, zero
    elsewhere (jax.grad of the slice)."""
    x = RNG.standard_normal((2, 2, 3, 4)).astype(np.float32)
    _, fn = _fn(Reshape((2, 3, 2), ofs=(0, 0, 2), stride=(12, 4, 1)), x)
    ct = RNG.standard_normal((2, 2, 3, 2)).astype(np.float32)
    y, (dx,), _ = _vjp(fn, {}, [x], ct)
    np.testing.assert_array_equal(np.asarray(y), x[..., 2:])
    want = jax.grad(lambda v: jnp.sum(v[..., 2:] * ct))(x)
    np.testing.assert_array_equal(np.asarray(dx), want)


@pytest.mark.parametrize(
    ("shape", "ofs", "stride"),
    [
        ((2, 3), (1, 0), (3, 1)),  # shape's contiguous stride: elements 3..8 of 12
        ((2, 6), (0, 0), None),  # a view of the whole sample: the default stride
        ((3, 2), (0, 1), (0, 2)),  # stride 0: each row the same odd elements (overlap)
        ((2, 2), None, (5, 3)),  # a skewed view
    ],
)
def test_reshape_view_matches_numpy_as_strided(shape, ofs, stride):
    """Per sample, the view == np.lib.stride_tricks.as_strided of the flat sample at
    NNC's offset sum(ofs * stride), strides in elements (stride defaulting to shape's
    contiguous ones); dx sums every read of an element (overlapping views add), as
    jax.grad of a take at as_strided's positions."""
    x = RNG.standard_normal((2, 12)).astype(np.float32)
    _, fn = _fn(Reshape(shape, ofs=ofs, stride=stride), x)
    st = stride or (shape[1], 1)
    start = sum(o * s for o, s in zip(ofs or (0, 0), st))
    pos = np.lib.stride_tricks.as_strided(
        np.arange(12)[start:], shape, tuple(8 * s for s in st), writeable=False
    )
    want = np.stack([np.lib.stride_tricks.as_strided(
        r[start:], shape, tuple(4 * s for s in st), writeable=False
    ) for r in x])  # fmt: skip
    ct = RNG.standard_normal((2, *shape)).astype(np.float32)
    y, (dx,), _ = _vjp(fn, {}, [x], ct)
    np.testing.assert_array_equal(np.asarray(y), want)
    gx = jax.grad(lambda v: jnp.sum(jnp.take(v, jnp.asarray(pos), axis=1) * ct))(x)
    np.testing.assert_allclose(np.asarray(dx), gx, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(shape=(2, 2), ofs=(0, 3), stride=(4, 1)), "reads element 8 of a sample of 8"),
        (dict(shape=(-1, 2), ofs=(0, 1)), "no -1"),
        (dict(shape=(2, 2), stride=(4,)), "one entry"),
        (dict(shape=(2, 2), ofs=(0, -1)), "ofs is"),
        (dict(shape=(2, 1), ofs=(0, 1)), r"needs stride=: NNC's default strides"),
        (dict(shape=(2, 2), stride="ab"), "stride is"),
    ],
)
def test_reshape_view_errors_name_the_layer(kwargs, match):
    """A view outside the sample, a -1 in a view, or mismatched / bad ofs and stride
    are ModelErrors naming Reshape('r')."""
    with pytest.raises(ModelError, match=match) as info:
        _fn(Reshape(name="r", **kwargs), np.zeros((1, 2, 4), np.float32))
    assert "Reshape('r')" in str(info.value)


def test_nchw_conv_transpose_reads_nnc_layout_weights(tmp_path):
    """Weights as ccv_cnnp_model_write lays out an NCHW transposed convolution (row
    __net__[t-net-0-up-0-0], NCHW tensor [in, filters/groups, kh, kw], bias [filters])
    read into ConvTranspose(format='NCHW') as they are; the output is NNC's CPU
    reference (its port, on the transposed input and weight)."""
    from fnnc.io import TensorFile
    from fnnc.models import Sequential

    w = RNG.standard_normal((2, 4, 3, 3)).astype(np.float32)
    bias = RNG.standard_normal(4).astype(np.float32)
    path = tmp_path / "up.sqlite3"
    with TensorFile(path) as f, f.transaction():
        f.write("__net__[t-net-0-up-0-0]", w, "NCHW")
        f.write("__net__[t-net-0-up-0-1]", bias, "NCHW")
    up = ConvTranspose(4, 3, strides=2, padding=1, format="NCHW", name="up")
    model = Sequential([up], name="net")
    x = RNG.standard_normal((1, 2, 3, 3)).astype(np.float32)
    model.compile([x])
    assert sorted(model.parameters()) == ["t-net-0-up-0-0", "t-net-0-up-0-1"]
    assert model.read(path, name="net") == []
    want = _nnc_conv_transpose(
        x.transpose(0, 2, 3, 1), w.transpose(0, 2, 3, 1), bias, 1, (2, 2), (1, 1), (1, 1), (5, 5)
    ).transpose(0, 3, 1, 2)
    np.testing.assert_allclose(np.asarray(model.evaluate([x])), want, rtol=1e-5, atol=1e-5)
