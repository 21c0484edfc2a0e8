"""Audit of issue 2 (foundation: symbolic graph, trace, interpret, compile).

Checked here, as the issue states them:
- the package surface: ``GraphBuilder``, ``verify``, ``trace``, ``interpret``,
  ``compile -> Program``, ``save`` / ``load``, ``to_dot`` in ``fnnc.graph``; the error
  hierarchy in ``fnnc.errors`` (every error a ``FnncError`` and the fitting builtin);
- the frozen IR: integer SSA ids, tensor symbols with name and spec, alias symbols
  (offset / stride / shape views of a root, NNC's rules, an alias of an alias);
- ``str(graph)`` (the SSA listing), ``to_dot``, ``save`` / ``load`` as plain JSON (no
  pickle) that round-trips hand-built and traced graphs;
- ``compile -> Program``: one jitted XLA program, donation for in-place,
  ``Program.memory()`` from XLA's memory analysis, the lowered text;
- NNC's autograd example (w = x*x, u = 1/x, v = log u, z = w + v) = 0.879953387 at
  x = 0.84, interpreted and compiled;
- ``compile(trace(f))(*args) == f(*args) == interpret(trace(f), *args)`` for a Flax NNX
  MLP, an NNX CNN with BatchNorm and pooling, a Linen transformer block, ``lax.cond``,
  ``lax.scan``, ``lax.while_loop``, ``jax.nn.softmax``, ``jnp.where``, integer indexing;
  common primitives mapped to commands, higher-order ones kept as generic nodes whose
  backward is the VJP; tracing valid but unusual JAX programs;
- bad input: clear ``FnncError`` subclasses naming the node and tensors for mismatched
  gemm / conv shapes at ``exec``, wrong dtype, unknown command, the wrong number or
  shapes of arrays, a loaded file that is not a graph.

Oracles: the JAX / Flax functions themselves, NumPy closed forms, ``jax.grad``.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import pickle

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax import lax

import fnnc
from fnnc import errors, ops
from fnnc.errors import (
    DTypeError,
    FnncError,
    GraphError,
    GraphFormatError,
    GraphInputError,
    ShapeError,
    UnknownCommandError,
)
from fnnc.graph import (
    AliasSymbol,
    Graph,
    GraphBuilder,
    Program,
    backward,
    compile,
    interpret,
    load,
    save,
    to_dot,
    trace,
    verify,
)
from tests.helpers import assert_close, rand

F32 = np.float32


def _both(graph: Graph, *args):
    """(interpret, compile) results of ``graph`` on ``args``."""
    return interpret(graph, *args), compile(graph)(*args)


def _commands(graph: Graph) -> collections.Counter:
    return collections.Counter(n.cmd.name for n in graph.nodes)


def _generic(graph: Graph) -> list[str]:
    return [
        str(n.cmd.param("prim"))
        for n in graph.nodes
        if n.cmd.name in ("primitive", "effectful_primitive")
    ]


# -- package surface --------------------------------------------------------------------------


def test_graph_package_exports_the_names_the_issue_uses() -> None:
    """fnnc.graph exports GraphBuilder, verify, trace, interpret, compile, Program, save,
    load and to_dot; fnnc exposes FnncError at the top."""
    import fnnc.graph as g

    for name in (
        "GraphBuilder",
        "verify",
        "trace",
        "interpret",
        "compile",
        "Program",
        "save",
        "load",
        "to_dot",
    ):
        assert callable(getattr(g, name)), name
    assert fnnc.FnncError is errors.FnncError


def test_error_hierarchy_pairs_fnnc_errors_with_builtins() -> None:
    """Every error class in fnnc.errors derives from FnncError; shape errors are
    ValueErrors, dtype errors TypeErrors, unknown commands KeyErrors."""
    classes = [
        v
        for v in vars(errors).values()
        if isinstance(v, type) and issubclass(v, Exception) and v.__module__ == errors.__name__
    ]
    assert len(classes) >= 8
    assert all(issubclass(c, FnncError) for c in classes)
    assert issubclass(ShapeError, ValueError)
    assert issubclass(DTypeError, TypeError)
    assert issubclass(UnknownCommandError, KeyError)
    assert issubclass(GraphInputError, ValueError) and issubclass(GraphFormatError, ValueError)


# -- NNC's autograd example -------------------------------------------------------------------


def _autograd_graph(shape: tuple[int, ...]) -> Graph:
    b = GraphBuilder()
    x = b.input(shape, name="x")
    w = b.exec(ops.ewprod(), x, x, name="w")
    u = b.exec(ops.ewdiv(), b.constant(np.ones(shape, F32)), x, name="u")
    v = b.exec(ops.ewlog(), u, name="v")
    z = b.exec(ops.ewsum(), w, v, name="z")
    return b.build([z])


@pytest.mark.parametrize("shape", [(), (1,)])
def test_nnc_autograd_example_is_0_879953387(shape) -> None:
    """w = x*x, u = 1/x, v = log u, z = w + v at x = 0.84: 0.879953387 (float32, 1e-6),
    both interpreted and compiled, for a scalar and a [1] input."""
    graph = _autograd_graph(shape)
    x = np.full(shape, 0.84, F32)
    for got in _both(graph, x):
        got = np.asarray(got)
        assert got.dtype == F32 and got.shape == shape
        assert abs(float(got.reshape(-1)[0]) - 0.879953387) < 1e-6
    # a Python float feeds a scalar input too
    if shape == ():
        assert abs(float(interpret(graph, 0.84)) - 0.879953387) < 1e-6


# -- the IR -------------------------------------------------------------------------------------


def test_ir_is_frozen_with_integer_ssa_ids() -> None:
    """Symbols carry id, name and spec; ids equal positions; graph, nodes and symbols are
    frozen, so an edit raises instead of changing the graph."""
    graph = _autograd_graph(())
    assert all(s.id == i and isinstance(s.id, int) for i, s in enumerate(graph.symbols))
    x = graph.symbol(graph.inputs[0])
    assert x.name == "x" and x.spec == jax.ShapeDtypeStruct((), F32)
    written = [o for n in graph.nodes for o in n.outputs]
    assert len(written) == len(set(written)), "SSA: each symbol written once"
    for obj, field in ((graph, "nodes"), (graph.nodes[0], "name"), (x, "name")):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(obj, field, None)
    assert hash(graph) == hash(_autograd_graph(())) and graph == _autograd_graph(())


def test_alias_views_follow_nnc_offset_and_stride() -> None:
    """A slice alias (offset on a [4, 6] root), a strided alias (every other column, as
    NNC's inc) and an alias of an alias read what the same NumPy views hold."""
    b = GraphBuilder()
    x = b.input((4, 6), name="x")
    block = b.alias(x, (2, 3), offset=(1, 2), name="block")
    evens = b.alias(x, (4, 3), stride=(6, 2), name="evens")
    inner = b.alias(block, (2, 2), offset=(0, 1), name="inner")
    flat = b.alias(x, (24,), name="flat")
    outs = [b.exec(ops.scalar_mul(a=1.0), v) for v in (block, evens, inner, flat)]
    graph = b.build(outs)
    assert all(isinstance(graph.symbol(s.id), AliasSymbol) for s in (block, evens, inner))
    assert graph.symbol(inner.id).root == x.id  # an alias of an alias views the root
    xs = np.arange(24, dtype=F32).reshape(4, 6)
    want = [xs[1:3, 2:5], xs[:, ::2], xs[1:3, 3:5], xs.reshape(-1)]
    for got in _both(graph, xs):
        assert_close(list(got), want, 0, 0)


def test_disjoint_alias_writes_assemble_one_tensor() -> None:
    """Two nodes write the two halves of one tensor through aliases (NNC's concat by
    views); reading the whole tensor gives the assembled result."""
    b = GraphBuilder()
    x = b.input((2, 3), name="x")
    t = b.tensor((2, 6), name="t")
    b.exec(ops.ewexp(), x, outputs=[b.alias(t, (2, 3), name="left")])
    b.exec(ops.scalar_mul(a=-2.0), x, outputs=[b.alias(t, (2, 3), offset=(0, 3), name="right")])
    graph = b.build([b.exec(ops.reduce_sum(axes=(1,)), t)])
    xs = rand((2, 3))
    want = (np.exp(xs).sum(1) - 2 * xs.sum(1)).reshape(2, 1)
    for got in _both(graph, xs):
        assert_close(got, want, 1e-5, 1e-5)


def test_verify_returns_the_graph_and_names_a_broken_node() -> None:
    """verify(graph) returns it; a hand-edited graph that reads a symbol before it is
    written raises GraphError naming the node, with the listing marked."""
    graph = _autograd_graph(())
    assert verify(graph) is graph
    nodes = list(graph.nodes)
    nodes[0], nodes[3] = nodes[3], nodes[0]  # ewlog before the ewdiv it reads
    broken = dataclasses.replace(graph, nodes=tuple(nodes))
    with pytest.raises(GraphError) as info:
        verify(broken)
    msg = str(info.value)
    assert "node 0" in msg and "ewlog" in msg and ">>" in msg


# -- text, dot, files ---------------------------------------------------------------------------


def test_str_graph_is_the_ssa_listing() -> None:
    """str(graph) lists the inputs with names and specs, one line per node with the node's
    integer SSA ids, command and hyper-parameters, and the return line."""
    b = GraphBuilder()
    x = b.input((2, 3), name="x")
    w = b.input((4, 3), name="w")
    y = b.exec(ops.gemm(transpose_b=True), x, w, name="fc")
    z = b.exec(ops.relu(), y)
    text = str(b.build([z]))
    lines = text.splitlines()
    assert lines[0] == "graph(%0:f32[2,3] x, %1:f32[4,3] w) {"
    assert lines[1].strip() == "%2:f32[2,4] = gemm[transpose_b=True](%0, %1)  # fc"
    assert lines[2].strip() == "%3:f32[2,4] = relu(%2)"
    assert lines[-2].strip() == "return %3" and lines[-1] == "}"


def test_to_dot_is_graphviz_text_of_every_node_and_tensor() -> None:
    """to_dot gives a 'digraph' with one box per node (named) and an edge per use."""
    graph = _autograd_graph(())
    dot = to_dot(graph)
    assert dot.lstrip().startswith("digraph") and dot.rstrip().endswith("}")
    for name in ("w", "u", "v", "z"):
        assert f"\\n{name}" in dot, name
    assert dot.count("->") >= sum(len(n.inputs) + len(n.outputs) for n in graph.nodes)


def test_save_load_round_trip_is_plain_json(tmp_path) -> None:
    """save writes JSON (no pickle); load gives an equal graph computing the same, with
    constants, aliases and several outputs."""
    b = GraphBuilder()
    x = b.input((2, 4), name="x")
    c = b.constant(rand((2, 4), seed=3), name="c")
    half = b.alias(x, (2, 2), offset=(0, 2), name="half")
    y = b.exec(ops.ewprod(), x, c, name="p")
    graph = b.build([y, b.exec(ops.tanh(), half)])
    path = tmp_path / "g.json"
    save(graph, path)
    raw = path.read_bytes()
    assert not raw.startswith(b"\x80")  # not a pickle stream
    data = json.loads(raw)
    assert isinstance(data, dict)
    loaded = load(path)
    assert loaded == graph and str(loaded) == str(graph)
    xs = rand((2, 4), seed=4)
    assert_close(list(interpret(loaded, xs)), list(interpret(graph, xs)), 0, 0)


def test_traced_graph_with_control_flow_saves_and_loads(tmp_path) -> None:
    """A traced function holding a generic node (lax.cond) saves and loads, and the loaded
    graph computes f."""

    def f(x, w):
        h = jnp.tanh(x @ w)
        return lax.cond(h.sum() > 0, lambda a: a * 2.0, lambda a: a - 1.0, h)

    x, w = rand((3, 4)), rand((4, 2), seed=1)
    graph = trace(f, x, w)
    save(graph, str(tmp_path / "t.json"))
    loaded = load(str(tmp_path / "t.json"))
    for xs in ((x, w), (-x, w)):  # both branches
        want = f(*xs)
        assert_close(interpret(loaded, *xs), want)
        assert_close(compile(loaded)(*xs), want)


# -- compile -> Program ---------------------------------------------------------------------


def _mlp_graph() -> Graph:
    b = GraphBuilder()
    x = b.input((8, 16), name="x")
    w = b.input((32, 16), name="w")
    h = b.exec(ops.relu(), b.exec(ops.gemm(transpose_b=True), x, w, name="fc"))
    return b.build([b.exec(ops.reduce_sum(axes=(1,)), h)])


def test_compile_returns_a_program_of_one_xla_module() -> None:
    """compile(graph) is a Program; its lowered text is one StableHLO module with a main
    function (one jax.jit), holding the dot of the gemm node."""
    program = compile(_mlp_graph())
    assert isinstance(program, Program)
    text = program.lowered_text()
    assert isinstance(text, str) and text.count("module @") == 1
    assert "func.func public @main" in text and "dot_general" in text
    x, w = rand((8, 16)), rand((32, 16), seed=1)
    want = np.maximum(x @ w.T, 0).sum(1, keepdims=True)
    assert_close(program(x, w), want, 1e-5, 1e-5)


def test_program_memory_reports_xla_memory_analysis() -> None:
    """Program.memory() gives XLA's bytes: arguments cover both inputs, outputs the
    result, and a peak estimate of at least arguments + outputs."""
    mem = compile(_mlp_graph()).memory()
    assert mem.argument_bytes >= (8 * 16 + 32 * 16) * 4
    assert mem.output_bytes >= 8 * 4
    assert mem.temp_bytes >= 0 and mem.alias_bytes == 0
    assert mem.peak_estimate_bytes >= mem.argument_bytes + mem.output_bytes
    assert "argument_bytes" in str(mem)


def test_donation_runs_in_place() -> None:
    """compile(graph, donate=[name]) lets the output reuse the donated input: XLA reports
    aliased bytes, the result is right and the donated array is consumed."""
    b = GraphBuilder()
    x = b.input((64,), name="x")
    graph = b.build([b.exec(ops.scalar_mul(a=3.0), x)])
    program = compile(graph, donate=["x"])
    assert program.memory().alias_bytes == 64 * 4
    xs = jnp.arange(64, dtype=F32)
    y = program(xs)
    np.testing.assert_array_equal(np.asarray(y), 3 * np.arange(64, dtype=F32))
    assert xs.is_deleted()


# -- trace: the issue's list of programs ----------------------------------------------------


class _MLP(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.fc1 = nnx.Linear(6, 8, rngs=rngs)
        self.out = nnx.Linear(8, 3, rngs=rngs)

    def __call__(self, x):
        return self.out(nnx.relu(self.fc1(x)))


def _control_flow(x, i):
    """lax.cond, lax.scan, lax.while_loop, jax.nn.softmax, jnp.where and integer
    indexing in one function (the Flax models of the issue are in test_trace.py)."""
    a = lax.cond(x.sum() > 0, jnp.sin, lambda v: v * v - 1.0, x)

    def step(c, row):
        c = jnp.tanh(c + row)
        return c, c * 2.0

    last, rows = lax.scan(step, jnp.zeros(4, F32), a)
    n, grown = lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, c[1] * 1.5 + 0.1), (0, rows))
    p = jax.nn.softmax(grown, axis=-1)
    w = jnp.where(p > 0.25, p, -x)
    picked = w[i] + x[1][None, :] - x[:, 2][i][:, None]
    return {"last": last, "n": n, "picked": picked}


@pytest.mark.parametrize("sign", [1.0, -1.0], ids=["cond_true", "cond_false"])
def test_compile_of_trace_equals_f_and_interpret(sign: float) -> None:
    """compile(trace(f))(*args) == f(*args) == interpret(trace(f), *args) for a function
    using lax.cond (both branches), lax.scan, lax.while_loop, jax.nn.softmax, jnp.where
    and integer indexing; the dict output keeps its structure."""
    x = sign * np.abs(rand((3, 4), seed=5))
    idx = np.array([2, 0, 2], np.int32)
    graph = trace(_control_flow, x, idx)
    want = _control_flow(x, idx)
    got_i, got_c = _both(graph, x, idx)
    assert set(got_c) == {"last", "n", "picked"}
    assert_close(got_i, want, 1e-5, 1e-5, what="interpret")
    assert_close(got_c, want, 1e-5, 1e-5, what="compile")
    assert np.asarray(got_c["n"]).dtype == np.asarray(want["n"]).dtype


def test_common_primitives_map_to_fnnc_commands() -> None:
    """dot_general -> gemm, conv_general_dilated -> convolution, add / mul -> the
    elementwise family, sum / max reductions -> reduce commands; jit inlined."""

    @jax.jit
    def inner(x, w):
        return x @ w

    def f(img, k, x, w):
        c = lax.conv_general_dilated(
            img, k, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
        )
        y = inner(x, w) * 2.0 + x.sum(axis=1, keepdims=True)
        return c.max(axis=(1, 2)), y

    args = (
        rand((1, 5, 5, 2)),
        rand((3, 3, 2, 4), seed=1),
        rand((3, 4), seed=2),
        rand((4, 4), seed=3),
    )
    graph = trace(f, *args)
    names = _commands(graph)
    assert names["gemm"] == 1 and names["convolution"] == 1, names
    assert names["reduce_sum"] >= 1 and names["reduce_max"] >= 1, names
    elementwise = {"add", "ewsum", "mul", "ewprod", "scalar_mul"}
    assert sum(names[n] for n in elementwise) >= 2, names
    assert not _generic(graph), _generic(graph)  # pjit inlined, nothing generic
    assert_close(compile(graph)(*args), f(*args), 1e-5, 1e-5)


def test_higher_order_primitives_stay_generic_nodes() -> None:
    """cond, while, scan and custom_jvp_call are carried as generic nodes."""
    x = rand((3, 4))

    @jax.custom_jvp
    def soft(x):
        return jnp.log1p(jnp.exp(x))

    soft.defjvp(lambda p, t: (soft(p[0]), t[0] * jax.nn.sigmoid(p[0])))

    def f(x):
        a = lax.cond(x[0, 0] > 0, jnp.sin, jnp.cos, x)
        b = lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, c[1] + 1.0), (0, a))[1]
        c = lax.scan(lambda c, r: (c + r, c), jnp.zeros(4, F32), b)[1]
        return soft(c)

    graph = trace(f, x)
    prims = " ".join(_generic(graph))
    for name in ("cond", "while", "scan", "custom_jvp_call"):
        assert name in prims, (name, prims)
    assert_close(compile(graph)(x), f(x), 1e-5, 1e-5)


def test_generic_nodes_differentiate_by_their_vjp() -> None:
    """The backward of a traced lax.cond and lax.scan (generic nodes) equals jax.grad."""

    def f(x, w):
        h = lax.cond(x.sum() > 0, lambda a: jnp.sin(a) * w, lambda a: a * w, x)
        return lax.scan(lambda c, r: (c * 0.5 + r, None), jnp.zeros(4, F32), h)[0].sum()

    x, w = np.abs(rand((3, 4))), rand((3, 4), seed=1)
    graph = trace(f, x, w)
    out = graph.outputs[0]
    gg, _grads = backward(graph, out, [graph.inputs[0], graph.inputs[1]])
    got = interpret(gg, x, w)
    want = jax.grad(f, argnums=(0, 1))(x, w)
    assert_close(list(got[1:]), list(want), 1e-5, 1e-5)


@pytest.mark.parametrize(
    "name",
    ["top_k", "linalg_inv", "fft_complex", "pure_callback", "dynamic_update_slice", "cumsum"],
)
def test_tracing_does_not_fail_on_valid_jax_programs(name: str) -> None:
    """Less common primitives (complex outputs, host callbacks, linear algebra) trace and
    compute what f computes."""
    x = rand((4, 4), seed=7)
    a = x + 4 * np.eye(4, dtype=F32)
    fns = {
        "top_k": (lambda x: lax.top_k(x, 2), (x,)),
        "linalg_inv": (jnp.linalg.inv, (a,)),
        "fft_complex": (lambda x: jnp.fft.fft(x), (x,)),
        "pure_callback": (
            lambda x: jax.pure_callback(np.sin, jax.ShapeDtypeStruct(x.shape, x.dtype), x) + 1,
            (x,),
        ),
        "dynamic_update_slice": (
            lambda x, i: lax.dynamic_update_slice(x, jnp.ones((1, 4), F32), (i, 0)),
            (x, np.int32(2)),
        ),
        "cumsum": (lambda x: jnp.cumsum(x, axis=1), (x,)),
    }
    f, args = fns[name]
    graph = trace(f, *args)
    want = f(*args)
    for got in _both(graph, *args):
        gl, wl = jax.tree.leaves(got), jax.tree.leaves(want)
        assert len(gl) == len(wl)
        for g, w in zip(gl, wl):
            assert np.asarray(g).dtype == np.asarray(w).dtype
            np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-5)


def test_nnx_module_as_argument_makes_parameters_inputs() -> None:
    """trace(lambda m, x: m(x), model, x): the module's parameters become named graph
    inputs, and the graph takes the module (or its leaves) when called."""
    model = _MLP(nnx.Rngs(0))
    x = rand((2, 6))
    graph = trace(lambda m, x: m(x), model, x)
    names = [graph.symbol(i).name for i in graph.inputs]
    assert names[-1] == "x" and any("fc1" in n and "kernel" in n for n in names), names
    want = model(x)
    assert_close(compile(graph)(model, x), want, 1e-5, 1e-5)
    assert_close(interpret(graph, model, x), want, 1e-5, 1e-5)


# -- bad input ---------------------------------------------------------------------------------


def _error(cls, builtin, fn, *fragments):
    with pytest.raises(cls) as info:
        fn()
    err = info.value
    assert isinstance(err, FnncError) and isinstance(err, builtin)
    for frag in fragments:
        assert frag in str(err), (frag, str(err))
    return str(err)


def test_mismatched_conv_shapes_at_exec_name_node_and_tensors() -> None:
    """A convolution whose weight expects other input channels fails when the node is
    added: ShapeError (a ValueError) naming the node and both tensors."""
    b = GraphBuilder()
    img = b.input((1, 6, 6, 3), name="img")
    kernel = b.input((4, 3, 3, 5), name="kernel")
    _error(
        ShapeError,
        ValueError,
        lambda: b.exec(ops.convolution(), img, kernel, name="conv1"),
        "conv1",
        "img",
        "kernel",
        "[1, 6, 6, 3]",
        "[4, 3, 3, 5]",
    )


def test_mismatched_gemm_shapes_at_exec_name_node_and_tensors() -> None:
    """gemm of [2, 3] by [5, 4] fails at exec with a ShapeError naming the node and inputs."""
    b = GraphBuilder()
    a = b.input((2, 3), name="a")
    w = b.input((5, 4), name="weight")
    _error(
        ShapeError,
        ValueError,
        lambda: b.exec(ops.gemm(), a, w, name="dense"),
        "dense",
        "%0 (a)",
        "%1 (weight)",
    )


def test_wrong_dtype_at_exec_is_a_dtype_error() -> None:
    """A convolution with an int32 weight, and a gemm mixing float32 and int32, raise
    DTypeError (a TypeError) naming the node."""
    b = GraphBuilder()
    img = b.input((1, 6, 6, 3), name="img")
    kernel = b.input((4, 3, 3, 3), np.int32, name="kernel")
    _error(DTypeError, TypeError, lambda: b.exec(ops.convolution(), img, kernel, name="c"), "'c'")
    a = b.input((2, 3), name="a")
    i = b.input((3, 2), np.int32, name="i")
    _error(DTypeError, TypeError, lambda: b.exec(ops.gemm(), a, i, name="g"), "'g'", "int32")


def test_unknown_command_is_clear_everywhere() -> None:
    """An unknown command name: UnknownCommandError (a KeyError) from lookup and at exec
    (naming the node), and a GraphError from verify of a hand-made node."""
    _error(UnknownCommandError, KeyError, lambda: ops.lookup("convolutoin"), "convolutoin")
    b = GraphBuilder()
    x = b.input((2,), name="x")
    _error(
        UnknownCommandError,
        KeyError,
        lambda: b.exec(ops.Command("frobnicate"), x, name="n"),
        "frobnicate",
        "'n'",
    )


def test_graph_fed_wrong_number_or_shapes_of_arrays() -> None:
    """interpret and Program reject too few / too many arrays (GraphInputError) and a
    mis-shaped one (ShapeError naming the input), never reaching XLA."""
    graph = _mlp_graph()
    program = compile(graph)
    x, w = rand((8, 16)), rand((32, 16))
    for run in (lambda *a: interpret(graph, *a), program):
        _error(GraphInputError, ValueError, lambda: run(x), "2")
        _error(GraphInputError, ValueError, lambda: run(x, w, w), "3")
        _error(ShapeError, ValueError, lambda: run(x, w[:, :8]), "w", "[32, 16]", "[32, 8]")
        _error(DTypeError, TypeError, lambda: run(x.astype(np.int32), w), "x", "int32")


@pytest.mark.parametrize(
    "content",
    [
        b"hello",
        b"",
        b'{"a": 1}',
        b"[1, 2, 3]",
        pickle.dumps({"format": "fnnc.graph"}),
        bytes(range(256)),
    ],
    ids=["text", "empty", "other_json", "json_list", "pickle", "binary"],
)
def test_loading_a_file_that_is_not_a_graph(tmp_path, content: bytes) -> None:
    """load of text, an empty file, other JSON, a pickle or random bytes raises
    GraphFormatError (a ValueError) naming the file; nothing is unpickled."""
    path = tmp_path / "not_a_graph.bin"
    path.write_bytes(content)
    _error(GraphFormatError, ValueError, lambda: load(path), "not_a_graph.bin")
