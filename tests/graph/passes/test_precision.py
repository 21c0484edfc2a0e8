"""cast_precision keeps a graph's meaning within bfloat16/float16 tolerance."""

from __future__ import annotations

import dataclasses

import jax
import ml_dtypes
import numpy as np
import pytest

from fnnc import ops
from fnnc.errors import GraphError
from fnnc.graph import (
    GraphBuilder,
    backward,
    case_of,
    cast_precision,
    compile,
    interpret,
    while_loop,
)


def _mlp():
    b = GraphBuilder()
    x, w, y = b.input((8, 5), name="x"), b.input((3, 5), name="w"), b.input((8,), np.int32)
    logits = b.exec(ops.tanh(), b.exec(ops.gemm(transpose_b=True), x, w))
    loss = b.exec(ops.softmax_crossentropy(), logits, y)
    loss = loss[0] if isinstance(loss, tuple) else loss
    return b.build([b.exec(ops.reduce_mean(axes=(0,)), loss), logits])


@pytest.mark.parametrize("dtype,tol", [("bfloat16", 2e-2), ("float16", 2e-3)])
def test_semantics_within_low_precision_tolerance(dtype, tol):
    rng = np.random.default_rng(0)
    x, w = rng.normal(size=(8, 5)), rng.normal(size=(3, 5))
    args = (x.astype(np.float32), w.astype(np.float32), rng.integers(0, 3, 8).astype(np.int32))
    graph = _mlp()
    low = cast_precision(graph, dtype)
    want, got = interpret(graph, *args), interpret(low, *args)
    for a, b in zip(got, want):
        assert a.dtype == np.float32  # outputs keep their types
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=tol, atol=tol)
    names = {low.symbols[n.outputs[0]].dtype.name: n.cmd.name for n in low.nodes}
    gemm = next(n for n in low.nodes if n.cmd.name == "gemm")
    assert low.symbols[gemm.outputs[0]].dtype.name == dtype, names
    ce = next(n for n in low.nodes if n.cmd.name == "softmax_crossentropy")
    assert all(low.symbols[s].dtype.name in ("float32", "int32") for s in ce.inputs)
    assert low.inputs == graph.inputs


def test_unknown_dtype_says_what_is_accepted():
    with pytest.raises(GraphError, match="expected one of"):
        cast_precision(_mlp(), "float8")


def test_data_movement_keeps_its_input_type_no_round_trip():
    """A float32 loss reshaped to a scalar stays float32: it is not rounded to the low
    type and converted back (the loss a bfloat16 model reported had 3 digits)."""
    b = GraphBuilder()
    x, w, y = b.input((8, 5), name="x"), b.input((3, 5), name="w"), b.input((8,), np.int32)
    logits = b.exec(ops.gemm(transpose_b=True), x, w)
    loss, _ = b.exec(ops.softmax_crossentropy(), logits, y)
    mean = b.exec(ops.reduce_mean(axes=(0, 1)), loss)
    scalar = b.exec(ops.reshape(shape=()), mean)
    low = cast_precision(b.build([scalar, b.exec(ops.transpose(perm=(1, 0)), logits)]), "bfloat16")
    after = next(n for n in low.nodes if n.cmd.name == "reduce_mean")
    readers = [n for n in low.nodes if after.outputs[0] in n.inputs]
    assert [n.cmd.name for n in readers] == ["reshape"]
    assert low.symbols[readers[0].outputs[0]].dtype == np.float32
    # a transpose of low logits stays low (converted to float32 once, as an output)
    tr = next(n for n in low.nodes if n.cmd.name == "transpose")
    assert low.symbols[tr.outputs[0]].dtype.name == "bfloat16"
    rng = np.random.default_rng(1)
    args = (
        rng.normal(size=(8, 5)).astype(np.float32),
        rng.normal(size=(3, 5)).astype(np.float32),
        rng.integers(0, 3, 8).astype(np.int32),
    )
    # oracle: NumPy's float32 loss of the bfloat16 product the graph computes
    bf = ml_dtypes.bfloat16
    z = args[0].astype(bf).astype(np.float32) @ args[1].astype(bf).astype(np.float32).T
    z = z.astype(bf).astype(np.float32)
    lse = np.log(np.exp(z - z.max(1, keepdims=True)).sum(1)) + z.max(1)
    want = np.mean(lse - z[np.arange(8), args[2]])
    got = float(interpret(low, *args)[0])
    assert abs(got - want) < 1e-5 * abs(want) + 1e-6, (got, want)


def test_an_embedding_gathers_from_its_float32_table_and_sums_its_gradient_in_float32():
    """4096 lookups of one row, each with a bfloat16 gradient of 0.1: the table's
    gradient is their float32 sum, 4096 * bfloat16(0.1), where a bfloat16 scatter
    stops growing near 32 (0.1 is under half an ulp of it). No node converts the table."""
    b = GraphBuilder()
    table, idx = b.input((50, 8), name="table"), b.input((4096,), np.int32, name="idx")
    w = b.input((8, 8), name="w")
    rows = b.exec(ops.embedding(), table, idx)
    y = b.exec(ops.gemm(), rows, w)
    loss = b.exec(ops.reduce_sum(axes=(0, 1)), y)
    low = cast_precision(b.build([loss]), "bfloat16")
    emb = next(n for n in low.nodes if n.cmd.name == "embedding")
    assert emb.inputs[0] == low.inputs[0] and low.spec(emb.outputs[0]).dtype == np.float32
    converted = [n.inputs[0] for n in low.nodes if n.cmd.name == "datatype_conversion"]
    assert low.inputs[0] not in converted
    step, (d_table,) = backward(low, low.outputs[0], [low.symbols[low.inputs[0]]])
    grads = compile(dataclasses.replace(step, outputs=(d_table.id,), out_tree=None))
    w_value = np.zeros((8, 8), np.float32)
    w_value[:, 0] = 0.1  # d loss / d row = w's row sums: 0.1, rounded to bfloat16
    got = grads(np.ones((50, 8), np.float32), np.zeros(4096, np.int32), w_value)
    want = 4096 * float(np.float32(ml_dtypes.bfloat16(0.1)))
    assert got.dtype == np.float32
    np.testing.assert_allclose(np.asarray(got)[0], want, rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(got)[1:], 0.0)


def test_a_weight_shared_by_many_layers_sums_their_gradients_in_float32():
    """One float32 weight read by 300 gemms (a layer reused 300 times, as NNC's cnnp
    models reuse one): each reader converts it to bfloat16 itself, so each use's
    gradient (exactly 1.0 per entry here) is converted to float32 before the 300 are
    summed, to 300. One shared conversion summed them in bfloat16, whose sum stops at
    256 (257 is not a bfloat16). XLA merges the identical forward conversions."""
    uses = 300
    b = GraphBuilder()
    x, w = b.input((1, 4), name="x"), b.input((3, 4), name="w")
    total = None
    for _ in range(uses):
        y = b.exec(ops.gemm(transpose_b=True), x, w)
        total = y if total is None else b.exec(ops.add(), total, y)
    loss = b.exec(ops.reduce_sum(axes=(0, 1)), total)
    low = cast_precision(b.build([loss]), "bfloat16")
    readers = [n for n in low.nodes if n.cmd.name == "datatype_conversion"]
    assert sum(n.inputs[0] == low.inputs[1] for n in readers) == uses
    step, (dw,) = backward(low, low.outputs[0], [low.symbols[low.inputs[1]]])
    grads = compile(dataclasses.replace(step, outputs=(dw.id,), out_tree=None))
    got = np.asarray(grads(np.ones((1, 4), np.float32), np.ones((3, 4), np.float32)))
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, np.full((3, 4), float(uses), np.float32))


def test_one_shared_conversion_sums_the_gradients_in_bfloat16_to_256():
    """What the per-reader conversion avoids, and the number the mixed-precision guide
    and cast_precision's docstring quote: one bfloat16 conversion of the weight shared by
    300 gemms sums their gradients of 1.0 in bfloat16, op by op, to 256 (the oracle: the
    same sum in ml_dtypes; 257 is not a bfloat16, and adding 1.0 to 256 rounds back)."""
    uses = 300
    b = GraphBuilder()
    x, w = b.input((1, 4), ml_dtypes.bfloat16, name="x"), b.input((3, 4), name="w")
    shared = b.exec(ops.datatype_conversion(dtype="bfloat16"), w)
    total = None
    for _ in range(uses):
        y = b.exec(ops.gemm(transpose_b=True), x, shared)
        total = y if total is None else b.exec(ops.add(), total, y)
    graph = b.build([b.exec(ops.reduce_sum(axes=(0, 1)), total)])
    step, (dw,) = backward(graph, graph.outputs[0], [graph.symbols[graph.inputs[1]]])
    step = dataclasses.replace(step, outputs=(dw.id,), out_tree=None)
    got = interpret(step, np.ones((1, 4), ml_dtypes.bfloat16), np.ones((3, 4), np.float32))
    want = ml_dtypes.bfloat16(0)
    for _ in range(uses):
        want = want + ml_dtypes.bfloat16(1.0)
    assert float(want) == 256.0
    np.testing.assert_array_equal(np.asarray(got), np.full((3, 4), float(want), np.float32))


@pytest.mark.parametrize("command", ["embedding", "index_select"])
def test_a_16_bit_table_sums_its_rows_gradients_in_float32_and_rounds_once(command):
    """A bfloat16 table (a model kept in bfloat16): the backward of the gather sums the
    4096 gradients of one row in float32 and rounds once, to bfloat16(409.6) = 410."""
    bf = ml_dtypes.bfloat16
    cmd = ops.embedding() if command == "embedding" else ops.index_select(axis=0)
    b = GraphBuilder()
    table, idx = b.input((50, 8), bf, name="table"), b.input((4096,), np.int32, name="idx")
    w = b.input((8, 8), bf, name="w")
    y = b.exec(ops.gemm(), b.exec(cmd, table, idx), w)
    loss = b.exec(ops.reduce_sum(axes=(0, 1)), y)
    step, (d_table,) = backward(b.build([loss]), loss, [table])
    grads = compile(dataclasses.replace(step, outputs=(d_table.id,), out_tree=None))
    w_value = np.zeros((8, 8), bf)
    w_value[:, 0] = 0.1
    got = np.asarray(grads(np.ones((50, 8), bf), np.zeros(4096, np.int32), w_value))
    assert got.dtype == bf
    want = bf(4096 * float(np.float32(bf(0.1))))
    np.testing.assert_array_equal(got[0].astype(np.float32), float(want))
    np.testing.assert_array_equal(got[1:].astype(np.float32), 0.0)
    # the backward itself scatters in float32, whatever a backend would make of a
    # bfloat16 scatter (a GPU's atomic adds round each one)
    t16, i32 = jax.ShapeDtypeStruct((50, 8), bf), jax.ShapeDtypeStruct((4096,), np.int32)
    rows = jax.ShapeDtypeStruct((4096, 8), bf)
    pull = lambda g, t, i: cmd.definition.backward((g,), (t, i), (None,), **cmd.kwargs)
    jaxpr = jax.make_jaxpr(pull)(rows, t16, i32).jaxpr
    scatters = [e for e in jaxpr.eqns if e.primitive.name.startswith("scatter")]
    assert scatters and all(e.outvars[0].aval.dtype == np.float32 for e in scatters)


def test_every_float32_command_is_a_registered_command():
    """A misspelt name keeps nothing in float32: ``"rmsnorm"`` had let ``rms_norm``
    compute its statistics in bfloat16."""
    from fnnc.core.command import lookup
    from fnnc.graph.passes.precision import KEEP_FLOAT32

    for name in sorted(KEEP_FLOAT32):
        lookup(name)  # raises for an unknown command
    b = GraphBuilder()
    x, scale = b.input((4, 16), name="x"), b.input((16,), name="scale")
    y, _ = b.exec(ops.rms_norm(), x, scale)
    w = b.input((8, 16), name="w")
    low = cast_precision(b.build([b.exec(ops.gemm(transpose_b=True), y, w)]), "bfloat16")
    norm = next(n for n in low.nodes if n.cmd.name == "rms_norm")
    assert all(low.spec(s).dtype == np.float32 for s in (*norm.inputs, *norm.outputs))


def _control_flow(kind):
    """gemm -> (3 trips of z <- tanh(z * a) | a case_of choosing tanh(z) or z * z) -> sum:
    the gemm computes low, the control-flow node in the float32 its bodies were built for."""
    b = GraphBuilder()
    x, w, a = b.input((2, 3), name="x"), b.input((4, 3), name="w"), b.input((2, 4), name="a")
    h = b.exec(ops.gemm(transpose_b=True), x, w)
    if kind == "while_loop":
        bb = GraphBuilder()
        z0, a0 = bb.input((2, 4), name="z0"), bb.input((2, 4), name="a")
        z1 = bb.exec(ops.tanh(), bb.exec(ops.ewprod(), z0, a0))
        cb = GraphBuilder()
        count = cb.input((), np.int32, name="count")
        cond = cb.build([cb.exec(ops.compare(op="lt"), count, cb.constant(np.int32(3)))])
        (z,) = while_loop(b, bb.build([z1]), cond, [h, a], carry_overs={z1: z0})
    else:
        s = GraphBuilder()
        zs, _ = s.input((2, 4), name="z"), s.input((2, 4), name="a")
        total = s.exec(ops.reshape(shape=()), s.exec(ops.reduce_sum(axes=(0, 1)), zs))
        test = s.exec(ops.compare(op="lt"), total, s.constant(np.float32(0)))
        k = s.exec(ops.select(), test, s.constant(np.int32(0)), s.constant(np.int32(1)))
        branches = []
        for fn in (lambda g, z: g.exec(ops.tanh(), z), lambda g, z: g.exec(ops.ewprod(), z, z)):
            g = GraphBuilder()
            z, _ = g.input((2, 4), name="z"), g.input((2, 4), name="a")
            branches.append(g.build([fn(g, z)]))
        (z,) = case_of(b, s.build([k]), branches, [h, a], bypass=[h])
    return b.build([b.exec(ops.reduce_sum(axes=(0, 1)), z), z])


def _control_flow_numpy(kind, x, w, a):
    z = x @ w.T
    if kind == "while_loop":
        for _ in range(3):
            z = np.tanh(z * a)
    else:
        z = np.tanh(z) if z.sum() < 0 else z * z
    return [np.sum(z, keepdims=True), z]


@pytest.mark.parametrize("kind", ["while_loop", "case_of"])
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_control_flow_nodes_compute_in_float32_within_low_tolerance(kind, sign):
    rng = np.random.default_rng(1)
    x, w, a = (rng.normal(size=s).astype(np.float32) for s in ((2, 3), (4, 3), (2, 4)))
    w = np.abs(w) * sign
    x = np.abs(x)  # the gemm's sign picks the case_of branch
    graph = _control_flow(kind)
    low = cast_precision(graph, "bfloat16")
    node = next(n for n in low.nodes if n.cmd.name == kind)
    assert [low.symbols[s].dtype.name for s in node.inputs] == ["float32", "float32"]
    gemm = next(n for n in low.nodes if n.cmd.name == "gemm")
    assert low.symbols[gemm.outputs[0]].dtype.name == "bfloat16"
    want = _control_flow_numpy(kind, x.astype(np.float64), w.astype(np.float64), a)
    np.testing.assert_allclose(np.asarray(interpret(graph, x, w, a)[1]), want[1], rtol=1e-5)
    for got in (interpret(low, x, w, a), compile(low)(x, w, a)):
        for g, v in zip(got, want):
            assert g.dtype == np.float32
            np.testing.assert_allclose(np.asarray(g), v, rtol=3e-2, atol=3e-2)
