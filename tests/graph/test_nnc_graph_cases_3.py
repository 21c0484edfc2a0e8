"""NNC's case..of, compile and simplify cases not ported elsewhere (part 3), translated:
case_of.tests.c ("graph for a piece-wise linear function", "symbolic graph for
piece-wise function"), symbolic.graph.compile.tests.c ("compile symbolic graph with
case..of") and simplify.tests.c ("simplify graph with softmax + crossentropy")
(liuliu/ccv ``test/unit/nnc``).

The other cases of those files and of while.tests.c, while.backward.tests.c,
case_of.backward.tests.c, graph.tests.c and symbolic.graph.tests.c are ported in
tests/graph/test_nnc_control_cases.py, test_control.py, test_nnc_graph_cases.py,
test_nnc_graph_cases_2.py, test_set_shape.py and passes/test_cse.py.

NNC's branch graphs own their tensors (weights set through the tensor arena); in fnnc a
branch is a graph over the case..of node's inputs, so those tensors are inputs of the
outer graph fed to every branch. Oracles: NNC's numbers where it states them, NumPy
otherwise, ``jax.grad`` for gradients.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fnnc import ops
from fnnc.graph import GraphBuilder, backward, case_of, compile, interpret, simplify

F32 = np.float32


def both(graph, *args):
    """The graph's outputs from ``interpret`` and from ``compile``; they must agree."""
    slow, fast = interpret(graph, *args), compile(graph)(*args)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), slow, fast)
    return fast


def selector(specs, cuts, last):
    """A selector over the first element of input 0 (the other ``specs`` are declared,
    unused): ``cuts`` are ``(op, bound, branch)`` tried in order, ``last`` otherwise."""
    s = GraphBuilder()
    ins = [s.input(shape, name=name) for shape, name in specs]
    first = s.exec(ops.reshape(shape=()), s.alias(ins[0], (1,), name="x[0]"))
    k = s.constant(np.int32(last))
    for op, bound, branch in reversed(cuts):
        test = s.exec(ops.compare(op=op), first, s.constant(F32(bound)))
        k = s.exec(ops.select(), test, s.constant(np.int32(branch)), k)
    return s.build([k])


def branch(specs, fn):
    """A branch graph over inputs ``specs`` (shape, name), returning ``fn(g, *inputs)``."""
    g = GraphBuilder()
    ins = [g.input(shape, name=name) for shape, name in specs]
    return g.build([fn(g, *ins)])


# NNC's piecewise_case_of: 0 below 0, -1 (bypass) on [0, 1), 1 on [1, 2), 2 from 2 on
# (3 above 1000, a branch these two cases never reach).
PIECEWISE = [("lt", 0, 0), ("lt", 1, -1), ("lt", 2, 1)]
# NNC's inputs and expected outputs, y = 0, x, (x - 1) * 0.5 + 1, 1.5.
PIECEWISE_VALUES = [(-1.0, 0.0), (0.76, 0.76), (1.226, (1.226 - 1) * 0.5 + 1), (2.1, 1.5)]


# -- case_of.tests.c ---------------------------------------------------------------------


def test_graph_for_a_piecewise_linear_function():
    """NNC: graph for a piece-wise linear function. Branch 0 sets 0, branch 1 is two
    nodes, x * p1 then + s1 (p1 = s1 = 0.5, tensors the branch owns: constants here),
    branch 2 sets 1.5; the selector's -1 passes x through."""
    spec = [((1,), "x")]

    def prod_then_sum(g, x):
        z = g.exec(ops.ewprod(), x, g.constant(F32([0.5]), name="p1"), name="prod_1")
        return g.exec(ops.ewsum(), z, g.constant(F32([0.5]), name="s1"), name="sum_1")

    branches = [
        branch(spec, lambda g, x: g.exec(ops.set(shape=(1,)), name="set_0")),
        branch(spec, prod_then_sum),
        branch(spec, lambda g, x: g.exec(ops.set(shape=(1,), value=1.5), name="set_2")),
    ]
    b = GraphBuilder()
    x = b.input((1,), name="x")
    (y,) = case_of(b, selector(spec, PIECEWISE, 2), branches, [x], bypass=[x])
    graph = b.build([y])
    for v, want in PIECEWISE_VALUES:
        np.testing.assert_allclose(both(graph, F32([v])), [want], rtol=0, atol=1e-5)


def test_symbolic_graph_for_piecewise_function():
    """NNC: symbolic graph for piece-wise function. Branch 1 is y1 = x * s + p with s
    and p tensors set from outside (0.5 each); branches 0 and 2 set 0 and 1.5; x maps to
    y when the selector bypasses."""
    specs = [((1,), "x"), ((1,), "s"), ((1,), "p")]
    branches = [
        branch(specs, lambda g, x, s, p: g.exec(ops.set(shape=(1,)), name="set")),
        branch(
            specs,
            lambda g, x, s, p: g.exec(
                ops.ewsum(), g.exec(ops.ewprod(), x, s, name="prod"), p, name="sum"
            ),
        ),
        branch(specs, lambda g, x, s, p: g.exec(ops.set(shape=(1,), value=1.5), name="set")),
    ]
    b = GraphBuilder()
    x, s, p = (b.input(shape, name=name) for shape, name in specs)
    sel = selector(specs, PIECEWISE, 2)
    (y,) = case_of(b, sel, branches, [x, s, p], bypass=[x], name="piece-wise linear")
    graph = b.build([y])
    half = F32([0.5])
    for v, want in PIECEWISE_VALUES:
        np.testing.assert_allclose(both(graph, F32([v]), half, half), [want], rtol=0, atol=1e-5)


# -- symbolic.graph.compile.tests.c ------------------------------------------------------

# NNC's _case_of: -1 below 0, 0 on [0, 1), 2 on [1, 2), 1 from 2 on. Branch index 0 is
# NNC's case_0, index 1 its case_2, index 2 its case_1.
COMPILE_CUTS = [("lt", 0, -1), ("lt", 1, 0), ("lt", 2, 2)]
# The weights of the three branches (NNC's dense weight is [out, in], y = x W^T + b).
CASE_0 = [
    ((1, 2), "w01"),
    ((1,), "b01"),
    ((3, 1), "w02"),
    ((3,), "b02"),
    ((2, 3), "w03"),
    ((2,), "b03"),
    ((1, 2), "w04"),
    ((1,), "b04"),
    ((2, 1), "w05"),
    ((2,), "b05"),
]
CASE_2 = [((8, 2), "w21"), ((8,), "b21"), ((2, 8), "w22"), ((2,), "b22")]
CASE_1 = [((16, 2), "w11"), ((16,), "b11"), ((2, 16), "w12"), ((2,), "b12")]
COMPILE_SPECS = [((2,), "x"), *CASE_0, *CASE_2, *CASE_1]
DENSE = ops.gemm(transpose_b=True)  # NNC's CMD_GEMM_FORWARD(NO_TRANSPOSE, TRANSPOSE(0, 1))


def _dense(g, x, w, bias, name):
    """y = x w^T + bias on a vector x (a row of one, as NNC's 1-d tensors multiply)."""
    row = g.exec(ops.reshape(shape=(1, x.shape[0])), x)
    y = g.exec(DENSE, row, w, bias, name=name)
    return g.exec(ops.reshape(shape=(w.shape[0],)), y)


def _case_0(g, x, *ws):
    """((x w01 + b01) w02 + b02) w03 + b03 plus (x w04 + b04) w05 + b05."""
    w01, b01, w02, b02, w03, b03, w04, b04, w05, b05 = ws[:10]
    z02 = _dense(g, _dense(g, x, w01, b01, "mul01"), w02, b02, "mul02")
    y01 = _dense(g, z02, w03, b03, "mul03")
    y02 = _dense(g, _dense(g, x, w04, b04, "mul04"), w05, b05, "mul05")
    return g.exec(ops.ewsum(), y01, y02, name="sum")


def _two_dense(first, second, at):
    def fn(g, x, *ws):
        w1, b1, w2, b2 = ws[at : at + 4]
        return _dense(g, _dense(g, x, w1, b1, first), w2, b2, second)

    return fn


def _compile_case_of_graph():
    branches = [
        branch(COMPILE_SPECS, _case_0),
        branch(COMPILE_SPECS, _two_dense("mul21", "mul22", len(CASE_0))),
        branch(COMPILE_SPECS, _two_dense("mul11", "mul12", len(CASE_0) + len(CASE_2))),
    ]
    b = GraphBuilder()
    ins = [b.input(shape, name=name) for shape, name in COMPILE_SPECS]
    sel = selector(COMPILE_SPECS, COMPILE_CUTS, 1)
    (y,) = case_of(b, sel, branches, ins, bypass=[0], name="case of")
    return b.build([y])


def _compile_case_of_weights():
    """NNC's fixed weights, and uniform (0, 1] ones where it draws them."""
    rng = np.random.default_rng(0)
    w = {name: (1 - rng.uniform(size=shape)).astype(F32) for shape, name in COMPILE_SPECS[1:]}
    w.update(
        w01=F32([[0.1, -0.28]]),
        b01=F32([1]),
        w04=F32([[-1.11, 15]]),
        b04=F32([0.2]),
        w05=F32([[3.1], [3.3]]),
        b05=F32([-0.2, -0.3]),
        b12=F32([0.32, -0.2]),
        b22=F32([3.32, -2]),
    )
    return w


def test_compile_symbolic_graph_with_case_of():
    """NNC: compile symbolic graph with case..of. x = [-1, 10] skips any computation
    (y = x); x = [0.5, 1] takes the two-path branch, [1.11, 2.56] the 16-wide one and
    [4.5, 3.33] the 8-wide one, each checked against NNC's formula in NumPy."""
    graph = _compile_case_of_graph()
    w = _compile_case_of_weights()
    weights = [w[name] for _, name in COMPILE_SPECS[1:]]

    def run(x):
        return np.asarray(both(graph, F32(x), *weights))

    np.testing.assert_array_equal(run([-1, 10]), F32([-1, 10]))

    x = F32([0.5, 1])
    z01 = 0.5 * 0.1 - 0.28 + 1  # NNC's z01val
    want = (z01 * w["w02"][:, 0] + w["b02"]) @ w["w03"].T + w["b03"]
    z04 = 0.5 * -1.11 + 15 + 0.2  # NNC's z04val
    want = want + z04 * F32([3.1, 3.3]) + F32([-0.2, -0.3])
    np.testing.assert_allclose(run(x), want, rtol=1e-5)

    x = F32([1.11, 2.56])
    want = (x @ w["w11"].T + w["b11"]) @ w["w12"].T + F32([0.32, -0.2])
    np.testing.assert_allclose(run(x), want, rtol=1e-5)

    x = F32([4.5, 3.33])
    want = (x @ w["w21"].T + w["b21"]) @ w["w22"].T + F32([3.32, -2])
    np.testing.assert_allclose(run(x), want, rtol=1e-5)


def test_gradient_of_the_compiled_case_of_branch_that_reads_x_twice():
    """NNC: compile symbolic graph with case..of, differentiated (NNC's case..of is
    differentiable, case_of.backward.tests.c): sum(y) on x = [0.5, 1] runs branch 0,
    whose two paths both read x, so x's gradient adds up; the weights of the branches
    not taken get zero. Oracle: jax.grad of the branch written in jnp."""
    graph = _compile_case_of_graph()
    w = _compile_case_of_weights()
    weights = [w[name] for _, name in COMPILE_SPECS[1:]]
    x = F32([0.5, 1])
    b = GraphBuilder.from_graph(graph)
    total = b.exec(ops.reduce_sum(axes=(0,)), graph.symbols[graph.outputs[0]])
    fwd = b.build([total])
    w11 = graph.inputs[1 + len(CASE_0) + len(CASE_2)]  # a weight of a branch not taken
    grad_graph, _ = backward(fwd, total, [*graph.inputs[:11], w11])
    *got, dw11 = compile(grad_graph)(x, *weights)[1:]
    np.testing.assert_array_equal(dw11, np.zeros((16, 2), F32))

    def f(x, w01, b01, w02, b02, w03, b03, w04, b04, w05, b05):
        y01 = ((x @ w01.T + b01) @ w02.T + b02) @ w03.T + b03
        y02 = (x @ w04.T + b04) @ w05.T + b05
        return jnp.sum(y01 + y02)

    want = jax.grad(f, argnums=tuple(range(11)))(x, *weights[:10])
    for g, v in zip(got, want, strict=True):
        np.testing.assert_allclose(g, v, rtol=1e-5, atol=1e-5)


# -- simplify.tests.c --------------------------------------------------------------------


def test_simplify_graph_with_softmax_and_crossentropy():
    """NNC: simplify graph with softmax + crossentropy. softmax then categorical
    cross-entropy, backward from the loss seeded with ones, simplified (CSE, fusion,
    pruning to da): the two forward nodes become NNC's softmax cross-entropy and da
    equals its backward, softmax(a) - onehot(label)."""
    b = GraphBuilder()
    a = b.input((2, 3), name="a")
    label = b.input((2,), np.int32, name="label")
    b0 = b.exec(ops.softmax(), a, name="softmax")
    loss0 = b.exec(ops.categorical_crossentropy(), b0, label, name="categorical crossentropy")
    ones = b.constant(np.ones(loss0.shape, F32), name="set 1")
    graph, (da0,) = backward(b.build([loss0]), loss0, [a], df=[ones])
    pruned = GraphBuilder.from_graph(graph).build([graph.symbols[da0.id]])
    new = simplify(pruned, passes=("cse", "fuse", "dce"))
    assert "softmax_crossentropy" in {n.cmd.name for n in new.nodes}
    assert not {"softmax", "categorical_crossentropy"} & {n.cmd.name for n in new.nodes}

    a_value = F32([[10, -1, -5], [12, 4, 24]])
    label_value = np.int32([2, 1])
    got = both(new, a_value, label_value)
    e = np.exp(a_value - a_value.max(-1, keepdims=True))
    want = e / e.sum(-1, keepdims=True) - np.eye(3, dtype=F32)[label_value]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(interpret(pruned, a_value, label_value), want, atol=1e-6)


@pytest.mark.parametrize("seed", [1.0, 2.5])
def test_softmax_crossentropy_fusion_keeps_a_seed_other_than_ones(seed):
    """NNC: simplify graph with softmax + crossentropy, with the seed dloss0 set to
    another constant: the fused backward scales softmax(a) - onehot(label) by it."""
    b = GraphBuilder()
    a = b.input((2, 3), name="a")
    label = b.input((2,), np.int32, name="label")
    loss0 = b.exec(ops.categorical_crossentropy(), b.exec(ops.softmax(), a), label)
    dloss = b.constant(np.full(loss0.shape, seed, F32), name="set")
    graph, (da0,) = backward(b.build([loss0]), loss0, [a], df=[dloss])
    new = simplify(GraphBuilder.from_graph(graph).build([graph.symbols[da0.id]]))
    a_value = F32([[0.5, -1, 2], [1, 4, -3]])
    label_value = np.int32([0, 2])

    def f(x):
        return seed * jnp.sum(-jnp.log(jax.nn.softmax(x))[jnp.arange(2), label_value])

    np.testing.assert_allclose(both(new, a_value, label_value), jax.grad(f)(a_value), atol=1e-5)
