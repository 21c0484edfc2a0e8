"""NNC's cases, translated (part 2): forward.tests.c, backward.tests.c, gradient.tests.c,
micro.tests.c and simplify.tests.c (liuliu/ccv ``test/unit/nnc``), float32. NNC's tensors
without a batch axis get a batch of 1; its closed forms are restated as window counts,
its non-uniform convolutions checked against a NumPy float64 oracle."""

from __future__ import annotations

import numpy as np
import pytest
from numpy.lib.stride_tricks import sliding_window_view

from fnnc import ops
from fnnc.graph import GraphBuilder, backward, case_of, compile, interpret, simplify, while_loop
from tests.helpers import assert_close, rand

F32 = np.float32


def _both(graph, *args):
    """The graph's outputs from interpret (the oracle) and from the compiled program."""
    return interpret(graph, *args), compile(graph)(*args)


def _cells(size, k, stride, pad):
    """Per output position along one axis, how many of the ``k`` window cells are inside
    an input of ``size`` (padding ``pad`` on both sides)."""
    out = (size + 2 * pad - k) // stride + 1
    start = np.arange(out) * stride - pad
    return np.minimum(start + k, size) - np.maximum(start, 0)


def _conv_oracle(x, w, pads):
    """NumPy float64 correlation of x [H, W, C] with w [O, kh, kw, C], zero padding."""
    xp = np.pad(x.astype(np.float64), (pads[0], pads[1], (0, 0)))
    windows = sliding_window_view(xp, w.shape[1:3], axis=(0, 1))  # [H', W', C, kh, kw]
    return np.einsum("yxcij,oijc->yxo", windows, w.astype(np.float64))


# -- forward.tests.c -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "size, kernel, stride, pad, values",
    [((225, 185, 3), (11, 11), 4, (1, 1), {300, 330, 363}),
     ((17, 27, 1), (5, 3), 1, (2, 1), {6, 8, 9, 10, 12, 15})],
    ids=["11x11 on 225x185", "5x3 on 17x27"],
)  # fmt: skip
def test_convolution_with_uniform_weights(size, kernel, stride, pad, values):
    """forward.tests.c "convolutional network of 11x11 on 225x185 with uniform weights"
    and "... of 5x3 on 17x27 ...": all ones, so each output counts its window's cells
    inside the image (300 at the corners, 330 on the borders, 363 inside; and 6 .. 15).

    NNC TEST_CASE covered here:
    "convolutional network of 5x3 on 17x27 with uniform weights".
    """
    h, w, c = size
    x, wt = np.ones((1, h, w, c), F32), np.ones((4, *kernel, c), F32)
    conv = ops.convolution(strides=stride, padding=tuple((p, p) for p in pad))
    got = np.asarray(conv(x, wt, np.zeros(4, F32)))
    rows, cols = (_cells(n, k, stride, p) for n, k, p in zip((h, w), kernel, pad))
    want = np.outer(rows, cols)[None, :, :, None] * c * np.ones(4)
    np.testing.assert_array_equal(got, want)
    assert set(np.unique(got).tolist()) == values


@pytest.mark.parametrize(
    "size, kernel, stride, pad",
    [((225, 185), (11, 11), 4, (1, 1)), ((27, 27), (3, 5), 1, (1, 2))],
    ids=["11x11 on 225x185", "3x5 on 27x27"],
)
def test_convolution_with_non_uniform_weights(size, kernel, stride, pad):
    """forward.tests.c "convolutional network of 11x11 on 225x185 with non-uniform weights"
    and "... of 3x5 on 27x27 ...": x = 1, 2, 3, ... and each filter 1, 2, 3, ....

    NNC TEST_CASE covered here:
    "convolutional network of 3x5 on 27x27 with non-uniform weights".
    """
    x = np.arange(1, size[0] * size[1] + 1, dtype=F32).reshape(1, *size, 1)
    k = kernel[0] * kernel[1]
    w = np.tile(np.arange(1, k + 1, dtype=F32), 4).reshape(4, *kernel, 1)
    conv = ops.convolution(strides=stride, padding=tuple((p, p) for p in pad))
    want = _conv_oracle(x[0], w, [(p, p) for p in pad])[::stride, ::stride]
    assert_close(conv(x, w, np.zeros(4, F32))[0], want, rtol=1e-6, atol=0)


def test_convolution_with_no_bias():
    """forward.tests.c "convolution with no bias": the same as a zero bias."""
    x, w = rand([1, 27, 27, 1], lo=0), rand([4, 3, 5, 1], seed=1, lo=0)
    conv = ops.convolution(padding="SAME")
    np.testing.assert_array_equal(conv(x, w), conv(x, w, np.zeros(4, F32)))


@pytest.mark.parametrize(
    "pool, size, window, first, row, step",
    [("max_pool", 55, 3, 113, 110, 2), ("max_pool", 57, 3, 117, 171, 3),
     ("max_pool", 54, 2, 56, 108, 2), ("avg_pool", 55, 3, 57, 110, 2),
     ("avg_pool", 57, 3, 59, 171, 3), ("avg_pool", 54, 2, 28.5, 108, 2)],
)  # fmt: skip
def test_pool(pool, size, window, first, row, step):
    """forward.tests.c "maximum pool network of 55x55 with window of 3x3 and stride of 2"
    (57x57 stride 3, 54x54 window 2 stride 2) and the three "average pool network" cases:
    x = 1, 2, 3, ... row by row, so output (y, x) is first + row * y + step * x.

    NNC TEST_CASEs covered here:
    "maximum pool network of 57x57 with window of 3x3 and stride of 3",
    "maximum pool network of 54x54 with window of 2x2 and stride of 2",
    "average pool network of 55x55 with window of 3x3 and stride of 2",
    "average pool network of 57x57 with window of 3x3 and stride of 3",
    "average pool network of 54x54 with window of 2x2 and stride of 2".
    """
    x = np.arange(1, size * size + 1, dtype=F32).reshape(1, size, size, 1)
    got = getattr(ops, pool)(window=(window, window), strides=(step, step))(x)
    n = (size - window) // step + 1
    want = first + row * np.arange(n)[:, None] + step * np.arange(n)[None, :]
    np.testing.assert_allclose(np.asarray(got)[0, :, :, 0], want, rtol=1e-6)


# NNC's expected outputs of the transposed 3x3 convolution of a 2x2x2 input of ones with
# weights 0, 1, ..., 17 and a bias of 1 (NHWC, row by row).
CONV_T_WANT = {
    (1, 1): [10, 21, 25, 14, 25, 53, 61, 33, 37, 77, 85, 45, 22, 45, 49, 26],
    (2, 1): [1, 10, 2, 20, 4, 22, 3, 12, 4, 22, 9, 45, 13, 49, 8, 26,
             10, 28, 21, 57, 25, 61, 14, 32, 7, 16, 14, 32, 16, 34, 9, 18],
    (2, 2): [1, 10, 2, 11, 3, 21, 2, 11, 3, 12, 4, 13, 5, 14, 9, 27, 5, 14, 6, 15,
             7, 25, 9, 27, 17, 53, 9, 27, 11, 29, 4, 13, 5, 14, 9, 27, 5, 14, 6, 15,
             7, 16, 8, 17, 15, 33, 8, 17, 9, 18],
}  # fmt: skip


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
@pytest.mark.parametrize("groups, stride", [(1, 1), (2, 1), (2, 2)])
def test_convolution_transpose_with_given_weights(groups, stride, layout):
    """forward.tests.c "convolution transpose of 3x3 on 2x2 with given weights", "... and
    group of 2", "... and group of 2, stride of 2", and each again "..., NCHW" (NCHW
    tensors and the [O, C/groups, kh, kw] weight go through format_transform)."""
    out = groups  # output channels; each group maps one input channel to one output
    conv_t = ops.convolution_transpose(strides=stride, groups=groups)
    b = GraphBuilder()
    if layout == "NHWC":
        x, w = b.input((1, 2, 2, 2), name="a"), b.input((2, 3, 3, 1), name="w")
        y = b.exec(conv_t, x, w, b.input((out,), name="bias"))
    else:
        x, w = b.input((1, 2, 2, 2), name="a"), b.input((2, 1, 3, 3), name="w")
        to_nhwc = ops.format_transform(src="NCHW", dst="NHWC")
        xt, wt = b.exec(to_nhwc, x), b.exec(to_nhwc, w)
        y = b.exec(conv_t, xt, wt, b.input((out,), name="bias"))
        y = b.exec(ops.format_transform(src="NHWC", dst="NCHW"), y)
    graph = b.build([y])
    n = (2 - 1) * stride + 3
    wv = np.arange(18, dtype=F32).reshape(graph.input_specs[1].shape)
    got = compile(graph)(np.ones((1, 2, 2, 2), F32), wv, np.ones(out, F32))
    want = np.asarray(CONV_T_WANT[groups, stride], F32).reshape(1, n, n, out)
    if layout == "NCHW":
        want = want.transpose(0, 3, 1, 2)
    np.testing.assert_array_equal(got, want)


# -- backward.tests.c ----------------------------------------------------------------------


def test_convolution_backward_of_3x5_on_21x31():
    """backward.tests.c "convolutional network of 3x5 on 21x31 for error backward
    propagation": x, g = 1 and w = 2 everywhere, so each gradient counts window cells:
    h = 32 * 2 * (rows inside) * (columns inside), dw = the overlap counts, dbias = 21 * 31."""
    x, w = np.ones((1, 31, 21, 3), F32), np.full((32, 5, 3, 3), 2, F32)
    bias, g = np.zeros(32, F32), np.ones((1, 31, 21, 32), F32)
    conv = ops.convolution(padding="SAME")
    h, dw, dbias = conv.definition.backward((g,), (x, w, bias), (None,), **conv.kwargs)
    rows, cols = _cells(31, 5, 1, 2), _cells(21, 3, 1, 1)
    assert_close(h, np.broadcast_to((32 * 2 * np.outer(rows, cols))[None, :, :, None], x.shape))
    dw_want = np.outer(31 - np.abs(np.arange(5) - 2), 21 - np.abs(np.arange(3) - 1))
    assert_close(dw, np.broadcast_to(dw_want[None, :, :, None], w.shape), rtol=1e-6)
    assert_close(dbias, np.full(32, 21 * 31, F32))


A = np.array([5, -3, 10, 11, -1], F32)
W = np.array([[0.5, 0.2, -0.3, 2, 4], [1, 8, 2, 8, -1], [0, 10, -1, -2, 3], [4, 7, 8, 10, 0]], F32)
BIAS = np.array([1, 4, 2, -1], F32)


@pytest.mark.parametrize("batch", [1, 2])
def test_full_connect_back_propagation(batch):
    """backward.tests.c "full connect back propagation" and "... with batch = 2" (the second
    row is -a, its gradient -g): gemm with a [out, in] weight and a bias, forward and
    backward with the bias as the gradient, against NNC's numbers.

    NNC TEST_CASE covered here:
    "full connect back propagation with batch = 2".
    """
    a = A if batch == 1 else np.stack([A, -A])
    g = BIAS if batch == 1 else np.stack([-BIAS, BIAS])
    dense = ops.gemm(transpose_b=True)
    y = dense(a, W, BIAS)
    bo = np.array([17.9, 94, -63, 188], F32)  # W a + bias: 16.9 + 1, 90 + 4, -65 + 2, ...
    assert_close(y, bo if batch == 1 else np.stack([bo, -(bo - BIAS) + BIAS]), rtol=1e-6)
    h, dw, dbias = dense.definition.backward((g,), (a, W, BIAS), (y,), **dense.kwargs)
    ho = np.array([0.5, 45.2, -2.3, 20, 6], F32)  # W^T g
    go = np.outer(BIAS, A)
    assert_close(dbias, BIAS if batch == 1 else np.zeros(4, F32))
    assert_close(dw, go if batch == 1 else -2 * go, rtol=1e-6)
    assert_close(h, ho if batch == 1 else np.stack([-ho, ho]), rtol=1e-6)


# -- gradient.tests.c ----------------------------------------------------------------------


def test_numerical_gradient_versus_analytical_gradient_for_convolution():
    """gradient.tests.c "numerical gradient versus analytical gradient for convolutional
    network": loss = -log softmax(conv(a, w) flattened)[24]; fnnc's backward pass against
    five-point central differences of a float64 NumPy forward."""
    n = 31 * 21 * 2
    a = ((np.arange(n) - n // 2) / ((n - 1) * n)).astype(F32).reshape(1, 31, 21, 2)
    w = (rand([4, 5, 3, 2], seed=1) * np.sqrt(2 / (21 * 31 * 6))).astype(F32)
    bias = np.zeros(4, F32)
    b = GraphBuilder()
    xa, xw, xbias = b.input(a.shape), b.input(w.shape, name="w"), b.input((4,), name="bias")
    conv = b.exec(ops.convolution(padding="SAME"), xa, xw, xbias, name="conv")
    flat = b.exec(ops.reshape(shape=(1, 31 * 21 * 4)), conv)
    label = b.constant(np.array([24], np.int32))
    loss, _ = b.exec(ops.softmax_crossentropy(), flat, label, name="loss")
    total = b.exec(ops.reshape(shape=()), loss)
    graph, _ = backward(b.build([total]), total, [xw, xbias])
    _, dw, dbias = compile(graph)(a, w, bias)

    def f(w, bias):
        logits = (_conv_oracle(a[0], w, [(2, 2), (1, 1)]) + bias).ravel()
        return np.log(np.exp(logits - logits.max()).sum()) + logits.max() - logits[24]

    def numeric(values, other, first, eps=1e-3):
        grad = np.zeros(values.shape)
        for i in range(values.size):
            for c, s in zip([1, -8, 8, -1], [-2, -1, 1, 2]):
                v = values.astype(np.float64).copy()
                v.flat[i] += s * eps
                grad.flat[i] += c * (f(v, other) if first else f(other, v))
        return grad / (12 * eps)

    assert_close(dw, numeric(w, bias, True), rtol=1e-3, atol=1e-9)  # |dw| up to 4e-4
    assert_close(dbias, numeric(bias, w, False), rtol=1e-3, atol=1e-6)


# -- micro.tests.c -------------------------------------------------------------------------

# NNC's micro-op reindex becomes a strided view: x[i0, i1 + i3, i2 + i4, i5] over the
# output (i0, i1, i2), window (i3, i4), channel i5 and filter i6 is a view of x with
# overlapping strides (stride 0 along i6); w[i6, i3, i4, i5] is a view of w with stride 0
# along the output axes. The product summed over (i3, i4, i5) is the convolution.
CONV_VIEW = (1, 2, 2, 3, 3, 5, 2)
X_STRIDES, W_STRIDES = (80, 20, 5, 20, 5, 1, 0), (0, 0, 0, 15, 5, 1, 45)
# Matrix multiplication: a[i0, i1] and b[i1, i2] as views [4, 2, 3], summed over i1.
GEMM_VIEW, A_STRIDES, B_STRIDES = (4, 2, 3), (2, 1, 0), (0, 3, 1)


def _micro(x_shape, w_shape, view, strides, axes, out_shape):
    """f(x, w) = sum over ``axes`` of view(x) * view(w), with its backward for a seed dy."""
    b = GraphBuilder()
    x, w = b.input(x_shape, name="x"), b.input(w_shape, name="w")
    xx, ww = (b.alias(t, view, stride=s) for t, s in zip((x, w), strides))
    yy = b.exec(ops.reduce_sum(axes=axes), b.exec(ops.ewprod(), xx, ww))
    y = b.exec(ops.reshape(shape=out_shape), yy)
    dy = b.input(out_shape, name="dy")
    return compile(backward(b.build([y]), y, [x, w], df=dy)[0])


MICRO = {
    "convolution": (
        ((1, 4, 4, 5), (2, 3, 3, 5), CONV_VIEW, (X_STRIDES, W_STRIDES), (3, 4, 5), (1, 2, 2, 2)),
        ops.convolution(),
    ),
    "gemm": (((4, 2), (2, 3), GEMM_VIEW, (A_STRIDES, B_STRIDES), (1,), (4, 3)), ops.gemm()),
}


def _micro_run(name):
    args, cmd = MICRO[name]
    x, w = rand(args[0], lo=0), rand(args[1], seed=1, lo=0)
    dy = np.ones(args[-1], F32)
    got = _micro(*args)(x, w, dy)
    y = cmd(x, w)
    return got, (y, *cmd.definition.backward((dy,), (x, w), (y,), **cmd.kwargs)[:2])


@pytest.mark.parametrize("name", ["convolution", "gemm"])
def test_micro_ops_forward(name):
    """micro.tests.c "represent convolution with micro ops, with external variables" and
    "..., no external variables" (one case in fnnc: a view's shape is always explicit),
    and "represent matrix multiplication with micro ops": the forward.

    NNC TEST_CASE covered here:
    "represent convolution with micro ops, no external variables".
    """
    got, want = _micro_run(name)
    assert_close(got[0], want[0], rtol=1e-5)


@pytest.mark.parametrize("name", ["convolution", "gemm"])
def test_micro_ops_backward(name):
    """micro.tests.c, the same three cases: the gradients of x and w through the views
    equal the convolution's (the gemm's) own backward."""
    got, want = _micro_run(name)
    assert_close(got[1:], want[1:], rtol=1e-5)


def test_gradient_of_an_overlapping_view_adds_up():
    """The smallest case of the above: the sliding windows [[x0, x1], [x1, x2]] of x,
    summed, read x1 twice, so d/dx = [1, 2, 1]."""
    b = GraphBuilder()
    x = b.input((3,), name="x")
    windows = b.alias(x, (2, 2), stride=(1, 1), name="windows")
    f = b.exec(ops.reshape(shape=()), b.exec(ops.reduce_sum(axes=(0, 1)), windows))
    graph, _ = backward(b.build([f]), f, [x])
    assert_close(compile(graph)(F32([1, 2, 3]))[1], F32([1, 2, 1]))


# -- simplify.tests.c ----------------------------------------------------------------------


def test_simplify_graph_with_data_transfer():
    """simplify.tests.c "simplify graph with data transfer": z[0] = x + y through a copy,
    z[1] = x through two copies; simplify drops the copy of a copy."""
    b = GraphBuilder()
    x, y = b.input((1,), name="x"), b.input((1,), name="y")
    z = b.tensor((2,), name="z")
    a1 = b.exec(ops.ewsum(), x, y, name="sum1")
    b.exec(ops.data_transfer(), a1, outputs=[b.alias(z, (1,), name="z1")], name="dt1")
    a2 = b.exec(ops.data_transfer(), x, name="dt2")
    b.exec(ops.data_transfer(), a2, outputs=[b.alias(z, (1,), offset=(1,))], name="dt3")
    graph = simplify(b.build([z]))
    copies = [n for n in graph.nodes if n.cmd.name == "data_transfer"]
    assert len(copies) == 2 and copies[1].inputs == (graph.inputs[0],)
    for got in _both(graph, F32([1.2]), F32([8])):
        assert_close(got, F32([1.2 + 8, 1.2]), atol=1e-5)


def test_simplify_graph_with_case_of():
    """simplify.tests.c "simplify graph with case..of": the sum and product computed twice
    outside the case..of merge, and the branches still see the right values."""
    b = GraphBuilder()
    x, y, z = (b.input((1,), name=n) for n in "xyz")
    sum1 = b.exec(ops.ewsum(), x, y, name="sum1")
    prod1 = b.exec(ops.ewprod(), sum1, z, name="prod1")
    sum2 = b.exec(ops.ewsum(), x, y, name="sum2")
    prod2 = b.exec(ops.ewprod(), sum2, z, name="prod2")
    names = ("x", "sum1", "prod1", "prod2", "sum2")

    def sub(fn):
        g = GraphBuilder()
        return g.build([fn(g, *(g.input((1,), name=n) for n in names))])

    def selector(g, x, *_):  # 0 below 0, 1 below 2, else -1 (bypass: q = prod1)
        v = g.exec(ops.reshape(shape=()), x)

        def below(bound, then, other):
            test = g.exec(ops.compare(op="lt"), v, g.constant(F32(bound)))
            return g.exec(ops.select(), test, g.constant(np.int32(then)), other)

        return below(0, 0, below(2, 1, g.constant(np.int32(-1))))

    branches = [
        sub(lambda g, x, s1, p1, p2, s2: g.exec(ops.ewsum(), s1, p1, p2)),
        sub(lambda g, x, s1, p1, p2, s2: g.exec(ops.ewprod(), p2, s2)),
    ]
    (q,) = case_of(
        b, sub(selector), branches, [x, sum1, prod1, prod2, sum2], bypass=[prod1],
        name="case..of",
    )  # fmt: skip
    graph = simplify(b.build([q]))
    assert [n.cmd.name for n in graph.nodes] == ["ewsum", "ewprod", "case_of"]
    for xv, want in [(-2, -0.9 + 2 * (-0.9 * 2.2)), (1.5, 2.6 * 2.6 * 2.2), (3, 4.1 * 2.2)]:
        for got in _both(graph, F32([xv]), F32([1.1]), F32([2.2])):
            assert_close(got, F32([want]), atol=1e-5)


def _while_graph(read):
    """NNC's while body z1 = x * y, p = x * y, z2 = z1 + p, carried z2 -> x, the condition
    count < 5 after the body (6 runs); then f = the sum of the final values of ``read``.
    fnnc returns body results only through carry-overs, so z1 and p are carried too."""
    bb = GraphBuilder()
    x, y = bb.input((1,), name="x"), bb.input((1,), name="y")
    last = {name: bb.input((1,), name=f"{name}_last") for name in ("z1", "p")}
    z1 = bb.exec(ops.ewprod(), x, y, name="z1")
    p = bb.exec(ops.ewprod(), x, y, name="p")
    z2 = bb.exec(ops.ewsum(), z1, p, name="z2")
    body = bb.build([z2, z1, p])
    cb = GraphBuilder()
    count = cb.input((), np.int32, name="count")
    cond = cb.build([cb.exec(ops.compare(op="lt"), count, cb.constant(np.int32(5)))])
    b = GraphBuilder()
    ins = [b.input((1,), name="x"), b.input((1,), name="y")]
    zero = b.constant(np.zeros(1, F32))
    carry = {z2: x, z1: last["z1"], p: last["p"]}
    loop = while_loop(
        b, body, cond, [*ins, zero, zero], carry_overs=carry, breakpoint="after", name="while"
    )
    outs = dict(zip(("z2", "z1", "p"), loop))
    return b.build([b.exec(ops.ewsum(), *(outs[k] for k in read), name="f")])


@pytest.mark.parametrize(
    "read, halves", [(("p", "z2"), 1), (("z1", "z2"), 1), (("z1", "p", "z2"), 2)]
)
def test_simplify_graph_with_while(read, halves):
    """simplify.tests.c "simplify graph with while, variant 1", "variant 2" and "variant 3":
    the two equal products in the body merge (NNC cannot merge them when both are read
    after the loop, variant 3; fnnc can), and f = r + r / 2 per product read.

    NNC TEST_CASEs covered here:
    "simplify graph with while, variant 2",
    "simplify graph with while, variant 3".
    """
    graph = _while_graph(read)
    new = simplify(graph)
    assert len(new.nodes[-2].cmd.param("body").nodes) == 2
    r = 0.5 * (1.1 * 2) ** 6
    for got in _both(new, F32([0.5]), F32([1.1])):
        assert_close(got, F32([r + halves * r * 0.5]), rtol=1e-5)
