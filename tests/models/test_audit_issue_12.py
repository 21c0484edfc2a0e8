"""Audit of issue 12 (NNC fidelity), checked as the issue states it.

Promises checked:

- Model files written by NNC (shared/nnc-files, see its README) load into fnnc's
  ``Sequential([Dense(8), ReLU(), Dense(3)])`` under NNC's ids (``t-0-0`` .. ``t-1-1``;
  ``__mlp__[t-0-0]`` with ``name="mlp"``) and reproduce NNC's forward to 1e-6; named
  sub-models give ``t-mlp-0-fc1-0-0`` ..; appending a parameter-free layer keeps every
  id; internals are ``<id>(<replica>)``; the same ids in ``Model.write`` and
  ``Checkpoints``.
- Commands: min / max backward sends a tie's gradient to both inputs; gemm and Dense
  take rank-1 operands (``[1, 2] x [[7,8,9],[10,11,12]]``); group_norm's
  ``reduce_axes`` (none by default) and its no-scale / no-bias form; float
  ``index_select`` interpolates; ``reduce_isnan``; attention's fused output
  projection with ``None`` for the mask in eager calls; ``GraphBuilder.input(None)`` and
  shape-less output symbols; ``TensorFile.read(name, shape=smaller)``; ``simplify``
  fusing softmax + cross-entropy after ``backward``.
- ``fold`` and ``fuse`` reach their fixpoint in one run on the issue's graphs.
- Dynamic graph: ``free`` of a gradient, ``evaluate(model, inputs)`` of a cnnp model
  trained through ``apply_gradients``, fresh Optax objects keyed by structure with the
  learning rate as an input, ``create_graph=True``, a taped ``while_loop``.
- Traced graphs with generic primitives save and load (``rsqrt``, GELU), and a
  tampered StableHLO blob is a ``GraphFormatError``.

Oracles: NNC's numbers from its C tests and the README of the NNC-written files, NumPy,
``jax.grad`` / ``jax.vjp``, Optax applied directly.
"""

from __future__ import annotations

import base64
import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import fnnc.graph as G
from fnnc import ops
from fnnc.errors import CommandError, GraphError, GraphFormatError, ShapeError
from fnnc.graph import DynamicGraph, GraphBuilder, backward, compile, interpret
from fnnc.graph.passes import fold, fuse
from fnnc.io import Checkpoints, TensorFile, read_parameters
from fnnc.models import Activation, BatchNorm, Dense, Input, Model, ReLU, Sequential
from tests.helpers import NNC_FILES, needs_nnc_files

# NNC_FILES/README.md: the weights, the input, and NNC's output for it.
W1 = np.array([[(((o * 4 + i) * 5) % 11 - 5) / 8 for i in range(4)] for o in range(8)], np.float32)
B1 = np.array([(o - 3.5) / 16 for o in range(8)], np.float32)
W2 = np.array([[(((o * 8 + i) * 3) % 7 - 3) / 8 for i in range(8)] for o in range(3)], np.float32)
B2 = np.array([0.125, -0.25, 0.375], np.float32)
X = np.array([i * 0.1 - 0.4 for i in range(8)], np.float32).reshape(2, 4)
NNC_OUT = np.array(
    [[-0.0210937411, -0.219531253, 0.30859375], [0.11328125, -0.291406244, 0.375]], np.float32
)
UNNAMED = ["t-0-0", "t-0-1", "t-1-0", "t-1-1"]
NAMED = ["t-mlp-0-fc1-0-0", "t-mlp-0-fc1-0-1", "t-mlp-0-fc2-0-0", "t-mlp-0-fc2-0-1"]


def _numpy_forward(x: np.ndarray) -> np.ndarray:
    return np.maximum(x @ W1.T + B1, 0) @ W2.T + B2


def _compiled(*extra, named: bool = False) -> Model:
    if named:
        layers = [Dense(8, name="fc1"), ReLU(name="act"), Dense(3, name="fc2"), *extra]
        model = Sequential(layers, name="mlp")
    else:
        model = Sequential([Dense(8), ReLU(), Dense(3), *extra])
    model.compile([np.zeros((2, 4), np.float32)])
    return model


# -- model files written by NNC ---------------------------------------------------------


@needs_nnc_files
@pytest.mark.parametrize(
    ("file", "name"), [("model.sqlite3", None), ("model_named.sqlite3", "mlp")]
)
def test_nnc_written_model_file_reproduces_nnc_forward(file, name):
    """Model.read of NNC's file: NNC's ids, README weights, NNC's output to 1e-6."""
    model = _compiled()
    assert sorted(model.parameters()) == UNNAMED
    assert model.read(NNC_FILES / file, name=name) == []
    got = np.asarray(model.evaluate([X]))
    np.testing.assert_allclose(got, NNC_OUT, rtol=0, atol=1e-6)
    np.testing.assert_allclose(got, _numpy_forward(X), rtol=0, atol=1e-6)


@needs_nnc_files
def test_read_parameters_finds_exactly_nnc_s_ids():
    """Without expectations, read_parameters lists the ids NNC wrote, per model name."""
    plain = read_parameters(NNC_FILES / "model.sqlite3")
    assert sorted(plain) == UNNAMED and not plain.internals
    named = read_parameters(NNC_FILES / "model_named.sqlite3", name="mlp")
    assert sorted(named) == UNNAMED
    np.testing.assert_array_equal(named["t-0-0"], W1)
    np.testing.assert_array_equal(named["t-1-1"], B2)


@needs_nnc_files
def test_appending_softmax_keeps_ids_so_nnc_s_file_still_loads():
    """A parameter-free layer appended: same ids; output is softmax of NNC's output."""
    model = _compiled(Activation("softmax"))
    assert sorted(model.parameters()) == UNNAMED
    assert model.read(NNC_FILES / "model.sqlite3") == []
    e = np.exp(NNC_OUT - NNC_OUT.max(-1, keepdims=True))
    np.testing.assert_allclose(
        np.asarray(model.evaluate([X])), e / e.sum(-1, keepdims=True), rtol=0, atol=1e-6
    )


@needs_nnc_files
def test_ids_read_from_nnc_hold_in_write_and_checkpoints(tmp_path):
    """Model.write(name="mlp") rows and checkpoint rows use the ids NNC's file has."""
    model = _compiled()
    model.read(NNC_FILES / "model_named.sqlite3", name="mlp")
    model.write(tmp_path / "again.sqlite3", name="mlp")
    want = [f"__mlp__[{i}]" for i in UNNAMED]
    assert TensorFile(tmp_path / "again.sqlite3", readonly=True).names() == want
    assert TensorFile(NNC_FILES / "model_named.sqlite3", readonly=True).names() == want
    with Checkpoints(tmp_path / "run.ckpt") as ckpt:
        ckpt.save(4, model)
        rows = set(ckpt.file.names())
    assert {f"__ckpt-4__[{i}]" for i in UNNAMED} <= rows


def test_named_submodels_ids_and_a_file_in_nnc_row_format(tmp_path):
    """mlp/fc1/act/fc2 give t-mlp-0-fc1-0-0 ..; rows __net__[<id>] read back, forward right."""
    model = _compiled(named=True)
    assert sorted(model.parameters()) == NAMED
    with TensorFile(tmp_path / "n.sqlite3") as f, f.transaction():
        for pid, value in zip(NAMED, (W1, B1, W2, B2)):
            f.write(f"__net__[{pid}]", value, "NHWC")
    assert model.read(tmp_path / "n.sqlite3", name="net") == []
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    np.testing.assert_allclose(np.asarray(model.evaluate([x])), _numpy_forward(x), atol=1e-6)
    softmaxed = _compiled(Activation("softmax"), named=True)
    assert sorted(softmaxed.parameters()) == NAMED


def test_internals_are_rows_with_their_replica(tmp_path):
    """BatchNorm's running statistics: r-1-0(0), r-1-1(0); a file in that layout loads."""
    model = Sequential([Dense(8), BatchNorm(epsilon=1e-5), ReLU(), Dense(3)])
    model.compile([np.zeros((2, 4), np.float32)])
    ids = sorted(model.parameters())
    assert ids == ["r-1-0", "r-1-1", "t-0-0", "t-0-1", "t-1-0", "t-1-1", "t-2-0", "t-2-1"]
    scale, bias = np.linspace(0.5, 1.5, 8), np.linspace(-0.2, 0.2, 8)
    mean, var = np.linspace(-0.1, 0.1, 8), np.linspace(0.5, 2.0, 8)
    rows = {"t-0-0": W1, "t-0-1": B1, "t-1-0": scale, "t-1-1": bias, "t-2-0": W2, "t-2-1": B2}
    rows |= {"r-1-0(0)": mean, "r-1-1(0)": var}
    with TensorFile(tmp_path / "bn.sqlite3") as f, f.transaction():
        for row, value in rows.items():
            f.write(row, np.asarray(value, np.float32))
    assert model.read(tmp_path / "bn.sqlite3") == []
    h = (X @ W1.T + B1 - mean) / np.sqrt(var + 1e-5) * scale + bias
    want = np.maximum(h, 0) @ W2.T + B2
    np.testing.assert_allclose(np.asarray(model.evaluate([X])), want, rtol=1e-5, atol=1e-5)


# -- commands ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["min", "max"])
def test_min_max_tie_gradient_reaches_both_inputs_in_graphs(name):
    """backward pass, compiled program and dynamic graph: a tie feeds both inputs."""
    a = np.array([1, 2, 3, 4], np.float32)
    c = np.array([1, 0, 3, 5], np.float32)  # ties at 0 and 2
    first_wins = a < c if name == "min" else a > c
    want_a = np.where((a == c) | first_wins, 1, 0)
    want_c = np.where((a == c) | ~first_wins, 1, 0)
    b = GraphBuilder()
    sa, sc = b.input((4,), name="a"), b.input((4,), name="c")
    total = b.exec(ops.reduce_sum(axes=(0,)), b.exec(getattr(ops, name)(), sa, sc))
    graph, _ = backward(b.build([total]), total, [sa, sc])
    for run in (lambda *v: interpret(graph, *v), compile(graph)):
        _, ga, gc = run(a, c)
        np.testing.assert_array_equal(ga, want_a)
        np.testing.assert_array_equal(gc, want_c)
    dg = DynamicGraph()
    va, vc = dg.variable(a), dg.variable(c)
    ga, gc = dg.backward(dg.exec(getattr(ops, name)(), va, vc).sum(), [va, vc])
    np.testing.assert_array_equal(ga.numpy(), want_a)
    np.testing.assert_array_equal(gc.numpy(), want_c)


def test_gemm_rank1_nnc_numbers_in_a_compiled_graph():
    """[1, 2] x [[7, 8, 9], [10, 11, 12]] = [27, 30, 33] (gemm.tests.c)."""
    b = GraphBuilder()
    a, m = b.input((2,), name="a"), b.input((2, 3), name="m")
    graph = b.build([b.exec(ops.gemm(), a, m)])
    got = compile(graph)(np.float32([1, 2]), np.float32([[7, 8, 9], [10, 11, 12]]))
    assert got.shape == (3,)
    np.testing.assert_array_equal(got, [27, 30, 33])


def test_dense_takes_a_rank1_input_and_trains():
    """Dense on a [4] input gives [3]; one SGD step equals optax on jax.grad of the same."""
    x, y = np.float32([0.5, -1.0, 2.0, 0.25]), np.float32([1, 0, -1])
    model = Sequential([Dense(3)])
    model.compile([x], loss="mse", minimizer=optax.sgd(0.1))
    p = {k: jnp.asarray(v) for k, v in model.parameters().items()}
    out = np.asarray(model.evaluate([x]))
    assert out.shape == (3,)
    np.testing.assert_allclose(out, p["t-0-0"] @ x + p["t-0-1"], rtol=1e-6)
    model.fit([x], [y])

    def loss(q):
        return jnp.mean((q["t-0-0"] @ x + q["t-0-1"] - y) ** 2)

    want = jax.tree.map(lambda v, g: v - 0.1 * g, p, jax.grad(loss)(p))
    for k in p:
        np.testing.assert_allclose(np.asarray(model.parameters()[k]), want[k], rtol=1e-6, atol=1e-7)


def test_group_norm_reduces_no_extra_axes_by_default():
    """Default group_norm normalises each position over its group's channels only."""
    x = np.random.default_rng(1).uniform(0, 1, (8, 16, 5)).astype(np.float32)
    y, mean, _ = ops.group_norm(groups=4, axis=1)(x)
    split = x.reshape(8, 4, 4, 5)
    m, v = split.mean(2, keepdims=True), split.var(2, keepdims=True)
    assert mean.shape == (8, 4, 5)
    np.testing.assert_allclose(y, ((split - m) / np.sqrt(v + 1e-5)).reshape(x.shape), atol=1e-4)


def test_group_norm_reduce_axes_without_scale_or_bias_in_a_graph():
    """reduce_axes=(2,) and no affine inputs: NumPy statistics over channels and axis 2."""
    x = np.random.default_rng(2).standard_normal((2, 6, 3, 4)).astype(np.float32)
    b = GraphBuilder()
    sx = b.input(x.shape, name="x")
    y, mean, _ = b.exec(ops.group_norm(groups=3, axis=1, reduce_axes=(2,), epsilon=1e-5), sx)
    graph = b.build([y, mean])
    got_y, got_mean = compile(graph)(x)
    split = x.reshape(2, 3, 2, 3, 4)
    m, v = split.mean((2, 3), keepdims=True), split.var((2, 3), keepdims=True)
    assert got_mean.shape == (2, 3, 1, 4)
    np.testing.assert_allclose(got_mean, m.reshape(2, 3, 1, 4), rtol=1e-5, atol=1e-6)
    want = ((split - m) / np.sqrt(v + 1e-5)).reshape(x.shape)
    np.testing.assert_allclose(got_y, want, rtol=1e-4, atol=1e-5)


def test_index_select_float_positions_in_a_graph_and_their_gradient():
    """[[1,2],[2,3],[3,4]] at [1.5, 0.4] -> [[2.5,3.5],[1.4,2.4]]; backward vs jax.grad."""
    rows = np.float32([[1, 2], [2, 3], [3, 4]])
    idx = np.float32([1.5, 0.4])
    b = GraphBuilder()
    sx, si = b.input((3, 2), name="x"), b.input((2,), name="i")
    picked = b.exec(ops.index_select(), sx, si)
    total = b.exec(ops.reduce_sum(axes=(0, 1)), b.exec(ops.ewprod(), picked, picked))
    graph, _ = backward(b.build([picked, total]), total, [sx])
    got, _, gx = compile(graph)(rows, idx)
    np.testing.assert_allclose(got, [[2.5, 3.5], [1.4, 2.4]], rtol=1e-6)

    def oracle(x):
        j = jnp.floor(idx).astype(jnp.int32)
        w = (idx - j)[:, None]
        p = (1 - w) * x[j] + w * x[jnp.minimum(j + 1, 2)]
        return jnp.sum(p * p)

    np.testing.assert_allclose(gx, jax.grad(oracle)(rows), rtol=1e-5)


def test_reduce_isnan_in_a_graph_nnc_numbers():
    """isnan of [[nan, 2, 3], [4, 5, 6]] over axis 1: int32 [[1], [0]] (reduce.tests.c)."""
    b = GraphBuilder()
    sx = b.input((2, 3), name="x")
    graph = b.build([b.exec(ops.reduce_isnan(axes=(1,)), sx)])
    got = compile(graph)(np.float32([[np.nan, 2, 3], [4, 5, 6]]))
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, [[1], [0]])


def test_attention_unify_head_with_none_mask_matches_numpy():
    """sdpa(q, k, v, None, w, bias): per-head softmax attention, heads joined, x w^T + b."""
    rng = np.random.default_rng(3)
    q, k = rng.uniform(0, 1, (1, 4, 2, 3)), rng.uniform(0, 1, (1, 5, 2, 3))
    v, w, bias = rng.uniform(0, 1, (1, 5, 2, 3)), rng.uniform(0, 1, (6, 6)), rng.uniform(0, 1, 6)
    q, k, v, w, bias = (a.astype(np.float32) for a in (q, k, v, w, bias))
    y, _ = ops.scaled_dot_product_attention(scale=0.5)(q, k, v, None, w, bias)
    logits = np.einsum("bshd,bthd->bhst", q, k) * 0.5
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    joined = np.einsum("bhst,bthd->bshd", p, v).reshape(1, 4, 6)
    np.testing.assert_allclose(y, joined @ w.T + bias, rtol=1e-5, atol=1e-6)


def test_auto_shapes_and_clear_errors_for_bad_shapes():
    """input(None) + set_shape, a shape-less output filled by its writer; bad shapes raise."""
    b = GraphBuilder()
    x = b.input(None, name="x")
    h = b.tensor(None, name="h")
    b.exec(ops.ewexp(), x, outputs=[h])
    b.set_shape(x, (2, 2))
    graph = b.build([h])
    xs = np.float32([[0, 1], [2, -1]])
    np.testing.assert_allclose(compile(graph)(xs), np.exp(xs), rtol=1e-6)
    for bad in (3, "ab", (2.5,), (-1, 2)):
        with pytest.raises(GraphError):
            GraphBuilder().input(bad, name="bad")
        with pytest.raises(GraphError):
            GraphBuilder().tensor(bad)


@needs_nnc_files
def test_tensor_file_read_into_a_smaller_shape_takes_the_first_values():
    """NNC's f32 (2, 3, 4) read as (2, 3) gives its first 6 values; larger is an error."""
    want = (np.arange(24, dtype=np.float32) * 0.5 - 3).reshape(2, 3, 4)
    with TensorFile(NNC_FILES / "tensors.sqlite3", readonly=True) as f:
        np.testing.assert_array_equal(
            f.read("f32", shape=(2, 3)), want.reshape(-1)[:6].reshape(2, 3)
        )
        np.testing.assert_array_equal(f.read("f32", shape=(5,)), want.reshape(-1)[:5])
        np.testing.assert_array_equal(f.read("f32", shape=(4, 6)), want.reshape(4, 6))
        with pytest.raises(ShapeError):
            f.read("f32", shape=(5, 5))


def test_simplify_fuses_softmax_crossentropy_after_backward():
    """softmax -> categorical CE, backward, simplify: one fused loss; jax.grad's numbers."""
    logits, labels = np.float32([[10, -1, -5], [12, 4, 24]]), np.int32([2, 1])
    b = GraphBuilder()
    x, lab = b.input((2, 3), name="x"), b.input((2,), np.int32, name="label")
    loss = b.exec(ops.categorical_crossentropy(), b.exec(ops.softmax(), x), lab)
    total = b.exec(ops.reduce_sum(axes=(0, 1)), loss)
    graph, _ = backward(b.build([total]), total, [x])
    simple = G.simplify(graph)
    names = [n.cmd.name for n in simple.nodes]
    assert "softmax_crossentropy" in names and "softmax" not in names, names
    assert "categorical_crossentropy" not in names, names
    got_total, gx = compile(simple)(logits, labels)

    def oracle(z):
        return -jnp.sum(jnp.take_along_axis(jax.nn.log_softmax(z), labels[:, None], axis=1))

    np.testing.assert_allclose(np.reshape(got_total, ()), oracle(logits), rtol=1e-5)
    np.testing.assert_allclose(gx, jax.grad(oracle)(logits), rtol=1e-5, atol=1e-6)


# -- passes at their fixpoint --------------------------------------------------------------


@pytest.mark.parametrize("identity", ["ewsum", "min"])
def test_fold_reaches_its_fixpoint_in_one_run(identity):
    """c = constant; s = ewsum(c) | min(c, c); v = alias(s); ewabs(v): fold(fold(g)) is fold(g)."""
    b = GraphBuilder()
    x = b.input((3,), name="x")
    c = b.constant(np.float32([[-1, 2, -3], [4, -5, 6]]))
    s = b.exec(ops.ewsum(), c) if identity == "ewsum" else b.exec(ops.min(), c, c)
    v = b.alias(s, (1, 3), offset=(1, 0))
    a = b.exec(ops.reshape(shape=(3,)), b.exec(ops.ewabs(), v))
    graph = b.build([b.exec(ops.ewprod(), x, a)])
    once = fold(graph)
    assert fold(once) is once
    assert "ewabs" not in [n.cmd.name for n in once.nodes]
    xs = np.float32([1, 2, 3])
    np.testing.assert_array_equal(interpret(once, xs), xs * np.float32([4, 5, 6]))


def test_fuse_reaches_its_fixpoint_in_one_run():
    """s = sigmoid(x); a = ewabs(s); ewdiv(s, a): all three fused at once."""
    b = GraphBuilder()
    x = b.input((2, 3), name="x")
    s = b.exec(ops.sigmoid(), x)
    graph = b.build([b.exec(ops.ewdiv(), s, b.exec(ops.ewabs(), s))])
    once = fuse(graph)
    assert fuse(once) is once
    assert len(once.nodes) == 1 and once.nodes[0].cmd.name == "fused_elementwise"
    xs = np.float32([[0.5, -1, 2], [0, 3, -4]])
    sig = 1 / (1 + np.exp(-xs))
    np.testing.assert_allclose(interpret(once, xs), sig / np.abs(sig), rtol=1e-6)


# -- dynamic graph and cnnp together --------------------------------------------------------


def test_freeing_a_gradient_drops_it_from_the_accumulator():
    """dg.free(dx) on backward's result: grad is gone; the next backward works afresh."""
    dg = DynamicGraph()
    x = dg.variable(np.float32([2.0, -1.0]), name="x")
    (dx,) = dg.backward((x * x * x).sum(), [x])
    np.testing.assert_allclose(dx.numpy(), [12, 3])
    dg.free(dx)
    assert dg.grad(x) is None
    (again,) = dg.backward((x * x * x).sum(), [x])
    np.testing.assert_allclose(again.numpy(), [12, 3])


def test_evaluate_a_cnnp_model_in_the_dynamic_graph_and_train_it_with_apply_gradients():
    """One node; gradients reach the model's parameters; apply_gradients(sgd) trains it."""
    x = Input()
    model = Model([x], [Dense(2, name="out")(Dense(3, name="hid")(x))])
    model.compile([np.zeros((4, 3), np.float32)])
    rng = np.random.default_rng(4)
    xs, target = rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal((4, 2))
    target = target.astype(np.float32)
    start = {k: jnp.asarray(v) for k, v in model.parameters().items()}
    dg = DynamicGraph()
    d = dg.evaluate(model, [dg.constant(xs)]) - dg.constant(target)
    assert dg.num_nodes == 2  # the model's call and the subtraction
    params = dg.parameters(model)
    dg.backward((d * d).sum(), list(params.values()))
    dg.apply_gradients(optax.sgd(0.05), list(params.values()))

    def loss(p):
        h = xs @ p["t-hid-0-0"].T + p["t-hid-0-1"][None]
        return jnp.sum((h @ p["t-out-0-0"].T + p["t-out-0-1"][None] - target) ** 2)

    grads = jax.grad(loss)(start)
    for k in start:
        want = start[k] - 0.05 * grads[k]
        np.testing.assert_allclose(np.asarray(model.parameters()[k]), want, rtol=1e-5, atol=1e-5)


def test_a_fresh_adam_per_model_step_keeps_state_and_one_program():
    """set_minimizer(optax.adam(lr)) anew each step: Optax's numbers, one fit program."""
    x = np.random.default_rng(5).standard_normal((4, 3)).astype(np.float32)
    y = np.ones((4, 2), np.float32)
    model = Sequential([Dense(2)])
    model.compile([x], loss="mse", minimizer=optax.adam(0.1))
    p = {k: jnp.asarray(v) for k, v in model.parameters().items()}
    lrs = [0.1, 0.05, 0.2]
    opt = optax.inject_hyperparams(optax.adam)(learning_rate=0.1)
    state = opt.init(p)

    def loss(q):
        return jnp.mean((x @ q["t-0-0"].T + q["t-0-1"][None] - y) ** 2)

    for lr in lrs:
        model.set_minimizer(optax.adam(lr))
        model.fit([x], [y])
        state.hyperparams["learning_rate"] = jnp.float32(lr)
        updates, state = opt.update(jax.grad(loss)(p), state, p)
        p = optax.apply_updates(p, updates)
    assert [k[0] for k in model.engine._programs] == ["fit"]
    for k in p:
        np.testing.assert_allclose(np.asarray(model.parameters()[k]), p[k], rtol=1e-4, atol=1e-5)


def test_a_new_learning_rate_recompiles_nothing_in_the_dynamic_graph():
    """dg.minimize with optax.adam(0.1) then optax.adam(0.2): state kept, no new program."""
    dg = DynamicGraph()
    w = dg.variable(np.float32([1.0, -2.0]), name="w")
    dg.minimize(optax.adam(0.1), (w * w).sum(), [w])
    compiled = dg.num_compiled
    dg.minimize(optax.adam(0.2), (w * w).sum(), [w])
    p = jnp.float32([1.0, -2.0])
    opt = optax.inject_hyperparams(optax.adam)(learning_rate=0.1)
    state = opt.init(p)
    for lr in (0.1, 0.2):
        state.hyperparams["learning_rate"] = jnp.float32(lr)
        updates, state = opt.update(2 * p, state, p)
        p = optax.apply_updates(p, updates)
    np.testing.assert_allclose(w.numpy(), p, rtol=1e-5)  # the state carried over
    assert dg.num_compiled == compiled


def test_create_graph_gives_second_derivatives():
    """d2/dx2 of sum(x * exp(x)) through backward(create_graph=True), vs jax."""
    x0 = np.float32([0.5, -1.0, 1.5])
    dg = DynamicGraph()
    x = dg.variable(x0, name="x")
    (dx,) = dg.backward((x * dg.exec(ops.ewexp(), x)).sum(), [x], create_graph=True)
    (dxx,) = dg.backward(dx.sum(), [x])
    f = lambda z: jnp.sum(z * jnp.exp(z))
    np.testing.assert_allclose(dx.numpy(), jax.grad(f)(x0), rtol=1e-5)
    np.testing.assert_allclose(dxx.numpy(), (2 + x0) * np.exp(x0), rtol=1e-5)


def _power_loop(tape: int):
    """z <- z * x while z < t (trip count from the data); returns the graph and dz/dx."""
    body_b = GraphBuilder()
    z0, x0, t0 = (body_b.input((1,), name=n) for n in ("z0", "x", "t"))
    z1 = body_b.exec(ops.ewprod(), z0, x0, name="z1")
    body = body_b.build([z1])
    cond_b = GraphBuilder()
    cond_b.input((), np.int32, name="count")
    z, t = cond_b.input((1,), name="z"), cond_b.input((1,), name="t")
    less = cond_b.exec(ops.compare(op="lt"), z, t)
    cond = cond_b.build([cond_b.exec(ops.reshape(shape=()), less)])
    b = GraphBuilder()
    x, tt = b.input((1,), name="x"), b.input((1,), name="t")
    one = b.constant(np.ones(1, np.float32))
    (zf,) = G.while_loop(
        b, body, cond, [one, x, tt], carry_overs={z1: z0}, cond_inputs=[z0, t0], tape=tape
    )
    total = b.exec(ops.reshape(shape=()), zf)
    graph, _ = backward(b.build([total]), total, [x])
    return graph


def test_a_taped_while_loop_is_differentiable_and_overflow_is_clear():
    """1.5**n first reaching 5 takes n = 4 trips: d/dx x**4 = 4 * 1.5**3; tape too short raises."""
    got_z, gx = compile(_power_loop(tape=8))(np.float32([1.5]), np.float32([5.0]))
    np.testing.assert_allclose(got_z, 1.5**4, rtol=1e-6)
    np.testing.assert_allclose(gx, [4 * 1.5**3], rtol=1e-6)
    with pytest.raises(CommandError, match="tape"):
        np.asarray(compile(_power_loop(tape=2))(np.float32([1.5]), np.float32([5.0]))[1])


# -- traced graphs with generic primitives save ---------------------------------------------


def test_the_issue_s_rsqrt_graph_saves_loads_and_runs(tmp_path):
    """G.save(G.trace(lambda x: jax.lax.rsqrt(x), jnp.ones(3)), "g.json") then load."""
    path = str(tmp_path / "g.json")
    G.save(G.trace(lambda x: jax.lax.rsqrt(x), jnp.ones(3)), path)
    xs = np.float32([1, 4, 16])
    np.testing.assert_allclose(G.interpret(G.load(path), xs), [1, 0.5, 0.25], rtol=1e-6)


def test_a_traced_nnx_mlp_with_gelu_saves_with_identical_outputs(tmp_path):
    """An NNX MLP with (tanh) GELU and a cumsum: outputs identical after save / load."""
    from flax import nnx

    class MLP(nnx.Module):
        def __init__(self, rngs):
            self.a, self.b = nnx.Linear(4, 8, rngs=rngs), nnx.Linear(8, 2, rngs=rngs)

        def __call__(self, x):
            return jnp.cumsum(self.b(nnx.gelu(self.a(x))), axis=-1)

    module = MLP(nnx.Rngs(0))
    xs = np.random.default_rng(6).standard_normal((3, 4)).astype(np.float32)
    graph = G.trace(module, xs)
    path = str(tmp_path / "mlp.json")
    G.save(graph, path)
    before = np.asarray(G.interpret(graph, xs, *_weights(graph, module, xs)))
    after = np.asarray(G.interpret(G.load(path), xs, *_weights(graph, module, xs)))
    np.testing.assert_array_equal(after, before)
    np.testing.assert_allclose(before, module(xs), rtol=1e-5, atol=1e-6)


def _weights(graph, module, xs):
    """The arrays a traced graph takes after x: its captured parameters, if inputs."""
    n_in = len(graph.inputs)
    if n_in == 1:
        return []
    from flax import nnx

    leaves = jax.tree.leaves(nnx.state(module, nnx.Param))
    assert len(leaves) == n_in - 1
    return leaves


def test_a_tampered_stablehlo_blob_is_a_graph_format_error(tmp_path):
    """A changed byte in a saved generic node's module: GraphFormatError, not a crash."""
    path = tmp_path / "g.json"
    G.save(G.trace(lambda x: jnp.cumsum(x) * 2, jnp.ones(3)), str(path))
    data = json.loads(path.read_text())
    touched = 0
    for node in data["nodes"]:
        for key, value in node["cmd"]["params"]:
            if key == "module" and isinstance(value, dict) and "$stablehlo" in value:
                blob = bytearray(base64.b64decode(value["$stablehlo"]))
                blob[len(blob) // 3] ^= 0x55
                value["$stablehlo"] = base64.b64encode(bytes(blob)).decode()
                touched += 1
    assert touched == 1
    path.write_text(json.dumps(data))
    with pytest.raises(GraphFormatError):
        G.load(str(path))
