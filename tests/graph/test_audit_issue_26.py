"""Audit of issue 26 (research on custom graph passes): the promises as the issue states them.

Checked here:
- the editing API over the immutable IR (``Rewriter``): insert before/after (context
  managers and the one-call ``insert_before`` / ``insert_after``), ``replace_all_uses``,
  ``replace_node``, ``remove``, a verified new ``Graph`` (the same object when nothing
  changed), errors naming the edit;
- patterns (``Pat``): commands, command attributes (elementwise, commutative, pure),
  hyper-parameters, dtypes, shapes, captures, commutative matching, constraints;
  ``Rule`` / ``graph_rewrite`` / ``rewrite_pass`` running to a fixpoint, inside
  sub-graphs too;
- patterns and replacements written as ordinary JAX / fnnc functions and traced
  (``replace_pattern``, ``traced_rule``): "replace ``x * sigmoid(x)`` by ``silu(x)``"
  as two small functions, and scale folding into a gemm as two functions;
- ``check_pass``: float64, gradients, the first node where values diverge, a
  deliberately wrong rewrite caught;
- passes where users need them: ``compile(graph, passes=[...])``,
  ``Model.compile(..., passes=...)`` (the ``{"forward": ...}`` / ``{"training": ...}``
  spelling) training to the same parameters as the rewrite by hand, the dynamic
  graph's lazy flush, ``FNNC_DEBUG`` showing each pass's diff, time and node counts;
- "fold a scale into the following gemm" and "relu to leaky relu", each at most 10
  lines of user code, against hand-computed oracles; fake-quant around every gemm.

Oracles: NumPy closed forms, ``jax.nn`` functions, and ``fnnc.graph.interpret``.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fnnc import config, ops
from fnnc.errors import GraphError
from fnnc.graph import (
    DynamicGraph,
    Graph,
    GraphBuilder,
    PassCheckError,
    PassReport,
    Pat,
    Rewriter,
    Rule,
    check_pass,
    compile,
    graph_rewrite,
    interpret,
    replace_pattern,
    rewrite_pass,
    run_passes,
    trace,
    traced_rule,
    while_loop,
)
from fnnc.graph.matching import match
from tests.helpers import rand, subprocess_env


def _sigmoid(v):
    return 1.0 / (1.0 + np.exp(-v))


def _mlp_graph() -> tuple[Graph, object, object, object]:
    """x[2,3] @ w[4,3]^T -> relu: the graph, x, w and the gemm's output symbol."""
    b = GraphBuilder()
    x, w = b.input((2, 3), name="x"), b.input((4, 3), name="w")
    h = b.exec(ops.gemm(transpose_b=True), x, w, name="fc")
    return b.build([b.exec(ops.relu(), h, name="act")]), x, w, h


XV = np.array([[1.0, -2.0, 0.5], [0.25, 1.5, -1.0]], np.float32)
WV = np.array([[0.5, 1.0, -1.0], [2.0, 0.0, 1.0], [-1.0, 0.5, 0.5], [0.0, -2.0, 1.0]], np.float32)


# -- 1. the editing API: Rewriter ------------------------------------------------------------


def test_rewriter_without_edits_returns_the_same_graph_object() -> None:
    """No edits: ``finish()`` is the very graph it was given, and ``changed`` is False."""
    graph, *_ = _mlp_graph()
    r = Rewriter(graph)
    assert not r.changed
    assert r.finish() is graph


def test_rewriter_insert_after_one_call_and_replace_all_uses() -> None:
    """``insert_after(node, cmd, *inputs)`` plus ``replace_all_uses``: relu(2 * (x @ w^T))."""
    graph, _, _, h = _mlp_graph()
    r = Rewriter(graph)
    (gemm,) = r.find("gemm")
    doubled = r.insert_after(gemm, ops.scalar_mul(a=2.0), h)
    r.replace_all_uses(h, doubled)
    assert r.changed
    new = r.finish()
    assert new is not graph and graph.nodes[1].cmd.name == "relu"  # the original stays
    assert [n.cmd.name for n in new.nodes] == ["gemm", "scalar_mul", "relu"]
    np.testing.assert_allclose(interpret(new, XV, WV), np.maximum(2 * XV @ WV.T, 0), rtol=1e-6)


def test_rewriter_insert_before_one_call_by_node_index() -> None:
    """``insert_before(index, ...)`` and ``replace_node``: relu(|x @ w^T|) is |x @ w^T|."""
    graph, _, _, h = _mlp_graph()
    r = Rewriter(graph)
    absolute = r.insert_before(1, ops.ewabs(), h)
    r.replace_node(1, ops.relu(), absolute)
    new = r.finish()
    assert [n.cmd.name for n in new.nodes] == ["gemm", "ewabs", "relu"]
    np.testing.assert_allclose(interpret(new, XV, WV), np.abs(XV @ WV.T), rtol=1e-6)


def test_rewriter_reads_producers_and_users_of_the_original_graph() -> None:
    """``find``, ``producer`` and ``users`` read the graph being edited."""
    graph, x, _, h = _mlp_graph()
    r = Rewriter(graph)
    (gemm,) = r.find("gemm")
    assert r.producer(h) == gemm
    assert r.producer(x) is None  # a graph input has no writer
    assert [n.cmd.name for n in r.users(h)] == ["relu"]
    assert r.find("conv") == []


def test_rewriter_removes_an_identity_node() -> None:
    """Removing ``scalar_mul[a=1]`` after rewiring its readers to its input."""
    b = GraphBuilder()
    x = b.input((3,), name="x")
    same = b.exec(ops.scalar_mul(a=1.0), x, name="noop")
    graph = b.build([b.exec(ops.ewexp(), same, name="e")])
    r = Rewriter(graph, name="drop_noop")
    r.replace_all_uses(same, x)
    r.remove(0)
    new = r.finish()
    assert [n.cmd.name for n in new.nodes] == ["ewexp"]
    xv = np.float32([-1.0, 0.0, 2.0])
    np.testing.assert_allclose(interpret(new, xv), np.exp(xv), rtol=1e-6)


def test_rewriter_finish_verifies_and_names_the_edit() -> None:
    """Removing a node still read is an error naming the rewriter, with the listing at
    the bad node."""
    graph, *_ = _mlp_graph()
    r = Rewriter(graph, name="my_pass")
    r.remove(0)  # the gemm, still read by relu
    with config.override(checks=True), pytest.raises(GraphError) as info:
        r.finish()
    msg = str(info.value)
    assert "my_pass" in msg and ">>" in msg and "relu" in msg


def test_rewriter_insert_relative_to_a_foreign_node_is_refused() -> None:
    """Inserting next to a node that is not in the graph, or a bad index, is a GraphError."""
    graph, _, _, h = _mlp_graph()
    r = Rewriter(graph)
    stranger = dataclasses.replace(graph.nodes[0], name="elsewhere")
    with pytest.raises(GraphError, match="not an original node"):
        r.insert_after(stranger, ops.relu(), h)
    with pytest.raises(GraphError, match="node index 9"):
        r.insert_before(9, ops.relu(), h)


def test_rewriter_fake_quant_around_every_gemm() -> None:
    """Quantize-dequantize after every gemm (the fake-quant tutorial's edit), by hand."""
    b = GraphBuilder()
    x, w1, w2 = b.input((2, 3), name="x"), b.input((3, 3), name="w1"), b.input((3, 2), name="w2")
    h = b.exec(ops.relu(), b.exec(ops.gemm(), x, w1, name="fc1"))
    graph = b.build([b.exec(ops.gemm(), h, w2, name="fc2")])
    r = Rewriter(graph, name="fake_quant")
    for node in r.find("gemm"):
        out = r.symbol(node.outputs[0])
        with r.inserting_after(node):
            q = r.call(lambda v: jnp.round(v / 0.25) * 0.25, out)
        r.replace_all_uses(out, q)
    new = r.finish()
    assert sum(n.cmd.name == "gemm" for n in new.nodes) == 2
    xv, w1v, w2v = rand((2, 3)), rand((3, 3), seed=1), rand((3, 2), seed=2)

    def fq(v):
        return np.round(v / 0.25) * 0.25

    want = fq(np.maximum(fq(xv @ w1v), 0) @ w2v)
    np.testing.assert_allclose(interpret(new, xv, w1v, w2v), want, rtol=1e-6, atol=1e-6)


# -- 2. patterns ------------------------------------------------------------------------------


def test_pattern_commutative_attribute_follows_the_command() -> None:
    """``attrs=("commutative",)``: ``add`` and ``mul`` are commutative, ``add[q=-1]`` is not."""
    b = GraphBuilder()
    x, y = b.input((3,), name="x"), b.input((3,), name="y")
    plus, minus, times = (
        b.exec(ops.add(), x, y),
        b.exec(ops.add(q=-1.0), x, y),
        b.exec(ops.mul(), x, y),
    )
    g = b.build([plus, minus, times])
    comm = Pat.op(None, Pat.var(), Pat.var(), attrs=("commutative",))
    assert match(comm, g, plus.id) is not None
    assert match(comm, g, times.id) is not None
    assert match(comm, g, minus.id) is None
    # y first: matches x + y by commuting, not x - y
    y_first = Pat.op("add", Pat.var("a", where=lambda s: s.name == "y"), Pat.var("b"))
    m = match(y_first, g, plus.id)
    assert m is not None and (m["a"].name, m["b"].name) == ("y", "x")
    assert match(y_first, g, minus.id) is None


def test_pattern_several_command_names_params_dtype_and_shape() -> None:
    """Command alternatives, a hyper-parameter predicate, dtypes and a shape with ``None``."""
    b = GraphBuilder()
    x = b.input((2, 3), name="x")
    e, lg = b.exec(ops.ewexp(), x), b.exec(ops.ewlog(), x)
    t = b.exec(ops.transpose(perm=(1, 0)), x)
    g = b.build([e, lg, t])
    either = Pat.op(("ewexp", "ewlog"), Pat.var("v"))
    assert [match(either, g, s.id) is not None for s in (e, lg, t)] == [True, True, False]
    assert match(Pat.op("transpose", perm=lambda p: p[0] == 1), g, t.id) is not None
    assert match(Pat.op("ewexp", Pat.var(dtype=(np.float16, np.float32))), g, e.id) is not None
    assert match(Pat.op("ewexp", Pat.var(dtype=np.float16)), g, e.id) is None
    assert match(Pat.op("ewexp", Pat.var(), shape=(None, 3)), g, e.id) is not None
    assert match(Pat.op("ewexp", Pat.var(), shape=(None, 2)), g, e.id) is None
    assert match(Pat.op(None, Pat.var(), attrs=("elementwise", "pure")), g, e.id) is not None


def test_rule_where_and_a_none_replacement_leave_the_graph_alone() -> None:
    """A failing ``where`` or a replacement returning None: the same graph object."""
    graph, *_ = _mlp_graph()
    never = Rule(
        Pat.op("relu", Pat.var("x")),
        lambda m: m.exec(ops.ewabs(), m["x"]),
        where=lambda m: m["x"].shape == (9, 9),
    )
    skip = Rule(Pat.op("relu", Pat.var("x")), lambda m: None)
    assert graph_rewrite(graph, [never, skip]) is graph


def test_rules_run_to_a_fixpoint_exp_log_chain_collapses() -> None:
    """log(exp(log(exp(x)))) -> x with one rule: the rewrite runs until nothing matches."""
    b = GraphBuilder()
    x = b.input((3,), name="x")
    v = x
    for _ in range(2):
        v = b.exec(ops.ewlog(), b.exec(ops.ewexp(), v))
    graph = b.build([b.exec(ops.tanh(), v)])
    cancel = Rule(Pat.op("ewlog", Pat.op("ewexp", Pat.var("x"))), lambda m: m["x"])
    new = graph_rewrite(graph, [cancel])
    assert [n.cmd.name for n in new.nodes] == ["tanh"]
    xv = np.float32([-1.0, 0.5, 2.0])
    np.testing.assert_allclose(interpret(new, xv), np.tanh(xv), rtol=1e-6)
    assert graph_rewrite(new, [cancel]) is new


def test_rewrite_pass_composes_with_run_passes_to_a_fixpoint() -> None:
    """Two rewrite passes in ``run_passes(max_rounds=...)``: the second round is unchanged."""
    b = GraphBuilder()
    x = b.input((4,), name="x")
    graph = b.build([b.exec(ops.relu(), b.exec(ops.scalar_mul(a=3.0), x))])
    to_leaky = rewrite_pass(
        Rule(
            Pat.op("relu", Pat.var("x")),
            lambda m: m.exec(ops.leaky_relu(negative_slope=0.25), m["x"]),
        ),
        name="to_leaky",
    )
    to_mul = rewrite_pass(
        Rule(
            Pat.op("scalar_mul", Pat.var("x")),
            lambda m: m.exec(ops.mul(), m["x"], m.constant(np.float32(m.root.cmd.param("a")))),
        ),
        name="to_mul",
    )
    report: list[PassReport] = []
    new = run_passes(graph, (to_leaky, to_mul), max_rounds=3, report=report)
    assert [r.changed for r in report] == [True, True, False, False]
    assert [r.name for r in report[:2]] == ["to_leaky", "to_mul"]
    xv = np.float32([-2.0, -0.5, 0.0, 1.0])
    np.testing.assert_allclose(interpret(new, xv), np.where(xv > 0, 3 * xv, 0.75 * xv))


def test_rules_rewrite_inside_a_while_body() -> None:
    """A rule reaches the body of a while loop: relu -> leaky relu inside the loop."""
    bb = GraphBuilder()
    z0, x0 = bb.input((1,), name="z0"), bb.input((1,), name="x0")
    z1 = bb.exec(ops.relu(), bb.exec(ops.ewprod(), z0, x0), name="z1")
    body = bb.build([z1])
    cb = GraphBuilder()
    count = cb.input((), np.int32, name="count")
    cond = cb.build([cb.exec(ops.compare(op="lt"), count, cb.constant(np.int32(3)))])
    ob = GraphBuilder()
    x = ob.input((1,), name="x")
    (z,) = while_loop(
        ob, body, cond, [ob.constant(np.ones(1, np.float32)), x], carry_overs={z1: z0}
    )
    graph = ob.build([z])
    leaky = Rule(
        Pat.op("relu", Pat.var("v")), lambda m: m.exec(ops.leaky_relu(negative_slope=0.5), m["v"])
    )
    new = graph_rewrite(graph, [leaky])
    zv = np.float32([1.0])
    for _ in range(3):  # z <- leaky(z * x), three times, by hand
        zv = zv * -2.0
        zv = np.where(zv > 0, zv, 0.5 * zv)
    np.testing.assert_allclose(interpret(new, np.float32([-2.0])), zv, rtol=1e-6)
    np.testing.assert_allclose(interpret(graph, np.float32([-2.0])), [0.0])


# -- 2b. patterns written as functions --------------------------------------------------------


def _silu_graph() -> Graph:
    return trace(lambda a: jnp.tanh(a * jax.nn.sigmoid(a)), jnp.ones(3), idioms=False)


def test_silu_as_two_functions_with_an_fnnc_command() -> None:
    """``x * sigmoid(x)`` -> ``ops.swish()(x)``: one swish node, tanh(silu(x)) by hand."""
    graph = _silu_graph()
    new = replace_pattern(graph, lambda x: x * jax.nn.sigmoid(x), lambda x: ops.swish()(x))
    assert [n.cmd.name for n in new.nodes] == ["swish", "tanh"]
    av = np.float32([-1.5, 0.0, 2.0])
    np.testing.assert_allclose(interpret(new, av), np.tanh(av * _sigmoid(av)), rtol=1e-6)


def test_silu_as_two_functions_with_jax_nn_silu() -> None:
    """The replacement written as ``jax.nn.silu`` (ordinary JAX) rewrites x * sigmoid(x)."""
    graph = _silu_graph()
    new = replace_pattern(graph, lambda x: x * jax.nn.sigmoid(x), lambda x: jax.nn.silu(x))
    assert sum(n.cmd.name == "sigmoid" for n in new.nodes) == 0
    av = np.float32([-1.5, 0.0, 2.0])
    np.testing.assert_allclose(interpret(new, av), np.tanh(av * _sigmoid(av)), rtol=1e-6)


def test_pattern_function_matches_the_swapped_product() -> None:
    """A pattern written ``sigmoid(x) * x`` matches a graph computing ``x * sigmoid(x)``."""
    graph = _silu_graph()
    new = replace_pattern(graph, lambda x: jax.nn.sigmoid(x) * x, lambda x: ops.swish()(x))
    assert [n.cmd.name for n in new.nodes] == ["swish", "tanh"]


def test_pattern_function_does_not_match_other_values_or_operands() -> None:
    """A traced constant matches only its own value; distinct arguments stay distinct."""
    graph = trace(lambda a, b: jnp.tanh(a * jax.nn.sigmoid(b)) * 3.0, jnp.ones(3), jnp.ones(3))
    assert replace_pattern(graph, lambda x: x * jax.nn.sigmoid(x), ops.swish()) is graph
    assert replace_pattern(graph, lambda x: x * 2.0, lambda x: x + x) is graph


def test_fold_scale_into_gemm_as_two_traced_functions() -> None:
    """(2x) @ w -> x @ (2w), written as two functions, on a traced layer: values by hand."""
    graph = trace(lambda a, w: jnp.tanh((2.0 * a) @ w), jnp.ones((2, 3)), jnp.ones((3, 4)))
    new = replace_pattern(graph, lambda x, w: (2.0 * x) @ w, lambda x, w: x @ (2.0 * w))
    gemm = next(n for n in new.nodes if n.cmd.name == "gemm")
    assert gemm.inputs[0] == new.inputs[0]  # the gemm reads x itself now
    av, wv = rand((2, 3)), rand((3, 4), seed=1)
    np.testing.assert_allclose(interpret(new, av, wv), np.tanh(av @ (2 * wv)), rtol=1e-5)


def test_traced_rule_is_a_rule_usable_in_graph_rewrite() -> None:
    """``traced_rule`` gives a ``Rule``; the replacement is traced on each match's shapes."""
    rule = traced_rule(lambda x: jnp.exp(jnp.log(x)), lambda x: jnp.abs(x))
    assert isinstance(rule, Rule)
    graph = trace(
        lambda a, b: jnp.exp(jnp.log(a)).sum() + jnp.exp(jnp.log(b)).sum(),
        jnp.ones((2,)),
        jnp.ones((3, 2)),
    )
    new = graph_rewrite(graph, [rule])
    assert not any(n.cmd.name == "ewlog" for n in new.nodes)
    av, bv = np.float32([1.0, 2.0]), rand((3, 2), lo=0.5, hi=2.0)
    np.testing.assert_allclose(interpret(new, av, bv), av.sum() + bv.sum(), rtol=1e-5)


# -- 3. check_pass ----------------------------------------------------------------------------


def _layer() -> Graph:
    return trace(
        lambda a, w: jnp.tanh(jax.nn.relu(2.0 * a) @ w), jnp.ones((2, 3)), jnp.ones((3, 4))
    )


relu_to_abs = rewrite_pass(
    Rule(Pat.op("relu", Pat.var("x")), lambda m: m.exec(ops.ewabs(), m["x"])), name="relu_to_abs"
)


def test_check_pass_of_a_no_op_pass_in_float64_with_gradients() -> None:
    """An identity pass: float64, gradients compared, zero error, the graph itself back."""
    graph = _layer()
    check = check_pass(lambda g: g, graph)
    assert check.dtype == "float64" and check.gradients
    assert check.max_error == 0.0 and check.graph is graph


def test_check_pass_catches_a_deliberately_wrong_rewrite() -> None:
    """relu -> abs changes the values: a PassCheckError (an AssertionError) naming the pass."""
    with pytest.raises(PassCheckError, match="relu_to_abs") as info:
        check_pass(relu_to_abs, _layer())
    assert isinstance(info.value, AssertionError)


def test_check_pass_names_the_swapped_node_as_the_first_to_diverge() -> None:
    """The first node whose result differs is the ewabs that replaced relu (node 2)."""
    with pytest.raises(PassCheckError) as info:
        check_pass(relu_to_abs, _layer())
    assert "node 2 (ewabs)" in str(info.value) or ">>%4:f32[2,3] = ewabs" in str(info.value)


def test_check_pass_tolerance_decides() -> None:
    """A leaky relu of slope 1e-6 passes at atol 1e-4 and fails at the float64 default."""
    tiny = rewrite_pass(
        Rule(
            Pat.op("relu", Pat.var("x")),
            lambda m: m.exec(ops.leaky_relu(negative_slope=1e-6), m["x"]),
        ),
        name="tiny_leak",
    )
    assert check_pass(tiny, _layer(), atol=1e-4, grads=False).max_error < 1e-4
    with pytest.raises(PassCheckError, match="tiny_leak"):
        check_pass(tiny, _layer(), grads=False)


def test_check_pass_blames_a_graph_breaking_pass_by_name() -> None:
    """A pass that breaks the graph: GraphError naming it, the listing at the bad node."""

    def shuffles(g: Graph) -> Graph:
        return dataclasses.replace(g, nodes=g.nodes[::-1])

    with pytest.raises(GraphError) as info:
        check_pass(shuffles, _layer())
    msg = str(info.value)
    assert "pass shuffles" in msg and ">>" in msg


# -- 4. passes where users need them ----------------------------------------------------------


def test_compile_with_a_traced_rule_pass() -> None:
    """``compile(graph, passes=[...])`` runs the rewrite; the program computes silu by hand."""
    graph = _silu_graph()
    silu = rewrite_pass(
        traced_rule(lambda x: x * jax.nn.sigmoid(x), lambda x: ops.swish()(x)), name="silu"
    )
    program = compile(graph, passes=[silu])
    assert [n.cmd.name for n in program.graph.nodes] == ["swish", "tanh"]
    av = np.float32([-1.5, 0.0, 2.0])
    np.testing.assert_allclose(program(av), np.tanh(av * _sigmoid(av)), rtol=1e-6)


def test_fnnc_debug_env_prints_each_pass_diff_time_and_node_counts() -> None:
    """``FNNC_DEBUG=1`` (the environment variable): compile(passes=) prints the pass's
    name, node counts, time and the listing's diff."""
    script = textwrap.dedent(
        """
        import numpy as np
        from fnnc import ops
        from fnnc.graph import GraphBuilder, Pat, Rule, compile, rewrite_pass
        b = GraphBuilder()
        x = b.input((3,), name="x")
        g = b.build([b.exec(ops.relu(), b.exec(ops.ewexp(), x), name="act")])
        drop = rewrite_pass(Rule(Pat.op("relu", Pat.var("v")), lambda m: m["v"]), name="drop_relu")
        p = compile(g, passes=[drop])
        print("VALUE", float(p(np.zeros(3, np.float32))[0]))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        env=subprocess_env(FNNC_DEBUG="1"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "drop_relu (round 1): 2 -> 1 nodes" in out and " ms" in out
    assert "-  %2:f32[3] = relu(%1)  # act" in out
    assert "VALUE 1.0" in out


def test_lazy_dynamic_graph_flush_runs_a_traced_rule() -> None:
    """``DynamicGraph(lazy=True, passes=[...])``: the flushed result is the rewritten one."""
    to_abs = rewrite_pass(traced_rule(lambda x: x * jax.nn.sigmoid(x), lambda x: jnp.abs(x)))
    dg = DynamicGraph(lazy=True, passes=[to_abs])
    xs = np.float32([-2.0, 0.5, 3.0])
    a = dg.constant(xs)
    y = dg.exec(ops.mul(), a, dg.exec(ops.sigmoid(), a))
    np.testing.assert_allclose(y.numpy(), np.abs(xs), rtol=1e-6)


def _model_mlp(act):
    from fnnc.models import Dense, Input, Model

    x = Input()
    return Model(x, Dense(3, name="fc2")(act(Dense(8, name="fc1")(x))), name="mlp")


def _model_train(model, start, x, y, steps=3, **kw):
    model.compile(x, loss="mse", minimizer=optax.sgd(0.1), **kw)
    if start is not None:
        model.set_parameters(start)
    for _ in range(steps):
        model.fit(x, y)
    return model.parameters()


def test_model_compile_forward_stage_mapping_trains_as_the_rewrite_by_hand() -> None:
    """``Model.compile(passes={"forward": [...]})`` trains to the parameters of the model
    written with leaky relu in the first place."""
    from fnnc.models.layers import CommandLayer

    rng = np.random.default_rng(3)
    x = rng.standard_normal((12, 5)).astype(np.float32)
    y = rng.standard_normal((12, 3)).astype(np.float32)
    leaky = ops.leaky_relu(negative_slope=0.2)
    to_leaky = rewrite_pass(
        Rule(Pat.op("relu", Pat.var("v")), lambda m: m.exec(leaky, m["v"])), name="to_leaky"
    )
    rewritten = _model_mlp(CommandLayer(ops.relu()))
    rewritten.compile(x, loss="mse", minimizer=optax.sgd(0.1), passes={"forward": [to_leaky]})
    start = rewritten.parameters()
    by_pass = _model_train(rewritten, start, x, y)
    by_hand = _model_train(_model_mlp(CommandLayer(leaky)), start, x, y)
    for pid in by_hand:
        np.testing.assert_allclose(by_pass[pid], by_hand[pid], rtol=1e-5, atol=1e-6)


def test_model_compile_training_stage_rewrite_keeps_the_training() -> None:
    """A semantics-keeping rewrite on the training graph (after backward) fires and the
    model trains to the same parameters as without it."""
    from fnnc.models.layers import CommandLayer

    rng = np.random.default_rng(4)
    x = rng.standard_normal((12, 5)).astype(np.float32)
    y = rng.standard_normal((12, 3)).astype(np.float32)
    fired: list[bool] = []
    as_max = rewrite_pass(
        Rule(
            Pat.op("relu", Pat.var("v")),
            lambda m: m.exec(ops.max(), m["v"], m.constant(np.zeros((), np.float32))),
        ),
        name="relu_as_max",
    )

    def spy(graph: Graph) -> Graph:
        new = as_max(graph)
        fired.append(new is not graph)
        return new

    start = _model_train(_model_mlp(CommandLayer(ops.relu())), None, x, y, steps=0)
    with_pass = _model_train(
        _model_mlp(CommandLayer(ops.relu())), start, x, y, passes={"training": [spy]}
    )
    plain = _model_train(_model_mlp(CommandLayer(ops.relu())), start, x, y)
    assert any(fired)
    for pid in plain:
        np.testing.assert_allclose(with_pass[pid], plain[pid], rtol=1e-5, atol=1e-6)


# -- 5. the two short rewrites of "what must hold" (<= 10 lines each) ------------------------


def test_fold_scale_and_leaky_relu_in_ten_lines_each_against_hand_values() -> None:
    """Scale folding (Pat + Rule, 5 lines) and relu -> leaky relu (3 lines), hand oracles."""
    # -- user code: fold a scale into the following gemm
    scaled = Pat.op("mul", Pat.const(name="c", shape=()), Pat.var("x"))
    fold_scale = Rule(
        Pat.op("gemm", scaled, Pat.var("w"), ...),
        lambda m: m.exec(
            m.root.cmd, m["x"], m.exec(ops.scalar_mul(a=float(m.value("c"))), m["w"]), *m.rest
        ),
    )
    # -- user code: relu -> leaky relu
    leaky = Rule(
        Pat.op("relu", Pat.var("x")), lambda m: m.exec(ops.leaky_relu(negative_slope=0.1), m["x"])
    )
    b = GraphBuilder()
    x, w = b.input((1, 2), name="x"), b.input((2, 2), name="w")
    sx = b.exec(ops.mul(), b.constant(np.float32(0.5)), x)
    graph = b.build([b.exec(ops.relu(), b.exec(ops.gemm(), sx, w))])
    new = graph_rewrite(graph, [fold_scale, leaky])
    assert [n.cmd.name for n in new.nodes] == ["scalar_mul", "gemm", "leaky_relu"]
    # x = [2, -4], w = [[1, 2], [3, -1]]: 0.5 x @ w = [1 - 6, 2 + 2] = [-5, 4]
    out = interpret(new, np.float32([[2, -4]]), np.float32([[1, 2], [3, -1]]))
    np.testing.assert_allclose(out, [[-0.5, 4.0]], rtol=1e-6)


# -- blame and checks where passes run --------------------------------------------------------


def _reorders(g: Graph) -> Graph:
    return dataclasses.replace(g, nodes=g.nodes[::-1])


def _chain() -> Graph:
    b = GraphBuilder()
    x = b.input((3,), name="x")
    return b.build([b.exec(ops.tanh(), b.exec(ops.relu(), x, name="act"), name="t")])


def test_compile_and_lazy_flush_blame_a_breaking_pass_by_name() -> None:
    """A graph-breaking pass in ``compile(passes=)`` and in the lazy dynamic graph's flush
    is named, with the listing marked at the first bad node."""
    with pytest.raises(GraphError, match=r"pass _reorders \(round 1\) produced an invalid") as e:
        compile(_chain(), passes=[_reorders])
    assert ">>" in str(e.value) and "tanh" in str(e.value)
    dg = DynamicGraph(lazy=True, passes=[_reorders])
    a = dg.constant(np.float32([1, 2, 3]))
    with pytest.raises(GraphError, match=r"pass _reorders"):
        dg.exec(ops.tanh(), dg.exec(ops.relu(), a)).numpy()


def test_model_fit_blames_a_breaking_forward_pass_by_name() -> None:
    """``Model.compile(passes=[broken])``: fit raises a GraphError naming the pass."""
    from fnnc.models.layers import CommandLayer

    model = _model_mlp(CommandLayer(ops.relu()))
    x, y = np.ones((4, 5), np.float32), np.ones((4, 3), np.float32)
    model.compile(x, loss="mse", minimizer=optax.sgd(0.1), passes=[_reorders])
    with pytest.raises(GraphError, match=r"pass _reorders .*invalid graph"):
        model.fit(x, y)


def test_check_pass_through_a_while_loop_names_the_loop_node() -> None:
    """A wrong rewrite inside a loop body: check_pass raises, naming the while_loop node;
    a right one passes (gradients through the bounded loop included)."""
    bb = GraphBuilder()
    z0, x0 = bb.input((2,), name="z0"), bb.input((2,), name="x0")
    z1 = bb.exec(ops.relu(), bb.exec(ops.ewprod(), z0, x0), name="z1")
    body = bb.build([z1])
    cb = GraphBuilder()
    count = cb.input((), np.int32, name="count")
    cond = cb.build([cb.exec(ops.compare(op="lt"), count, cb.constant(np.int32(3)))])
    ob = GraphBuilder()
    x = ob.input((2,), name="x")
    (z,) = while_loop(
        ob,
        body,
        cond,
        [ob.constant(np.ones(2, np.float32)), x],
        carry_overs={z1: z0},
        max_iterations=4,
    )
    graph = ob.build([ob.exec(ops.tanh(), z)])
    as_max = rewrite_pass(
        Rule(
            Pat.op("relu", Pat.var("x")),
            lambda m: m.exec(ops.max(), m["x"], m.constant(np.zeros((), np.float32))),
        ),
        name="relu_as_max",
    )
    ok = check_pass(as_max, graph)
    assert ok.gradients and ok.max_error < 1e-6
    with pytest.raises(PassCheckError, match=r"relu_to_abs changed the values: node 1 \(while"):
        check_pass(relu_to_abs, graph)


def test_check_pass_of_the_builtin_fusion_in_float64() -> None:
    """check_pass(fuse, softmax + CE): float64, gradients, agreement to 1e-12."""
    b = GraphBuilder()
    x, label = b.input((2, 3), name="x"), b.input((2,), np.int32, name="label")
    loss = b.exec(ops.categorical_crossentropy(), b.exec(ops.softmax(), x), label)
    from fnnc.graph import fuse

    check = check_pass(fuse, b.build([loss]))
    assert check.dtype == "float64" and check.gradients and check.max_error < 1e-12
    assert [n.cmd.name for n in check.graph.nodes] == ["softmax_crossentropy"]


def test_exact_gelu_to_tanh_gelu_on_a_traced_flax_layer() -> None:
    """The tutorial's rewrite with ``replace_pattern`` on a traced nnx.Linear: the result
    equals ``jax.nn.gelu(approximate=True)`` of the layer, applied directly."""
    from flax import nnx

    layer = nnx.Linear(4, 3, rngs=nnx.Rngs(0))
    xv = rand((2, 4))
    graph = trace(lambda v: jax.nn.gelu(layer(v), approximate=False), xv)
    new = replace_pattern(
        graph,
        lambda v: jax.nn.gelu(v, approximate=False),
        lambda v: ops.gelu(approximate=True)(v),
    )
    assert not any(n.cmd.name == "ewerfc" for n in new.nodes)
    assert sum(n.cmd.name == "gelu" for n in new.nodes) == 1
    want = jax.nn.gelu(layer(xv), approximate=True)
    np.testing.assert_allclose(interpret(new, xv), want, rtol=1e-5, atol=1e-6)


def test_relu_to_leaky_relu_as_two_traced_functions() -> None:
    """``replace_pattern(g, jax.nn.relu, leaky)`` on a traced graph: values by hand."""
    graph = trace(lambda v: jnp.tanh(jax.nn.relu(v)), jnp.ones(4))
    new = replace_pattern(
        graph, lambda v: jax.nn.relu(v), lambda v: jax.nn.leaky_relu(v, negative_slope=0.1)
    )
    assert not any(n.cmd.name == "relu" for n in new.nodes)
    xv = np.float32([-3.0, -0.5, 0.0, 2.0])
    np.testing.assert_allclose(interpret(new, xv), np.tanh([-0.3, -0.05, 0.0, 2.0]), rtol=1e-6)


def test_debug_shows_the_pass_diff_in_the_lazy_flush_and_in_model_fit(capsys) -> None:
    """With debug on, the user's pass prints its line and diff in the lazy dynamic graph's
    flush and in ``Model.fit`` (forward stage)."""
    from fnnc.models.layers import CommandLayer

    to_leaky = rewrite_pass(
        Rule(
            Pat.op("relu", Pat.var("x")),
            lambda m: m.exec(ops.leaky_relu(negative_slope=0.5), m["x"]),
        ),
        name="to_leaky",
    )
    with config.override(debug=1):
        dg = DynamicGraph(lazy=True, passes=[to_leaky])
        got = dg.exec(ops.relu(), dg.constant(np.float32([-1.0, 2.0]))).numpy()
        out = capsys.readouterr().out
        np.testing.assert_allclose(got, [-0.5, 2.0])
        assert "-- to_leaky (round 1): 1 -> 1 nodes" in out
        assert "+  %1:f32[2] = leaky_relu[negative_slope=0.5](%0)" in out
        model = _model_mlp(CommandLayer(ops.relu()))
        x, y = np.ones((4, 5), np.float32), np.ones((4, 3), np.float32)
        model.compile(x, loss="mse", minimizer=optax.sgd(0.1), passes=[to_leaky])
        model.fit(x, y)
        out = capsys.readouterr().out
    assert "-- to_leaky (round 1)" in out and "leaky_relu[negative_slope=0.5]" in out
