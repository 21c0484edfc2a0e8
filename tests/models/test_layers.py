"""Each cnnp layer's output against an independent JAX computation from its parameters."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fnnc import ops
from fnnc.errors import ModelError
from fnnc.models import (
    LSTM,
    Activation,
    Add,
    AvgPool,
    BatchNorm,
    CommandLayer,
    Concat,
    Conv,
    Dense,
    Dropout,
    Embedding,
    Flatten,
    GroupNorm,
    Input,
    Layer,
    LayerNorm,
    MaxPool,
    Model,
    Mul,
    MultiHeadAttention,
    Parameter,
    Reshape,
    RMSNorm,
)
from tests.helpers import assert_close, rand


def _run(layer, *xs, **evaluate):
    ins = [Input() for _ in xs]
    model = Model(ins, [layer(*ins)])
    model.compile(list(xs))
    return np.asarray(model.evaluate(list(xs), **evaluate)), model.parameters()


def test_dense_is_x_wt_plus_b():
    x = rand([3, 4])
    y, p = _run(Dense(5, name="d"), x)
    assert_close(y, x @ np.asarray(p["t-d-0-0"]).T + np.asarray(p["t-d-0-1"]), rtol=1e-5)


def test_conv_nhwc_weight_out_kh_kw_in():
    x = rand([2, 5, 5, 3])
    y, p = _run(Conv(4, (3, 3), strides=2, name="c"), x)
    w = np.transpose(np.asarray(p["t-c-0-0"]), (1, 2, 3, 0))  # -> HWIO
    want = jax.lax.conv_general_dilated(
        x, w, (2, 2), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
    )
    assert_close(y, want + np.asarray(p["t-c-0-1"])[None, None, None, :], rtol=1e-5, atol=1e-5)


def test_norms():
    x = rand([2, 4, 6])
    y, _p = _run(LayerNorm(name="ln"), x)
    mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    assert_close(y, (x - mu) / np.sqrt(var + 1e-5), rtol=1e-4, atol=1e-5)  # scale 1, bias 0
    y, _ = _run(RMSNorm(name="rms"), x)
    assert_close(y, x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6), rtol=1e-4, atol=1e-5)
    xg = rand([2, 3, 3, 4])
    y, _ = _run(GroupNorm(2, name="gn"), xg)
    g = xg.reshape(2, 3, 3, 2, 2)
    want = (g - g.mean((1, 2, 4), keepdims=True)) / np.sqrt(g.var((1, 2, 4), keepdims=True) + 1e-5)
    assert_close(y, want.reshape(xg.shape), rtol=1e-4, atol=1e-5)


def test_pools_flatten_reshape():
    x = rand([1, 4, 4, 2])
    y, _ = _run(MaxPool((2, 2)), x)
    assert_close(y, x.reshape(1, 2, 2, 2, 2, 2).max((2, 4)))
    y, _ = _run(AvgPool((2, 2)), x)
    assert_close(y, x.reshape(1, 2, 2, 2, 2, 2).mean((2, 4)), rtol=1e-6)
    y, _ = _run(Flatten(), x)
    assert_close(y, x.reshape(1, -1))
    y, _ = _run(Reshape((8, 4)), x)
    assert_close(y, x.reshape(1, 8, 4))


def test_embedding_rows():
    idx = np.array([[0, 3], [2, 2]], np.int32)
    y, p = _run(Embedding(5, 3, name="e"), idx)
    assert_close(y, np.asarray(p["t-e-0-0"])[idx])


def test_lstm_against_a_scan():
    x = rand([2, 3, 4])
    y, p = _run(LSTM(5, name="l"), x)
    w_ih, w_hh, b = (np.asarray(p[f"t-l-0-{i}"]) for i in range(3))

    def cell(carry, xt):
        h, c = carry
        z = xt @ w_ih.T + h @ w_hh.T + b[None, :]
        i, f, g, o = jnp.split(z, 4, axis=-1)
        c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
        h = jax.nn.sigmoid(o) * jnp.tanh(c)
        return (h, c), h

    zero = jnp.zeros((2, 5))
    _, hs = jax.lax.scan(cell, (zero, zero), jnp.swapaxes(x, 0, 1))
    assert_close(y, jnp.swapaxes(hs, 0, 1), rtol=1e-5, atol=1e-6)


def test_multi_head_attention_against_manual():
    x = rand([2, 3, 8])
    y, p = _run(MultiHeadAttention(2, name="mha"), x)
    w = [np.asarray(p[f"t-mha-0-{i}"]) for i in range(8)]

    def heads(t, i):
        return (t @ w[i].T + w[4 + i]).reshape(2, 3, 2, 4)

    q, k, v = heads(x, 0), heads(x, 1), heads(x, 2)
    logits = np.einsum("bshd,bthd->bhst", q, k) / np.sqrt(4)
    attn = np.exp(logits - logits.max(-1, keepdims=True))
    attn /= attn.sum(-1, keepdims=True)
    o = np.einsum("bhst,bthd->bshd", attn, v).reshape(2, 3, 8)
    assert_close(y, o @ w[3].T + w[7], rtol=1e-4, atol=1e-5)


def test_dropout_only_while_training():
    x = np.ones((4, 100), np.float32)
    y, _ = _run(Dropout(0.5), x)
    assert_close(y, x)  # test mode: identity
    y, _ = _run(Dropout(0.5), x, is_test=False)
    kept = y != 0
    assert 0.3 < kept.mean() < 0.7 and np.allclose(y[kept], 2.0)


@pytest.mark.parametrize("kind", ["relu", "sigmoid", "tanh", "swish", "gelu", "mish", "softmax"])
def test_activations(kind):
    x = rand([3, 4], lo=-3, hi=3)
    y, _ = _run(Activation(kind), x)
    ref = {
        "relu": jax.nn.relu,
        "sigmoid": jax.nn.sigmoid,
        "tanh": jnp.tanh,
        "swish": jax.nn.swish,
        "gelu": lambda v: jax.nn.gelu(v, approximate=False),
        "mish": lambda v: v * jnp.tanh(jax.nn.softplus(v)),
        "softmax": jax.nn.softmax,
    }[kind]
    assert_close(y, ref(x), rtol=1e-5, atol=1e-6)


def test_add_mul_concat():
    a, b = rand([2, 3]), rand([2, 3], seed=1)
    assert_close(_run(Add(), a, b)[0], a + b)
    assert_close(_run(Mul(), a, b)[0], a * b)
    assert_close(_run(Concat(axis=-1), a, b)[0], np.concatenate([a, b], -1))


@pytest.mark.parametrize(
    "make, arg",
    [
        (lambda v: Dense(v, name="d"), "count"),
        (lambda v: Conv(v, 3, name="d"), "filters"),
        (lambda v: Conv(4, v, name="d"), "kernel_size"),
        (lambda v: Conv(4, 3, groups=v, name="d"), "groups"),
        (lambda v: GroupNorm(v, name="d"), "groups"),
        (lambda v: Embedding(v, 4, name="d"), "vocab"),
        (lambda v: LSTM(v, name="d"), "hidden"),
        (lambda v: MultiHeadAttention(v, name="d"), "num_heads"),
    ],
)
@pytest.mark.parametrize("bad", [2.5, "3", 0, -1, True])
def test_layer_sizes_must_be_positive_ints(make, arg, bad):
    with pytest.raises(ModelError, match=rf"layer \w+\('d'\): {arg} is .*expected a positive int"):
        make(bad)


@pytest.mark.parametrize("make", [MaxPool, AvgPool, lambda v, name: Conv(4, v, name=name)])
def test_per_axis_sizes_must_be_positive_ints(make):
    with pytest.raises(ModelError, match=r"\('p'\): \w+\[0\] is 0 .*expected a positive int"):
        make((0, -1), name="p")
    with pytest.raises(ModelError, match=r"\('p'\): \w+ is 2.5 .*one per spatial axis"):
        make(2.5, name="p")


def test_numpy_int_sizes_build_as_ints():
    x = rand([3, 4])
    y, p = _run(Dense(np.int64(5), name="d"), x)  # a NumPy integer is a whole size
    assert p["t-d-0-0"].shape == (5, 4)
    assert_close(y, x @ np.asarray(p["t-d-0-0"]).T + np.asarray(p["t-d-0-1"]), rtol=1e-5)


def test_parameter_shape_of_floats_is_refused():
    with pytest.raises(ModelError, match=r"Parameter\('p'\): parameter 0 has the shape \[2.5\]"):
        Model(Input(), Parameter((2.5,), name="p")()).compile([rand([2, 3])])


def _times_parameter(init):
    x = Input()
    model = Model(x, Mul()(x, Parameter((3,), init=init, name="w")()))
    data = rand([2, 3])
    model.compile(data, loss=None)
    return data, np.asarray(model.parameters()["t-w-0-0"]), np.asarray(model.evaluate(data))


@pytest.mark.parametrize(
    "init, want",
    [
        (np.float32(0.5), [0.5, 0.5, 0.5]),
        (np.int64(2), [2.0, 2.0, 2.0]),
        (np.array(0.25, np.float32), [0.25, 0.25, 0.25]),
        (np.array([1.0, 2.0, 3.0]), [1.0, 2.0, 3.0]),
        (jnp.array([1.0, -2.0, 3.0]), [1.0, -2.0, 3.0]),
        ([4, 5, 6], [4.0, 5.0, 6.0]),
    ],
)
def test_parameter_init_takes_numpy_and_jax_values(init, want):
    data, value, y = _times_parameter(init)
    assert value.dtype == np.float32 and value.tolist() == want
    assert_close(y, data * np.float32(want)[None], rtol=1e-6)


def test_parameter_init_that_is_not_a_value_or_function_names_the_layer():
    with pytest.raises(ModelError, match=r"Parameter\('w'\): init='ones' \(str\) is neither"):
        Parameter((3,), init="ones", name="w")
    with pytest.raises(ModelError, match=r"Parameter\('w'\): init is an array of shape \[2\]"):
        Parameter((3,), init=np.ones(2), name="w")


def test_an_error_inside_an_init_function_names_the_parameter():
    def bad(shape):
        return np.ones(shape)

    with pytest.raises(ModelError, match=r"t-w-0-0 \[3\] of layer Parameter\('w'\): its init bad "):
        _times_parameter(bad)


@pytest.mark.parametrize("norm", [LayerNorm, RMSNorm])
@pytest.mark.parametrize("axes", [(3,), (-3,), (1, -1), (1.0,)])
def test_norm_axes_outside_the_input_rank_name_the_layer(norm, axes):
    with pytest.raises(ModelError, match=rf"layer {norm.__name__}\('n'\): axes=.* shape \[2, 3\]"):
        _run(norm(axes=axes, name="n"), rand([2, 3]))


def test_norm_axes_may_be_one_int_or_negative():
    x = rand([2, 4, 6])
    y, p = _run(LayerNorm(axes=-2, name="ln"), x)  # the same as axes=(1,)
    assert p["t-ln-0-0"].shape == (4,)
    mu, var = x.mean(1, keepdims=True), x.var(1, keepdims=True)
    assert_close(y, (x - mu) / np.sqrt(var + 1e-5), rtol=1e-4, atol=1e-5)


def test_int_window_and_kernel_cover_the_spatial_axes_of_a_batched_sequence():
    """In a model every input has a batch axis: on [N, W, C] an int window or kernel is
    1-D, per sample (the op's "one sample" reading took N as a spatial axis)."""
    x = rand([4, 6, 1])
    y, _ = _run(MaxPool(2), x)
    assert_close(y, x.reshape(4, 3, 2, 1).max(2))
    y, _ = _run(AvgPool(2), x)
    assert_close(y, x.reshape(4, 3, 2, 1).mean(2), rtol=1e-6)
    y, p = _run(Conv(2, 3, name="c"), x)
    w, b = np.asarray(p["t-c-0-0"]), np.asarray(p["t-c-0-1"])
    assert w.shape == (2, 3, 1)  # [filters, k, in]
    xp = np.pad(x, ((0, 0), (1, 1), (0, 0)))  # SAME for a width-3 kernel
    want = sum(np.einsum("ntc,oc->nto", xp[:, k : k + 6], w[:, k]) for k in range(3)) + b
    assert_close(y, want, rtol=1e-5, atol=1e-5)


def test_int_kernel_keeps_nnc_layout_in_2d_and_grows_with_the_input_rank():
    _, p = _run(Conv(4, 3, name="c"), rand([1, 5, 5, 2]))
    assert sorted(p) == ["t-c-0-0", "t-c-0-1"] and p["t-c-0-0"].shape == (4, 3, 3, 2)
    _, p = _run(Conv(4, 2, name="c"), rand([1, 3, 3, 3, 2]))
    assert p["t-c-0-0"].shape == (4, 2, 2, 2, 2)


@pytest.mark.parametrize(
    "layer, shape",
    [
        (MaxPool((2, 2, 2), name="p"), [2, 6, 6, 4]),
        (AvgPool((2, 2), name="p"), [2, 6, 4]),
        (Conv(2, (3, 3), name="p"), [2, 6, 4]),
        (Conv(2, 3, name="p"), [2, 6]),
    ],
)
def test_a_kernel_that_does_not_fit_the_spatial_axes_names_the_layer(layer, shape):
    kind = type(layer).__name__
    with pytest.raises(ModelError, match=rf"layer {kind}\('p'\): .*shape \[{shape[0]}, "):
        _run(layer, rand(shape))


def test_a_batch_norm_called_twice_chains_its_running_statistics():
    """The second call reads the statistics the first one updated (NNC updates them in
    place; a shared flax.nnx.BatchNorm too): closed form 0.9 (0.9 m + 0.1 mu1) + 0.1 mu2
    with m = 0, and the same for the biased variances from v = 1."""
    x = rand([8, 3]) + 2
    bn, i = BatchNorm(name="bn"), Input()
    y = Add()(bn(i), bn(Mul()(i, i)))  # the second call normalises x * x
    model = Model(i, y)
    model.compile(x, loss="mse", minimizer=optax.sgd(0.0))
    model.fit(x, np.zeros_like(x))
    p = model.parameters()
    (mu1, v1), (mu2, v2) = (x.mean(0), x.var(0)), ((x * x).mean(0), (x * x).var(0))
    assert_close(p["r-bn-0-0"], 0.9 * (0.9 * 0 + 0.1 * mu1) + 0.1 * mu2, rtol=1e-5)
    assert_close(p["r-bn-0-1"], 0.9 * (0.9 * 1 + 0.1 * v1) + 0.1 * v2, rtol=1e-5)


def test_dense_on_integers_names_the_layer_and_what_to_do():
    want = r"layer Dense\('d'\): parameter t-d-0-0 \[2, 3\] .* floating-point .*, got int32; "
    with pytest.raises(ModelError, match=want + r".*input.*Embedding"):
        _run(Dense(2, name="d"), np.zeros((2, 3), np.int32))


def test_attention_on_integers_names_the_layer_before_any_command_fails():
    want = r"MultiHeadAttention\('a'\): parameter t-a-0-0 \[8, 8\] .* floating-point "
    with pytest.raises(ModelError, match=want + r".*got int32; .*input.*Embedding"):
        _run(MultiHeadAttention(2, name="a"), np.zeros((2, 4, 8), np.int32))


def test_command_layer_outputs_must_match_the_command():
    x, i = rand([3, 4]), Input()
    with pytest.raises(ModelError, match=r"CommandLayer\('r'\): outputs=2, but relu gives 1 "):
        Model(i, list(CommandLayer(ops.relu(), outputs=2, name="r")(i))).compile(x)
    with pytest.raises(ModelError, match=r"outputs=1, but layer_norm gives 3 output\(s\) on 1 "):
        _run(CommandLayer(ops.layer_norm(axes=(-1,)), name="n"), x)
    y, mean, _ = CommandLayer(ops.layer_norm(axes=(-1,)), outputs=3, name="n")(i)
    model = Model(i, [y, mean])
    model.compile(x)
    got = model.evaluate(x)
    assert_close(got[1].reshape(3), x.mean(-1), rtol=1e-5)


class _SaysTwoGivesOne(Layer):
    def num_outputs(self, num_inputs):
        return 2

    def build(self, ctx, x):
        return ctx.b.exec(ops.relu(), x)


def test_a_layer_whose_build_gives_another_count_than_num_outputs_names_it():
    i = Input()
    a, b = _SaysTwoGivesOne(name="two")(i)
    want = r"_SaysTwoGivesOne\('two'\): build returned 1 output\(s\), but num_outputs\(1\) says 2"
    with pytest.raises(ModelError, match=want):
        Model([i], [a, b]).compile(rand([2, 3]))
