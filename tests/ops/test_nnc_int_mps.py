"""NNC's Metal integration tests ``test/int/nnc/mpsdnn.tests.c`` (liuliu/ccv), ported where
the cuDNN ports (``test_nnc_int_cudnn*.py``), ``test_nnc_int_misc.py`` and the unit-case
ports (``test_nnc_op_cases*.py``) do not already cover the semantics.

Each C case runs a command on MPS and compares it with NNC's CPU reference. Here fnnc's
command (eagerly, or in a compiled graph as the C test builds it) is compared with an
independent oracle: NumPy in float64, closed forms, or ``jax.vjp`` of a float64 ``jnp``
formula. What is new against the cuDNN file: the 1x1-kernel convolution, the MPS
cases' norm epsilons (1e-6 for layer norm and RMS norm, 1e-7 for group norm) in a graph
that moves x to the device and y back with DATA_TRANSFER, ADD in such a graph (with
DATATYPE_CONVERSION nodes in half precision) and its symbolic backward, the backwards
NNC asks only some gradients of (layer / group norm without the bias gradient, mul with
one gradient, mse without ``db``), backwards missing a forward input (add ``(a, nil)``,
``(nil, b)``) or the output gradient (mul, scalar mul: NNC's null gradient stands for
ones), and softmax / sigmoid gradients through the backward pass reading only y.

NNC's ``dsfmt_genrand_open_close`` draws are NumPy draws in (0, 1]; shapes are the C
test's where small, shrunk otherwise (batch 64 of 112x112 images becomes 2 of 6x6).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fnnc import ops
from fnnc.graph import GraphBuilder, backward, compile, interpret
from tests.helpers import assert_close
from tests.ops.test_nnc_int_cudnn_2 import vjp64

f16, f32, f64 = np.float16, np.float32, np.float64
Spec = jax.ShapeDtypeStruct


def open_close(shape, seed: int, scale: float = 1.0) -> np.ndarray:
    """NNC's ``dsfmt_genrand_open_close``: uniform in (0, 1], times ``scale``."""
    return ((1 - np.random.default_rng(seed).random(shape)) * scale).astype(f32)


def _nchw(t):
    return np.transpose(t, (0, 3, 1, 2))


# -- convolution with a 1x1 kernel ----------------------------------------------------------


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_convolution_with_1x1_kernel(layout) -> None:
    """NNC: "mps forward convolution with 1x1 kernel" and "mps forward convolution in nchw
    format with 1x1 kernel": CONVOLUTION_FORWARD(1, 96, 1, 1, 3) from [64, 112, 112, 3] to
    [64, 112, 112, 96] (here [2, 6, 6, 3] to [2, 6, 6, 8]); NNC's automatic hint for equal
    sizes and a 1x1 window is stride 1, no padding, so each output pixel is w @ x + bias.
    Weights are open-close / 3 (in * 1 * 1), bias i / out."""
    x = open_close((2, 6, 6, 3), 0)
    w = open_close((8, 1, 1, 3), 1, 1 / 3)
    bias = (np.arange(8) / 8).astype(f32)
    want = np.einsum("nhwc,oc->nhwo", x.astype(f64), w[:, 0, 0, :].astype(f64)) + bias
    cmd = ops.convolution(strides=1, padding=0)
    if layout == "NCHW":
        to_nhwc = ops.format_transform(src="NCHW", dst="NHWC")
        y = cmd(to_nhwc(_nchw(x)), to_nhwc(_nchw(w)), bias)
        got, want = ops.format_transform(src="NHWC", dst="NCHW")(y), _nchw(want)
        assert got.shape == (2, 8, 6, 6)
    else:
        got = cmd(x, w, bias)
        assert got.shape == (2, 6, 6, 8)
    assert_close(got, want, rtol=1e-5, atol=1e-5)


# -- softmax and sigmoid gradients through the backward pass ---------------------------------

ACTIVATIONS = {
    "softmax": (
        lambda x: (
            np.exp(x - x.max(1, keepdims=True))
            / np.exp(x - x.max(1, keepdims=True)).sum(1, keepdims=True)
        ),
        lambda y, dy: y * (dy - (dy * y).sum(1, keepdims=True)),
    ),
    "sigmoid": (lambda x: 1 / (1 + np.exp(-x)), lambda y, dy: dy * y * (1 - y)),
}


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_activation_gradient_through_the_backward_pass_from_y_alone(name) -> None:
    """NNC: "compare softmax gradient with mps" and "compare sigmoid gradient with mps": the
    symbolic backward of y = f(x) on [10, 100] seeded with dy one at (i, i), compiled; NNC's
    reference is the backward command on ``TENSOR_LIST(dy, 0, y)`` (no x), so fnnc's
    backward is also run with x as a spec only."""
    fwd, grad = ACTIVATIONS[name]
    cmd = getattr(ops, name)()
    x = open_close((10, 100), 0)
    dy = np.zeros((10, 100), f32)
    dy[np.arange(10), np.arange(10)] = 1
    b = GraphBuilder()
    xs, dys = b.input((10, 100), name="x"), b.input((10, 100), name="dy")
    ys = b.exec(cmd, xs, name=name)
    graph, _ = backward(b.build([ys]), ys, [xs], df=dys)
    y, dx = compile(graph)(x, dy)
    want_y = fwd(x.astype(f64))
    want_dx = grad(want_y, dy.astype(f64))
    assert_close(y, want_y, rtol=1e-6, atol=1e-7)
    assert_close(dx, want_dx, rtol=1e-5, atol=1e-7)
    (alone,) = cmd.definition.backward((dy,), (Spec(x.shape, x.dtype),), (y,), **cmd.kwargs)
    assert_close(alone, want_dx, rtol=1e-5, atol=1e-7)


# -- norms with the MPS cases' epsilons, in a graph with data transfers ------------------------

AXES = (1, 2, 3)


def _layer_norm64(x, scale=None, bias=None, *, epsilon):
    mu = x.mean(AXES, keepdims=True)
    y = (x - mu) / np.sqrt(((x - mu) ** 2).mean(AXES, keepdims=True) + epsilon)
    return y if scale is None else y * scale + bias


def _group_norm64(x, scale=None, bias=None, *, epsilon):
    """NNC's GROUP_NORM(1, 4, eps) on [2, 16, 2, 10]: statistics per (sample, group, h, w)."""
    xs = x.reshape(2, 4, 4, 2, 10)
    mu = xs.mean(2, keepdims=True)
    y = ((xs - mu) / np.sqrt(((xs - mu) ** 2).mean(2, keepdims=True) + epsilon)).reshape(x.shape)
    return y if scale is None else y * scale + bias


def _rms_norm64(x, scale, *, epsilon):
    return x / np.sqrt((x * x).mean(AXES, keepdims=True) + epsilon) * scale


NORM_CASES = {
    # C case -> (command, x shape, number of parameters, oracle)
    "compare layer norm with mps": (
        ops.layer_norm(axes=AXES, epsilon=1e-6),
        (2, 2, 2, 10),
        2,
        functools.partial(_layer_norm64, epsilon=1e-6),
    ),
    "compare layer norm with mps without scale / bias": (
        ops.layer_norm(axes=AXES, epsilon=1e-6),
        (2, 2, 2, 10),
        0,
        functools.partial(_layer_norm64, epsilon=1e-6),
    ),
    "compare group norm with mps": (
        ops.group_norm(groups=4, axis=1, epsilon=1e-7, reduce_axes=()),
        (2, 16, 2, 10),
        2,
        functools.partial(_group_norm64, epsilon=1e-7),
    ),
    "compare group norm with mps without scale / bias": (
        ops.group_norm(groups=4, axis=1, epsilon=1e-7, reduce_axes=()),
        (2, 16, 2, 10),
        0,
        functools.partial(_group_norm64, epsilon=1e-7),
    ),
    "compare rmsnorm with mps": (
        ops.rms_norm(axes=AXES, epsilon=1e-6),
        (2, 2, 2, 10),
        1,
        functools.partial(_rms_norm64, epsilon=1e-6),
    ),
}


@pytest.mark.parametrize("case", list(NORM_CASES))
def test_norm_forward_with_mps_epsilon_between_transfers(case) -> None:
    """NNC: "compare layer norm with mps" (LAYER_NORM(1e-6, 1, 1, 2, 3)), "... without scale /
    bias", "compare group norm with mps" (GROUP_NORM(1, 4, 1e-7, 1)), "... without scale /
    bias" and "compare rmsnorm with mps" (RMSNORM(1e-6, 1, 2, 3)): a host x transferred to
    the device, normalised, and y transferred back, in one compiled graph. x and the
    parameters (NNC's x-ranked [1, ...] tensors) are open-close draws."""
    cmd, shape, n_params, oracle = NORM_CASES[case]
    x = open_close(shape, 1)
    params = [open_close((1, *shape[1:]), 2 + i) for i in range(n_params)]
    b = GraphBuilder()
    host_x = b.input(shape, name="host x")
    ps = [b.input(p.shape, name=f"p{i}") for i, p in enumerate(params)]
    dev_x = b.exec(ops.data_transfer(), host_x, name="transfer x")
    outs = b.exec(cmd, dev_x, *ps, name="norm")
    host_y = b.exec(ops.data_transfer(), outs[0], name="transfer y")
    y = compile(b.build([host_y]))(x, *params)  # one output: the array itself
    want = oracle(x.astype(f64), *(p.astype(f64) for p in params))
    assert_close(y, want, rtol=1e-5, atol=1e-5)
    # The saved statistics in the shapes the C test declares for them.
    stats_shape = (2, 4, 2, 10) if shape[1] == 16 else (2, 1, 1, 1)
    assert all(s.shape == stats_shape for s in cmd(x, *params)[1:])


# -- add in a graph with transfers (and conversions), and its backward -------------------------


@pytest.mark.parametrize("dtype", [f32, f16])
def test_add_between_transfers_and_conversions(dtype) -> None:
    """NNC: "compare add with mps" and "compare add with mps in half precision": host x
    [10, 5, 5, 3] and y [10, 5, 1, 3] (in half precision first converted to 16F) moved to
    the device, ADD(0.5, 0.2), moved back (and converted to 32F), in one compiled graph."""
    x, y = open_close((10, 5, 5, 3), 0), open_close((10, 5, 1, 3), 1)
    b = GraphBuilder()
    xs, ys = b.input(x.shape, name="x"), b.input(y.shape, name="y")
    if dtype == f16:
        xs = b.exec(ops.datatype_conversion(dtype="float16"), xs, name="convert x")
        ys = b.exec(ops.datatype_conversion(dtype="float16"), ys, name="convert y")
    a = b.exec(ops.data_transfer(), xs, name="transfer x")
    c = b.exec(ops.add(p=0.5, q=0.2), a, b.exec(ops.data_transfer(), ys), name="add")
    z = b.exec(ops.data_transfer(), c, name="transfer z")
    if dtype == f16:
        z = b.exec(ops.datatype_conversion(dtype="float32"), z, name="convert z")
    got = compile(b.build([z]))(x, y)
    assert got.dtype == f32
    tol = 1e-6 if dtype == f32 else 1e-3  # NNC's 1e-3 for the half-precision round trip
    assert_close(got, 0.5 * x.astype(f64) + 0.2 * y.astype(f64), rtol=tol, atol=tol)


@pytest.mark.parametrize("wrt", ["x, y", "x"], ids=["both", "no-dy"])
def test_add_gradient_through_transfers(wrt) -> None:
    """NNC: "compare add gradient with mps" and "compare add gradient with mps no dyt ": the
    symbolic backward of c = ADD(0.5, 0.2)(transfer(x), transfer(y)) with respect to the host
    tensors x [10, 5, 5, 3] and y [10, 5, 1, 3], seeded with open-close dc; dx = 0.5 dc and
    dy = 0.2 dc summed over the broadcast axis (the second case reads only dx)."""
    x, y = open_close((10, 5, 5, 3), 0), open_close((10, 5, 1, 3), 1)
    dc = open_close((10, 5, 5, 3), 2)
    b = GraphBuilder()
    xs, ys = b.input(x.shape, name="x"), b.input(y.shape, name="y")
    dcs = b.input(dc.shape, name="dc")
    a, bb = b.exec(ops.data_transfer(), xs), b.exec(ops.data_transfer(), ys)
    c = b.exec(ops.add(p=0.5, q=0.2), a, bb, name="add")
    wanted = [xs, ys] if wrt == "x, y" else [xs]
    graph, _ = backward(b.build([c]), c, wanted, df=dcs)
    _, *grads = compile(graph)(x, y, dc)
    want = [0.5 * dc.astype(f64), 0.2 * dc.astype(f64).sum(2, keepdims=True)]
    assert len(grads) == len(wanted)
    for got, w, name in zip(grads, want, ("dx", "dy")):
        assert_close(got, w, rtol=1e-6, atol=1e-6, what=name)


# -- add / mul backwards with a missing input, output or output gradient ------------------------

COL = np.array([[1], [2], [3], [4]], f32)
PAIR = np.array([5, 6], f32)
C = np.array([[6, 7], [7, 8], [8, 9], [9, 10]], f32)  # the C tests' c, the output gradient


@pytest.mark.parametrize("missing", ["b", "a"], ids=["(a, nil)", "(nil,b)"])
def test_add_backward_without_one_forward_input(missing) -> None:
    """NNC: "broadcasting semantics for add backward mps (a, nil)" and "... (nil,b)":
    ADD_BACKWARD(0.5, 0.2) on ``TENSOR_LIST(c, a, )`` (or ``(c, 0, b)``): ADD's backward
    reads no forward tensor, so the missing one arrives as a spec (its shape only); the
    gradient wanted is still p (q) times c summed over the broadcast axis."""
    cmd = ops.add(p=0.5, q=0.2)
    a = Spec(COL.shape, COL.dtype) if missing == "a" else COL
    b = Spec(PAIR.shape, PAIR.dtype) if missing == "b" else PAIR
    out = Spec((4, 2), f32)
    da, db = cmd.definition.backward((C,), (a, b), (out,), **cmd.kwargs)
    if missing == "b":
        assert_close(da, 0.5 * C.astype(f64).sum(1, keepdims=True), rtol=1e-6, atol=1e-6)
    else:
        assert_close(db, 0.2 * C.astype(f64).sum(0), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("wanted", [("a",), ("b",)], ids=["(a, nil) / (no output db)", "(nil,b)"])
def test_mul_backward_with_one_gradient_wanted(wanted) -> None:
    """NNC: "broadcasting semantics for mul backward (a, nil)", "... (nil,b)" and "... (no
    output db)": MUL_BACKWARD(0.5) of a [4, 1] and b [2] with output gradient c, asked for
    one gradient only; here the backward pass with respect to that input alone."""
    bld = GraphBuilder()
    a, b = bld.input((4, 1), name="a"), bld.input((2,), name="b")
    dc = bld.input((4, 2), name="dc")
    c = bld.exec(ops.mul(p=0.5), a, b, name="mul")
    graph, _ = backward(bld.build([c]), c, [a if w == "a" else b for w in wanted], df=dc)
    _, got = interpret(graph, COL, PAIR, C)
    c64 = C.astype(f64)
    want = (
        0.5 * (c64 * PAIR).sum(1, keepdims=True)
        if wanted == ("a",)
        else 0.5 * (c64 * COL.astype(f64)).sum(0)
    )
    assert_close(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    "a, b",
    [
        (COL, PAIR),
        (np.array([[1, 2, 3], [4, 5, 6]], f32), np.array([7, 8, 9], f32)),
        (np.array([7, 8, 9], f32), np.array([[1, 2, 3], [4, 5, 6]], f32)),
    ],
    ids=["no input grad", "for b", "for a"],
)
def test_mul_backward_with_null_output_gradient(a, b) -> None:
    """NNC: "broadcasting semantics for mul backward (no input grad)", "... for b" and "... for
    a": MUL_BACKWARD(0.5) on ``TENSOR_LIST(0, a, b)``, the null output gradient standing for
    ones; fnnc's backward takes ``None`` for it. da = 0.5 b summed to a's shape, and back."""
    cmd = ops.mul(p=0.5)
    shape = np.broadcast_shapes(a.shape, b.shape)
    da, db = cmd.definition.backward((None,), (a, b), (Spec(shape, f32),), **cmd.kwargs)

    def sum_to(v, target):
        v = v.sum(tuple(range(v.ndim - len(target))))
        return v.sum(tuple(i for i, n in enumerate(target) if n == 1), keepdims=True)

    assert_close(da, sum_to(0.5 * np.broadcast_to(b.astype(f64), shape), a.shape))
    assert_close(db, sum_to(0.5 * np.broadcast_to(a.astype(f64), shape), b.shape))


def test_scalar_mul_forward_backward_and_null_gradient() -> None:
    """NNC: "mps scalar mul forward", "mps scalar mul backward" and "mps scalar mul backward,
    no input": SCALAR_MUL(1.1) gives 1.1 x on [4]; its backward gives 1.1 dy, and on
    ``TENSOR_LIST(0)`` (no gradient, no input) 1.1 everywhere."""
    cmd = ops.scalar_mul(a=1.1)
    x, dy = open_close((4,), 0), open_close((4,), 1)
    assert_close(cmd(x), 1.1 * x.astype(f64), rtol=1e-6, atol=1e-6)
    spec = Spec((4,), f32)
    (dx,) = cmd.definition.backward((dy,), (spec,), (spec,), **cmd.kwargs)
    assert_close(dx, 1.1 * dy.astype(f64), rtol=1e-6, atol=1e-6)
    (ones,) = cmd.definition.backward((None,), (spec,), (spec,), **cmd.kwargs)
    assert_close(ones, np.full(4, 1.1), rtol=1e-6, atol=1e-6)


def test_mse_sum_backward_without_db() -> None:
    """NNC: "mps mse sum loss backward (no output db)": MSE_BACKWARD(REDUCE_SUM) of a, b
    [10, 100] in (0, 1] with g = 1, asked for da only (``TENSOR_LIST(da, 0)``): here the
    backward pass with respect to a alone; da = 2 (a - b). Also the command's backward fed
    NNC's [10]-shaped g."""
    a, b = open_close((10, 100), 0), open_close((10, 100), 1)
    bld = GraphBuilder()
    xs, ys, gs = bld.input(a.shape, name="a"), bld.input(b.shape, name="b"), bld.input((10, 1))
    c = bld.exec(ops.mse(reduce="sum"), xs, ys, name="mse")
    graph, _ = backward(bld.build([c]), c, [xs], df=gs)
    loss, da = compile(graph)(a, b, np.ones((10, 1), f32))
    a64, b64 = a.astype(f64), b.astype(f64)
    assert_close(loss[:, 0], ((a64 - b64) ** 2).sum(1), rtol=1e-5, atol=1e-5)
    assert_close(da, 2 * (a64 - b64), rtol=1e-6, atol=1e-6)
    # The C test's g (and c) are [10] vectors, not [10, 1]: the command's backward takes it.
    cmd = ops.mse(reduce="sum")
    da10, _ = cmd.definition.backward((np.ones(10, f32),), (a, b), (loss,), **cmd.kwargs)
    assert_close(da10, 2 * (a64 - b64), rtol=1e-6, atol=1e-6)


# -- layer / group norm gradients without the bias gradient -------------------------------------


def _layer_norm_jnp(x, scale, bias):
    mu = jnp.mean(x, axis=AXES, keepdims=True)
    var = jnp.mean(jnp.square(x - mu), axis=AXES, keepdims=True)
    return (x - mu) / jnp.sqrt(var + 1e-4) * scale + bias


def _group_norm_jnp(x, scale, bias):
    xs = jnp.reshape(x, (2, 4, 4, 2, 10))
    mu = jnp.mean(xs, axis=2, keepdims=True)
    var = jnp.mean(jnp.square(xs - mu), axis=2, keepdims=True)
    return jnp.reshape((xs - mu) / jnp.sqrt(var + 1e-5), x.shape) * scale + bias


GRADIENT_CASES = {
    "compare layer norm gradient with mps (no bias)": (
        ops.layer_norm(axes=AXES, epsilon=1e-4),
        (2, 2, 2, 10),
        _layer_norm_jnp,
    ),
    "compare group norm gradient with mps (no dbias)": (
        ops.group_norm(groups=4, axis=1, epsilon=1e-5, reduce_axes=()),
        (2, 16, 2, 10),
        _group_norm_jnp,
    ),
}


@pytest.mark.parametrize("case", list(GRADIENT_CASES))
def test_norm_gradient_without_the_bias_gradient(case) -> None:
    """NNC: "compare layer norm gradient with mps (no bias)" (LAYER_NORM(1e-4, 1, 1, 2, 3))
    and "compare group norm gradient with mps (no dbias)" (GROUP_NORM(1, 4, 1e-5, 1)): the
    norm with scale and bias, its symbolic backward taken with respect to x and scale only
    (x in (0, 100], parameters and dy in NNC's draws), compiled."""
    cmd, shape, oracle = GRADIENT_CASES[case]
    x = open_close(shape, 1, 100)
    pshape = (1, *shape[1:])
    scale, bias = open_close(pshape, 2), open_close(pshape, 3)
    dy = open_close(shape, 4) * 2 - 1
    b = GraphBuilder()
    xs, ss, bs = b.input(shape, name="x"), b.input(pshape, name="scale"), b.input(pshape)
    dys = b.input(shape, name="dy")
    y = b.exec(cmd, xs, ss, bs, name="norm")[0]
    graph, grads = backward(b.build([y]), y, [xs, ss], df=dys)
    assert len(grads) == 2
    got_y, dx, dscale = compile(graph)(x, scale, bias, dy)
    want_y, (want_dx, want_dscale, _) = vjp64(oracle, (x, scale, bias), dy)
    assert_close(got_y, want_y, rtol=1e-5, atol=1e-5)
    assert_close(dx, want_dx, rtol=1e-4, atol=1e-5 * np.abs(want_dx).max(), what="dx")
    assert_close(dscale, want_dscale, rtol=1e-4, atol=1e-5, what="dscale")
