"""Audit 9 of the cnnp layers: each fix checked against an independent oracle (float64
NumPy, closed forms, NNC's layouts)."""

from __future__ import annotations

import types

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import optax
import pytest

from fnnc import ops
from fnnc.errors import DTypeError, ModelError
from fnnc.models import (
    BatchNorm,
    CommandLayer,
    Dense,
    Dropout,
    Input,
    Model,
    Mul,
    MultiHeadAttention,
    Parameter,
    ReLU,
    Reshape,
    RotaryEmbedding,
    Sequential,
    model_function,
)
from fnnc.models.initialize import initialize

BF16 = ml_dtypes.bfloat16


def test_batch_norm_beside_bfloat16_keeps_float32_statistics_that_move():
    """NNC's ccv_cnnp_batch_norm makes scale, bias, mean and var float32 beside a 16-bit
    input. Kept in bfloat16, a running mean of 2.1875 with momentum 0.99 never moved
    toward a batch mean near 3 (the update, 0.0077, is under half its spacing)."""
    x = Input()
    model = Model([x], [BatchNorm(momentum=0.99, name="bn")(x)])
    data = (np.random.default_rng(0).standard_normal((16, 2)) + 3.0).astype(BF16)
    model.compile([data])
    assert {k: v.dtype for k, v in model.parameters().items()} == dict.fromkeys(
        ["t-bn-0-0", "t-bn-0-1", "r-bn-0-0", "r-bn-0-1"], np.dtype(np.float32)
    )
    old_mean, old_var = np.float32([2.1875, 2.1875]), np.float32([1.0, 1.0])
    model.set_parameters({"r-bn-0-0": old_mean, "r-bn-0-1": old_var})
    y = model.evaluate([data], is_test=False)
    x64 = data.astype(np.float64)
    mu, var = x64.mean(0), x64.var(0)  # biased, as NNC's
    got = model.parameters()
    np.testing.assert_allclose(got["r-bn-0-0"], 0.99 * old_mean + 0.01 * mu, rtol=1e-6)
    np.testing.assert_allclose(got["r-bn-0-1"], 0.99 * old_var + 0.01 * var, rtol=1e-6)
    y = np.asarray(y)
    assert y.dtype == BF16  # the output keeps the input's type, rounded once
    want = (x64 - mu) / np.sqrt(var + 1e-5)
    np.testing.assert_allclose(y.astype(np.float64), want, rtol=2**-8, atol=2**-8)


def test_backward_without_ingrads_seeds_ones_of_each_outputs_type():
    """NNC's ccv_cnnp_model_backward without ingrads seeds ones of the output's type: a
    bfloat16 model's backward() built float32 ones and failed on its own program input
    ('Program: input %4 (df[0]) expects bfloat16'), and so did any model with an integer
    output (an argmax beside the logits, 'df[1] expects int32')."""
    x = Input()
    h = Dense(2, name="d")(x)
    model = Model([x], [h, CommandLayer(ops.argmax(axis=-1))(h)])
    xs = np.array([[1, 2, -1], [0, 3, 2]], BF16)  # small integers: every sum exact
    model.compile([xs], minimizer=optax.sgd(0.0))
    w = np.asarray(model.parameters()["t-d-0-0"], np.float64)
    model.evaluate([xs], requires_grad=True)
    (dx,) = model.backward()
    # d sum(x W^T + b) / dx[n, k] = sum_j W[j, k], every row alike; the argmax adds nothing
    np.testing.assert_allclose(np.asarray(dx, np.float64), np.tile(w.sum(0), (2, 1)), rtol=2**-8)
    with pytest.raises(DTypeError, match=r"backward: ingrads 0 is float32\[2, 2\].*bfloat16"):
        model.backward([np.ones((2, 2), np.float32), np.ones((2, 1), np.int32)])


def _bf16_ulps(got, want):
    """|got - want| in units of bfloat16's spacing at ``want`` (float64)."""
    spacing = 2.0 ** (np.floor(np.log2(np.maximum(np.abs(want), 2.0**-100))) - 7)
    return np.abs(np.asarray(got, np.float64) - want) / spacing


def test_rotary_embedding_rotates_bfloat16_in_float32_and_rounds_once():
    """x cos + rotate_half(x) sin in bfloat16 rounded the tables, both products and
    their sum: where the two terms cancel, outputs were up to 53 ulps off (107 half-ulps).
    Forward and backward against the float64 rotation, within one rounding."""
    t, d, offset = 64, 8, 1000
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, t, 1, d)).astype(BF16)
    g = rng.standard_normal((1, t, 1, d)).astype(BF16)
    inp = Input()
    model = Model([inp], [RotaryEmbedding(offset=offset, name="rope")(inp)])
    model.compile([x])
    fn = model_function(model, [x])

    def forward_backward(v, ct):
        y, vjp = jax.vjp(lambda v: fn([v], {})[0][0], v)
        return y, vjp(ct)[0]

    y, dx = jax.jit(forward_backward)(jnp.asarray(x), jnp.asarray(g))
    half = d // 2
    theta = 10000.0 ** (-np.arange(half) * 2 / d)
    angle = np.arange(offset, offset + t)[:, None] * theta[None]
    cos = np.cos(np.concatenate([angle, angle], 1))[None, :, None, :]
    sin = np.sin(np.concatenate([angle, angle], 1))[None, :, None, :]
    x64, g64 = x.astype(np.float64), g.astype(np.float64)
    want = x64 * cos + np.concatenate([-x64[..., half:], x64[..., :half]], -1) * sin
    gs = g64 * sin  # the rotation's transpose: rotate_half(v)^T = concat(v[D/2:], -v[:D/2])
    want_dx = g64 * cos + np.concatenate([gs[..., half:], -gs[..., :half]], -1)
    assert y.dtype == dx.dtype == BF16
    assert _bf16_ulps(y, want).max() <= 1.0
    assert _bf16_ulps(dx, want_dx).max() <= 1.0


def _param_model(init):
    x = Input()
    return Model([x], [Mul()(x, Parameter((3,), init=init, name="w")())])


@pytest.mark.parametrize(
    "init, got",
    [(lambda k, s, d: jnp.zeros((2,)), r"float32\[2\]"), (lambda k, s, d: None, "None")],
)
def test_an_initializer_returning_another_shape_names_the_parameter_at_compile(init, got):
    """An init function returning [2] for a [3] parameter failed at the first evaluate as
    'Program: input %1 (t-0-0) expects float32[3]' (None: a bare IndexError)."""
    with pytest.raises(ModelError, match=rf"parameter t-w-0-0 \[3\] .*returned {got}"):
        _param_model(init).compile([np.ones((2, 3), np.float32)])


def test_an_initializer_value_is_converted_to_the_parameters_dtype():
    """A draw that ignores ``dtype`` (float32 for a bfloat16 parameter), or integers for
    a float32 one, starts the parameter converted, as NNC's initializers write into its
    tensor: the same values as converting the eager call's result."""
    key = jax.random.key(5)
    infos = [
        types.SimpleNamespace(
            id="t-a-0-0", layer="A", shape=(4,), dtype=np.dtype(BF16), init=lambda k, s, d: (
                jax.random.normal(k, s)
            )
        ),
        types.SimpleNamespace(
            id="t-b-0-0", layer="B", shape=(3,), dtype=np.dtype(np.float32),
            init=lambda k, s, d: jnp.arange(3, dtype=jnp.int32),
        ),
    ]  # fmt: skip
    _, (a, b) = initialize(key, infos)
    _, sub = jax.random.split(key)
    assert a.dtype == BF16 and b.dtype == np.float32
    np.testing.assert_array_equal(np.asarray(a), np.asarray(jax.random.normal(sub, (4,)), BF16))
    np.testing.assert_array_equal(np.asarray(b), [0.0, 1.0, 2.0])
    model = _param_model(lambda k, s, d: np.arange(3))  # NumPy int64: converted too
    model.compile([np.ones((2, 3), np.float32)])
    np.testing.assert_array_equal(model.evaluate([np.ones((2, 3), np.float32)]), [[0, 1, 2]] * 2)


@pytest.mark.parametrize(
    "shapes, message",
    [
        ([(3, 8)], r"query input is \[3, 8\]; expected \[batch, sequence, features\]"),
        ([(1, 2, 2, 8)], r"query input is \[1, 2, 2, 8\]; expected \[batch, sequence"),
        ([(2, 3, 8), (2, 4, 4, 8)], r"key/value input is \[2, 4, 4, 8\]"),
        ([(3, 4, 8), (2, 4, 8)], r"query \[3, 4, 8\] and key/value \[2, 4, 8\] have other batch"),
    ],
)
def test_attention_on_inputs_of_another_rank_names_the_layer_and_the_shape_given(shapes, message):
    """MultiHeadAttention takes [N, S, D]; other ranks reached scaled_dot_product_attention
    and were reported as its [B, S, H, D] operands, shapes the user never made."""
    ins = [Input() for _ in shapes]
    model = Model(ins, [MultiHeadAttention(2, name="mha")(*ins)])
    with pytest.raises(ModelError, match=r"layer MultiHeadAttention\('mha'\): .*" + message):
        model.compile([np.zeros(s, np.float32) for s in shapes])


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: BatchNorm(momentum=2.0), r"momentum is 2\.0 .*\[0\.0, 1\.0\]; it weights the old"),
        (lambda: BatchNorm(momentum=-0.1), r"momentum is -0\.1"),
        (lambda: BatchNorm(momentum=True), r"momentum is True \(bool\)"),
        (lambda: BatchNorm(epsilon=-1e-5), r"epsilon is -1e-05"),
        (lambda: Dropout(1.5), r"p is 1\.5 .*\[0\.0, 1\.0\); the probability"),
        (lambda: Dropout(1.0), r"p is 1\.0"),
        (lambda: Dropout(float("nan")), r"p is nan"),
        (lambda: Dropout("0.5"), r"p is '0\.5' \(str\)"),
    ],
)
def test_rates_outside_their_range_are_refused_where_the_layer_is_made(make, message):
    """BatchNorm(momentum=2.0) built and trained, its running statistics diverging
    (new = 2 old - batch); Dropout(1.5) built and evaluated, failing only once trained."""
    with pytest.raises(ModelError, match=message):
        make()


def test_batch_norm_momentum_zero_takes_the_batch_statistics():
    """momentum=0, the end of the range, is taken: the documented update (NNC's reading,
    new = momentum * old + (1 - momentum) * batch) then gives the batch's statistics."""
    data = np.array([[1.0, 4.0], [3.0, 0.0]], np.float32)  # mean [2, 2], biased var [1, 4]
    x = Input()
    model = Model([x], [BatchNorm(momentum=0, name="bn")(x)])
    model.compile([data])
    model.evaluate([data], is_test=False)
    got = model.parameters()
    np.testing.assert_allclose(got["r-bn-0-0"], [2.0, 2.0])
    np.testing.assert_allclose(got["r-bn-0-1"], [1.0, 4.0])


@pytest.mark.parametrize(
    "init", [np.array([1.0, -2.0, 3.5], BF16), jnp.array([1.0, -2.0, 3.5], jnp.bfloat16)]
)
def test_a_parameter_starts_from_bfloat16_values(init):
    """A bfloat16 array (NumPy's kind 'V') was refused as 'neither a value nor an
    initializer'; it starts the float32 parameter at its values, exactly."""
    model = _param_model(init)
    model.compile([np.ones((1, 3), np.float32)])
    np.testing.assert_array_equal(model.parameters()["t-w-0-0"], np.float32([1.0, -2.0, 3.5]))


@pytest.mark.parametrize("init", [1e300, np.array([1.0, -1e39, 0.0]), 10**40])
def test_a_parameter_value_beyond_float32_is_refused_not_made_inf(init):
    """Parameter(init=1e300) started at inf silently (NumPy's cast warning aside), as
    Literal.of's float64 constants did before ac341b0."""
    with pytest.raises(ModelError, match=r"Parameter\('w'\): init holds -?1e\+\d+, beyond float32"):
        Parameter((3,), init=init, name="w")


def test_reshape_infers_its_minus_one_from_one_sample_so_an_empty_batch_passes():
    """Reshape((-1, 2)) left the -1 to the whole tensor's size, so a batch of 0 rows (which
    evaluate documents gives 0 rows) failed: 'cannot infer the -1 in [0, -1, 2]'."""
    x = Input()
    model = Model([x], [Reshape((-1, 2))(x)])
    data = np.arange(12, dtype=np.float32).reshape(3, 4)
    model.compile([data])
    np.testing.assert_array_equal(model.evaluate([data]), data.reshape(3, -1, 2))
    assert np.shape(model.evaluate([np.zeros((0, 4), np.float32)])) == (0, 2, 2)


def test_a_nested_layers_parameter_used_outside_its_model_says_why_it_cannot_be():
    """lin.parameter(0) of a Dense applied inside a nested model follows that model's own
    Input, so the outer model was refused with 'an output depends on an Input() that is
    not among the model's inputs' and nothing about the parameter."""
    lin = Dense(2, name="lin")
    inner = Sequential([lin, ReLU()], name="inner")
    x = Input()
    y = CommandLayer(ops.gemm(transpose_b=True))(inner(x), lin.parameter(0))
    with pytest.raises(ModelError, match=r"Dense\('lin'\)\.parameter\(0\) follows .* another"):
        Model([x], [y])
    x = Input()  # the plain case keeps its message
    with pytest.raises(ModelError, match=r"not among the model's inputs$"):
        Model([x], [Dense(2)(Input())])
