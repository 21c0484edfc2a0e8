"""Audit 9 of the cnnp layers' options against NNC's constructors (ccv_nnc.h,
ccv_cnnp_model_addons.c): GroupNorm's group_axis / reduce_axes / elementwise_affine,
Dropout's entirety, Embedding's dtype and MultiHeadAttention's attention mask and scale,
each checked against an independent oracle (float64 NumPy, Flax, counting)."""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from fnnc.errors import ModelError
from fnnc.models import (
    Activation,
    Add,
    AvgPool,
    Chunk,
    Conv,
    Dense,
    Dropout,
    Embedding,
    GroupNorm,
    Input,
    LayerNorm,
    MaxPool,
    Model,
    Mul,
    MultiHeadAttention,
    RMSNorm,
    SwiGLU,
    model_function,
)

RNG = np.random.default_rng(9)


def _fn(layer, *xs, training=False):
    """The compiled model of ``layer`` on inputs like ``xs``, its model_function and
    its parameters."""
    ins = [Input() for _ in xs]
    model = Model(ins, [layer(*ins)])
    model.compile(list(xs))
    return model, model_function(model, list(xs), training=training)


def _vjp(fn, params, xs, ct, keys=()):
    """(y, dx of every input, d params) of ``fn`` at ``xs`` for the cotangent ``ct``."""

    def f(xs, params):
        return fn(list(xs), params, list(keys))[0][0]

    def both(xs, params, ct):
        y, vjp = jax.vjp(f, xs, params)
        return (y, *vjp(ct))

    return jax.jit(both)(tuple(jnp.asarray(x) for x in xs), params, jnp.asarray(ct))


def test_group_norm_nchw_group_axis_and_reduce_axes_match_float64_numpy():
    """GroupNorm(group_axis=1, reduce_axes=(2, 3)) is NNC's NCHW group norm; its scale
    and bias are per channel. Oracle: the float64 closed form, and jax.grad of it."""
    x = RNG.standard_normal((2, 4, 3, 2)).astype(np.float32) * 2 + 1
    _, fn = _fn(GroupNorm(2, group_axis=1, reduce_axes=(2, 3), name="gn"), x)
    scale = RNG.standard_normal(4).astype(np.float32)
    bias = RNG.standard_normal(4).astype(np.float32)
    params = {"t-gn-0-0": jnp.asarray(scale), "t-gn-0-1": jnp.asarray(bias)}
    ct = RNG.standard_normal(x.shape).astype(np.float32)

    def oracle(x, scale, bias, xp=np):
        g = xp.reshape(x, (2, 2, 2, 3, 2))  # [N, G, C/G, H, W]
        mu = g.mean(axis=(2, 3, 4), keepdims=True)
        var = ((g - mu) ** 2).mean(axis=(2, 3, 4), keepdims=True)
        y = xp.reshape((g - mu) / xp.sqrt(var + 1e-5), x.shape)
        return y * scale[None, :, None, None] + bias[None, :, None, None]

    y, (dx,), dp = _vjp(fn, params, [x], ct)
    want = oracle(x.astype(np.float64), scale.astype(np.float64), bias.astype(np.float64))
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
    loss = lambda x, s, b: jnp.sum(oracle(x, s, b, jnp) * ct)
    gx, gs, gb = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(x, scale, bias)
    np.testing.assert_allclose(dx, gx, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(dp["t-gn-0-0"], gs, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(dp["t-gn-0-1"], gb, rtol=1e-4, atol=1e-5)


def test_group_norm_without_affine_matches_flax_and_has_no_parameters():
    """elementwise_affine=False (NNC's elementwise_affine=0) makes no scale or bias: the
    same numbers as flax.linen.GroupNorm(use_scale=False, use_bias=False), forward and
    gradient; reduce_axes=() normalises each position over its group's channels alone."""
    x = RNG.standard_normal((2, 3, 2, 6)).astype(np.float32) * 3 - 2
    ct = RNG.standard_normal(x.shape).astype(np.float32)
    model, fn = _fn(GroupNorm(3, elementwise_affine=False, name="gn"), x)
    assert model.parameters() == {}
    flax_gn = nn.GroupNorm(num_groups=3, use_scale=False, use_bias=False, epsilon=1e-5)
    ref = lambda v: flax_gn.apply({}, v)
    y, (dx,), _ = _vjp(fn, {}, [x], ct)
    np.testing.assert_allclose(y, ref(x), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dx, jax.jit(jax.grad(lambda v: jnp.sum(ref(v) * ct)))(x), atol=1e-5)
    _, fn = _fn(GroupNorm(3, reduce_axes=(), elementwise_affine=False), x)
    g = x.astype(np.float64).reshape(2, 3, 2, 3, 2)
    want = (g - g.mean(-1, keepdims=True)) / np.sqrt(g.var(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(fn([x], {})[0][0], want.reshape(x.shape), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "make, shape, match",
    [
        (lambda: GroupNorm(2, elementwise_affine="no", name="gn"), None, "elementwise_affine"),
        (lambda: GroupNorm(2, group_axis=1.0, name="gn"), None, "group_axis"),
        (lambda: GroupNorm(2, group_axis=4, name="gn"), (1, 2, 2, 4), "axes=\\(4,\\)"),
        (
            lambda: GroupNorm(2, group_axis=1, reduce_axes=(1, 2), name="gn"),
            (1, 4, 2),
            "group_axis",
        ),
        (lambda: GroupNorm(2, reduce_axes=(1, 1), name="gn"), (1, 2, 2, 4), "distinct"),
        (lambda: Dropout(0.1, entirety=0.5, name="drop"), None, "entirety"),
        (lambda: Embedding(4, 2, dtype=np.int32, name="emb"), None, "dtype"),
        (lambda: Embedding(4, 2, dtype="nope", name="emb"), None, "dtype"),
        (lambda: MultiHeadAttention(2, has_attn_mask="yes", name="mha"), None, "has_attn_mask"),
        (lambda: MultiHeadAttention(2, scale="1", name="mha"), None, "scale"),
        (lambda: MultiHeadAttention(2, scale=float("nan"), name="mha"), None, "scale"),
    ],
)
def test_a_bad_value_of_each_new_option_names_the_layer(make, shape, match):
    with pytest.raises(ModelError, match=match) as info:
        layer = make()
        x = Input()
        Model([x], [layer(x)]).compile([np.zeros(shape, np.float32)])
    assert "layer " in str(info.value) and "('" in str(info.value)


def test_dropout_entirety_keeps_or_drops_the_whole_input_at_rate_p():
    """entirety=True (NNC's ccv_cnnp_dropout(p, 1)) draws once per call: every output is
    all zeros or x / (1 - p), and over 400 keys about 1 - p are kept (counted; 6 sigma);
    the gradient is the same mask times 1 / (1 - p). Element-wise dropout mixes."""
    x = RNG.uniform(1, 2, (2, 3)).astype(np.float32)
    ct = RNG.standard_normal(x.shape).astype(np.float32)
    keys = jax.vmap(lambda i: jax.random.key_data(jax.random.key(i)))(jnp.arange(400))

    def run(entirety):
        _, fn = _fn(Dropout(0.25, entirety=entirety), x, training=True)
        return jax.jit(jax.vmap(lambda k: _vjp(fn, {}, [x], ct, [k])[:2]))(keys)

    y, (dx,) = run(True)
    kept = np.all(np.isclose(y, x / 0.75, rtol=1e-6), axis=(1, 2))
    dropped = np.all(y == 0, axis=(1, 2))
    assert np.all(kept | dropped)
    assert abs(kept.mean() - 0.75) < 6 * np.sqrt(0.75 * 0.25 / 400)
    want_dx = np.where(kept[:, None, None], ct / 0.75, 0)
    np.testing.assert_allclose(dx, want_dx, rtol=1e-6)
    y, _ = run(False)
    mixed = ~np.all(y == 0, axis=(1, 2)) & np.any(y == 0, axis=(1, 2))
    assert mixed.any()


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
def test_embedding_dtype_makes_a_16_bit_table(dtype):
    """dtype (NNC's ccv_cnnp_embedding datatype, 32F or 16F) is the table's and the
    output's type; rows and their gradient (summed per row) equal NumPy's take and
    add.at in float64, rounded once."""
    idx = np.array([[0, 2], [2, 3]], np.int32)
    model, fn = _fn(Embedding(4, 3, dtype=dtype, name="emb"), idx)
    table = model.parameters()["t-emb-0-0"]
    assert table.dtype == np.dtype(dtype) and table.shape == (4, 3)
    ct = RNG.standard_normal((2, 2, 3)).astype(dtype)
    y, _, dp = _vjp(fn, {"t-emb-0-0": jnp.asarray(table)}, [idx], ct)
    assert y.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(np.asarray(y), np.asarray(table)[idx])
    want = np.zeros((4, 3))
    np.add.at(want, idx.reshape(-1), ct.astype(np.float64).reshape(-1, 3))
    assert dp["t-emb-0-0"].dtype == np.dtype(dtype)
    np.testing.assert_array_equal(np.asarray(dp["t-emb-0-0"]), want.astype(dtype))
    assert Embedding(4, 3).dtype == np.float32  # the default is unchanged


def _attention64(x, kv, p, heads, mask, scale=None):
    """Float64 NumPy multi-head attention with the layer's parameters; mask: bool keep
    or float added, broadcast to [N, H, S, T]."""
    d = x.shape[-1]
    proj = lambda v, i: v @ p[f"t-mha-0-{i}"].T + p[f"t-mha-0-{4 + i}"][None, None]
    q, k, v = (
        proj(t, i).reshape(*t.shape[:2], heads, d // heads) for t, i in ((x, 0), (kv, 1), (kv, 2))
    )
    logits = np.einsum("bshd,bthd->bhst", q, k) * (scale or 1 / np.sqrt(d // heads))
    if mask.dtype == bool:
        logits = np.where(mask, logits, -np.inf)
    else:
        logits = logits + mask
    w = np.exp(logits - logits.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    o = np.einsum("bhst,bthd->bshd", w, v).reshape(*x.shape[:2], d)
    return o @ p["t-mha-0-3"].T + p["t-mha-0-7"][None, None]


def test_attention_bool_padding_mask_matches_float64_numpy_forward_and_gradient():
    """has_attn_mask=True (NNC's option of that name) takes the mask as the last input:
    here a bool [N, 1, 1, T] padding mask in self-attention. Oracle: float64 NumPy
    attention with the layer's weights; gradients: jax.grad of a float32 jnp copy."""
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    keep = np.ones((2, 1, 1, 3), bool)
    keep[0, ..., 2] = False  # sample 0's last key is padding
    ct = RNG.standard_normal(x.shape).astype(np.float32)
    model, fn = _fn(MultiHeadAttention(2, has_attn_mask=True, name="mha"), x, keep)
    p = {k: np.asarray(v, np.float64) for k, v in model.parameters().items()}
    y, (dx, _), _ = _vjp(fn, model.parameters(), [x, keep], ct)
    np.testing.assert_allclose(y, _attention64(x, x, p, 2, keep), rtol=1e-5, atol=1e-5)
    # a second oracle: sample 0 attends as if its padding key were not there at all
    unmasked = _attention64(x[:1], x[:1, :2], p, 2, np.ones((1, 1, 1, 2), bool))
    np.testing.assert_allclose(y[:1], unmasked, rtol=1e-5, atol=1e-5)
    ref = lambda v: jnp.sum(_attention_jnp(v, v, p, 2, keep) * ct)
    np.testing.assert_allclose(dx, jax.jit(jax.grad(ref))(x), rtol=1e-4, atol=1e-5)


def test_attention_float_mask_with_scale_and_causal_matches_float64_numpy():
    """A float additive [N, 1, S, T] mask in cross-attention, with scale=0.3 (NNC's
    scale) and is_causal (bottom-right) on top; the mask's gradient is checked too."""
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    kv = RNG.standard_normal((2, 5, 4)).astype(np.float32)
    add = RNG.standard_normal((2, 1, 3, 5)).astype(np.float32)
    ct = RNG.standard_normal(x.shape).astype(np.float32)
    mha = MultiHeadAttention(2, has_attn_mask=True, scale=0.3, is_causal=True, name="mha")
    model, fn = _fn(mha, x, kv, add)
    p = {k: np.asarray(v, np.float64) for k, v in model.parameters().items()}
    causal = np.arange(5)[None, :] <= np.arange(3)[:, None] + 2  # bottom-right
    want_mask = np.where(causal, add.astype(np.float64), -np.inf)
    y, (dx, dkv, dmask), _ = _vjp(fn, model.parameters(), [x, kv, add], ct)
    np.testing.assert_allclose(y, _attention64(x, kv, p, 2, want_mask, 0.3), rtol=1e-5, atol=1e-5)
    grads = jax.jit(
        jax.grad(
            lambda a, b, m: jnp.sum(
                _attention_jnp(a, b, p, 2, jnp.where(causal, m, -jnp.inf), 0.3) * ct
            ),
            argnums=(0, 1, 2),
        )
    )(x, kv, add)
    for got, want in zip((dx, dkv, dmask), grads):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def _attention_jnp(x, kv, p, heads, mask, scale=None):
    """_attention64 in jnp float32, for jax.grad."""
    d = x.shape[-1]
    p = {k: jnp.asarray(v, jnp.float32) for k, v in p.items()}
    proj = lambda v, i: v @ p[f"t-mha-0-{i}"].T + p[f"t-mha-0-{4 + i}"][None, None]
    q, k, v = (
        proj(t, i).reshape(*t.shape[:2], heads, d // heads) for t, i in ((x, 0), (kv, 1), (kv, 2))
    )
    logits = jnp.einsum("bshd,bthd->bhst", q, k) * (scale or 1 / np.sqrt(d // heads))
    logits = jnp.where(mask, logits, -jnp.inf) if mask.dtype == bool else logits + mask
    o = jnp.einsum("bhst,bthd->bshd", jax.nn.softmax(logits, -1), v).reshape(*x.shape[:2], d)
    return o @ p["t-mha-0-3"].T + p["t-mha-0-7"][None, None]


def test_attention_mask_input_count_is_checked():
    """A has_attn_mask layer without its mask input, or a plain one given three inputs,
    names the layer and says where the mask goes."""
    x = Input()
    with pytest.raises(ModelError, match=r"MultiHeadAttention\('mha'\).*pass the mask last"):
        Model([x], [MultiHeadAttention(2, has_attn_mask=True, name="mha")(x)]).compile(
            [np.zeros((1, 2, 4), np.float32)]
        )
    a, b, c = Input(), Input(), Input()
    with pytest.raises(ModelError, match=r"MultiHeadAttention\('mha'\).*has_attn_mask=True"):
        Model([a, b, c], [MultiHeadAttention(2, name="mha")(a, b, c)]).compile(
            [np.zeros((1, 2, 4), np.float32)] * 3
        )


def _erf(x):
    return np.vectorize(math.erf)(x)


ACTIVATIONS = [
    # ((kind, options), the float64 NumPy closed form)
    (
        ("gelu", {"approximate": True}),
        lambda x: 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3))),
    ),
    (("gelu", {}), lambda x: 0.5 * x * (1 + _erf(x / np.sqrt(2)))),
    (("leaky_relu", {"negative_slope": 0.2}), lambda x: np.where(x > 0, x, 0.2 * x)),
    (("swish", {"beta": 2.0}), lambda x: x / (1 + np.exp(-2 * x))),
    (("softmax", {"axis": 0}), lambda x: np.exp(x) / np.exp(x).sum(0, keepdims=True)),
]


@pytest.mark.parametrize(
    "spec, oracle", ACTIVATIONS, ids=[f"{k}{sorted(o.items())}" for (k, o), _ in ACTIVATIONS]
)
def test_activation_options_reach_the_command(spec, oracle):
    """Activation passes the command's options on (NNC's ccv_cnnp_gelu(tanh),
    ccv_cnnp_leaky_relu(negative_slope)): Activation("gelu", approximate=True) was an
    'unknown keyword argument' error. Oracle: float64 closed forms, and central
    differences of them for the gradient."""
    kind, options = spec
    x = np.array([[-1.5, -0.3, 0.2], [0.7, 1.1, -2.0]], np.float32)
    ct = RNG.standard_normal(x.shape).astype(np.float32)
    _, fn = _fn(Activation(kind, name="act", **options), x)
    y, (dx,), _ = _vjp(fn, {}, [x], ct)
    x64, h = x.astype(np.float64), 1e-6
    np.testing.assert_allclose(y, oracle(x64), rtol=1e-5, atol=1e-6)
    if kind == "softmax":  # a vector function: the vjp through the closed form's Jacobian
        s = oracle(x64)
        want = s * (ct - (ct * s).sum(0, keepdims=True))
    else:
        want = ct * (oracle(x64 + h) - oracle(x64 - h)) / (2 * h)
    np.testing.assert_allclose(dx, want, rtol=1e-4, atol=1e-5)


def test_add_and_mul_weights_match_numpy():
    """Add(p, q) is NNC's ccv_cnnp_add(p, q) = p a + q b and Mul(p) is ccv_cnnp_mul(p) =
    p a b, broadcasting; gradients q * g and p * g * other (NumPy closed forms)."""
    a = RNG.standard_normal((2, 3)).astype(np.float32)
    b = RNG.standard_normal((1, 3)).astype(np.float32)
    ct = RNG.standard_normal((2, 3)).astype(np.float32)
    _, fn = _fn(Add(p=0.5, q=-2.0), a, b)
    y, (da, db), _ = _vjp(fn, {}, [a, b], ct)
    np.testing.assert_allclose(y, 0.5 * a - 2.0 * b, rtol=1e-6)
    np.testing.assert_allclose(da, 0.5 * ct, rtol=1e-6)
    np.testing.assert_allclose(db, (-2.0 * ct).sum(0, keepdims=True), rtol=1e-6)
    _, fn = _fn(Mul(p=3.0), a, b)
    y, (da, db), _ = _vjp(fn, {}, [a, b], ct)
    np.testing.assert_allclose(y, 3.0 * a * b, rtol=1e-6)
    np.testing.assert_allclose(da, 3.0 * ct * b, rtol=1e-6)
    np.testing.assert_allclose(db, (3.0 * ct * a).sum(0, keepdims=True), rtol=1e-5)


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: Activation("gelu", tanh=True, name="act"), r"Activation\('gelu', name='act'\)"),
        (lambda: Activation("relu", negative_slope=0.1), r"Activation\('relu'\).*negative_slope"),
        (lambda: Activation("gelu", approximate="yes"), r"Activation\('gelu'\).*approximate"),
        (lambda: Add(p="a"), r"layer Add: .*'p'"),
        (lambda: Mul(p=float("nan")), r"layer Mul: p=nan"),
    ],
)
def test_bad_activation_add_mul_options_name_the_layer(make, match):
    with pytest.raises(ModelError, match=match):
        make()


@pytest.mark.parametrize(
    "make",
    [
        lambda eps: LayerNorm(epsilon=eps, name="norm"),
        lambda eps: RMSNorm(epsilon=eps, name="norm"),
        lambda eps: GroupNorm(2, epsilon=eps, name="norm"),
    ],
    ids=["layer_norm", "rms_norm", "group_norm"],
)
def test_norm_epsilon_must_be_a_number_at_least_zero(make):
    """A negative epsilon made a constant input's output NaN (inf for RMSNorm) silently;
    it is now refused naming the layer, as BatchNorm's was. A valid one reaches the
    command: a constant row normalises to 0 (RMS: c / sqrt(c^2 + eps), float64)."""
    for bad in (-1.0, "1e-5", float("nan")):
        with pytest.raises(ModelError, match=r"\('norm'\): epsilon"):
            make(bad)
    x = np.full((2, 4), 3.0, np.float32)
    model, fn = _fn(make(0.5), x)
    y = fn([x], fn.initial_parameters(model))[0][0]
    want = 3.0 / np.sqrt(9.0 + 0.5) if isinstance(make(0.5), RMSNorm) else 0.0
    np.testing.assert_allclose(y, np.full(x.shape, want), rtol=1e-6, atol=1e-6)


def test_layer_norm_elementwise_affine_must_be_a_bool():
    """LayerNorm(elementwise_affine="no") built a scale and bias (a truthy string)."""
    with pytest.raises(ModelError, match=r"LayerNorm\('ln'\): elementwise_affine"):
        LayerNorm(elementwise_affine="no", name="ln")
    x = np.ones((2, 4), np.float32)
    model, _ = _fn(LayerNorm(elementwise_affine=0, name="ln"), x)  # NNC's int flag
    assert model.parameters() == {}


@pytest.mark.parametrize("layer", [AvgPool(0), MaxPool((0, 0))], ids=["avg", "max"])
def test_a_window_of_zeros_pools_the_whole_spatial_extent_as_nnc(layer):
    """NNC's pools take kdim {0, 0} as the input's whole height and width (its ResNet
    ends in ccv_cnnp_average_pool(DIM_ALLOC(0, 0), ...)); fnnc refused window=0.
    Oracle: NumPy mean / max over H and W, gradients ct / (H W) and ct at the argmax."""
    x = RNG.permutation(2 * 3 * 4 * 2).astype(np.float32).reshape(2, 3, 4, 2)  # distinct
    ct = RNG.standard_normal((2, 1, 1, 2)).astype(np.float32)
    _, fn = _fn(layer, x)
    y, (dx,), _ = _vjp(fn, {}, [x], ct)
    if isinstance(layer, AvgPool):
        want, want_dx = x.mean((1, 2), keepdims=True), np.broadcast_to(ct / 12, x.shape)
    else:
        want = x.max((1, 2), keepdims=True)
        want_dx = np.where(x == want, ct, 0)
    np.testing.assert_allclose(y, want, rtol=1e-6)
    np.testing.assert_allclose(dx, want_dx, rtol=1e-6)


def test_a_window_mixing_zeros_and_sizes_or_a_global_pool_without_space_names_the_layer():
    with pytest.raises(ModelError, match=r"MaxPool\('pool'\): window\[0\] is 0"):
        MaxPool((0, 2), name="pool")
    x = Input()
    with pytest.raises(ModelError, match=r"AvgPool\('pool'\).*no spatial axis"):
        Model([x], [AvgPool(0, name="pool")(x)]).compile([np.zeros((2, 3), np.float32)])


def test_chunk_splits_into_equal_pieces_as_numpy():
    """Chunk(n, axis) is NNC's ccv_cnnp_chunk: n outputs, np.split's pieces in order;
    the gradient of the input is the outputs' cotangents joined back (np.concatenate)."""
    x = RNG.standard_normal((2, 6, 2)).astype(np.float32)
    cts = [RNG.standard_normal((2, 2, 2)).astype(np.float32) for _ in range(3)]
    inp = Input()
    model = Model([inp], list(Chunk(3, axis=-2, name="qkv")(inp)))
    model.compile([x])
    fn = model_function(model, [x])

    def both(x, cts):
        ys, vjp = jax.vjp(lambda v: fn([v], {})[0], x)
        return ys, vjp(cts)[0]

    ys, dx = jax.jit(both)(jnp.asarray(x), [jnp.asarray(c) for c in cts])
    for y, want in zip(ys, np.split(x, 3, axis=1), strict=True):
        np.testing.assert_array_equal(y, want)
    np.testing.assert_array_equal(dx, np.concatenate(cts, axis=1))


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: Chunk(2, axis=1, name="c"), r"Chunk\('c'\): cannot cut axis 1 of its input"),
        (lambda: Chunk(2, axis=3, name="c"), r"Chunk\('c'\): cannot cut axis 3"),
        (lambda: Chunk(0, name="c"), r"Chunk\('c'\): n is 0"),
        (lambda: Chunk(2, axis=1.0, name="c"), r"Chunk\('c'\): axis is 1.0"),
    ],
)
def test_chunk_errors_name_the_layer(make, match):
    x = Input()
    with pytest.raises(ModelError, match=match):
        Model([x], list(make()(x))).compile([np.zeros((2, 5, 2), np.float32)])


@pytest.mark.parametrize(
    "make, arg",
    [
        (lambda v: Dense(2, no_bias=v, name="l"), "no_bias"),
        (lambda v: Conv(2, 1, no_bias=v, name="l"), "no_bias"),
        (lambda v: SwiGLU(4, down=v, name="l"), "down"),
    ],
    ids=["dense", "conv", "swiglu"],
)
def test_bool_options_refuse_non_bools_and_take_nnc_int_flags(make, arg):
    """Dense(no_bias="no"), Conv(no_bias="no") and SwiGLU(down="no") dropped the bias
    (the down projection) silently: a truthy string. Now a ModelError naming the layer;
    NNC's 1 / 0 still work, making the parameters True / False make (counted)."""
    with pytest.raises(ModelError, match=rf"\('l'\): {arg} is 'no'"):
        make("no")
    x = np.zeros((2, 3, 4), np.float32)
    counts = []
    for v in (1, True, 0, False):
        model, _ = _fn(make(v), x)
        counts.append(len(model.parameters()))
    assert counts[0] == counts[1] and counts[2] == counts[3] and counts[0] != counts[2]
