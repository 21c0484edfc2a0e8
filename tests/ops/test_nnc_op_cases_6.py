"""NNC's op tests (liuliu/ccv ``test/unit/nnc/*.tests.c``), continued from
``test_nnc_op_cases_5.py``: ``crossentropy.tests.c`` (softmax + categorical
cross-entropy against the fused command, both differentiated in one graph),
``loss.tests.c`` (mse against zero labels, as the unit tests run it),
``layer.norm.tests.c``, ``rmsnorm.tests.c`` and ``group.norm.tests.c`` as NNC builds
them (the normalisation in a symbolic graph, its scale and bias made by ``SET`` in
NNC's x-ranked layout, the saved statistics in NNC's shapes, the backward pass taken
with respect to x, scale and bias) and ``dropout.tests.c`` (the backward reading only
the gradient and the mask, NNC's ``TENSOR_LIST(g, 0, 0, 0, c)``).

The other cases of these files are ported elsewhere: ``test_nnc_batch_norm.py`` and
``test_nnc_op_cases_4.py`` (batch norm), ``test_nnc_op_cases_2.py`` (layer norm, rmsnorm
and smooth L1 against primitives), ``test_nnc_op_cases_4.py`` (label smoothing, sigmoid
binary cross-entropy, group norm gradients), ``tests/graph/test_nnc_bind_parallel_random_cases.py``
(dropout in a graph, random), ``test_nnc_quantize.py`` / ``test_nnc_op_cases_3.py``
(histograms). NNC's ``dsfmt_genrand_open_close`` draws are NumPy draws in (0, 1].
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from fnnc import ops
from fnnc.graph import GraphBuilder, backward, compile, interpret
from tests.helpers import assert_close, assert_tensor_eq

f32, i32 = np.float32, np.int32


def _open_close(shape, seed: int) -> np.ndarray:
    return (1 - np.random.default_rng(seed).random(shape)).astype(f32)


def _key(seed: int) -> np.ndarray:
    return np.asarray(jax.random.key_data(jax.random.key(seed)))


# -- crossentropy.tests.c ----------------------------------------------------------------------


def test_softmax_then_categorical_crossentropy_vs_softmax_crossentropy_in_one_graph() -> None:
    """NNC's "compare softmax + categorical crossentropy v.s. softmax crossentropy
    command": one graph holds softmax -> categorical cross-entropy (loss0) and the fused
    softmax cross-entropy (loss1, b1) on the same logits and an int label of shape [2]
    (rank 1); the backward pass is taken twice, for loss0 then for loss1 on the graph
    that already holds the first gradient, each seeded with ones ("set 1"). The losses
    and the two gradients of a agree; NumPy gives their values."""
    b = GraphBuilder()
    a = b.input((2, 3), name="a")
    label = b.input((2,), i32, name="label")
    b0 = b.exec(ops.softmax(), a, name="softmax")
    loss0 = b.exec(ops.categorical_crossentropy(), b0, label, name="categorical crossentropy")
    loss1, b1 = b.exec(ops.softmax_crossentropy(), a, label, name="softmax crossentropy")
    dloss0, dloss1 = b.input((2, 1), name="dloss0"), b.input((2, 1), name="dloss1")
    graph = b.build([loss0, loss1, b0, b1])
    graph, (da0,) = backward(graph, loss0, [a], df=dloss0)
    graph, (da1,) = backward(graph, loss1, [a], df=dloss1)
    assert tuple(graph.outputs[-2:]) == (da0.id, da1.id)
    assert [graph.symbols[s].shape for s in graph.outputs[:2]] == [(2, 1), (2, 1)]
    logits = np.array([[10, -1, -5], [12, 4, 24]], f32)
    labels = np.array([2, 1], i32)
    ones = np.ones((2, 1), f32)
    got_loss0, got_loss1, got_b0, got_b1, got_da0, got_da1 = (
        np.asarray(v) for v in compile(graph)(logits, labels, ones, ones)
    )
    assert_close(got_loss0, got_loss1, rtol=1e-6, atol=1e-6)
    assert_close(got_da0, got_da1, rtol=0, atol=1e-6)
    assert_close(got_b0, got_b1, rtol=1e-6, atol=1e-7)
    x64 = logits.astype(np.float64)
    e = np.exp(x64 - x64.max(-1, keepdims=True))
    softmax = e / e.sum(-1, keepdims=True)
    want_loss = -np.log(softmax[np.arange(2), labels])[:, None]
    assert_close(got_loss1, want_loss, rtol=1e-6, atol=1e-6)
    assert_close(got_da1, softmax - np.eye(3)[labels], rtol=0, atol=1e-6)


# -- loss.tests.c ------------------------------------------------------------------------------


@pytest.mark.parametrize("reduce", ["mean", "sum"])
def test_mse_loss_against_zero_labels_forward_and_backward(reduce) -> None:
    """NNC's "mse mean loss forward" / "mse sum loss forward" and "mse mean loss
    backward" / "mse sum loss backward": a in (0, 1] [10, 10] against b = 0; the loss of
    sample i is the mean (sum) of a_i^2, and with g = 1 the backward gives
    da = 2 a / 10 (2 a) and db = -da. fnnc keeps the reduced axis: the loss is [10, 1]
    where NNC's test allocates [10]."""
    a, b = _open_close((10, 10), 0), np.zeros((10, 10), f32)
    cmd = ops.mse(reduce=reduce)
    c = cmd(a, b)
    a64 = a.astype(np.float64)
    per = 10.0 if reduce == "mean" else 1.0
    assert_close(c, (a64 * a64).sum(1, keepdims=True) / per, rtol=1e-6, atol=1e-7)
    da, db = cmd.definition.backward((np.ones((10, 1), f32),), (a, b), (c,), **cmd.kwargs)
    assert_close(da, 2 * a64 / per, rtol=1e-6, atol=1e-7)
    assert_close(db, -2 * a64 / per, rtol=1e-6, atol=1e-7)


def test_mse_loss_through_the_backward_pass_of_both_inputs() -> None:
    """NNC's "mse mean loss backward" as a graph: the backward pass of the mean mse with
    respect to a and b (the label, differentiable in NNC's MSE_BACKWARD) seeded with
    ones gives 2 a / 10 and -2 a / 10 for b = 0."""
    g = GraphBuilder()
    a, b = g.input((10, 10), name="a"), g.input((10, 10), name="b")
    c = g.exec(ops.mse(reduce="mean"), a, b, name="mse")
    seed = g.input((10, 1), name="g")
    graph, _ = backward(g.build([c]), c, [a, b], df=seed)
    av = _open_close((10, 10), 0)
    _, da, db = interpret(graph, av, np.zeros((10, 10), f32), np.ones((10, 1), f32))
    assert_close((da, db), (2 * av / 10, -2 * av / 10), rtol=1e-6, atol=1e-7)


# -- layer.norm.tests.c, rmsnorm.tests.c, group.norm.tests.c: as NNC builds them --------------


def _whitening_graph(shape, axes, centre: bool = True):
    """NNC's graph of fine-grained commands: sum over ``axes`` (kept), times 1 / n for the
    mean, x - mean (CMD_ADD_FORWARD(1, -1)), its square summed and scaled for the
    variance, std = exp(log(var) / 2), 1 / std, y = whitening * inv_std; with the
    backward pass of y seeded by dy. ``centre=False`` is rmsnorm's graph (no mean).
    Returns the graph with inputs (x, dy) and outputs (y, dx)."""
    n = float(np.prod([shape[a] for a in axes]))
    b = GraphBuilder()
    x, dy = b.input(shape, name="x"), b.input(shape, name="dy")

    def mean_of(t, name):
        return b.exec(ops.scalar_mul(a=1.0 / n), b.exec(ops.reduce_sum(axes=axes), t), name=name)

    w = b.exec(ops.add(p=1.0, q=-1.0), x, mean_of(x, "mean"), name="whitening") if centre else x
    var = mean_of(b.exec(ops.ewprod(), w, w, name="sqr"), "var")
    logvar_2 = b.exec(ops.scalar_mul(a=0.5), b.exec(ops.ewlog(), var, name="log(var)"))
    std = b.exec(ops.ewexp(), logvar_2, name="std")
    inv_std = b.exec(ops.ewdiv(), b.constant(np.float32(1.0)), std, name="1/std")
    y = b.exec(ops.mul(), w, inv_std, name="y")
    return backward(b.build([y]), y, [x], df=dy)[0]


def _norm_graph(cmd, shape, param_shape, n_params: int):
    """NNC's second graph: ``scale`` SET to 1 and ``bias`` SET to 0 in NNC's layout
    (``param_shape``), the normalisation command with all its outputs, and the backward
    pass of y (seeded by dy) with respect to x and the parameters. Inputs (x, dy);
    outputs (y, the saved statistics, dx, then the parameters' gradients)."""
    b = GraphBuilder()
    x = b.input(shape, name="x")
    params = [
        b.exec(ops.set(shape=param_shape, value=v), name=n)
        for v, n in ((1.0, "set_scale"), (0.0, "set_bias"))[:n_params]
    ]
    outs = b.exec(cmd, x, *params, name=cmd.name)
    dy = b.input(shape, name="dy")
    graph, _ = backward(b.build(list(outs)), outs[0], [x, *params], df=dy)
    return graph


def _affine_grads(dy, y):
    """NNC's scale / bias gradients for scale 1 and bias 0 in the layout [1, ...]:
    sum over the batch of dy * xhat (xhat = y) and of dy."""
    dy, y = dy.astype(np.float64), y.astype(np.float64)
    return (dy * y).sum(0, keepdims=True), dy.sum(0, keepdims=True)


NORMS = {
    # C cases -> (command, x shape, NNC's parameter shape, number of parameters,
    #              NNC's saved statistics shape, fine-grained shape and axes, centre)
    "layer norm": (
        ops.layer_norm(axes=(1, 2, 3), epsilon=0.0),
        (8, 4, 4, 10), (1, 4, 4, 10), 2, (8, 1, 1, 1), (8, 4, 4, 10), (1, 2, 3), True,
    ),
    "layer norm without scale / bias": (
        ops.layer_norm(axes=(1, 2, 3), epsilon=0.0),
        (8, 4, 4, 10), (1, 4, 4, 10), 0, (8, 1, 1, 1), (8, 4, 4, 10), (1, 2, 3), True,
    ),
    "rmsnorm": (
        ops.rms_norm(axes=(1, 2, 3), epsilon=0.0),
        (8, 4, 4, 10), (1, 4, 4, 10), 1, (8, 1, 1, 1), (8, 4, 4, 10), (1, 2, 3), False,
    ),
    "simple group norm (like layer norm)": (
        ops.group_norm(groups=1, axis=3, epsilon=0.0),
        (8, 4, 4, 10), (1, 4, 4, 10), 2, (8, 4, 4, 1), (8, 4, 4, 10), (3,), True,
    ),
    "group norm": (
        ops.group_norm(groups=4, axis=1, epsilon=0.0),
        (8, 16, 5), (1, 16, 5), 2, (8, 4, 5), (8, 4, 4, 5), (2,), True,
    ),
    "group norm without scale / bias": (
        ops.group_norm(groups=4, axis=1, epsilon=0.0),
        (8, 16, 5), (1, 16, 5), 0, (8, 4, 5), (8, 4, 4, 5), (2,), True,
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", list(NORMS))
def test_normalisation_in_a_graph_vs_fine_grained_graph(case) -> None:
    """NNC's "implement layer norm with other symbolic graph" and "compare layer norm
    gradient with other symbolic graph" (CMD_LAYER_NORM_FORWARD(0, 1, 1, 2, 3)), each
    "... without scale / bias" (elementwise_affine 0); "implement rmsnorm with other
    symbolic graph" and "compare rmsnorm gradient ..." (CMD_RMSNORM_FORWARD(0, 1, 2,
    3)); "implement simple group norm (like layer norm) with other symbolic graph"
    (CMD_GROUP_NORM_FORWARD(3, 1, 0, 1)), "implement group norm with other symbolic
    graph" (CMD_GROUP_NORM_FORWARD(1, 4, 0, 1) on [8, 16, 5], the fine-grained graph on
    its [8, 4, 4, 5] view reducing axis 2) and "... without scale / bias", with their
    gradient cases. As NNC builds them: scale and bias SET to 1 and 0 in NNC's x-ranked
    layout inside the graph, saved statistics in NNC's shapes, the backward pass with
    respect to x, scale and bias. y passes NNC's REQUIRE_TENSOR_EQ (128 ULPs) against the
    fine-grained graph; dx matches within 1e-5 (NNC's group norm tolerance; its layer
    norm and rmsnorm cases use REQUIRE_TENSOR_EQ, which float noise near zero breaks for
    one entry of 1280 here, so 1e-5 for all); the parameters' gradients match NumPy's
    closed form."""
    cmd, shape, param_shape, n_params, stat_shape, fine_shape, axes, centre = NORMS[case]
    x = _open_close(fine_shape, 1)
    dy = _open_close(fine_shape, 2) * 2 - 1
    fine = _whitening_graph(fine_shape, axes, centre)
    y_ref, dx_ref = (np.asarray(v) for v in interpret(fine, x, dy))
    graph = _norm_graph(cmd, shape, param_shape, n_params)
    outs = [np.asarray(v) for v in compile(graph)(x.reshape(shape), dy.reshape(shape))]
    n_stats = 1 if cmd.name == "rms_norm" else 2
    y, stats, dx, dparams = outs[0], outs[1 : 1 + n_stats], outs[1 + n_stats], outs[2 + n_stats :]
    assert [s.shape for s in stats] == [stat_shape] * n_stats
    assert_close(y, y_ref.reshape(shape), rtol=0, atol=1e-5)
    assert_tensor_eq(y, y_ref.reshape(shape))  # NNC's REQUIRE_TENSOR_EQ on y
    assert_close(dx, dx_ref.reshape(shape), rtol=0, atol=1e-5)
    assert [p.shape for p in dparams] == [param_shape] * n_params
    want = _affine_grads(dy.reshape(shape), y_ref.reshape(shape))[:n_params]
    assert_close(dparams, list(want), rtol=1e-4, atol=1e-4)


# -- dropout.tests.c ---------------------------------------------------------------------------

A = ((np.arange(1000) + 1) * 0.01).reshape(20, 50).astype(f32)
G = (np.arange(1000) + 1).reshape(20, 50).astype(f32)


def test_dropout_forty_percent_and_its_gradient_from_the_mask_alone() -> None:
    """NNC's "dropout 40% of a 20x50 matrix" and "dropout gradient for 40% of a 20x30
    matrix" as the C test runs the commands: CMD_DROPOUT_FORWARD(0.4) on a = (i + 1) /
    100 gives b, 40% +- 5% zeros and a / 0.6 elsewhere (within 1e-5); CMD_DROPOUT_BACKWARD
    reads only g = i + 1 and the mask c (``TENSOR_LIST(g, 0, 0, 0, c)``): h is g / 0.6
    where b is kept and 0 where dropped."""
    cmd = ops.dropout(p=0.4)
    for seed in range(3):
        b, c = (np.asarray(v) for v in cmd(A, _key(seed)))
        assert c.shape == A.shape
        kept = b != 0
        assert abs((~kept).mean() - 0.4) <= 5e-2
        assert_close(b[kept], A[kept] / 0.6, rtol=0, atol=1e-5)
        h, _ = cmd.definition.backward((G, None), (None, None), (None, c), **cmd.kwargs)
        h = np.asarray(h)
        assert abs((h == 0).mean() - 0.4) <= 5e-2
        assert_close(h, np.where(kept, G / 0.6, 0), rtol=1e-6, atol=0)


def test_dropout_entire_matrix_and_its_gradient_from_the_mask_alone() -> None:
    """NNC's "dropout entire matrix with 20% chance" and "dropout gradient entire matrix
    with 20% chance": CMD_DROPOUT_FORWARD(0.2, 1) zeroes all of a or scales all of it by
    1 / 0.8; the backward from g and the mask alone does the same to g. Over 16 keys
    both outcomes occur."""
    cmd = ops.dropout(p=0.2, entirety=True)
    dropped = []
    for seed in range(16):
        b, c = (np.asarray(v) for v in cmd(A, _key(seed)))
        dropped.append(bool(b.flat[0] == 0))
        scale = 0.0 if dropped[-1] else 1 / 0.8
        assert_close(b, A * scale, rtol=1e-6, atol=0)
        h, _ = cmd.definition.backward((G, None), (None, None), (None, c), **cmd.kwargs)
        assert_close(h, G * scale, rtol=1e-6, atol=0)
    assert 0 < sum(dropped) < 16
