"""User mistakes raise the matching FnncError subclass (which also derives from the
builtin callers expect), with a message naming the node or tensor and the shapes."""

from __future__ import annotations

import numpy as np
import pytest

from fnnc import ops
from fnnc.errors import (
    CommandError,
    DTypeError,
    FnncError,
    GraphError,
    GraphInputError,
    ShapeError,
    UnknownCommandError,
)
from fnnc.graph import Graph, GraphBuilder, compile, interpret


def _raises(cls: type[Exception], builtin: type[Exception] | None, fn, *fragments: str) -> str:
    with pytest.raises(cls) as info:
        fn()
    err = info.value
    assert isinstance(err, FnncError)
    if builtin is not None:
        assert isinstance(err, builtin)
    msg = str(err)
    for fragment in fragments:
        assert fragment in msg, f"{fragment!r} not in: {msg}"
    return msg


# -- at exec: the shape rule runs as the node is added --------------------------------------


def test_gemm_shape_mismatch_at_exec() -> None:
    b = GraphBuilder()
    x = b.input((2, 3), name="x")
    w = b.input((4, 3), name="w")
    _raises(
        ShapeError,
        ValueError,
        lambda: b.exec(ops.gemm(), x, w, name="fc"),
        "node 'fc' (gemm)",
        "float32[2, 3]",
        "float32[4, 3]",
        "k=3",
        "k=4",
        "%0 (x):float32[2, 3]",
        "%1 (w):float32[4, 3]",
        "gemm(transpose_b=True)",
    )
    # The suggested fix works and gives x @ w.T.
    y = b.exec(ops.gemm(transpose_b=True), x, w, name="fc")
    assert y.shape == (2, 4)


def test_broadcast_mismatch_at_exec() -> None:
    b = GraphBuilder()
    x = b.input((2, 3), name="x")
    y = b.input((4,), name="y")
    _raises(
        ShapeError,
        ValueError,
        lambda: b.exec(ops.ewsum(), x, y, name="s"),
        "node 's' (ewsum)",
        "[2, 3], [4] do not broadcast",
        "%1 (y):float32[4]",
    )


def test_wrong_dtype_at_exec() -> None:
    b = GraphBuilder()
    x = b.input((2, 3), name="x")
    i = b.input((2, 3), np.int32, name="i")
    _raises(
        DTypeError,
        TypeError,
        lambda: b.exec(ops.ewprod(), x, i, name="p"),
        "node 'p' (ewprod)",
        "float32[2, 3]",
        "int32[2, 3]",
        "datatype_conversion",
    )
    _raises(
        DTypeError,
        TypeError,
        lambda: b.exec(ops.select(), x, x, x, name="sel"),
        "node 'sel' (select)",
        "condition must be bool, got float32[2, 3]",
    )


def test_wrong_number_of_inputs() -> None:
    b = GraphBuilder()
    x = b.input((2,), name="x")
    _raises(
        CommandError,
        ValueError,
        lambda: b.exec(ops.ewdiv(), x, name="d"),
        "node 'd' (ewdiv)",
        "expected 2 input(s), got 1",
        "ewdiv(a, b)",
    )
    _raises(
        CommandError,
        ValueError,
        lambda: b.exec(ops.ewexp(), x, x, name="e"),
        "node 'e' (ewexp)",
        "expected 1 input(s), got 2",
    )
    _raises(
        CommandError,
        ValueError,
        lambda: b.exec(ops.gemm(), x, x, x, x, name="g"),
        "expected 2 to 3 input(s), got 4",
    )
    # The same mistake in an eager call.
    _raises(
        CommandError,
        ValueError,
        lambda: ops.ewdiv()(np.ones(2, np.float32)),
        "ewdiv: expected 2 input(s), got 1",
    )


def test_variadic_command_with_no_inputs() -> None:
    b = GraphBuilder()
    _raises(
        CommandError,
        ValueError,
        lambda: b.exec(ops.ewsum(), name="none"),
        "node 'none' (ewsum)",
        "expected at least 1 input(s), got 0",
    )


def test_eager_call_shape_mismatch() -> None:
    a, w = np.ones((2, 3), np.float32), np.ones((4, 3), np.float32)
    _raises(ShapeError, ValueError, lambda: ops.gemm()(a, w), "float32[2, 3]", "float32[4, 3]")


# -- commands ----------------------------------------------------------------------------------


def test_unknown_command() -> None:
    msg = _raises(
        UnknownCommandError,
        KeyError,
        lambda: ops.lookup("no_such"),
        "unknown command 'no_such'",
        "fnnc.ops.registry()",
    )
    assert not msg.startswith('"'), "KeyError quoting leaked into the message"
    _raises(UnknownCommandError, KeyError, lambda: ops.lookup("ewsun"), "Did you mean ewsum")
    _raises(
        UnknownCommandError, KeyError, lambda: ops.lookup("scalarmul"), "Did you mean scalar_mul"
    )
    _raises(
        UnknownCommandError, KeyError, lambda: ops.Command("gemmm").definition, "Did you mean gemm"
    )


def test_unknown_hyper_parameter() -> None:
    _raises(
        CommandError,
        ValueError,
        lambda: ops.gemm(transpose_c=True),
        "gemm: unknown hyper-parameter(s) ['transpose_c']",
        "transpose_a",
        "transpose_b",
    )
    _raises(CommandError, ValueError, lambda: ops.scalar_mul(alpha=2.0), "['alpha']", "['a']")
    _raises(
        CommandError,
        ValueError,
        lambda: ops.gemm().param("bias"),
        "command gemm has no hyper-parameter 'bias'",
    )
    _raises(
        CommandError,
        ValueError,
        lambda: ops.clamp(min=np.zeros(3)),
        "array hyper-parameters are not allowed",
    )


def test_symbols_from_another_builder() -> None:
    b1, b2 = GraphBuilder(), GraphBuilder()
    x1 = b1.input((2, 3), name="x")
    b2.input((3,), name="other")
    y2 = b2.input((5,), name="y")
    _raises(
        GraphError,
        ValueError,
        lambda: b1.exec(ops.ewexp(), y2, name="e"),
        "node e",
        "%1 (y)",
        "belongs to another builder",
    )
    _raises(GraphError, ValueError, lambda: b2.exec(ops.ewexp(), x1), "%0 (x)", "another builder")
    _raises(GraphError, ValueError, lambda: b2.build([x1]), "build", "another builder")
    _raises(GraphError, ValueError, lambda: b2.alias(x1, (6,)), "alias", "another builder")


# -- feeding a graph: interpret and compiled programs -------------------------------------------


def _graph() -> Graph:
    b = GraphBuilder()
    x = b.input((2, 3), name="x")
    w = b.input((3,), name="w")
    return b.build([b.exec(ops.mul(), x, w, name="m")])


GOOD = (np.ones((2, 3), np.float32), np.ones((3,), np.float32))


@pytest.fixture(scope="module")
def runners():
    graph = _graph()
    program = compile(graph)
    return {
        "interpret": (lambda *xs: interpret(graph, *xs)),
        "Program": program,
    }


@pytest.mark.parametrize("where", ["interpret", "Program"])
def test_wrong_number_of_arrays(runners, where: str) -> None:
    run = runners[where]
    _raises(
        GraphInputError,
        ValueError,
        lambda: run(GOOD[0]),
        f"{where}: the graph takes 2 array(s) (%0 (x), %1 (w)), got 1",
    )
    _raises(GraphInputError, ValueError, lambda: run(*GOOD, GOOD[1]), "takes 2 array(s)", "got 3")
    _raises(GraphInputError, ValueError, lambda: run(), "got 0")


@pytest.mark.parametrize("where", ["interpret", "Program"])
def test_wrong_shape_of_an_array(runners, where: str) -> None:
    run = runners[where]
    _raises(
        ShapeError,
        ValueError,
        lambda: run(GOOD[0], np.ones((4,), np.float32)),
        f"{where}: input %1 (w) expects float32[3], got float32[4]",
    )
    _raises(
        ShapeError,
        ValueError,
        lambda: run(GOOD[0].T, GOOD[1]),
        "input %0 (x) expects float32[2, 3], got float32[3, 2]",
    )


@pytest.mark.parametrize("where", ["interpret", "Program"])
def test_wrong_dtype_of_an_array(runners, where: str) -> None:
    run = runners[where]
    _raises(
        DTypeError,
        TypeError,
        lambda: run(GOOD[0], np.ones((3,), np.int32)),
        f"{where}: input %1 (w) expects float32[3], got int32[3]",
        ".astype(float32)",
    )


@pytest.mark.parametrize("where", ["interpret", "Program"])
def test_good_arrays_still_run(runners, where: str) -> None:
    """After the errors above, the same runner gives x * w (the checks did not break it)."""
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    w = np.array([1.0, -2.0, 0.5], np.float32)
    np.testing.assert_array_equal(np.asarray(runners[where](x, w)), x * w)
    # pytrees of arrays are flattened in order
    np.testing.assert_array_equal(np.asarray(runners[where]((x, w))), x * w)


def test_compile_donate_unknown_name() -> None:
    graph = _graph()
    _raises(
        GraphInputError,
        ValueError,
        lambda: compile(graph, donate=["nope"]),
        "donate names input 'nope'",
        "['x', 'w']",
    )
    _raises(
        GraphInputError,
        ValueError,
        lambda: compile(graph, donate=[2]),
        "donate index 2 is not a graph input position",
    )
    _raises(GraphInputError, ValueError, lambda: compile(graph, donate=[-1]), "donate index -1")


def test_a_read_nothing_writes_is_an_error_not_zeros() -> None:
    """A hand-made graph (``dataclasses.replace`` in a pass) that dropped an input: compile
    and interpret read zeros for it, silently; now they name the node and the tensor. A
    root written only through views still starts as zeros (NNC leaves it unset)."""
    import dataclasses

    b = GraphBuilder()
    x, w = b.input((2, 3), name="x"), b.input((4, 3), name="w")
    graph = b.build([b.exec(ops.gemm(transpose_b=True), x, w, name="fc")])
    dropped = dataclasses.replace(graph, inputs=(x.id,))
    xs = np.ones((2, 3), np.float32)
    for run in (lambda: interpret(dropped, xs), lambda: compile(dropped)(xs)):
        _raises(GraphError, None, run, r"node 0 (fc) read %1 (w)", "verify(graph)")
    b = GraphBuilder()
    x = b.input((2,), name="x")
    root = b.tensor((4,), name="root")
    b.exec(ops.relu(), x, outputs=[b.alias(root, (2,), offset=(1,))])
    got = interpret(b.build([root]), np.array([-1.0, 2.0], np.float32))
    np.testing.assert_array_equal(np.asarray(got), [0.0, 0.0, 2.0, 0.0])


def test_graph_entry_points_refuse_what_is_not_a_graph() -> None:
    """A function, a name or a number where a graph goes is a GraphError naming the entry
    point and what came (it was an AttributeError from inside)."""
    from fnnc.graph import memory_plan, run_passes, simplify, to_dot, verify

    x = np.ones((2, 3), np.float32)
    cases = {
        "compile": (lambda: compile(lambda a: a), "got function '<lambda>'", "trace("),
        "interpret": (lambda: interpret("g", x), "got str 'g'", "GraphBuilder"),
        "verify": (lambda: verify(3), "got int 3", "GraphBuilder"),
        "memory_plan": (lambda: memory_plan("g"), "got str 'g'", "GraphBuilder"),
        "to_dot": (lambda: to_dot(3), "got int 3", "GraphBuilder"),
        "run_passes": (lambda: run_passes(None, ()), "got NoneType None", "GraphBuilder"),
        "simplify": (lambda: simplify([1]), "got list [1]", "GraphBuilder"),
    }
    for where, (run, *fragments) in cases.items():
        _raises(GraphError, ValueError, run, f"{where}: expected a fnnc.graph.Graph", *fragments)
    program = compile(_graph())
    _raises(GraphError, ValueError, lambda: verify(program), "pass its .graph")


def test_compile_donates_one_position_or_name() -> None:
    """``donate=0`` and ``donate="x"`` are ``donate=[0]`` (they raised "not iterable");
    a bool or a non-position is refused, saying what donate takes."""
    from fnnc.graph import memory_plan

    graph = _graph()
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    w = np.array([1.0, -2.0, 0.5], np.float32)
    for donate in (0, "x", np.int64(0)):
        program = compile(graph, donate=donate)
        assert program.donate == (0,)
        np.testing.assert_array_equal(np.asarray(program(x.copy(), w)), x * w)
        assert memory_plan(graph, donate=donate) == memory_plan(graph, donate=[0])
    for bad in (True, [0.5], 2.5):
        _raises(GraphInputError, ValueError, lambda: compile(graph, donate=bad), "compile: donate")
    _raises(GraphInputError, ValueError, lambda: memory_plan(graph, donate=1.5), "memory_plan")
