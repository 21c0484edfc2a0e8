"""NNC's symbolic-graph cases, translated: graph.tests.c, symbolic.graph.tests.c,
autograd.tests.c and autograd.vector.tests.c (liuliu/ccv ``test/unit/nnc``; simplify,
forward, backward, gradient and micro are in test_nnc_graph_cases_2.py), float32 and
smaller shapes. NNC's numbers where it states them, ``jax.grad`` of the same function
written in jnp otherwise."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fnnc import ops
from fnnc.graph import GraphBuilder, backward, compile, interpret, memory_plan, trace
from tests.helpers import assert_close, rand

F32 = np.float32


def _both(graph, *args):
    """The graph's outputs from interpret (the oracle) and from the compiled program."""
    return interpret(graph, *args), compile(graph)(*args)


def _f32(*values):
    """Expected outputs as float32 arrays, one per graph output."""
    return tuple(np.asarray(v, F32) for v in values)


def _ancestors(graph, sid):
    """Indices of the nodes symbol ``sid`` depends on (views count as their root)."""
    sym, producers = graph.symbols, graph.producers
    todo, seen = [sym[sid].root], set()
    while todo:
        node = producers.get(todo.pop())
        if node is None or node in seen:
            continue
        seen.add(node)
        todo.extend(sym[s].root for s in graph.nodes[node].inputs)
    return seen


# -- graph.tests.c -------------------------------------------------------------------------


def test_run_simple_graph_network():
    """graph.tests.c "run simple graph network": convolution, softmax, a custom loss node
    and the convolution's backward node in one graph give what the commands give run one
    at a time."""
    n = 31 * 21 * 2
    a = ((np.arange(n) - n // 2) / ((n - 1) * n)).astype(F32).reshape(1, 31, 21, 2)
    w = (rand([4, 5, 3, 2], seed=1) * np.sqrt(2 / (21 * 31 * 6))).astype(F32)
    bias = np.zeros(4, F32)
    onehot = np.zeros((1, 31, 21, 4), F32)
    onehot.flat[24] = 1
    conv, softmax = ops.convolution(padding="SAME"), ops.softmax()
    loss = ops.call(graph=trace(lambda m: m - onehot, onehot))  # NNC's CMD_CUSTOM_FORWARD
    specs = tuple((s.shape, F32) for s in (a, w, bias))
    conv_back = ops.gradient(
        of=conv, in_specs=specs, out_specs=(((1, 31, 21, 4), F32),), grad_mask=(True,),
        wants=(0, 1, 2),
    )  # fmt: skip
    b = GraphBuilder()
    xa, xw, xbias = b.input(a.shape, name="a"), b.input(w.shape, name="w"), b.input((4,))
    xb = b.exec(conv, xa, xw, xbias, name="forw")
    xm = b.exec(softmax, xb, name="softmax")
    xg = b.exec(loss, xm, name="loss")
    grads = b.exec(conv_back, xg, xa, xw, name="back")  # NNC's inputs: g, a, w
    graph = b.build([xb, xm, xg, *grads])

    vb = conv(a, w, bias)
    vm = softmax(vb)
    vg = vm - onehot
    vh, vgw, vgbias = conv.definition.backward((vg,), (a, w, bias), (vb,), **conv.kwargs)
    for got in _both(graph, a, w, bias):
        assert_close(got, (vb, vm, vg, vh, vgw, vgbias), rtol=1e-5, atol=1e-7)


# -- symbolic.graph.tests.c ----------------------------------------------------------------


def test_compile_symbolic_graph_of_one_node():
    """symbolic.graph.tests.c "compile symbolic graph of one node": c = a * b computed in
    place (fnnc: a donated input's buffer takes the result)."""
    b = GraphBuilder()
    xa, xb = b.input((1,), name="a"), b.input((1,), name="b")
    graph = b.build([b.exec(ops.ewprod(), xa, xb, name="prod")])
    program = compile(graph, donate=["a"])
    assert program.memory().alias_bytes == 4
    np.testing.assert_allclose(program(F32([1.2]), F32([2.3])), [1.2 * 2.3], atol=1e-6)


def test_unused_tensor_symbols_take_no_memory():
    """symbolic.graph.tests.c "compile a simple symbolic graph with autogen": tensor
    symbols no node reads or writes get no memory. (NNC's other check, softmax writing
    in place over its input, is XLA's buffer assignment in fnnc, not the graph's.)"""
    b = GraphBuilder()
    a = b.input((1, 31, 21, 2), name="a")
    w, bias = b.input((4, 5, 3, 2), name="w"), b.input((4,), name="bias")
    unused = [b.tensor((1,), name="unused0"), b.tensor((1,), name="unused1")]
    m = b.exec(ops.softmax(), b.exec(ops.convolution(padding="SAME"), a, w, bias, name="forw"))
    graph = b.build([m])
    plan = memory_plan(graph)
    assert len(plan.intervals) == 5 and not set(plan.intervals) & {u.id for u in unused}
    assert plan.peak_bytes == 4 * (31 * 21 * (2 + 4 + 4) + 4 * 5 * 3 * 2 + 4)


def test_query_connectivity_from_one_exec_to_another():
    """symbolic.graph.tests.c "query connectivity from one exec symbol to another": which
    of some nodes reach another through data edges (NNC's sources_to_destinations)."""
    b = GraphBuilder()
    a, c = b.input((1,), name="a"), b.input((1,), name="c")
    log1 = b.exec(ops.ewlog(), a, name="log1")
    d = b.exec(ops.ewlog(), c, name="log2")
    e = b.exec(ops.ewsum(), a, c, name="sum1")
    f = b.exec(ops.ewlog(), d, name="log3")
    graph = b.build([e, b.exec(ops.ewsum(), log1, f, name="sum2")])
    index = {node.name: i for i, node in enumerate(graph.nodes)}

    def reach(sources, destination):  # a node reaches itself, as in NNC
        before = _ancestors(graph, graph.nodes[index[destination]].outputs[0])
        return [index[s] in before for s in sources]

    assert reach(["sum1", "log1", "log2", "log1"], "sum2") == [False, True, True, True]
    assert reach(["sum1", "log1", "log2"], "sum1") == [True, False, False]
    assert reach(["log3", "log1", "log2"], "sum2") == [True, True, True]


def test_build_a_simple_symbolic_graph_and_check_its_format():
    """symbolic.graph.tests.c "build a simple symbolic graph and check its format": two
    nodes; the convolution has no incoming node and one outgoing, softmax the reverse."""
    b = GraphBuilder()
    a = b.input((1, 31, 21, 2), name="a")
    w, bias = b.input((4, 5, 3, 2), name="w"), b.input((4,), name="bias")
    conv = b.exec(ops.convolution(padding="SAME"), a, w, bias, name="forw")
    graph = b.build([b.exec(ops.softmax(), conv, name="softmax")])
    producers, consumers = graph.producers, graph.consumers
    edges = {}
    for i, node in enumerate(graph.nodes):
        incoming = {producers[s] for s in node.inputs if s in producers}
        outgoing = {j for s in node.outputs for j in consumers.get(s, [])}
        edges[node.name] = (len(incoming), len(outgoing))
    assert edges == {"forw": (0, 1), "softmax": (1, 0)}
    assert [str(n.cmd) for n in graph.nodes] == ["convolution[padding=SAME]", "softmax"]


# -- autograd.tests.c ----------------------------------------------------------------------


def test_autograd_without_x_in_the_formula():
    """autograd.tests.c "autograd with D[y, x] when x = 10 and y = 1 (no x presence in
    the formula)": y comes from a set node; dy/dx is 0."""
    b = GraphBuilder()
    x = b.input((1,), name="x")
    y = b.exec(ops.set(shape=(1,), value=1.0), name="set")
    graph, _ = backward(b.build([y]), y, [x])
    for got in _both(graph, F32([10])):
        assert_close(got, _f32([1], [0]), atol=1e-6)


def _x_log_inv(b, x, y=None):
    """y * x + log(1 / x) (x * x when y is None), as NNC's prod, inv, log and sum."""
    w = b.exec(ops.ewprod(), x if y is None else y, x, name="prod")
    u = b.exec(ops.ewdiv(), b.constant(np.ones(1, F32), name="1"), x, name="inv")
    return b.exec(ops.ewsum(), w, b.exec(ops.ewlog(), u, name="log"), name="sum")


def test_partial_autograd():
    """autograd.tests.c "partial autograd with D[y * x + Log[1 / x], y] when x = 0.84 and
    y = 1.23": dz/dy = x, and the 1 / x branch, which y does not reach, gets no
    gradient node."""
    b = GraphBuilder()
    x, y = b.input((1,), name="x"), b.input((1,), name="y")
    z = _x_log_inv(b, x, y)
    graph, _ = backward(b.build([z]), z, [y])
    of = [str(n.cmd.param("of")) for n in graph.nodes if n.cmd.name == "gradient"]
    assert of == ["ewsum", "ewprod"]
    for got in _both(graph, F32([0.84]), F32([1.23])):
        assert_close(got, _f32([1.23 * 0.84 + np.log(1 / 0.84)], [0.84]), atol=1e-6)


def test_autograd_of_two_separate_functions():
    """autograd.tests.c "autograd with D[x * x + Log[1 / x], x] D[y * y + Log[1 / y], y]
    when x = 0.84 and y = 0.24": one backward for two unconnected functions."""
    b = GraphBuilder()
    x0, x1 = b.input((1,), name="x"), b.input((1,), name="y")
    z0, z1 = _x_log_inv(b, x0), _x_log_inv(b, x1)
    graph, _ = backward(b.build([z0, z1]), [z0, z1], [x0, x1])
    want = [[v * v + np.log(1 / v) for v in (0.84, 0.24)], [2 * v - 1 / v for v in (0.84, 0.24)]]
    for got in _both(graph, F32([0.84]), F32([0.24])):
        assert_close(got, _f32(*([v] for v in want[0]), *([v] for v in want[1])), atol=1e-6)


# -- autograd.vector.tests.c: views of vectors ---------------------------------------------


def test_autograd_through_views_of_a_sum():
    """autograd.vector.tests.c "autograd with D[y = x + [1 1.5] => x_1 + (y_1 + y_1 ^ 2)
    + Exp[y_2], x] when x = [0.44 -1.18]"."""
    b = GraphBuilder()
    x = b.input((2,), name="x")
    y = b.exec(ops.ewsum(), x, b.constant(F32([1, 1.5]), name="[1 1.5]"), name="plus")
    x_1 = b.alias(x, (1,), name="x_1")
    y_1, y_2 = b.alias(y, (1,), name="y_1"), b.alias(y, (1,), offset=(1,), name="y_2")
    u_1 = b.exec(ops.ewsum(), b.exec(ops.ewprod(), y_1, y_1, name="sqr"), y_1, name="plus_y")
    v = b.exec(ops.ewsum(), x_1, u_1, b.exec(ops.ewexp(), y_2, name="exp"), name="sum")
    graph, _ = backward(b.build([v]), v, [x])
    value = 0.44 + (1.44 + 1.44**2) + np.exp(-1.18 + 1.5)
    for got in _both(graph, F32([0.44, -1.18])):
        assert_close(got, _f32([value], [2 + 2 * 1.44, np.exp(-1.18 + 1.5)]), atol=1e-6)


def _log_square_graph(write_y_2):
    """y_1 = log x_1 and (if ``write_y_2``) y_2 = x_2 ^ 2, written into views of y."""
    b = GraphBuilder()
    x, y = b.input((2,), name="x"), b.tensor((2,), name="y")
    x_1, y_1 = b.alias(x, (1,), name="x_1"), b.alias(y, (1,), name="y_1")
    b.exec(ops.ewlog(), x_1, outputs=[y_1], name="log")
    if write_y_2:  # every write to y comes before the first read of any view of it
        x_2, y_2 = b.alias(x, (1,), offset=(1,)), b.alias(y, (1,), offset=(1,), name="y_2")
        b.exec(ops.ewprod(), x_2, x_2, outputs=[y_2], name="x_2_sqr")
    w = b.exec(ops.ewprod(), y_1, y_1, name="y_1_sqr")
    if write_y_2:
        v = b.exec(ops.ewsum(), w, b.exec(ops.ewprod(), y_1, y_2, name="prod"), name="sum")
    else:
        v = b.exec(ops.ewsum(), w, y_1, name="sum")
    return backward(b.build([v]), v, [x])[0]


def test_autograd_through_views_written_by_two_nodes():
    """autograd.vector.tests.c "autograd with D[y_1 = Log[x_1], y_2 = x_2 ^ 2 => y_1 ^ 2
    + y_1 * y_2, x] when x = [0.38 -2.8]"."""
    graph = _log_square_graph(write_y_2=True)
    l1 = np.log(0.38)
    want = _f32([l1 * l1 + l1 * 2.8**2], [2 * l1 / 0.38 + 2.8**2 / 0.38, 2 * -2.8 * l1])
    for got in _both(graph, F32([0.38, -2.8])):
        assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_autograd_through_a_view_written_by_one_node():
    """autograd.vector.tests.c "autograd with D[y_1 = Log[x_1] => y_1 ^ 2 + y_1, x] when
    x = [0.21 -13.22]" (NNC leaves dx_2 undefined; it is 0, as jax.grad says)."""
    graph = _log_square_graph(write_y_2=False)
    l1 = np.log(0.21)
    for got in _both(graph, F32([0.21, -13.22])):
        assert_close(got, _f32([l1 * l1 + l1], [2 * l1 / 0.21 + 1 / 0.21, 0]), atol=1e-5)


# -- autograd.vector.tests.c: views of a convolution's output ------------------------------

# NNC's image 100x100x3 into 128 channels, here 8x8x3 into 8: views are half the rows by
# 4 channels, named by their (row, channel) offsets.
QUADRANTS = ((0, 0), (0, 4), (4, 0), (4, 4))


def _sliced(offsets, whole_c=True):
    """conv -> b; relu of each view of b into the same view of c (or, for views that
    overlap, into separate tensors); f = the sum of avg_pool(c) (or of the relus)."""
    b = GraphBuilder()
    image = b.input((1, 8, 8, 3), name="image")
    w, bias = b.input((8, 3, 3, 3), name="w"), b.input((8,), name="bias")
    conv = b.exec(ops.convolution(padding="SAME"), image, w, bias, name="conv")
    c = b.tensor((1, 8, 8, 8), name="c") if whole_c else None
    outs = []
    for k, (row, ch) in enumerate(offsets):
        view = (1, 4, 8, 4)
        bk = b.alias(conv, view, offset=(0, row, 0, ch), name=f"b{k}")
        ck = b.alias(c, view, offset=(0, row, 0, ch), name=f"c{k}") if whole_c else None
        out = b.exec(ops.relu(), bk, outputs=[ck] if whole_c else None, name=f"relu{k}")
        outs.append(out)
    if whole_c:
        terms = [b.exec(ops.avg_pool(window=(8, 8)), c, name="pool")]
    else:
        terms = outs
    sums = [b.exec(ops.reduce_sum(axes=tuple(range(4))), t) for t in terms]
    f = b.exec(ops.reshape(shape=()), b.exec(ops.ewsum(), *sums) if len(sums) > 1 else sums[0])
    graph, grads = backward(b.build([f]), f, [w, bias, conv])
    return graph, grads


def _sliced_oracle(offsets, whole_c=True):
    def f(image, w, bias):
        conv = jax.lax.conv_general_dilated(
            image, jnp.transpose(w, (1, 2, 3, 0)), (1, 1), "SAME",
            dimension_numbers=("NHWC", "HWIO", "NHWC"),
        ) + bias.reshape(1, 1, 1, 8)  # fmt: skip
        c = jnp.zeros_like(conv)
        total = 0.0
        for row, ch in offsets:
            part = jax.nn.relu(conv[:, row : row + 4, :, ch : ch + 4])
            c = c.at[:, row : row + 4, :, ch : ch + 4].set(part)
            total = total + part.sum()
        return c.mean(axis=(1, 2)).sum() if whole_c else total

    return f


@pytest.mark.parametrize(
    "offsets, whole_c",
    [(QUADRANTS, True), (QUADRANTS[:2], True), (((0, 0), (0, 2)), False)],
    ids=["tiling", "top-half", "overlapping"],
)
def test_autograd_with_sliced_tensors_for_convolution(offsets, whole_c):
    """autograd.vector.tests.c "autograd with sliced tensors for convolution doesn't require
    zeros (similar to Inception module)", "... require zeros" and "... that are
    over-subscribed" (and "... with no-op", the same graph without fnnc's need for a
    joining node): gradients against jax.grad; the unread part of b gets zeros."""
    graph, _ = _sliced(offsets, whole_c)
    args = rand([1, 8, 8, 3]), rand([8, 3, 3, 3], seed=1), rand([8], seed=2)
    f = _sliced_oracle(offsets, whole_c)
    want_f = f(*args)
    want_w, want_bias = jax.grad(f, argnums=(1, 2))(*args)
    got = compile(graph)(*args)
    assert_close(got[:3], (want_f, want_w, want_bias), rtol=1e-5, atol=1e-5)
    if not whole_c:
        return
    db = np.asarray(got[3])
    read = np.zeros(db.shape, bool)
    for row, ch in offsets:
        read[:, row : row + 4, :, ch : ch + 4] = True
    assert (db[~read] == 0).all() and (db[read] != 0).any()


def test_over_subscribed_views_sum_their_gradients():
    """autograd.vector.tests.c "autograd with sliced tensors for convolution that are
    over-subscribed": the views of b overlap, so b's gradient is an ewsum."""
    graph, (_, _, db) = _sliced(((0, 0), (0, 2)), whole_c=False)
    assert graph.nodes[graph.producers[db.id]].cmd.name == "ewsum"


def test_disjoint_views_write_one_gradient_tensor():
    """autograd.vector.tests.c "autograd with sliced tensors for convolution doesn't require
    zeros (similar to Inception module)": the four views tile b, so their gradients are
    written into b's gradient directly (four writes through views of db), no sum of
    whole-size copies."""
    graph, (_, _, db) = _sliced(QUADRANTS)
    assert db.id not in graph.producers  # written only through its views
    assert "ewsum" not in [node.cmd.name for node in graph.nodes]
    writes = [
        node for node in graph.nodes
        if node.cmd.name == "data_transfer" and graph.symbols[node.outputs[0]].root == db.id
    ]  # fmt: skip
    assert len(writes) == 4


def test_concatenated_tensors_sum_gradients_before_the_split():
    """autograd.vector.tests.c "autograd with concatenated tensors to check dependencies
    done correctly (similar to observation / action concatenation for critics)": obs and
    act are copied into views of obs_act, which two gemms read; the gradients of obs and
    act come after the ewsum of the two gemms' gradients."""
    b = GraphBuilder()
    obs, act = b.input((8, 4), name="obs"), b.input((8, 1), name="act")
    w1, w2 = b.input((5, 1), name="w1"), b.input((5, 1), name="w2")
    obs_act = b.tensor((8, 5), name="obs_act")
    b.exec(ops.data_transfer(), obs, outputs=[b.alias(obs_act, (8, 4), name="obs0")])
    b.exec(ops.data_transfer(), act, outputs=[b.alias(obs_act, (8, 1), offset=(0, 4))])
    v1 = b.exec(ops.gemm(), obs_act, w1, name="gemm1")
    v2 = b.exec(ops.gemm(), obs_act, w2, name="gemm2")
    d1, d2 = b.input((8, 1), name="dv1"), b.input((8, 1), name="dv2")
    graph, grads = backward(b.build([v1, v2]), [v1, v2], [w1, w2, obs, act], df=[d1, d2])
    for g in grads[2:]:
        assert any(graph.nodes[i].cmd.name == "ewsum" for i in _ancestors(graph, g.id))

    def f(obs, act, w1, w2, d1, d2):
        x = jnp.concatenate([obs, act], axis=1)
        return ((x @ w1) * d1).sum() + ((x @ w2) * d2).sum()

    args = [rand(s, seed=i) for i, s in enumerate([(8, 4), (8, 1), (5, 1), (5, 1), (8, 1), (8, 1)])]
    want = jax.grad(f, argnums=(2, 3, 0, 1))(*args)
    assert_close(compile(graph)(*args)[2:], want, rtol=1e-5, atol=1e-6)
