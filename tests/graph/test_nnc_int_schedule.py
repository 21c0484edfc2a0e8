"""NNC's ``test/int/nnc/schedule.tests.c`` (liuliu/ccv): the graphs it schedules, ported.

NNC compiles each symbolic graph, gives it a static schedule on GPU streams
(``ccv_nnc_graph_set_default_static_schedule``) and runs it on a stream; the test then
checks the result against the algebra written out in C. fnnc has no streams to assign
(XLA schedules a compiled program itself), so what carries over is the graph: independent
gemm branches joined later, a while loop whose result feeds a gemm beside an unrelated
branch, a case..of with one branch, and both in one graph. Each graph runs interpreted
and compiled and must give NNC's numbers (its hand-written float arithmetic, done here in
float64). NNC's gemm is ``GEMM_FORWARD(NO_TRANSPOSE, TRANSPOSE(0, 1))``: fnnc's
``gemm(transpose_b=True)``. NNC's while count is an int64 starting at 0 and ``while_5``
keeps looping while it is below 5, so the body runs 5 times; its ``case_of_0`` always
picks branch 0.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from fnnc import ops
from fnnc.graph import GraphBuilder, case_of, compile, interpret, while_loop

F32 = np.float32
GEMM = ops.gemm(transpose_b=True)
A = [1.4, 0.2]


def both(graph, *args):
    """The graph's outputs from ``interpret`` and from ``compile``; they must agree."""
    args = [np.asarray(a, F32) for a in args]
    slow, fast = interpret(graph, *args), compile(graph)(*args)
    jax.tree.map(lambda s, f: np.testing.assert_allclose(s, f, rtol=1e-6, atol=1e-6), slow, fast)
    return fast


def dense(builder, x, w, bias, name):
    """NNC's ``GEMM(x, w, bias)`` node with w and bias as graph inputs."""
    return builder.exec(GEMM, x, builder.input(w, name=f"w{name}"),
                        builder.input(bias, name=f"bias{name}"), name=f"mul{name}")  # fmt: skip


def loop_five_times(builder, a):
    """NNC's "while 1..5": b1 = a w1 + bias1 carried over to a, while count < 5."""
    body = GraphBuilder()
    ba = body.input((1, 2), name="a")
    b1 = dense(body, ba, (2, 2), (2,), "1")
    cond = GraphBuilder()
    count = cond.input((), np.int32, name="count")
    cond = cond.build([cond.exec(ops.compare(op="lt"), count, cond.constant(np.int32(5)))])
    w1, bias1 = builder.input((2, 2), name="w1"), builder.input((2,), name="bias1")
    (out,) = while_loop(builder, body.build([b1]), cond, [a, w1, bias1], carry_overs={b1: ba})
    return out


def case_of_0(builder, a, name):
    """NNC's case..of over a whose ``case_of_0`` always picks branch 0: b = a w + bias."""
    selector = GraphBuilder()
    for shape, label in [((1, 2), "a"), ((2, 2), "w"), ((2,), "bias")]:
        selector.input(shape, name=label)
    selector = selector.build([selector.constant(np.int32(0))])
    branch = GraphBuilder()
    ba = branch.input((1, 2), name="a")
    out = branch.exec(GEMM, ba, branch.input((2, 2), name="w"), branch.input((2,), name="bias"))
    w, bias = builder.input((2, 2), name=f"w{name}"), builder.input((2,), name=f"bias{name}")
    (b,) = case_of(
        builder, selector, [branch.build([out])], [a, w, bias], bypass=[a], name="case..of"
    )
    return b


def nnc_loop(w1, n=5):
    """The C test's loop: (av0, av1) <- (av0 w1[0] + av1 w1[1], av0 w1[2] + av1 w1[3])."""
    av0, av1 = A
    for _ in range(n):
        av0, av1 = av0 * w1[0] + av1 * w1[1], av0 * w1[2] + av1 * w1[3]
    return av0, av1


def test_schedule_gpu_work_on_one_stream():
    """NNC: "schedule GPU work on one stream": b = a w + bias for a (1.4, 0.2), w (2, 11),
    bias 0."""
    b = GraphBuilder()
    a = b.input((1, 2), name="a")
    graph = b.build([dense(b, a, (1, 2), (1,), "")])
    got = both(graph, [A], [[2, 11]], [0])
    np.testing.assert_allclose(got, [[1.4 * 2 + 0.2 * 11]], rtol=1e-6)


def test_schedule_gpu_work_on_multiple_streams():
    """NNC: "schedule GPU work on multiple streams": three independent gemms of a (NNC
    puts them on separate streams), c = b1 b2 + 0.2, then d = c b3 + 0.3."""
    b = GraphBuilder()
    a = b.input((1, 2), name="a")
    b1, b2, b3 = (dense(b, a, (1, 2), (1,), k) for k in "123")
    c = b.exec(GEMM, b1, b2, b.input((1,), name="biasc"), name="mulc")
    d = b.exec(GEMM, c, b3, b.input((1,), name="biasd"), name="muld")
    args = [[A], [[2, 11]], [0], [[1, 2.2]], [1], [[0.5, 1.5]], [0.5], [0.2], [0.3]]
    got = both(b.build([d]), *args)
    b1v, b2v = 1.4 * 2 + 0.2 * 11, 1.4 * 1 + 0.2 * 2.2 + 1
    b3v = 1.4 * 0.5 + 0.2 * 1.5 + 0.5
    np.testing.assert_allclose(got, [[(b1v * b2v + 0.2) * b3v + 0.3]], rtol=1e-6)


def test_schedule_gpu_work_with_while_loop():
    """NNC: "schedule GPU work with while loop": b1 from the five-step loop over a, beside
    it b2 = a w2 + bias2 outside the loop, b3 = b1 w3 + bias3, c = b2 b3 + 0.5."""
    b = GraphBuilder()
    a = b.input((1, 2), name="a")
    b1 = loop_five_times(b, a)
    b2 = dense(b, a, (1, 2), (1,), "2")
    b3 = dense(b, b1, (1, 2), (1,), "3")
    c = b.exec(GEMM, b2, b3, b.input((1,), name="biasc"), name="mulc")
    w1 = [1.1, 2.2, 1, 2]
    args = [[A], [[1.1, 2.2], [1, 2]], [0, 0], [[0.6, 3]], [0.4], [[0.2, 0.3]], [1], [0.5]]
    got = both(b.build([c]), *args)
    av0, av1 = nnc_loop(w1)
    b2v = 1.4 * 0.6 + 0.2 * 3 + 0.4
    b3v = av0 * 0.2 + av1 * 0.3 + 1
    np.testing.assert_allclose(got, [[b2v * b3v + 0.5]], rtol=1e-6)


def test_schedule_gpu_work_with_case_of():
    """NNC: "schedule GPU work with case..of": branch 0 computes b = a w + bias for w
    [[2, 11], [1, 2]], bias 0."""
    b = GraphBuilder()
    a = b.input((1, 2), name="a")
    graph = b.build([case_of_0(b, a, "")])
    got = both(graph, [A], [[2, 11], [1, 2]], [0, 0])
    np.testing.assert_allclose(got, [[1.4 * 2 + 0.2 * 11, 1.4 + 0.2 * 2]], rtol=1e-6)


@pytest.mark.parametrize("order", ["loop first", "case..of first"])
def test_schedule_gpu_work_with_both_while_loop_and_case_of(order):
    """NNC: "schedule GPU work with both while loop and case..of": the five-step loop gives
    b1, the case..of gives b2 from a (w2 [[0.1, 0.2], [1.2, 1.1]], bias2 (1, 0)); b3 = b2
    w3 + bias3, b4 = b1 w4 + bias4, c = b3 b4 + 0.5. NNC's order of node creation does
    not matter; here both orders are built."""
    b = GraphBuilder()
    a = b.input((1, 2), name="a")
    if order == "loop first":
        b1 = loop_five_times(b, a)
        b2 = case_of_0(b, a, "2")
        loop_args, case_args = [0, 1], [2, 3]
    else:
        b2 = case_of_0(b, a, "2")
        b1 = loop_five_times(b, a)
        loop_args, case_args = [2, 3], [0, 1]
    b3 = dense(b, b2, (1, 2), (1,), "3")
    b4 = dense(b, b1, (1, 2), (1,), "4")
    c = b.exec(GEMM, b3, b4, b.input((1,), name="biasc"), name="mulc")
    control = [[[1.1, 2.2], [1, 2]], [0, 0], [[0.1, 0.2], [1.2, 1.1]], [1, 0]]
    ordered = [control[i] for i in loop_args + case_args]
    rest = [[[0.6, 3]], [0.4], [[0.2, 0.3]], [1], [0.5]]
    got = both(b.build([c]), [A], *ordered, *rest)
    av0, av1 = nnc_loop([1.1, 2.2, 1, 2])
    b2v0, b2v1 = 1.4 * 0.1 + 0.2 * 0.2 + 1, 1.4 * 1.2 + 0.2 * 1.1
    b3v = b2v0 * 0.6 + b2v1 * 3 + 0.4
    b4v = av0 * 0.2 + av1 * 0.3 + 1
    np.testing.assert_allclose(got, [[b3v * b4v + 0.5]], rtol=1e-6)
