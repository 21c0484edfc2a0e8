"""``format="NCHW"`` on MaxPool, AvgPool, BatchNorm and Upsample (as Conv's; NNC reads
the format from the tensor: ``ccv_cnnp_batch_norm``'s axes via ``ccv_nnc_tensor_hw``, the
pool and upsample kernels' NCHW paths). Before, an NCHW model Conv(format="NCHW") ->
BatchNorm -> MaxPool normalised over W and pooled over C and H, silently.

Oracle: the same layer in NHWC on the transposed input, its output transposed back:
forward, gradients (``jax.grad`` of :func:`model_function`) and training-mode BatchNorm
statistics equal to the bit; BatchNorm's batch statistics also against NumPy float64 over
axes (0, 2, 3); a small NCHW model trained two steps against its NHWC twin."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fnnc.models import (
    AvgPool,
    BatchNorm,
    Conv,
    Dense,
    Flatten,
    MaxPool,
    ModelError,
    Sequential,
    Upsample,
    model_function,
)

RNG = np.random.default_rng(0)
X = (RNG.integers(-8, 9, size=(2, 3, 4, 4)) / 4).astype(np.float32)  # dyadic: exact sums
TO_NHWC, TO_NCHW = (0, 2, 3, 1), (0, 3, 1, 2)


def _function(layers, shape, training=False):
    model = Sequential(layers)
    model.compile([np.zeros(shape, np.float32)])
    fn = model_function(model, [jax.ShapeDtypeStruct(shape, np.float32)], training=training)
    return fn, fn.initial_parameters(model)


def _stack(fmt):
    """Every layer with a new ``format``, in one model: one compile for all of them."""
    return [
        BatchNorm(format=fmt, name="bn"),
        MaxPool(2, format=fmt),
        Upsample((2, 1.5), mode="bilinear", format=fmt),
        AvgPool(3, strides=2, padding=1, format=fmt),
    ]


@pytest.fixture(scope="module")
def pair():
    """The NCHW stack on X and its NHWC twin on X transposed, both as ``(x, params) -> (y
    in NCHW, internals)`` (training mode), and their parameters (the same, not 0 / 1)."""
    fc, params = _function(_stack("NCHW"), X.shape, training=True)
    fh, _ = _function(_stack(1 + 1), X.transpose(TO_NHWC).shape, training=True)  # NNC's 2
    params = {k: v + np.float32(0.25) * np.arange(3, dtype=np.float32) for k, v in params.items()}

    @jax.jit
    def nchw(x, p):
        (y,), internals = fc([x], p)
        return y, internals

    @jax.jit
    def twin(x, p):
        (y,), internals = fh([jnp.transpose(x, TO_NHWC)], p)
        return jnp.transpose(y, TO_NCHW), internals

    return nchw, twin, params


def test_nchw_layers_are_their_nhwc_twins_on_the_transposed_input(pair):
    nchw, twin, params = pair
    assert sorted(params) == ["r-bn-0-0", "r-bn-0-1", "t-bn-0-0", "t-bn-0-1"]
    assert all(v.shape == (3,) for v in params.values())  # scale, bias, statistics: [C]
    y, internals = nchw(X, params)
    y2, internals2 = twin(X, params)
    assert y.shape == (2, 3, 2, 2)  # 4x4 -> 2x2 -> 4x3 -> 2x2, channels stay on axis 1
    np.testing.assert_array_equal(y, y2)
    for k in internals:  # the running statistics
        np.testing.assert_array_equal(internals[k], internals2[k], err_msg=k)
    g = (RNG.integers(-4, 5, size=y.shape) / 8).astype(np.float32)

    def grads(f):
        return jax.jit(jax.grad(lambda x, p: (f(x, p)[0] * g).sum(), argnums=(0, 1)))(X, params)

    (gx, gp), (gx2, gp2) = grads(nchw), grads(twin)
    assert np.abs(gx).max() > 0
    np.testing.assert_array_equal(gx, gx2)
    for k in gp:
        np.testing.assert_array_equal(gp[k], gp2[k], err_msg=k)


def test_nchw_batch_norm_normalises_over_n_h_w_and_updates_per_channel():
    fn, params = _function([BatchNorm(format="NCHW", name="bn")], X.shape, training=True)
    params = {k: np.asarray(v, np.float64) + 0.25 * np.arange(3) for k, v in params.items()}
    (y,), internals = fn([X], {k: v.astype(np.float32) for k, v in params.items()})
    x64 = X.astype(np.float64)
    mu, var = x64.mean(axis=(0, 2, 3)), x64.var(axis=(0, 2, 3))
    old_mean, old_var = params["r-bn-0-0"], params["r-bn-0-1"]
    np.testing.assert_allclose(internals["r-bn-0-0"], 0.9 * old_mean + 0.1 * mu, rtol=1e-6)
    np.testing.assert_allclose(internals["r-bn-0-1"], 0.9 * old_var + 0.1 * var, rtol=1e-6)
    c = (slice(None), None, None)
    want = (x64 - mu[c]) / np.sqrt(var[c] + 1e-5) * params["t-bn-0-0"][c] + params["t-bn-0-1"][c]
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


def test_nchw_pools_pool_h_and_w_not_c():
    fn, params = _function([MaxPool(2, format=1)], X.shape)  # NNC's int for NCHW
    np.testing.assert_array_equal(fn([X], params)[0][0], X.reshape(2, 3, 2, 2, 2, 2).max((3, 5)))
    fn, params = _function([AvgPool(0, format="nchw")], X.shape)  # global: H x W
    np.testing.assert_array_equal(fn([X], params)[0][0], X.mean((2, 3), keepdims=True))


def test_nchw_batch_norm_test_mode_uses_the_running_statistics_per_channel():
    fn, params = _function([BatchNorm(format="NCHW", name="bn")], X.shape)
    params = {k: v + np.float32(0.5) * np.arange(3, dtype=np.float32) for k, v in params.items()}
    c = (slice(None), None, None)
    m, v, s, b = (
        np.asarray(params[k])[c] for k in ("r-bn-0-0", "r-bn-0-1", "t-bn-0-0", "t-bn-0-1")
    )
    np.testing.assert_allclose(
        fn([X], params)[0][0], (X - m) / np.sqrt(v + 1e-5) * s + b, rtol=1e-6, atol=1e-6
    )


def _cnn(fmt):
    return Sequential(
        [
            Conv(4, 3, format=fmt, name="conv"),
            BatchNorm(format=fmt, name="bn"),
            MaxPool(2, format=fmt),
            Flatten(),
            Dense(2, name="fc"),
        ]
    )


def test_nchw_cnn_trains_as_its_nhwc_twin_with_the_same_weights():
    y = np.array([0, 1], np.int32)
    nchw, nhwc = _cnn("NCHW"), _cnn("NHWC")
    for model, x in ((nchw, X), (nhwc, X.transpose(TO_NHWC))):
        model.compile([x], loss="softmax_crossentropy", minimizer=optax.sgd(0.5))
    p = nhwc.parameters()

    def dense_nchw(w):  # flatten order: NHWC (h, w, c) -> NCHW (c, h, w)
        return w.reshape(2, 2, 2, 4).transpose(0, 3, 1, 2).reshape(2, 16)

    def conv_nchw(w):  # [O, kh, kw, I] -> [O, I, kh, kw]
        return w.transpose(0, 3, 1, 2)

    same = {k: v for k, v in p.items() if k not in ("t-conv-0-0", "t-fc-0-0")}
    nchw.set_parameters(
        {**same, "t-conv-0-0": conv_nchw(p["t-conv-0-0"]), "t-fc-0-0": dense_nchw(p["t-fc-0-0"])}
    )
    for _ in range(2):
        nchw.fit([X], [y])
        nhwc.fit([X.transpose(TO_NHWC)], [y])
    a, b = nchw.parameters(), nhwc.parameters()
    assert sorted(a) == sorted(b)
    b["t-conv-0-0"], b["t-fc-0-0"] = conv_nchw(b["t-conv-0-0"]), dense_nchw(b["t-fc-0-0"])
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=1e-5, atol=1e-6, err_msg=k)
    assert not np.allclose(a["r-bn-0-0"], 0)  # the running mean moved


@pytest.mark.parametrize(
    "make",
    [
        lambda f: MaxPool(2, format=f, name="layer"),
        lambda f: AvgPool(2, format=f, name="layer"),
        lambda f: BatchNorm(format=f, name="layer"),
        lambda f: Upsample(2, format=f, name="layer"),
    ],
    ids=["max", "avg", "bn", "upsample"],
)
@pytest.mark.parametrize("bad", ["CHWN", 4, True, None])
def test_a_bad_format_names_the_layer(make, bad):
    with pytest.raises(ModelError, match=r"\('layer'\): format is .*'NCHW'"):
        make(bad)


def test_upsample_layer_checks_its_mode_and_nchw_batch_norm_its_rank():
    with pytest.raises(ModelError, match=r"Upsample\('u'\): mode is 'cubic'"):
        Upsample(2, mode="cubic", name="u")
    model = Sequential([BatchNorm(format="NCHW", name="b")])
    with pytest.raises(ModelError, match=r"BatchNorm\('b'\): .* no channel axis 1"):
        model.compile([np.zeros((4,), np.float32)])
