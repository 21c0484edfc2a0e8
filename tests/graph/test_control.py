"""while_loop and case_of: NNC's examples, breakpoint semantics, nesting, gradients,
save/load, and the errors that name the sub-graph's symbols."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fnnc import config, ops
from fnnc.errors import CommandError, DTypeError, GraphError, ShapeError
from fnnc.graph import GraphBuilder, case_of, compile, interpret, load, save, while_loop
from fnnc.graph.passes.backward import backward
from tests.helpers import assert_close

F32 = np.float32


def count_below(n, op="lt"):
    c = GraphBuilder()
    count = c.input((), np.int32, name="count")
    return c.build([c.exec(ops.compare(op=op), count, c.constant(np.int32(n)))])


def power_body(shape=(1,)):
    """z1 = z0 * x."""
    b = GraphBuilder()
    z0, x = b.input(shape, name="z0"), b.input(shape, name="x")
    z1 = b.exec(ops.ewprod(), z0, x, name="z1")
    return b.build([z1]), z0, z1


def x5y(max_iterations=None):
    """NNC's "symbolic graph for a while loop to compute x ^ 5 * y"."""
    body, z0, z1 = power_body()
    b = GraphBuilder()
    x, y = b.input((1,), name="x"), b.input((1,), name="y")
    one = b.constant(np.ones(1, F32), name="z")
    (z,) = while_loop(
        b, body, count_below(5), [one, x], carry_overs={z1: z0}, max_iterations=max_iterations
    )
    return b.build([b.exec(ops.ewprod(), z, y, name="prod1")])


XY = (np.array([0.92], F32), np.array([3.2], F32))


@pytest.mark.parametrize("bound", [None, 5, 9])
def test_nnc_x5_times_y_interpret_and_compile(bound):
    graph = x5y(bound)
    for run in (lambda *a: interpret(graph, *a), compile(graph)):
        got = run(*XY)
        assert got.dtype == F32
        np.testing.assert_allclose(np.asarray(got), [2.109060874], rtol=1e-6)


def two_carry_body():
    """z1 = z0 * x (node 0); w1 = w0 + z1 (node 1)."""
    b = GraphBuilder()
    z0, w0, x = b.input((), name="z0"), b.input((), name="w0"), b.input((), name="x")
    z1 = b.exec(ops.ewprod(), z0, x, name="z1")
    w1 = b.exec(ops.ewsum(), w0, z1, name="w1")
    return b.build([z1, w1]), (z0, w0), (z1, w1)


@pytest.mark.parametrize("bound", [None, 12])
@pytest.mark.parametrize(
    "where, z_mults, w_adds",
    [("before", 0, 0), ("after", 1, 1), (1, 1, 0), (0, 0, 0), (2, 1, 1)],
)
@pytest.mark.parametrize("n", [0, 3])
def test_breakpoint_runs_the_body_n_or_n_plus_1_times(n, where, z_mults, w_adds, bound):
    """count < n: before the body, n passes; after it, n + 1; between the two nodes, z is
    updated n + 1 times and w n times (the last pass stops at the breakpoint)."""
    body, (z0, w0), (z1, w1) = two_carry_body()
    b = GraphBuilder()
    z, w, x = b.input((), name="z"), b.input((), name="w"), b.input((), name="x")
    outs = while_loop(
        b,
        body,
        count_below(n),
        [z, w, x],
        carry_overs={z1: z0, w1: w0},
        breakpoint=where,
        max_iterations=bound,
    )
    graph = b.build(list(outs))
    zf, wf = interpret(graph, F32(1), F32(0), F32(2))
    mults, adds = n + z_mults, n + w_adds
    assert float(zf) == 2.0**mults
    assert float(wf) == sum(2.0**k for k in range(1, adds + 1))


def test_condition_reads_a_value_computed_before_the_breakpoint():
    """Double z until it passes 100 (breakpoint after the body, cond on z1)."""
    body, z0, z1 = power_body(())
    c = GraphBuilder()
    c.input((), np.int32, name="count")
    seen = c.input((), name="z1")
    cond = c.build([c.exec(ops.compare(op="lt"), seen, c.constant(F32(100)))])
    b = GraphBuilder()
    z, x = b.input((), name="z"), b.input((), name="x")
    for bound in (None, 20):
        (out,) = while_loop(
            b,
            body,
            cond,
            [z, x],
            carry_overs={z1: z0},
            breakpoint="after",
            cond_inputs=[z1],
            max_iterations=bound,
        )
        assert float(interpret(b.build([out]), F32(1), F32(2))) == 128.0


def test_max_iterations_stops_the_loop_at_that_count():
    body, z0, z1 = power_body(())
    b = GraphBuilder()
    z, x = b.input((), name="z"), b.input((), name="x")
    (out,) = while_loop(b, body, count_below(10), [z, x], carry_overs={z1: z0}, max_iterations=4)
    assert float(interpret(b.build([out]), F32(1), F32(2))) == 16.0


# --- case_of ----------------------------------------------------------------------


def piecewise(shape=()):
    """NNC's piece-wise linear function: 0 below 0, bypass on [0, 1), x / 2 + 1 / 2 on
    [1, 2), 1.5 from 2."""
    s = GraphBuilder()
    x = s.input(shape, name="x")
    scalar = s.exec(ops.reshape(shape=()), x) if shape else x

    def below(v, then, other):
        test = s.exec(ops.compare(op="lt"), scalar, s.constant(F32(v)))
        return s.exec(ops.select(), test, s.constant(np.int32(then)), other)

    selector = s.build([below(0, 0, below(1, -1, below(2, 1, s.constant(np.int32(2)))))])

    def branch(fn):
        g = GraphBuilder()
        x = g.input(shape, name="x")
        return g.build([fn(g, x)])

    zero = branch(lambda g, x: g.exec(ops.set(shape=shape), name="y0"))
    half = branch(
        lambda g, x: g.exec(ops.add(p=0.5, q=0.5), x, g.constant(np.ones(shape, F32)), name="y1")
    )
    flat = branch(lambda g, x: g.exec(ops.set(shape=shape, value=1.5), name="y2"))
    return selector, [zero, half, flat]


@pytest.mark.parametrize("x, want", [(-1.0, 0.0), (0.76, 0.76), (1.226, 1.113), (2.1, 1.5)])
def test_case_of_selects_each_branch_and_bypasses(x, want):
    selector, branches = piecewise()
    b = GraphBuilder()
    xs = b.input((), name="x")
    (y,) = case_of(b, selector, branches, [xs], bypass=[xs], name="piece-wise linear")
    graph = b.build([y])
    for run in (lambda v: interpret(graph, v), compile(graph)):
        np.testing.assert_allclose(float(run(F32(x))), want, rtol=1e-6)


def test_case_of_bypass_maps_outputs_to_input_positions():
    s = GraphBuilder()
    s.input((), np.int32, name="k"), s.input((2,), name="a"), s.input((2,), name="b")
    selector = s.build([s.constant(np.int32(-1))])
    g = GraphBuilder()
    _, a, bb = g.input((), np.int32), g.input((2,), name="a"), g.input((2,), name="b")
    swap = g.build([g.exec(ops.ewsum(), a, bb), g.exec(ops.ewprod(), a, bb)])
    b = GraphBuilder()
    k, a, bv = b.input((), np.int32, name="k"), b.input((2,), name="a"), b.input((2,), name="b")
    outs = case_of(b, selector, [swap], [k, a, bv], bypass=[bv, 1])
    got = interpret(b.build(list(outs)), np.int32(0), F32([1, 2]), F32([3, 4]))
    assert_close(got, (F32([3, 4]), F32([1, 2])))


def test_selector_index_comes_from_the_inputs():
    s = GraphBuilder()
    k = s.input((), np.int32, name="k")
    s.input((), name="x")
    selector = s.build([k])
    branches = []
    for a in (2.0, 3.0):
        g = GraphBuilder()
        g.input((), np.int32, name="k")
        branches.append(g.build([g.exec(ops.scalar_mul(a=a), g.input((), name="x"))]))
    b = GraphBuilder()
    kk, x = b.input((), np.int32, name="k"), b.input((), name="x")
    (y,) = case_of(b, selector, branches, [kk, x], bypass=[x])
    graph = b.build([y])
    got = [float(interpret(graph, np.int32(i), F32(5))) for i in (-1, 0, 1)]
    assert got == [5.0, 10.0, 15.0]


# --- nesting ----------------------------------------------------------------------


def test_case_of_inside_a_while_body():
    """NNC's "symbolic while graph contains a case..of graph and multiply its output with
    0.3": the piece-wise function applied 4 times to 1.226, then times 0.3."""
    selector, branches = piecewise((1,))
    bb = GraphBuilder()
    x = bb.input((1,), name="x")
    (y,) = case_of(bb, selector, branches, [x], bypass=[x], name="piece-wise linear vector")
    body = bb.build([y])
    b = GraphBuilder()
    x0, a = b.input((1,), name="x"), b.input((1,), name="a")
    for bound in (None, 6):
        (out,) = while_loop(
            b, body, count_below(4), [x0], carry_overs={y: x}, max_iterations=bound, name="while 4"
        )
        graph = b.build([b.exec(ops.ewprod(), a, out, name="prod1")])
        want = (1 + 0.226 * 0.5**4) * 0.3
        for run in (lambda *v: interpret(graph, *v), compile(graph)):
            got = run(F32([1.226]), F32([0.3]))
            np.testing.assert_allclose(np.asarray(got), [want], rtol=1e-6)


def test_while_inside_a_case_branch():
    """Branch 0 is x^3 by a loop, branch 1 doubles; the selector reads k."""
    body, z0, z1 = power_body(())
    g = GraphBuilder()
    g.input((), np.int32, name="k")
    x = g.input((), name="x")
    (cube,) = while_loop(g, body, count_below(2), [x, x], carry_overs={z1: z0}, max_iterations=3)
    loop_branch = g.build([cube])
    d = GraphBuilder()
    d.input((), np.int32, name="k")
    double = d.build([d.exec(ops.scalar_mul(a=2.0), d.input((), name="x"))])
    s = GraphBuilder()
    k = s.input((), np.int32, name="k")
    s.input((), name="x")
    selector = s.build([k])
    b = GraphBuilder()
    kk, xx = b.input((), np.int32, name="k"), b.input((), name="x")
    (y,) = case_of(b, selector, [loop_branch, double], [kk, xx], bypass=[xx])
    graph = b.build([y])
    program = compile(graph)
    for i, want in ((-1, 1.5), (0, 1.5**3), (1, 3.0)):
        assert float(interpret(graph, np.int32(i), F32(1.5))) == pytest.approx(want)
        assert float(program(np.int32(i), F32(1.5))) == pytest.approx(want)
    grad = jax.grad(lambda v: interpret(graph, np.int32(0), v))(F32(1.5))
    assert float(grad) == pytest.approx(3 * 1.5**2)


# --- gradients --------------------------------------------------------------------


def test_gradient_of_x5y_matches_closed_form_and_derived_backward():
    graph = x5y(max_iterations=6)
    x, y = XY
    f = lambda x, y: jnp.sum(interpret(graph, x, y))
    gx, gy = jax.grad(f, argnums=(0, 1))(x, y)
    np.testing.assert_allclose(np.asarray(gx), 5 * x**4 * y, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(gy), x**5, rtol=1e-5)
    # the command's own (derived) backward: d(z)/d(x) for the loop node alone
    loop = graph.nodes[1]
    opdef = ops.lookup("while_loop")
    ins = (np.ones(1, F32), x)
    out = loop.cmd(*ins)
    g_init, g_x = opdef.backward((jnp.ones(1, F32),), ins, (out,), **loop.cmd.kwargs)
    np.testing.assert_allclose(np.asarray(g_x), 5 * x**4, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(g_init), x**5, rtol=1e-5)
    assert_close(g_x * y, gx)


def test_gradient_without_a_bound_says_to_set_max_iterations():
    graph = x5y()
    loop = graph.nodes[1]
    ins = (np.ones(1, F32), XY[0])
    with pytest.raises(CommandError, match="max_iterations"):
        ops.lookup("while_loop").backward(
            (jnp.ones(1, F32),), ins, (loop.cmd(*ins),), **loop.cmd.kwargs
        )
    # forward mode needs no bound
    _, tangent = jax.jvp(lambda x: interpret(graph, x, XY[1]), (XY[0],), (np.ones(1, F32),))
    np.testing.assert_allclose(np.asarray(tangent), 5 * XY[0] ** 4 * XY[1], rtol=1e-5)


def test_gradient_through_case_of():
    selector, branches = piecewise()
    b = GraphBuilder()
    x = b.input((), name="x")
    (y,) = case_of(b, selector, branches, [x], bypass=[x])
    graph = b.build([y])
    grads = [float(jax.grad(lambda v: interpret(graph, v))(F32(v))) for v in (-1, 0.5, 1.5, 3)]
    assert grads == [0.0, 1.0, 0.5, 0.0]


def test_backward_pass_through_a_bounded_loop_and_the_unbounded_error():
    graph = x5y(max_iterations=6)
    grad_graph, _ = backward(graph, graph.outputs[0], [graph.inputs[0]])
    _, gx = interpret(grad_graph, *XY)
    np.testing.assert_allclose(np.asarray(gx), 5 * XY[0] ** 4 * XY[1], rtol=1e-5)
    graph = x5y()  # no bound: the pass itself refuses, naming the loop node
    with pytest.raises(CommandError, match=r"while_loop.*no backward here.*max_iterations=N"):
        backward(graph, graph.outputs[0], [graph.inputs[0]])


def test_passes_inside_the_body_keep_the_breakpoint():
    """The breakpoint is stored as body outputs, so dce/cse renumbering the body's nodes
    cannot move it: after node 2 here means after z1, before w1."""
    from fnnc.graph import passes

    b = GraphBuilder()
    z0, w0, x = b.input((), name="z0"), b.input((), name="w0"), b.input((), name="x")
    b.exec(ops.ewexp(), x, name="dead")
    z1 = b.exec(ops.ewprod(), z0, x, name="z1")
    w1 = b.exec(ops.ewsum(), w0, b.exec(ops.ewprod(), z0, x, name="dup"), name="w1")
    body = b.build([z1, w1])
    ob = GraphBuilder()
    ins = [ob.input((), name=n) for n in ("z", "w", "x")]
    carry = {z1: z0, w1: w0}
    outs = while_loop(ob, body, count_below(3), ins, carry_overs=carry, breakpoint=2)
    graph = ob.build(list(outs))
    args = (F32(1), F32(0), F32(2))
    assert_close(interpret(graph, *args), (F32(16), F32(14)))
    for run in (passes.dce, passes.cse, lambda g: passes.cse(passes.dce(g))):
        simpler = run(graph)
        assert len(simpler.nodes[0].cmd.param("body").nodes) < len(body.nodes)
        assert_close(interpret(simpler, *args), (F32(16), F32(14)))


# --- text and files ---------------------------------------------------------------


def test_listing_names_the_carried_symbols():
    text = str(x5y(max_iterations=5))
    assert "while_loop[1 nodes; carry z1->z0; break before; max_iterations=5]" in text
    selector, branches = piecewise()
    b = GraphBuilder()
    x = b.input((), name="x")
    (y,) = case_of(b, selector, branches, [x], bypass=[x])
    assert "case_of[3 branches; bypass (0)]" in str(b.build([y]))


def test_save_load_round_trip(tmp_path):
    selector, branches = piecewise((1,))
    bb = GraphBuilder()
    x = bb.input((1,), name="x")
    (y,) = case_of(bb, selector, branches, [x], bypass=[x])
    body = bb.build([y])
    b = GraphBuilder()
    x0, a = b.input((1,), name="x"), b.input((1,), name="a")
    (out,) = while_loop(b, body, count_below(4), [x0], carry_overs={y: x}, max_iterations=6)
    graph = b.build([b.exec(ops.ewprod(), a, out)])
    path = tmp_path / "while.json"
    save(graph, path)
    back = load(path)
    assert back == graph and str(back) == str(graph)
    args = (F32([1.226]), F32([0.3]))
    assert_close(interpret(back, *args), interpret(graph, *args))


# --- errors -----------------------------------------------------------------------


def loop_in(body, cond, carry, inputs_specs, **kw):
    b = GraphBuilder()
    ins = [b.input(shape, dtype, name=f"i{k}") for k, (shape, dtype) in enumerate(inputs_specs)]
    return while_loop(b, body, cond, ins, carry_overs=carry, **kw)


def test_body_output_without_carry_over_is_named():
    body, (z0, _), (z1, _) = two_carry_body()
    with pytest.raises(GraphError, match=r"body output %4 \(w1\) has no carry-over"):
        loop_in(body, count_below(3), {z1: z0}, [((), F32)] * 3)


def test_body_writing_its_own_input_is_named():
    with config.override(checks=False):
        b = GraphBuilder()
        z, x = b.input((), name="z"), b.input((), name="x")
        b.exec(ops.ewprod(), z, x, outputs=[z], name="in place")
        body = b.build([z])
    with pytest.raises(GraphError, match=r"writes the body input %0 \(z\).*carry it over"):
        loop_in(body, count_below(3), [], [((), F32)] * 2)


def test_carry_over_with_mismatched_specs_is_named():
    b = GraphBuilder()
    z0, x = b.input((2,), name="z0"), b.input((3,), name="x")
    z1 = b.exec(ops.reduce_sum(axes=(0,)), x, name="z1")
    body = b.build([z1])
    with pytest.raises(ShapeError, match=r"%2 \(z1\) -> %0 \(z0\).*float32\[1\].*float32\[2\]"):
        loop_in(body, count_below(3), {z1: z0}, [((2,), F32), ((3,), F32)])
    b = GraphBuilder()
    z0, x = b.input((), np.int32, name="z0"), b.input((), name="x")
    z1 = b.exec(ops.scalar_mul(a=2.0), x, name="z1")
    body = b.build([z1])
    with pytest.raises(DTypeError, match=r"%2 \(z1\) -> %0 \(z0\)"):
        loop_in(body, count_below(3), {z1: z0}, [((), np.int32), ((), F32)])


def test_condition_must_return_a_bool_scalar():
    body, z0, z1 = power_body(())
    c = GraphBuilder()
    n = c.input((), np.int32, name="count")
    as_float = c.build([c.exec(ops.datatype_conversion(dtype="float32"), n, name="f")])
    with pytest.raises(
        DTypeError, match=r"condition returns %1 \(f\): float32\[\], expected a bool"
    ):
        loop_in(body, as_float, {z1: z0}, [((), F32)] * 2)
    c = GraphBuilder()
    n = c.input((), np.int32, name="count")
    wide = c.exec(ops.compare(), n, c.constant(np.zeros(3, np.int32)), name="t")
    with pytest.raises(ShapeError, match=r"condition returns %2 \(t\): bool\[3\]"):
        loop_in(body, c.build([wide]), {z1: z0}, [((), F32)] * 2)
    c = GraphBuilder()
    n = c.input((), name="count")
    wrong_count = c.build([c.exec(ops.compare(), n, c.constant(F32(3)))])
    with pytest.raises(
        DTypeError, match=r"first input %0 \(count\) is float32\[\], but the loop count"
    ):
        loop_in(body, wrong_count, {z1: z0}, [((), F32)] * 2)


def test_condition_reading_a_later_output_is_named():
    body, z0, z1 = power_body(())
    c = GraphBuilder()
    c.input((), np.int32, name="count")
    c.input((), name="z1")
    cond = c.build([c.constant(np.bool_(True))])
    with pytest.raises(GraphError, match=r"reads body output %2 \(z1\).*after the breakpoint"):
        loop_in(body, cond, {z1: z0}, [((), F32)] * 2, cond_inputs=[z1])


def test_symbols_that_are_not_outputs_or_of_another_graph():
    body, z0, z1 = power_body(())
    with pytest.raises(GraphError, match=r"carry-over source %0 \(z0\) is not a body output"):
        loop_in(body, count_below(2), {z0: z0}, [((), F32)] * 2)
    other, *_ = power_body((3,))
    with pytest.raises(GraphError, match="not a symbol of the body graph"):
        loop_in(body, count_below(2), {other.symbols[2]: z0}, [((), F32)] * 2)
    with pytest.raises(ShapeError, match=r"input 1 is float32\[2\].*body input %1 \(x\)"):
        loop_in(body, count_below(2), {z1: z0}, [((), F32), ((2,), F32)])
    with pytest.raises(CommandError, match="breakpoint"):
        loop_in(body, count_below(2), {z1: z0}, [((), F32)] * 2, breakpoint=5)


def test_case_branches_must_agree_on_output_specs():
    selector, (zero, half, _) = piecewise()
    g = GraphBuilder()
    x = g.input((), name="x")
    wide = g.build([g.exec(ops.broadcast_to(shape=(2,)), x, name="y2")])
    b = GraphBuilder()
    xs = b.input((), name="x")
    with pytest.raises(ShapeError, match=r"branch 2 output %1 \(y2\) is float32\[2\].*%1 \(y0\)"):
        case_of(b, selector, [zero, half, wide], [xs], bypass=[xs])


def test_selector_must_return_an_int_scalar():
    _, branches = piecewise()
    s = GraphBuilder()
    x = s.input((), name="x")
    as_float = s.build([s.exec(ops.scalar_mul(a=1.0), x, name="k")])
    b = GraphBuilder()
    xs = b.input((), name="x")
    with pytest.raises(
        DTypeError, match=r"selector returns %1 \(k\): float32\[\], expected an integer scalar"
    ):
        case_of(b, as_float, branches, [xs], bypass=[xs])
    s = GraphBuilder()
    s.input((), name="x")
    vector = s.build([s.constant(np.zeros(2, np.int32), name="k")])
    with pytest.raises(ShapeError, match=r"selector returns %1 \(k\): int32\[2\]"):
        case_of(b, vector, branches, [xs], bypass=[xs])


def test_bypass_must_name_inputs_of_matching_specs():
    selector, branches = piecewise()
    b = GraphBuilder()
    xs, other = b.input((), name="x"), b.input((2,), name="other")
    with pytest.raises(GraphError, match=r"bypass output 0 names %1 \(other\)"):
        case_of(b, selector, branches, [xs], bypass=[other])
    s2 = GraphBuilder()
    s2.input((), name="x")
    s2.input((2,), name="other")
    sel2 = s2.build([s2.constant(np.int32(0))])
    br = []
    for _ in range(1):
        g = GraphBuilder()
        x, _o = g.input((), name="x"), g.input((2,), name="other")
        br.append(g.build([g.exec(ops.scalar_mul(a=2.0), x, name="y")]))
    with pytest.raises(ShapeError, match=r"bypass output 0 \(input 1\) is float32\[2\].*%2 \(y\)"):
        case_of(b, sel2, br, [xs, other], bypass=[other])
