"""NNC's graph cases written as NNC writes them, where the earlier ports reshaped or
checked less (liuliu/ccv ``test/unit/nnc``):

- simplify.tests.c "simplify graph (x + y) * (x + y)": ``ewsum``/``ewprod`` on ``[1]``
  tensors and the whole ``simplify`` (``passes/test_cse.py`` has an ``add``/``mul`` one);
- symbolic.graph.compile.tests.c "compile symbolic graph with case..of", branch 0 with
  NNC's rank-1 tensors straight into ``gemm`` (a rank-1 operand is a row vector), and
  tensor.bind.tests.c's gemm of a ``[1, 1]`` result with a rank-1 ``d``;
- case_of.tests.c "symbolic while graph contains a case..of graph and multiply its
  output with 0.3": both of NNC's runs (the earlier port checks the first).

Oracles: NNC's stated numbers, or the closed form the C test computes.
"""

from __future__ import annotations

import numpy as np

from fnnc import ops
from fnnc.graph import GraphBuilder, case_of, compile, interpret, simplify, while_loop

F32 = np.float32
DENSE = ops.gemm(transpose_b=True)


def _both(graph, *args):
    return [np.asarray(interpret(graph, *args)), np.asarray(compile(graph)(*args))]


def test_simplify_x_plus_y_times_x_plus_y_keeps_one_sum():
    b = GraphBuilder()
    x, y = b.input((1,), name="x"), b.input((1,), name="y")
    z1 = b.exec(ops.ewsum(), x, y, name="sum1")
    z2 = b.exec(ops.ewsum(), x, y, name="sum2")
    graph = simplify(b.build([b.exec(ops.ewprod(), z1, z2, name="prod")]))
    names = [n.cmd.name for n in graph.nodes]
    assert names.count("ewsum") <= 1 and len(names) <= 2, names
    for got in _both(graph, F32([10]), F32([8])):
        np.testing.assert_allclose(got, [324.0], rtol=1e-6)


def test_case_of_branch_with_rank_1_tensors_into_gemm():
    b = GraphBuilder()
    names = ["x", "w01", "b01", "w02", "b02", "w03", "b03", "w04", "b04", "w05", "b05"]
    shapes = [(2,), (1, 2), (1,), (3, 1), (3,), (2, 3), (2,), (1, 2), (1,), (2, 1), (2,)]
    s = {n: b.input(sh, name=n) for n, sh in zip(names, shapes)}
    z01 = b.exec(DENSE, s["x"], s["w01"], s["b01"], name="mul01")
    z02 = b.exec(DENSE, z01, s["w02"], s["b02"], name="mul02")
    y01 = b.exec(DENSE, z02, s["w03"], s["b03"], name="mul03")
    y02 = b.exec(DENSE, b.exec(DENSE, s["x"], s["w04"], s["b04"]), s["w05"], s["b05"])
    assert (z01.shape, z02.shape, y01.shape) == ((1,), (3,), (2,))
    graph = b.build([b.exec(ops.ewsum(), y01, y02, name="sum")])
    rng = np.random.default_rng(0)
    w02, b02, w03, b03 = (rng.uniform(size=sh).astype(F32) for sh in [(3, 1), (3,), (2, 3), (2,)])
    args = [F32([0.5, 1]), F32([[0.1, -0.28]]), F32([1]), w02, b02, w03, b03]
    args += [F32([[-1.11, 15]]), F32([0.2]), F32([[3.1], [3.3]]), F32([-0.2, -0.3])]
    z02v = (0.5 * 0.1 - 0.28 + 1) * w02[:, 0].astype(np.float64) + b02
    z04v = 0.5 * -1.11 + 15 + 0.2
    want = w03 @ z02v + b03 + [z04v * 3.1 - 0.2, z04v * 3.3 - 0.3]
    for got in _both(graph, *args):
        np.testing.assert_allclose(got, want, rtol=1e-5)


def test_tensor_bind_gemm_of_a_product_with_a_rank_1_tensor():
    b = GraphBuilder()
    a, bm, d = b.input((1, 2), name="a"), b.input((2, 1), name="b"), b.input((1,), name="d")
    c = b.exec(ops.gemm(), a, bm, name="gemm")
    graph = b.build([b.exec(ops.gemm(), c, d, name="mul")])
    args = F32([[1.1, 11003]]), F32([[-1], [-0.12]]), F32([0.5])
    for got in _both(graph, *args):
        np.testing.assert_allclose(got.reshape(-1), [-(11003 * 0.12 + 1.1) * 0.5], rtol=1e-6)


def _selector():
    s = GraphBuilder()
    x = s.input((1,), name="x")
    s.input((1,), name="s")
    s.input((1,), name="p")
    v = s.exec(ops.reshape(shape=()), x)
    k = s.constant(np.int32(2))
    for op, bound, branch in reversed([("lt", 0, 0), ("lt", 1, -1), ("lt", 2, 1)]):
        less = s.exec(ops.compare(op=op), v, s.constant(F32(bound)))
        k = s.exec(ops.select(), less, s.constant(np.int32(branch)), k)
    return s.build([k])


def _branch(fn):
    g = GraphBuilder()
    return g.build([fn(g, *(g.input((1,), name=n) for n in "xsp"))])


def test_while_around_case_of_times_0_3_both_of_nncs_runs():
    branches = [
        _branch(lambda g, x, s, p: g.exec(ops.set(shape=(1,)))),
        _branch(lambda g, x, s, p: g.exec(ops.ewsum(), g.exec(ops.ewprod(), x, s), p)),
        _branch(lambda g, x, s, p: g.exec(ops.set(shape=(1,), value=1.5))),
    ]
    bb = GraphBuilder()
    x, s, p = (bb.input((1,), name=n) for n in "xsp")
    (y,) = case_of(bb, _selector(), branches, [x, s, p], bypass=[x])
    body = bb.build([y])
    c = GraphBuilder()
    count = c.input((), np.int32)
    cond = c.build([c.exec(ops.compare(op="lt"), count, c.constant(np.int32(4)))])
    b = GraphBuilder()
    ins = [b.input((1,), name=n) for n in "xsp"]
    (out,) = while_loop(b, body, cond, ins, carry_overs={y: x}, name="while 4")
    a = b.input((1,), name="a")
    graph = b.build([b.exec(ops.ewprod(), a, out)])
    # x = 1.226: branch 1 four times (x -> 0.5 x + 0.5); x = 0.8: bypass four times
    for xv, want in ((1.226, (1 + 0.226 * 0.5**4) * 0.3), (0.8, 0.8 * 0.3)):
        for got in _both(graph, F32([xv]), F32([0.5]), F32([0.5]), F32([0.3])):
            np.testing.assert_allclose(got, [want], atol=1e-6)
