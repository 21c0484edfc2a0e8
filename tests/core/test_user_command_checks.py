"""Mistakes in a user's command definition get named errors where they would otherwise
give silently wrong values or raw tracebacks: a backward returning a bare array (split
along axis 0 by ``tuple()``) or the wrong number of gradients, a backward without the
hyper-parameters, a forward that disagrees with its shape rule, a rule returning no
spec, a backward reading a tensor ``uses=`` does not keep; and a command can be
replaced (``replace=True``) without running a stale definition."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fnnc import ops
from fnnc.errors import CommandError, FnncError, GraphError, RuleError
from fnnc.graph import DynamicGraph, GraphBuilder, backward, compile

Spec = jax.ShapeDtypeStruct
same = lambda x: Spec(x.shape, x.dtype)
X = np.array([0.1, 0.7, 1.5], np.float32)


def _sum_of(cmd, n_inputs=1):
    b = GraphBuilder()
    xs = [b.input((3,), np.float32, f"x{i}") for i in range(n_inputs)]
    return b.build([b.exec(ops.reduce_sum(axes=(0,)), b.exec(cmd, *xs, name="mine"))])


def _gradients(graph, *args):
    grad_graph, _ = backward(graph, graph.outputs[0], list(graph.inputs))
    return compile(grad_graph)(*args)[1:]


def _command(name, backward_fn, forward=jnp.sin, **kw):
    rule = lambda x, *rest: same(x)
    cmd = ops.defcommand(family="custom", shape=rule, name=name, **kw)(forward)
    cmd.backward(backward_fn)
    return cmd


def test_backward_returning_a_bare_array_is_refused(restore_registries):
    """Before: tuple(array) split it along axis 0, dW became the scalar dW[0]."""
    cmd = _command("test_bare", lambda g, i, o: g[0] * jnp.cos(i[0]))
    with pytest.raises(CommandError, match=r"test_bare: .*bare array float32\[3\].*\(g,\)"):
        _gradients(_sum_of(cmd()), X)
    dg = DynamicGraph()
    w = dg.variable(X)
    with pytest.raises(CommandError, match="test_bare"):
        dg.backward(dg.exec(ops.reduce_sum(axes=(0,)), dg.exec(cmd(), w)), [w])


@pytest.mark.parametrize("count", [1, 3])
def test_backward_with_wrong_count_is_refused(restore_registries, count):
    """Too few was an IndexError, too many dropped silently: both name the command."""
    grads = lambda g, i, o: (g[0] * i[1], g[0] * i[0], g[0])[:count]
    cmd = _command(f"test_count{count}", grads, forward=lambda a, b: a * b)
    with pytest.raises(CommandError, match=rf"returned {count} value\(s\).*per input \(2\)"):
        _gradients(_sum_of(cmd(), 2), X, X)


def test_right_backward_matches_jax_grad(restore_registries):
    """The checks pass a correct backward through: d sum(a*b) = (b, a)."""
    cmd = _command("test_right", lambda g, i, o: [g[0] * i[1], g[0] * i[0]], lambda a, b: a * b)
    y = np.array([3.0, 4.0, 5.0], np.float32)
    want = jax.grad(lambda a, b: jnp.sum(a * b), argnums=(0, 1))(X, y)
    for got, w in zip(_gradients(_sum_of(cmd(), 2), X, y), want):
        np.testing.assert_allclose(got, w)


def test_backward_without_hyper_parameters_suggests_signature(restore_registries):
    fwd = ops.defcommand(family="custom", shape=lambda x, *, k: same(x), name="test_nokw")
    cmd = fwd(lambda x, *, k=1.0: k * x)
    cmd.backward(lambda g, i, o: (g[0] * 2.0,))
    with pytest.raises(CommandError, match=r"test_nokw: .*outputs, \*, k=1.0\) or with \*\*"):
        _gradients(_sum_of(cmd(k=2.0)), X)


@pytest.mark.parametrize(
    ("forward", "said"),
    [
        (lambda x: x[:2], r"float32\[2\]"),  # wrong shape
        (lambda x: x.astype(jnp.float16), r"float16\[3\]"),  # wrong dtype
        (lambda x: (x, x + 1), r"2 value\(s\)"),  # wrong count
    ],
)
def test_forward_disagreeing_with_rule_is_refused_everywhere(restore_registries, forward, said):
    """Eager calls, compile, the dynamic graph (and interpret) all check the forward's
    results against the rule; before, only interpret checked shape and dtype."""
    cmd = ops.defcommand(family="custom", shape=same, name="test_liar_fwd")(forward)
    b = GraphBuilder()
    graph = b.build([b.exec(cmd(), b.input((3,), np.float32, "x"), name="n")])
    with pytest.raises(CommandError, match=rf"test_liar_fwd: its forward .*{said}"):
        cmd()(X)
    with pytest.raises(GraphError, match=rf"node 0 \(n\): test_liar_fwd produced .*{said}"):
        compile(graph)
    dg = DynamicGraph()
    with pytest.raises(CommandError, match="test_liar_fwd"):
        dg.exec(cmd(), dg.variable(X))


def test_backward_of_wrong_shape_is_refused_in_compile(restore_registries):
    cmd = _command("test_bw_shape", lambda g, i, o: (jnp.sum(g[0] * jnp.cos(i[0]), 0),))
    with pytest.raises(GraphError, match=r"test_bw_shape.*disagrees with its backward"):
        _gradients(_sum_of(cmd()), X)


@pytest.mark.parametrize("rule", [lambda x: None, lambda x: x.shape])
def test_rule_returning_no_spec_is_a_rule_error(restore_registries, rule):
    cmd = ops.defcommand(family="custom", shape=rule, name="test_no_spec")(lambda x: x * 2)
    with pytest.raises(RuleError, match=r"test_no_spec: the shape rule .* returned"):
        cmd()(X)
    with pytest.raises(RuleError, match="test_no_spec"):
        cmd().shape(Spec((3,), np.float32))
    b = GraphBuilder()
    with pytest.raises(RuleError, match=r"node 'n' \(test_no_spec\)"):
        b.exec(cmd(), b.input((3,), np.float32, "x"), name="n")


def test_rule_raising_any_error_is_a_rule_error(restore_registries):
    def rule(x):
        raise RuntimeError("broken rule")

    cmd = ops.defcommand(family="custom", shape=rule, name="test_broken_rule")(lambda x: x)
    with pytest.raises(RuleError, match=r"test_broken_rule.*broken rule") as info:
        cmd()(X)
    assert isinstance(info.value.__cause__, RuntimeError)


@pytest.mark.parametrize(
    "rule",
    [lambda g, i, o: (g[0] * jnp.cos(i[0]),), lambda g, i, o: (jnp.cos(i[0]) * g[0],)],
)
def test_backward_reading_what_uses_omits_names_the_fix(restore_registries, rule):
    """Before: JAX's 'A ShapeDtypeStruct does not have a value' from compile."""
    cmd = _command("test_uses_lie", rule, uses=ops.Uses(inputs=()))
    with pytest.raises(CommandError, match=r"test_uses_lie: its backward .*uses=Uses\("):
        _gradients(_sum_of(cmd()), X)


@pytest.mark.parametrize("holder", ["call", "fused_elementwise"])
def test_backward_reading_what_uses_omits_inside_a_sub_graph_names_the_fix(
    restore_registries, holder
):
    """Differentiated inside a sub-graph (call) or a fused body, the omitted input came
    as a plain ShapeDtypeStruct: JAX's raw TypeError, naming no command."""
    cmd = _command("test_sub_uses_lie", lambda g, i, o: (g[0] * i[0],), uses=ops.Uses(inputs=()))
    b = GraphBuilder()
    body = b.build([b.exec(cmd(), b.input((3,), np.float32, "x"))])
    holding = getattr(ops, holder)(**{"graph" if holder == "call" else "body": body})
    with pytest.raises(CommandError, match=r"test_sub_uses_lie: its backward .*uses=Uses\("):
        _gradients(_sum_of(holding), X)


def test_backward_check_is_asked_the_order(restore_registries):
    """check(cmd, order) refuses a gradient's gradient (order 2) by the same hook that
    refuses the first; a check taking only the command still works (asked every order)."""
    orders = lambda cmd, order=1: "first order only" if order > 1 else None
    cmd = ops.defcommand(family="custom", shape=same, name="test_orders", backward_check=orders)(
        jnp.sin
    )
    graph = _sum_of(cmd())
    grads, (dx,) = backward(graph, graph.outputs[0], list(graph.inputs))
    np.testing.assert_allclose(compile(grads)(X)[1], np.cos(X), rtol=1e-6)
    b = GraphBuilder.from_graph(grads)
    total = b.exec(ops.reduce_sum(axes=(0,)), dx)
    with pytest.raises(CommandError, match=r"backward of test_orders, and first order only"):
        backward(b.build([total]), total, [grads.symbols[grads.inputs[0]]])
    plain = ops.defcommand(
        family="custom", shape=same, name="test_plain_check", backward_check=lambda c: "no"
    )(jnp.sin)
    with pytest.raises(CommandError, match=r"test_plain_check has no backward here: no"):
        _gradients(_sum_of(plain()), X)


def test_replace_runs_the_new_definition(restore_registries):
    """A notebook cell run again: 'registered twice' says what to do; replace=True
    replaces, and eager calls (cached compiled forwards) run the new forward."""

    def cell(scale, replace=False):
        kw = {"replace": True} if replace else {}
        return ops.defcommand(family="custom", shape=same, name="test_cell", **kw)(
            lambda x: x * scale
        )

    cmd = cell(2.0)
    np.testing.assert_allclose(cmd()(X), 2 * X)
    with pytest.raises(CommandError, match=r"registered twice.*replace=True"):
        cell(3.0)
    cmd = cell(3.0, replace=True)
    np.testing.assert_allclose(cmd()(X), 3 * X)
    np.testing.assert_allclose(compile(_sum_of(cmd()))(X), 3 * X.sum(), rtol=1e-6)


def test_replacing_a_builtin_needs_replace(restore_registries):
    with pytest.raises(CommandError, match=r"'relu' is registered twice.*built-in"):
        ops.defcommand(family="activation", shape=same, name="relu")(lambda x: x)
    ops.defcommand(family="activation", shape=same, name="relu", replace=True)(lambda x: -x)
    np.testing.assert_allclose(ops.relu()(X), -X)


def test_builtin_relu_is_back_after_the_test_above():
    np.testing.assert_allclose(ops.relu()(np.array([-1.0, 2.0], np.float32)), [0.0, 2.0])
    assert not isinstance(ops.relu, FnncError)
