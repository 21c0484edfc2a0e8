"""NNC's integration tests of miscellaneous commands, ported (liuliu/ccv ``test/int/nnc/``:
``leaky_relu``, ``loss``, ``swiglu``, ``walsh_hadamard_transform``, ``hyper_connection``,
``datatype``, ``random`` and ``rotate_half`` ``.tests.c``).

The C tests compare a GPU / Metal kernel with the CPU reference kernel, so the
expected values here come from the CPU kernels (``lib/nnc/cmd/**/*_cpu_ref.c``),
written as float64 NumPy beside each test, on the C tests' shapes and fills
(``dsfmt_genrand_open_close`` becomes NumPy draws in (0, 1]). Cases already ported
elsewhere are left out: the Walsh-Hadamard known values and self-inverse
(``test_nnc_quantize.py``), rotate_half forward / backward / view (``test_nnc_rope.py``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fnnc import ops
from fnnc.errors import FnncError
from fnnc.graph import GraphBuilder, interpret
from fnnc.graph.passes.backward import backward
from fnnc.models import Add, CommandLayer, Input, Model, SwiGLU
from tests.helpers import assert_close

f32 = np.float32
Spec = jax.ShapeDtypeStruct


def open_close(shape, seed: int) -> np.ndarray:
    """float32 values in (0, 1], as the C tests' ``dsfmt_genrand_open_close``."""
    return (1.0 - np.random.default_rng(seed).random(shape)).astype(f32)


def run_backward(cmd, grads, inputs, outputs):
    return cmd.definition.backward(grads, inputs, outputs, **cmd.kwargs)


# -- leaky_relu.tests.c (ccv_nnc_leaky_relu_cpu_ref.c) ---------------------------------------

SLOPE = 0.2


def nnc_leaky_relu(x):
    return np.where(x >= 0, x, x * f32(SLOPE))


def nnc_leaky_relu_back(dy, y):
    """The CPU kernel's backward reads the output: ``y >= 0 ? dy : slope * dy``."""
    return np.where(y >= 0, dy, f32(SLOPE) * dy)


@pytest.mark.parametrize("signed", [False, True], ids=["open-close", "signed"])
def test_leaky_relu_in_float(signed):
    """ "leaky relu in float": CMD_LEAKY_RELU_FORWARD(0.2) on [20, 10] (NCHW) in a
    compiled graph equals the CPU kernel exactly; the C test's inputs are all in (0, 1],
    so a signed draw is added."""
    x = open_close((20, 10), 0) * (2 if signed else 1) - (1 if signed else 0)
    b = GraphBuilder()
    a = b.input((20, 10), name="a")
    y = b.exec(ops.leaky_relu(negative_slope=SLOPE), a, name="leaky relu")
    got = interpret(b.build([y]), x)
    np.testing.assert_array_equal(np.asarray(got), nnc_leaky_relu(x))


def test_leaky_relu_in_half_precision():
    """ "leaky relu in half precision": float16 input and output, within NNC's 1e-3 of
    the float32 kernel on the unrounded input."""
    x = open_close((20, 10), 0) * 2 - 1
    got = ops.leaky_relu(negative_slope=SLOPE)(x.astype(np.float16))
    assert got.dtype == jnp.float16
    assert_close(got, nnc_leaky_relu(x), rtol=0, atol=1e-3)


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["float", "half precision"])
def test_leaky_relu_gradient(dtype):
    """ "leaky relu gradient in float / in half precision": the symbolic backward of
    y = leaky_relu(x) on [10, 100] seeded with dy = 1 at (i, i) for i < 10, else 0;
    dx equals CMD_LEAKY_RELU_BACKWARD(0.2) of (dy, y) (exact in float, 1e-3 in half)."""
    x = (open_close((10, 100), 0) * 2 - 1).astype(dtype)
    dy = np.zeros((10, 100), dtype)
    dy[np.arange(10), np.arange(10)] = 1
    b = GraphBuilder()
    xs = b.input((10, 100), dtype, name="x")
    dys = b.input((10, 100), dtype, name="dy")
    ys = b.exec(ops.leaky_relu(negative_slope=SLOPE), xs, name="leaky relu")
    graph, _ = backward(b.build([ys]), ys, [xs], df=dys)
    y, got = interpret(graph, x, dy)
    want_y = nnc_leaky_relu(x.astype(f32))
    want_dx = nnc_leaky_relu_back(dy.astype(f32), want_y)
    tol = 0 if dtype == np.float32 else 1e-3
    assert_close(y, want_y, rtol=0, atol=tol)
    assert_close(got, want_dx, rtol=0, atol=tol)


def test_leaky_relu_gradient_at_zero_passes_the_gradient():
    """ccv_nnc_leaky_relu_cpu_ref.c backward: ``h = (y >= 0) ? g : slope * g``; an input
    of exactly 0 gives y = 0 and so the full gradient."""
    cmd = ops.leaky_relu(negative_slope=SLOPE)
    x = jnp.asarray([-1.0, 0.0, 1.0], jnp.float32)
    dy = jnp.ones(3, jnp.float32)
    (got,) = run_backward(cmd, (dy,), (x,), (cmd(x),))
    np.testing.assert_array_equal(np.asarray(got), [SLOPE * f32(1), 1.0, 1.0])


def test_leaky_relu_backward_reads_only_the_output():
    """leaky_relu.tests.c calls CMD_LEAKY_RELU_BACKWARD(0.2) on ``TENSOR_LIST(dy, 0, y)``:
    no input tensor. Here the input arrives as a spec only (fnnc's convention for a
    tensor the backward does not use)."""
    cmd = ops.leaky_relu(negative_slope=SLOPE)
    x = open_close((10, 100), 0) * 2 - 1
    y = cmd(x)
    dy = open_close((10, 100), 1)
    (got,) = run_backward(cmd, (jnp.asarray(dy),), (Spec(x.shape, x.dtype),), (y,))
    np.testing.assert_array_equal(np.asarray(got), nnc_leaky_relu_back(dy, np.asarray(y)))


# -- loss.tests.c ----------------------------------------------------------------------------


def _class_inputs():
    """[10, 100] scores in (0, 1] (not normalised, as in the C test) and float labels
    (i + 1) * 9 as a [10] tensor."""
    return open_close((10, 100), 0), ((np.arange(10) + 1) * 9).astype(f32)


def nnc_categorical(a, label, trim0, trim1):
    """ccv_nnc_categorical_crossentropy_cpu_ref.c with a [batch] float label: forward c
    and backward h for g = 1, targets trim1 at (int)(label + 0.5), trim0 elsewhere."""
    a = a.astype(np.float64)
    t = np.full(a.shape, trim0)
    t[np.arange(a.shape[0]), (label + 0.5).astype(int)] = trim1
    return -(t * np.log(a)).sum(-1), -t / a


@pytest.mark.parametrize("trims", [(0.0, 1.0), (0.1, 0.9)], ids=["plain", "label smoothing"])
def test_categorical_crossentropy_forward_and_backward(trims):
    """ "cross entropy loss forward / backward" and "... with label smoothing"
    (CMD_CATEGORICAL_CROSSENTROPY_FORWARD() and (0.1, 0.9)): float class labels [10]
    against [10, 100] scores; the backward with g = 1 per sample."""
    a, label = _class_inputs()
    cmd = ops.categorical_crossentropy(trim0=trims[0], trim1=trims[1])
    want_c, want_h = nnc_categorical(a, label, *trims)
    c = cmd(a, label)
    assert c.shape == (10, 1)
    assert_close(c[:, 0], want_c, rtol=1e-6, atol=1e-5)
    g = jnp.ones((10, 1), jnp.float32)
    h, _ = run_backward(cmd, (g,), (jnp.asarray(a), jnp.asarray(label)), (c,))
    assert_close(h, want_h, rtol=1e-6, atol=1e-6)


BINARY = {  # the C tests' pos_weight: none (1) and CMD_..._FORWARD(1.2)
    "": 1.0,
    " with pos_weight": 1.2,
}


def _binary_inputs(shift: bool):
    a = open_close((10, 100), 0)
    label = (np.arange(1000) % 2).astype(f32).reshape(10, 100)
    return (a * 10 - 5 if shift else a), label


def nnc_binary_back(a, b, w):
    """ccv_nnc_binary_crossentropy_cpu_ref.c's backward for g = 1:
    ``(a b (w - 1) + a - w b) / max((1 - a) a, 1e-12)``."""
    a, b = a.astype(np.float64), b.astype(np.float64)
    return (a * b * (w - 1) + a - w * b) / np.maximum((1 - a) * a, 1e-12)


def nnc_binary(a, b, w):
    """ccv_nnc_binary_crossentropy_cpu_ref.c: forward c and the backward for g = 1."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    c = ((b64 - 1) * np.log(1 - a64)).sum(-1) - w * (b64 * np.log(a64)).sum(-1)
    return c, nnc_binary_back(a, b, w)


@pytest.mark.parametrize("suffix", list(BINARY), ids=["plain", "pos_weight"])
def test_binary_crossentropy_forward_and_backward(suffix):
    """ "binary cross entropy loss forward / backward" and "... with pos_weight":
    probabilities in (0, 1], labels i % 2, g = 1 per sample."""
    w = BINARY[suffix]
    a, label = _binary_inputs(shift=False)
    cmd = ops.binary_crossentropy(pos_weight=w)
    want_c, want_h = nnc_binary(a, label, w)
    c = cmd(a, label)
    assert_close(c[:, 0], want_c, rtol=1e-5, atol=1e-4)
    g = jnp.ones((10, 1), jnp.float32)
    h, _ = run_backward(cmd, (g,), (jnp.asarray(a), jnp.asarray(label)), (c,))
    assert_close(h, want_h, rtol=1e-4, atol=1e-4)


def test_binary_crossentropy_backward_is_finite_at_saturated_probabilities():
    """ccv_nnc_binary_crossentropy_cpu_ref.c backward clamps the denominator at 1e-12:
    p = 1 with y = 1 and p = 0 with y = 0 give 0 (the C test's (0, 1] draws may hit 1)."""
    cmd = ops.binary_crossentropy()
    p = jnp.asarray([[1.0, 0.0, 0.5]], jnp.float32)
    y = jnp.asarray([[1.0, 0.0, 1.0]], jnp.float32)
    h, _ = run_backward(cmd, (jnp.ones((1, 1), jnp.float32),), (p, y), (None,))
    want = nnc_binary_back(np.asarray(p), np.asarray(y), 1.0)
    np.testing.assert_allclose(np.asarray(h), want, rtol=1e-6)


def nnc_sigmoid_binary(x, b, w):
    """ccv_nnc_sigmoid_binary_crossentropy_cpu_ref.c: forward (c, d = sigmoid) and the
    backward for g = 1 from (b, d): ``(d - 1) b w + d (1 - b)``."""
    x, b = x.astype(np.float64), b.astype(np.float64)
    d = 1 / (1 + np.exp(-x))
    c = ((1 - b) * x + (1 + b * (w - 1)) * np.log1p(np.exp(-x))).sum(-1)
    return c, d, (d - 1) * b * w + d * (1 - b)


@pytest.mark.parametrize("suffix", list(BINARY), ids=["plain", "pos_weight"])
def test_sigmoid_binary_crossentropy_forward_and_backward(suffix):
    """ "sigmoid binary cross entropy loss forward" (logits (0, 1] * 10 - 5), "... forward
    no loss" (the sigmoid output alone), "... backward" (logits in (0, 1], backward from
    ``TENSOR_LIST(g, 0, 0, b, 0, d)``: only the label and the sigmoid), each also "with
    pos_weight"."""
    w = BINARY[suffix]
    cmd = ops.sigmoid_binary_crossentropy(pos_weight=w)
    x, label = _binary_inputs(shift=True)
    want_c, want_d, _ = nnc_sigmoid_binary(x, label, w)
    c, d = cmd(x, label)
    assert_close(c[:, 0], want_c, rtol=1e-5, atol=1e-4)
    assert_close(d, want_d, rtol=1e-6, atol=1e-6)
    x, label = _binary_inputs(shift=False)
    _, d = cmd(x, label)
    _, _, want_h = nnc_sigmoid_binary(x, label, w)
    g = jnp.ones((10, 1), jnp.float32)
    h, _ = run_backward(
        cmd, (g, None), (Spec(x.shape, x.dtype), jnp.asarray(label)), (Spec((10, 1), f32), d)
    )
    assert_close(h, want_h, rtol=1e-6, atol=1e-6)


def nnc_mse(a, b, reduce):
    """ccv_nnc_mse_cpu_ref.c: c and the backward (ha, hb) for g = 1."""
    a, b = a.astype(np.float64), b.astype(np.float64)
    k = 2.0 / a.shape[1] if reduce == "mean" else 2.0
    c = ((b - a) ** 2).sum(-1) * (1 / a.shape[1] if reduce == "mean" else 1)
    return c, k * (a - b), k * (b - a)


@pytest.mark.parametrize("reduce", ["mean", "sum"])
def test_mse_forward_and_backward_of_both_inputs(reduce):
    """ "mse mean / sum loss forward" and "... backward" (CMD_MSE_FORWARD(REDUCE_MEAN /
    REDUCE_SUM)): a, b in (0, 1] [10, 100]; the backward gives both da and db."""
    a, b = open_close((10, 100), 0), open_close((10, 100), 1)
    cmd = ops.mse(reduce=reduce)
    want_c, want_da, want_db = nnc_mse(a, b, reduce)
    c = cmd(a, b)
    assert_close(c[:, 0], want_c, rtol=1e-5, atol=1e-6)
    g = jnp.ones((10, 1), jnp.float32)
    da, db = run_backward(cmd, (g,), (jnp.asarray(a), jnp.asarray(b)), (c,))
    assert_close(da, want_da, rtol=1e-6, atol=1e-7)
    assert_close(db, want_db, rtol=1e-6, atol=1e-7)


LOSSES_NO_GRADIENT = {
    # C case -> (fnnc command, inputs, NNC's backward of the first input for g = 1)
    "binary cross entropy loss backward no input gradient": lambda: (
        ops.binary_crossentropy(),
        _binary_inputs(False),
        nnc_binary(*_binary_inputs(False), 1.0)[1],
    ),
    "... with pos_weight": lambda: (
        ops.binary_crossentropy(pos_weight=1.2),
        _binary_inputs(False),
        nnc_binary(*_binary_inputs(False), 1.2)[1],
    ),
    "sigmoid binary cross entropy loss backward no input gradient": lambda: (
        ops.sigmoid_binary_crossentropy(),
        _binary_inputs(False),
        nnc_sigmoid_binary(*_binary_inputs(False), 1.0)[2],
    ),
    "... (sigmoid) with pos_weight": lambda: (
        ops.sigmoid_binary_crossentropy(pos_weight=1.2),
        _binary_inputs(False),
        nnc_sigmoid_binary(*_binary_inputs(False), 1.2)[2],
    ),
}


@pytest.mark.parametrize("case", list(LOSSES_NO_GRADIENT))
def test_loss_backward_without_an_input_gradient(case):
    """The C tests' "... backward no input gradient" pass no g (``TENSOR_LIST(0, a, b)``)
    and the kernel takes 1 per sample; in fnnc that is the backward pass's default seed
    on the summed loss."""
    cmd, (a, label), want = LOSSES_NO_GRADIENT[case]()
    b = GraphBuilder()
    xs, ys = b.input(a.shape, name="a"), b.input(label.shape, name="b")
    loss = b.exec(cmd, xs, ys)
    loss = loss[0] if isinstance(loss, tuple) else loss
    total = b.exec(ops.reduce_sum(axes=(0, 1)), loss)
    graph, _ = backward(b.build([total]), total, [xs])
    _, got = interpret(graph, a, label)
    assert_close(got, want, rtol=1e-4, atol=1e-4)


# -- swiglu.tests.c (ccv_nnc_swiglu_cpu_ref.c) -----------------------------------------------


def swiglu_fill(count, multiplier, modulus, scale):
    i = np.arange(count, dtype=np.int64)
    return (((i * multiplier) % modulus) - modulus // 2).astype(f32) * f32(scale)


def nnc_swiglu(a, gate_w, up_w, clamp):
    a, gate_w, up_w = (x.astype(np.float64) for x in (a, gate_w, up_w))
    gate, up = a @ gate_w.T, a @ up_w.T
    if clamp > 0:
        gate, up = np.minimum(gate, clamp), np.clip(up, -clamp, clamp)
    return up * gate / (1 + np.exp(-gate))


@pytest.mark.parametrize("clamp", [2.5, 0.0], ids=["clamp", "no clamp"])
def test_swiglu_composes_gate_and_up_projections(clamp):
    """ "SwiGLU composes gate and up projections on CPU and infers metadata from the
    activation": a [2, 3, 31], weights [29, 31], CMD_SWIGLU_FORWARD(2.5); the output is
    [2, 3, 29] float32 and equals the reference within 1e-5 (the unclamped form is the
    Metal decode case's second run)."""
    n, k = 29, 31
    a = swiglu_fill(6 * k, 17, 101, 1 / 64).reshape(2, 3, k)
    gate_w = swiglu_fill(n * k, 29, 113, 1 / 512).reshape(n, k)
    up_w = swiglu_fill(n * k, 37, 127, 1 / 512).reshape(n, k)
    cmd = ops.swiglu(clamp=clamp)
    specs = (Spec(a.shape, f32), Spec(gate_w.shape, f32), Spec(up_w.shape, f32))
    spec = jax.eval_shape(lambda *xs: cmd(*xs), *specs)
    assert (tuple(spec.shape), spec.dtype) == ((2, 3, n), np.dtype(f32))
    got = cmd(a, gate_w, up_w)
    want = nnc_swiglu(a, gate_w, up_w, clamp)
    assert_close(got, want, rtol=0, atol=1e-5)


def test_swiglu_model_owns_two_projection_weights():
    """ "SwiGLU model exposes one input and owns both projection weights":
    ccv_cnnp_swiglu(29, 2.5, ...) on [2, 3, 31] gives [2, 3, 29] float32 and has two
    parameters (fnnc: SwiGLU(29, clamp=2.5, down=False)); its values are NNC's swiglu of
    its two weights."""
    x = swiglu_fill(2 * 3 * 31, 17, 101, 1 / 8).reshape(2, 3, 31)
    inp = Input()
    model = Model(inp, SwiGLU(29, clamp=2.5, down=False, name="swiglu")(inp), name="swiglu")
    model.compile(x)
    y = model.evaluate(x)
    assert (tuple(y.shape), y.dtype) == ((2, 3, 29), np.dtype(f32))
    params = model.parameters()
    assert len(params) == 2
    gate_w, up_w = (np.asarray(params[k]) for k in sorted(params))
    assert_close(y, nnc_swiglu(x, gate_w, up_w, 2.5), rtol=1e-5, atol=1e-6)


# -- walsh_hadamard_transform.tests.c --------------------------------------------------------


def hadamard(n: int) -> np.ndarray:
    """The natural-order (Sylvester) Hadamard matrix."""
    h = np.ones((1, 1))
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h


def test_walsh_hadamard_transform_matches_the_matrix_product():
    """ "compare walsh hadamard transform with mps" (576 x 128, scale 0.0883883...): here
    fnnc against x H * scale in float64, within the test's 2e-5."""
    scale = 0.08838834764831845
    a = open_close((576, 128), 2) * 2 - 1
    got = ops.walsh_hadamard_transform(scale=scale)(a)
    assert_close(got, a.astype(np.float64) @ hadamard(128) * f32(scale), rtol=0, atol=2e-5)


def test_walsh_hadamard_transform_in_half_precision():
    """ "compare walsh hadamard transform in half precision with mps": [13, 17, 64]
    float16, scale 1/8, within 2e-3 of the float32 transform of the rounded input."""
    a16 = (open_close((13, 17, 64), 3) * 2 - 1).astype(np.float16)
    cmd = ops.walsh_hadamard_transform(scale=1 / 8)
    got = cmd(a16)
    assert got.dtype == jnp.float16
    assert_close(got, cmd(a16.astype(f32)), rtol=0, atol=2e-3)


def test_walsh_hadamard_transform_as_a_model_layer():
    """ "ccv_cnnp walsh hadamard transform": a model applying the transform with scale 0.5
    to [2, 4] gives the known values (fnnc spells the layer CommandLayer)."""
    x = Input()
    model = Model(x, CommandLayer(ops.walsh_hadamard_transform(scale=0.5))(x), name="wht")
    a = np.array([[1, 2, 3, 4], [-1, 0, 1, 2]], f32)
    model.compile(a)
    np.testing.assert_array_equal(np.asarray(model.evaluate(a)), [[5, -1, -2, 0], [1, -1, -2, 0]])


# -- hyper_connection.tests.c (ccv_nnc_hyper_connection_cpu_ref.c) ---------------------------


def hc_fill(count: int, offset: int) -> np.ndarray:
    i = np.arange(count)
    return (((i * 17 + offset * 13) % 53) - 26).astype(f32) / f32(32)


def nnc_hc_split(mix, scale, base, n, iterations, eps):
    """The CPU kernel's split of each row: pre, post and the Sinkhorn-normalised comb."""
    mix, scale, base = (x.astype(np.float64) for x in (mix, scale, base))
    rows = mix.reshape(-1, 2 * n + n * n)
    z = rows * np.repeat(scale, [n, n, n * n]) + base
    pre = 1 / (1 + np.exp(-z[:, :n])) + eps
    post = 2 / (1 + np.exp(-z[:, n : 2 * n]))
    logits = z[:, 2 * n :].reshape(-1, n, n)
    e = np.exp(logits - logits.max(-1, keepdims=True))
    comb = e / e.sum(-1, keepdims=True) + eps
    comb = comb / (comb.sum(-2, keepdims=True) + eps)
    for _ in range(iterations - 1):
        comb = comb / (comb.sum(-1, keepdims=True) + eps)
        comb = comb / (comb.sum(-2, keepdims=True) + eps)
    lead = mix.shape[:-1]
    return pre.reshape(*lead, n), post.reshape(*lead, n), comb.reshape(*lead, n * n)


def nnc_hc_expand(block, residual, post, comb, n):
    c = comb.astype(np.float64).reshape(*comb.shape[:-1], n, n)
    mixed = np.einsum("...ji,...jd->...id", c, residual.astype(np.float64))
    return block[..., None, :] * post[..., :, None] + mixed


def test_hyper_connection_forward_modes_match_scalar_relationships():
    """ "hyper connection forward modes match scalar relationships":
    CMD_HYPER_CONNECTION_FORWARD(3, 3, 1e-6), 5 rows, hidden 7. Output shapes; split and
    weighted split agree on post and comb; weighted = sum_i pre_i residual_i; expand =
    block post_i + sum_j comb[j, i] residual_j; split equals the CPU kernel."""
    rows, n, hidden = 5, 3, 7
    width = 2 * n + n * n
    mix = hc_fill(rows * width, 1).reshape(rows, width)
    scale, base = hc_fill(3, 2), hc_fill(width, 3)
    residual = hc_fill(rows * n * hidden, 4).reshape(rows, n, hidden)
    block = hc_fill(rows * hidden, 5).reshape(rows, hidden)
    split = ops.hyper_connection(count=n, sinkhorn_iterations=3, epsilon=1e-6)
    expand = ops.hyper_connection(mode="expand", count=n)
    pre, post, comb = split(mix, scale, base)
    assert [p.size for p in (pre, post, comb)] == [rows * n, rows * n, rows * n * n]
    w_post, w_comb, weighted = split(mix, scale, base, residual)
    assert [p.size for p in (w_post, w_comb, weighted)] == [rows * n, rows * n * n, rows * hidden]
    assert_close(w_post, post, rtol=0, atol=1e-6)
    assert_close(w_comb, comb, rtol=0, atol=1e-6)
    for got, want in zip((pre, post, comb), nnc_hc_split(mix, scale, base, n, 3, 1e-6)):
        assert_close(got, want, rtol=0, atol=1e-6)
    want_weighted = np.einsum("rid,ri->rd", residual, np.asarray(pre, np.float64))
    assert_close(weighted, want_weighted, rtol=0, atol=1e-6)
    expanded = expand(block, residual, w_post, w_comb)
    assert expanded.size == rows * n * hidden
    want = nnc_hc_expand(block, residual, np.asarray(w_post), np.asarray(w_comb), n)
    assert_close(expanded, want, rtol=0, atol=1e-6)


@pytest.mark.parametrize("rows, n, seeds", [(1, 4, (6, 7, 8, 9, 10)), (9, 3, (11, 12, 13, 9, 10))])
def test_hyper_connection_twenty_sinkhorn_iterations(rows, n, seeds):
    """ "hyper connection Metal row-one implementation matches CPU reference" (1 row, 4
    streams; hidden 4097 there, 33 here) and "... scalar-count fallback ..." (9 rows, 3
    streams): CMD_HYPER_CONNECTION_FORWARD(n, 20, 1e-6), every output within the tests'
    1e-5 (2e-5 for the expansion) of the CPU kernel."""
    hidden, width = 33, 2 * n + n * n
    mix = hc_fill(rows * width, seeds[0]).reshape(rows, width)
    scale, base = hc_fill(3, seeds[1]), hc_fill(width, seeds[2])
    residual = hc_fill(rows * n * hidden, seeds[3]).reshape(rows, n, hidden)
    block = hc_fill(rows * hidden, seeds[4]).reshape(rows, hidden)
    split = ops.hyper_connection(count=n, sinkhorn_iterations=20, epsilon=1e-6)
    want_pre, want_post, want_comb = nnc_hc_split(mix, scale, base, n, 20, 1e-6)
    pre, post, comb = split(mix, scale, base)
    assert_close([pre, post, comb], [want_pre, want_post, want_comb], rtol=0, atol=1e-5)
    w_post, w_comb, weighted = split(mix, scale, base, residual)
    assert_close(weighted, np.einsum("rid,ri->rd", residual, want_pre), rtol=0, atol=1e-5)
    expanded = ops.hyper_connection(mode="expand", count=n)(block, residual, w_post, w_comb)
    want = nnc_hc_expand(block, residual, want_post, want_comb, n)
    assert_close(expanded, want, rtol=0, atol=2e-5)


def test_hyper_connection_rejects_incompatible_tensor_shapes():
    """ "hyper connection rejects incompatible tensor shapes": count 4, a mix whose last
    axis is twice the control width 2n + n^2, and a residual whose leading axes are
    transposed against the mix's."""
    n, width = 4, 2 * 4 + 16
    split = ops.hyper_connection(count=n, sinkhorn_iterations=20, epsilon=1e-6)
    with pytest.raises(FnncError, match="2n"):
        split(np.zeros((2, 2 * width), f32), np.zeros(3, f32), np.zeros(width, f32))
    with pytest.raises(FnncError, match="residual"):
        split(
            np.zeros((2, 3, width), f32),
            np.zeros(3, f32),
            np.zeros(width, f32),
            np.zeros((3, 2, n, 5), f32),
        )


def test_hyper_connection_expand_takes_a_square_combination():
    """hyper_connection.tests.c's Metal cases run the CPU kernel's expand with the
    combination shaped [rows, hc, hc]; the result is the same as with [rows, hc * hc]."""
    rows, n, hidden = 2, 3, 5
    residual = hc_fill(rows * n * hidden, 4).reshape(rows, n, hidden)
    block = hc_fill(rows * hidden, 5).reshape(rows, hidden)
    post, comb = hc_fill(rows * n, 6).reshape(rows, n), hc_fill(rows * n * n, 7)
    expand = ops.hyper_connection(mode="expand", count=n)
    got = expand(block, residual, post, comb.reshape(rows, n, n))
    assert_close(got, expand(block, residual, post, comb.reshape(rows, n * n)))


# -- datatype.tests.c -------------------------------------------------------------------------


def test_datatype_conversion_model_mixes_half_and_float_inputs():
    """ "datatype conversion model can reference to the last parameter for the type":
    a1 -> float16, + a3 (float16), -> the type of a2 (float32), + a2; the result is
    a1 + 2 a2 within 1e-2. NNC's model takes the last conversion's type from a2
    (ccv_cnnp_datatype_conversion(0, 1)); fnnc's CommandLayer names it."""
    i1, i2, i3 = Input(), Input(), Input()
    out = CommandLayer(ops.datatype_conversion(dtype="float16"))(i1)
    out = Add()(out, i3)
    out = CommandLayer(ops.datatype_conversion(dtype="float32"))(out)
    out = Add()(out, i2)
    model = Model([i1, i2, i3], out, name="datatype")
    a1, a2 = np.array([0.24, -1.4], f32), np.array([-3.23, 2.44], f32)
    a3 = a2.astype(np.float16)
    model.compile([a1, a2, a3])
    got = model.evaluate([a1, a2, a3])
    assert got.dtype == jnp.float32
    assert_close(got, a1.astype(np.float64) + 2 * a2.astype(np.float64), rtol=0, atol=1e-2)


# -- random.tests.c ----------------------------------------------------------------------------

KEY = np.asarray(jax.random.key_data(jax.random.key(0)))


def test_random_normal_distribution():
    """ "random normal distribution": CMD_RANDOM_NORMAL_FORWARD(std 1, mean 0) filling
    100000 floats in a graph; mean 0 and std 1 within 1e-2 (fnnc's sampler takes a key)."""
    b = GraphBuilder()
    key = b.input((2,), np.uint32, name="key")
    x = b.exec(ops.random_normal(shape=(100000,), std=1.0, mean=0.0), key, name="random")
    got = interpret(b.build([x]), KEY)
    got = np.asarray(got, np.float64)
    assert abs(got.mean()) < 1e-2 and abs(got.std() - 1) < 1e-2


@pytest.mark.parametrize("dtype", ["float32", "float16"], ids=["float", "half precision"])
def test_random_uniform_distribution(dtype):
    """ "random uniform distribution" and "... in half precision":
    CMD_RANDOM_UNIFORM_FORWARD(-8, 4) on 100000 values: all within (-8 - 1e-5, 4 + 1e-5)
    and each of the 12 unit bins within 1000 of 100000 / 12."""
    got = ops.random_uniform(shape=(100000,), dtype=dtype, low=-8.0, high=4.0)(KEY)
    assert got.dtype == np.dtype(dtype)
    x = np.asarray(got, f32)
    assert x.min() > -8 - 1e-5 and x.max() < 4 + 1e-5
    bins = np.clip(np.round(x - 0.5).astype(int) + 8, 0, 11)
    counts = np.bincount(bins, minlength=12)
    assert np.all(np.abs(counts - round(100000 / 12)) <= 1000), counts
