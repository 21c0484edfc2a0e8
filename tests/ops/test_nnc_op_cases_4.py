"""NNC's op tests (liuliu/ccv ``test/unit/nnc/*.tests.c``), continued from
``test_nnc_op_cases_3.py``: ``crossentropy.tests.c``, the non-finite case of
``conform_data_format.tests.c``, ``numa.tests.c``, ``minimize.tests.c`` (least squares
solved by NNC's minimizers on a symbolic and on a dynamic graph), the gradient cases of
``group.norm.tests.c``, the running statistics of ``batch.norm.tests.c`` and
``attention.tests.c``. Each test names the C test case it ports.

NNC's symbolic graph with ``ccv_nnc_symbolic_graph_minimize`` is fnnc's ``minimize``
pass compiled into one step program; NNC's ``ccv_nnc_graph_exec_set`` of a new SGD rate
at steps 250, 500 and 750 is a rate schedule of the step count (fnnc's spelling, see
``fnnc.models.minimizers``). Tensor binding (``TENSOR_BIND_MAP``,
``ccv_nnc_tensor_bind_symbol``) is passing arrays as program inputs, and NNC's enforced
in-place running statistics are donated inputs. Shapes are NNC's, smaller where its
tensors are large (attention's [32, 128, 8, 64]); values are uniform in (0, 1] as
NNC's ``dsfmt_genrand_open_close``, from NumPy's generator.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fnnc import ops
from fnnc.errors import CommandError, ModelError
from fnnc.graph import DynamicGraph, GraphBuilder, backward, compile, interpret, minimize
from fnnc.models import CommandLayer, Input, Model, Parameter, minimizers
from tests.helpers import assert_close

f32, i32 = np.float32, np.int32


def _open_close(shape, seed: int) -> np.ndarray:
    return (1 - np.random.default_rng(seed).random(shape)).astype(f32)


# -- crossentropy.tests.c ----------------------------------------------------------------------

LOGITS = np.array([[10, -2, -5], [-12, 4, 24]], f32)
ONE_HOT = np.array([[0.1, 0.1, 0.9], [0.1, 0.9, 0.1]], f32)  # trims 0.1 / 0.9 at [2, 1]
LABEL = np.array([[2], [1]], i32)


def _loss_and_grad(cmd, x, label, n_out: int):
    """Loss (and softmax / sigmoid) and the gradient of x the backward pass derives with a
    seed of ones on the loss (NNC's "set 1" on dloss)."""
    b = GraphBuilder()
    xs = b.input(x.shape, name="x")
    ls = b.input(label.shape, label.dtype, name="label")
    outs = b.exec(cmd, xs, ls)
    outs = outs if n_out > 1 else (outs,)
    seed = b.input(outs[0].shape, name="dloss")
    graph, _ = backward(b.build(list(outs)), outs[0], [xs], df=seed)
    return [np.asarray(t) for t in interpret(graph, x, label, np.ones(outs[0].shape, f32))]


def _same(a, b) -> None:
    """NNC's REQUIRE_TENSOR_EQ, NaN where both are NaN."""
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6, equal_nan=True)


def test_categorical_crossentropy_label_smoothing_one_hot_vs_label() -> None:
    """NNC's "compare label smoothing with one hot and label for categorical crossentropy
    command": trims 0.1 / 0.9 on labels [2, 1] give the loss and gradient of the smoothed
    one-hot targets. NNC feeds logits, not probabilities, so logs of negative entries
    make both losses NaN, and the gradients -t / a stay finite."""
    cmd = ops.categorical_crossentropy(trim0=0.1, trim1=0.9)
    loss0, da0 = _loss_and_grad(cmd, LOGITS, ONE_HOT, 1)
    loss1, da1 = _loss_and_grad(cmd, LOGITS, LABEL, 1)
    _same(loss0, loss1)
    assert np.isnan(loss0).all()
    _same(da0, da1)
    assert_close(da1, -ONE_HOT / LOGITS, rtol=1e-6)


def test_softmax_crossentropy_label_smoothing_one_hot_vs_label() -> None:
    """NNC's "compare label smoothing with one hot and label for softmax crossentropy
    command": loss, softmax and gradient agree between the two label forms, and the
    gradient is softmax - targets."""
    cmd = ops.softmax_crossentropy(trim0=0.1, trim1=0.9)
    loss0, p0, da0 = _loss_and_grad(cmd, LOGITS, ONE_HOT, 2)
    loss1, p1, da1 = _loss_and_grad(cmd, LOGITS, LABEL, 2)
    _same(loss0, loss1)
    _same(p0, p1)
    _same(da0, da1)
    assert_close(da0, p0 - ONE_HOT, rtol=1e-6, atol=1e-7)


def test_softmax_crossentropy_label_smoothing_loss_values() -> None:
    """The loss values of the case above. NNC's kernel reports sum(t * (max - x)): 14.7
    and 21.6, the cross-entropy of these targets, which sum to 1.1. fnnc's loss is
    logsumexp(x) - sum(t * x), the function whose gradient is exactly the backward both
    compute (softmax - t): it is the cross-entropy whenever the targets sum to 1 (here
    sum(t) - 1 = 0.1 times logsumexp below NNC's), so jax.grad of fnnc's forward and its
    NNC-convention backward agree (a documented choice, fnnc/ops/loss.py)."""
    cmd = ops.softmax_crossentropy(trim0=0.1, trim1=0.9)
    loss, p = cmd(LOGITS, LABEL)
    x = LOGITS.astype(np.float64)
    lse = np.log(np.exp(x).sum(-1, keepdims=True))
    assert_close(loss, lse - (ONE_HOT * x).sum(-1, keepdims=True), rtol=1e-6)
    nnc = np.array([[14.7], [21.6]])
    assert_close(loss + 0.1 * lse, nnc, rtol=1e-5)  # NNC's, with sum(t) - 1 = 0.1
    grad = jax.grad(lambda v: cmd(v, LABEL)[0].sum())(LOGITS)
    assert_close(grad, np.asarray(p) - ONE_HOT, rtol=1e-5, atol=1e-6)
    eps = 0.3  # targets that sum to 1: fnnc's loss is the cross-entropy
    smooth = ops.softmax_crossentropy(trim0=eps / 3, trim1=1 - eps + eps / 3)
    t = np.where(ONE_HOT > 0.5, 1 - eps + eps / 3, eps / 3)
    assert_close(smooth(LOGITS, LABEL)[0], -(t * (x - lse)).sum(-1, keepdims=True), rtol=1e-5)


@pytest.mark.parametrize("pos_weight", [1.0, 1.2], ids=["plain", "pos_weight"])
def test_sigmoid_then_binary_crossentropy_vs_the_fused_command(pos_weight) -> None:
    """NNC's "compare sigmoid + binary entropy v.s. sigmoid binary entropy command" and
    "... with pos_weight" (1.2): loss and gradient of sigmoid followed by
    binary_crossentropy equal those of sigmoid_binary_crossentropy."""
    x = np.array([[10, -1, -5], [12, 4, 5]], f32)
    y = np.array([[1, 0, 0], [1, 1, 0]], f32)
    b = GraphBuilder()
    xs, ys = b.input((2, 3), name="a"), b.input((2, 3), name="label")
    loss0 = b.exec(ops.binary_crossentropy(pos_weight=pos_weight), b.exec(ops.sigmoid(), xs), ys)
    loss1, _ = b.exec(ops.sigmoid_binary_crossentropy(pos_weight=pos_weight), xs, ys)
    seed = b.input((2, 1), name="dloss")
    g0, _ = backward(b.build([loss0]), loss0, [xs], df=seed)
    g1, _ = backward(b.build([loss1]), loss1, [xs], df=seed)
    ones = np.ones((2, 1), f32)
    l0, d0 = interpret(g0, x, y, ones)
    l1, d1 = interpret(g1, x, y, ones)
    assert_close(l0, l1, rtol=1e-5, atol=1e-6)
    assert_close(d0, d1, rtol=1e-5, atol=1e-6)
    p = 1 / (1 + np.exp(-x.astype(np.float64)))
    assert_close(d1, (1 + (pos_weight - 1) * y) * p - pos_weight * y, rtol=1e-5, atol=1e-6)


# -- conform_data_format.tests.c: the non-finite prefix ----------------------------------------


def test_conform_data_format_keeps_a_non_finite_value_in_its_block() -> None:
    """NNC's "conform data format rejects unsupported selectors and invalid geometry", its
    one case not in test_nnc_quantize.py: NNC's CPU kernel refuses a NaN in the conformed
    prefix at run time. A jitted command cannot stop on data; fnnc's NaN stays in its
    64-value block, and every other value conforms as without it."""
    a = np.random.default_rng(0).normal(size=(2, 128)).astype(f32)
    clean = np.asarray(ops.conform_data_format(preserved_tail=64)(a))
    a[0, 0] = np.nan
    out = np.asarray(ops.conform_data_format(preserved_tail=64)(a))
    assert np.isnan(out[0, :64]).all()
    np.testing.assert_array_equal(out[0, 64:], clean[0, 64:])
    np.testing.assert_array_equal(out[1], clean[1])


# -- numa.tests.c ---------------------------------------------------------------------------------


def test_simple_graph_x_times_0_3_plus_3() -> None:
    """NNC's "simple graph x * 0.3 + 3 compiled with NUMA": the arithmetic; where XLA puts
    the buffers is its own business (NNC's NUMA placement has no fnnc counterpart)."""
    b = GraphBuilder()
    x, a, c = b.input((1,), name="x"), b.input((1,), name="a"), b.input((1,), name="b")
    z = b.exec(ops.ewsum(), b.exec(ops.ewprod(), x, a, name="prod"), c, name="sum")
    got = compile(b.build([z]))(f32([1.21]), f32([0.3]), f32([3]))
    assert abs(float(np.asarray(got)[0]) - (1.21 * 0.3 + 3)) < 1e-6


# -- minimize.tests.c: b = a wᵀ + bias, minimize sum(b * b) over w -----------------------------

A = np.array([[10, 1], [3, 5]], f32)
BIAS = np.array([1, -1], f32)


def _w0() -> np.ndarray:
    """NNC's CMD_RANDOM_UNIFORM_FORWARD(-0.5, 0.5) on w."""
    return np.random.default_rng(0).uniform(-0.5, 0.5, (2, 2)).astype(f32)


def _converged(w, tol_1: float, tol_2: float = 1e-1) -> None:
    """At the minimum a wᵀ = -bias: rows of a give [-1, 1] (NNC's tolerances per row)."""
    got = A.astype(np.float64) @ np.asarray(w, np.float64).T
    assert np.all(np.abs(got[0] - [-1, 1]) < tol_1), got
    assert np.all(np.abs(got[1] - [-1, 1]) < tol_2), got


def _solve_on_symbolic_graph(optimizer, steps: int = 1000) -> np.ndarray:
    b = GraphBuilder()
    w = b.input((2, 2), name="w")
    a, bias = b.input((2, 2), name="a"), b.input((2,), name="bias")
    y = b.exec(ops.gemm(transpose_b=True), a, w, bias, name="gemm")
    s = b.exec(ops.reduce_sum(axes=(0, 1)), b.exec(ops.ewprod(), y, y, name="square"), name="sum")
    step, layout = minimize(b.build([s]), s, [w], optimizer)
    program = compile(step)
    params = [_w0()]
    state = layout.init(params)  # NNC sets the saved aux to 0
    for _ in range(steps):
        params, state, _ = layout.split(program(*params, *state, A, BIAS))
    return np.asarray(params[0])


def _sgd_rate(count):
    """NNC sets the rate 1e-4 before step 250, 1e-5 before 500, 1e-6 before 750."""
    return jnp.select([count < 250, count < 500, count < 750], [1e-3, 1e-4, 1e-5], 1e-6)


SYMBOLIC = {
    # NNC's command -> (fnnc minimizer, NNC's tolerance on the first row)
    "sgd": (minimizers.sgd(_sgd_rate, momentum=0.9, dampening=0.9, decay=0.995), 1e-3),
    "adam": (minimizers.adam(0.002, beta1=0.9, beta2=0.98, epsilon=1e-9), 1e-1),
    "rmsprop": (
        minimizers.rmsprop(0.001, decay=1e-4, alpha=0.9, momentum=0.9, epsilon=1e-9),
        1e-1,
    ),
    "adamw": (minimizers.adamw(0.002, beta1=0.9, beta2=0.98, epsilon=1e-9), 1e-1),
}


@pytest.mark.parametrize("kind", list(SYMBOLIC))
def test_solve_least_square_sum_on_symbolic_graph(kind) -> None:
    """NNC's "solve least square sum with stochastic gradient descent on symbolic graph"
    (CMD_SGD_FORWARD(0, 0.001, 1, 0.995, 0.9, 0.9), rate lowered every 250 steps),
    "... with adam on symbolic graph" (CMD_ADAM_FORWARD(i + 1, 0.002, 0.9, 0.98, 0, 1e-9,
    0)), "... with rmsprop on symbolic graph" (CMD_RMSPROP_FORWARD(0.001, 0.0001, 0.9,
    0.9, 1e-9)) and "... with adamW on symbolic graph": 1000 steps.

    NNC TEST_CASEs covered here:
    "solve least square sum with adam on symbolic graph",
    "solve least square sum with rmsprop on symbolic graph",
    "solve least square sum with adamW on symbolic graph".
    """
    optimizer, tol = SYMBOLIC[kind]
    _converged(_solve_on_symbolic_graph(optimizer), tol)


@pytest.mark.parametrize("apply", [False, True], ids=["minimize", "backward+apply"])
def test_solve_least_square_sum_with_sgd_on_dynamic_graph(apply) -> None:
    """NNC's "solve least square sum with stochastic gradient descent on dynamic graph" and
    "... on dynamic graph, backward & apply gradients": 1000 eager steps at rate 0.001,
    a, bias and every intermediate made (and dropped) per step."""
    dg = DynamicGraph()
    w = dg.variable(_w0(), name="w")
    sgd = minimizers.sgd(0.001, momentum=0.9, dampening=0.9, decay=0.995)
    for _ in range(1000):
        a, bias = dg.variable(A, name="a"), dg.variable(BIAS, name="bias")
        y = dg.exec(ops.gemm(transpose_b=True), a, w, bias)
        s = dg.exec(ops.reduce_sum(axes=(0, 1)), dg.exec(ops.ewprod(), y, y))
        if apply:
            dg.backward(s, [w])
            dg.apply_gradients(sgd, [w])
        else:
            dg.minimize(sgd, s, [w])
    _converged(w.numpy(), 1e-3)


# -- group.norm.tests.c: gradients against NNC's fine-grained graph ----------------------------


def _whitening_graph(shape, axis: int):
    """NNC's graph: mean and variance over ``axis`` by reduce_sum and scalar_mul, std =
    exp(log(var) / 2), y = (x - mean) / std; returns (y, dx) for a seed dy."""
    n = shape[axis]
    b = GraphBuilder()
    x, dy = b.input(shape, name="x"), b.input(shape, name="dy")

    def mean_of(t, name):
        return b.exec(ops.scalar_mul(a=1.0 / n), b.exec(ops.reduce_sum(axes=(axis,)), t), name=name)

    whitening = b.exec(ops.add(p=1.0, q=-1.0), x, mean_of(x, "mean"), name="whitening")
    var = mean_of(b.exec(ops.ewprod(), whitening, whitening), "var")
    std = b.exec(ops.ewexp(), b.exec(ops.scalar_mul(a=0.5), b.exec(ops.ewlog(), var)))
    inv_std = b.exec(ops.ewdiv(), b.constant(np.float32(1.0)), std, name="1/std")
    y = b.exec(ops.mul(), whitening, inv_std, name="y")
    return backward(b.build([y]), y, [x], df=dy)[0]


GROUP_NORM = {
    # C case -> (fine-grained shape and axis, group_norm input shape, groups, axis, affine)
    "simple (like layer norm)": ((8, 4, 4, 10), 3, (8, 4, 4, 10), 1, 3, True),
    "groups": ((8, 4, 4, 5), 2, (8, 16, 5), 4, 1, True),
    "groups without scale / bias": ((8, 4, 4, 5), 2, (8, 16, 5), 4, 1, False),
}


@pytest.mark.parametrize("case", list(GROUP_NORM))
def test_group_norm_gradient_against_the_fine_grained_graph(case) -> None:
    """NNC's "compare simple group norm (like layer norm) gradient with other symbolic
    graph" (CMD_GROUP_NORM_FORWARD(3, 1, 0, 1), scale 1 / bias 0 shaped [1, 4, 4, 10]),
    "compare group norm gradient with other symbolic graph" (CMD_GROUP_NORM_FORWARD(1, 4,
    0, 1) on [8, 16, 5], the graph on its [8, 4, 4, 5] view) and "... without scale /
    bias" (elementwise_affine 0): dx within NNC's 1e-5."""
    fine_shape, fine_axis, shape, groups, axis, affine = GROUP_NORM[case]
    x = _open_close(fine_shape, 1)
    dy = _open_close(fine_shape, 2) * 2 - 1
    y_ref, dx_ref = interpret(_whitening_graph(fine_shape, fine_axis), x, dy)
    cmd = ops.group_norm(groups=groups, axis=axis, epsilon=0.0, reduce_axes=())
    params = (np.ones((1, *shape[1:]), f32), np.zeros((1, *shape[1:]), f32)) if affine else ()
    xs, dys = x.reshape(shape), dy.reshape(shape)
    outs = cmd(xs, *params)
    assert_close(outs[0], np.asarray(y_ref).reshape(shape), rtol=0, atol=1e-5)
    grads = cmd.definition.backward((dys, None, None), (xs, *params), outs, **cmd.kwargs)
    assert_close(grads[0], np.asarray(dx_ref).reshape(shape), rtol=0, atol=1e-5)


# -- batch.norm.tests.c: aggregated running mean / var -------------------------------------------


def test_aggregated_mean_and_var_from_batch_norm() -> None:
    """NNC's "compare aggregated mean / var from batch norm with binded tensors on
    outputs", "... on inputs", "... with late binded tensors on outputs" and "... on
    inputs": CMD_BATCH_NORM_FORWARD(0, 0, 0.9, 0, 1, 2) run on x1 then x2 from zero
    running statistics. In fnnc every binding is an input array: the compiled program
    with the running mean / var donated (NNC's enforced in-place symbols) and fed back,
    the interpreted graph and NumPy give the same statistics."""
    b = GraphBuilder()
    x = b.input((8, 4, 4, 10), name="x")
    mean, var = b.input((10,), name="mean"), b.input((10,), name="var")
    scale, bias = b.constant(np.ones(10, f32)), b.constant(np.zeros(10, f32))
    bn = ops.batch_norm(epsilon=0.0, momentum=0.9, axes=(0, 1, 2))
    _, new_mean, new_var, _, _ = b.exec(bn, x, scale, bias, mean, var, name="batch_norm")
    graph = b.build([new_mean, new_var])
    draws = _open_close((8 * 4 * 4 * 10, 2), 1)  # NNC draws x1 and x2 interleaved
    x1, x2 = (draws[:, i].reshape(8, 4, 4, 10) for i in (0, 1))
    program = compile(graph, donate=("mean", "var"))
    assert program.memory().alias_bytes >= 2 * 10 * 4
    stats = [np.zeros(10, f32), np.zeros(10, f32)]
    reference = list(stats)
    want = [np.zeros(10), np.zeros(10)]
    for xv in (x1, x2):
        stats = list(program(xv, *stats))
        reference = list(interpret(graph, xv, *reference))
        x64 = xv.astype(np.float64)
        want = [0.9 * want[0] + 0.1 * x64.mean((0, 1, 2)), 0.9 * want[1] + 0.1 * x64.var((0, 1, 2))]
    assert_close(stats, reference, rtol=1e-6, atol=1e-7)
    assert_close(stats, want, rtol=1e-5, atol=1e-7)


# -- attention.tests.c -------------------------------------------------------------------------

B, S, H, D, DV = 2, 8, 2, 4, 3


def _qkv(seed: int = 1):
    return (
        _open_close((B, S, H, D), seed),
        _open_close((B, S, H, D), seed + 1),
        _open_close((B, S, H, DV), seed + 2),
    )


def _fine_grained_attention():
    """NNC's graph: transpose heads forward, q / 8, q kᵀ, softmax over a [B H S, S] view,
    times v, heads back; returns (r, dq, dk, dv) for a seed dr."""
    b = GraphBuilder()
    q, k, v = (
        b.input(s, name=n)
        for s, n in (((B, S, H, D), "q"), ((B, S, H, D), "k"), ((B, S, H, DV), "v"))
    )
    heads = ops.transpose(perm=(0, 2, 1, 3))
    tq, tk, tv = (b.exec(heads, t) for t in (q, k, v))
    qk = b.exec(ops.gemm(transpose_b=True), b.exec(ops.scalar_mul(a=1 / 8), tq), tk, name="q @ k")
    s = b.tensor((B * H * S, S), name="s")
    b.exec(ops.softmax(), b.alias(qk, (B * H * S, S)), outputs=[s], name="softmax")
    r = b.exec(ops.gemm(), b.alias(s, (B, H, S, S)), tv, name="final")
    tr = b.exec(heads, r)
    dr = b.input((B, S, H, DV), name="dr")
    return backward(b.build([tr]), tr, [q, k, v], df=dr)[0]


def _sdpa_graph():
    b = GraphBuilder()
    q, k, v = b.input((B, S, H, D)), b.input((B, S, H, D)), b.input((B, S, H, DV))
    r = b.exec(ops.scaled_dot_product_attention(scale=1 / 8), q, k, v)
    dr = b.input((B, S, H, DV), name="dr")
    return backward(b.build([r]), r, [q, k, v], df=dr)[0]


def test_scaled_dot_product_attention_forward_and_gradient_vs_fine_grained_graph() -> None:
    """NNC's "implement scaled dot product attention with fine-grained symbolic graph" and
    "implement gradient of scaled dot product attention with fine-grained symbolic
    graph" (seed dr = 1): the command equals the graph, gradients within NNC's 1e-5."""
    q, k, v = _qkv()
    dr = np.ones((B, S, H, DV), f32)
    want = interpret(_fine_grained_attention(), q, k, v, dr)
    got = compile(_sdpa_graph())(q, k, v, dr)
    assert_close(got[0], want[0], rtol=1e-5, atol=1e-6)
    for g, w in zip(got[1:], want[1:]):
        assert_close(g, w, rtol=0, atol=1e-5)


def _causal_mask() -> np.ndarray:
    """NNC's [1, 1, S, S] float mask: -FLT_MAX above the diagonal, 0 elsewhere."""
    return np.where(np.triu(np.ones((S, S), bool), 1), -np.finfo(f32).max, 0).astype(f32)[
        None, None
    ]


@pytest.mark.parametrize("masked", [False, True], ids=["plain", "attention mask"])
def test_run_scaled_dot_product_attention_with_cnnp_model(masked) -> None:
    """NNC's "run scaled dot product attention with cnnp model" and "run scaled dot product
    attention + attention mask with cnnp model": a model of the command equals the
    command; the masked one is causal attention."""
    inputs = [*_qkv(), *([_causal_mask()] if masked else [])]
    cmd = ops.scaled_dot_product_attention(scale=1 / 8)
    xs = [Input() for _ in inputs]
    model = Model(xs, [CommandLayer(cmd, name="scaled_dot_product_attention")(*xs)])
    model.compile(inputs)
    got = model.evaluate(inputs)
    assert_close(got, cmd(*inputs), rtol=1e-6, atol=1e-7)
    if masked:
        causal = ops.scaled_dot_product_attention(scale=1 / 8, is_causal=True)
        assert_close(got, causal(*inputs[:3]), rtol=1e-6, atol=1e-7)


def _unify_head_model(mask=None):
    q, k, v = Input(), Input(), Input()
    w = Parameter((H * DV, H * DV), init=0.0, name="w")()
    bias = Parameter((H * DV,), init=0.0, name="bias")()
    cmd = ops.scaled_dot_product_attention(scale=1 / 8)
    y, _ = CommandLayer(cmd, outputs=2, name="scaled_dot_product_attention")(q, k, v, mask, w, bias)
    return Model([q, k, v], [y])


def test_run_scaled_dot_product_attention_unify_head_with_cnnp_model() -> None:
    """NNC's "run scaled dot product attention + unify head output with cnnp model": q, k,
    v, no mask, then the head-joining weights and bias as parameters. fnnc's graphs have
    no empty input slot (NNC's NO_TENSOR_SYMBOL): the layer and the builder say so and
    what to pass instead (the zero mask of the next test)."""
    with pytest.raises(ModelError, match=r"input 3 is None.*neutral value"):
        _unify_head_model(None)
    b = GraphBuilder()
    q, k, v = (b.input(a.shape, name=n) for a, n in zip(_qkv(), "qkv"))
    w, bias = b.input((H * DV, H * DV), name="w"), b.input((H * DV,), name="bias")
    with pytest.raises(CommandError, match=r"input 3 is None but input 5 is given.*zero"):
        b.exec(ops.scaled_dot_product_attention(scale=1 / 8), q, k, v, None, w, bias)
    plain = b.exec(ops.scaled_dot_product_attention(scale=1 / 8), q, k, v)
    trailing = b.exec(ops.scaled_dot_product_attention(scale=1 / 8), q, k, v, None, None)
    assert trailing.shape == plain.shape  # the same node: trailing None left out


def test_run_unify_head_with_cnnp_model_through_a_zero_mask() -> None:
    """The case above with fnnc's workaround, an additive zero mask in the mask's place:
    with w and bias set as NNC sets them, the model equals the eager command."""
    zero = Parameter((1, 1, 1, 1), init=0.0, name="mask")()
    model = _unify_head_model(zero)
    q, k, v = _qkv()
    model.compile([q, k, v])
    w, bias = _open_close((H * DV, H * DV), 7), _open_close((H * DV,), 8)
    ids = {p.split("-")[1]: p for p in model.parameters()}
    model.set_parameters({ids["w"]: w, ids["bias"]: bias})
    y, _ = ops.scaled_dot_product_attention(scale=1 / 8)(q, k, v, None, w, bias)
    assert_close(model.evaluate([q, k, v]), y, rtol=1e-6, atol=1e-6)
