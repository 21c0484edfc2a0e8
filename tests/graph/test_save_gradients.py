"""Backward graphs of traced generic primitives save and load (issue 25, item 4).

A primitive no command stands for (sinh, cumsum, cummax, ...) is a generic node; its
gradient node differentiates it. Both go to the file as StableHLO through jax.export
(the gradient as ``gradient[of=exported]``), so every graph ``trace`` and ``backward``
make saves, and the loaded graph computes the gradients ``jax.grad`` gives.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fnnc import ops
from fnnc.errors import CommandError
from fnnc.graph import (
    GraphBuilder,
    backward,
    compile,
    from_data,
    interpret,
    load,
    save,
    to_data,
    trace,
)
from tests.helpers import assert_close


def _rotary(x):
    """Rotary position embedding of ``x[seq, dim]`` (Fourier features of positions)."""
    seq, dim = x.shape
    freq = 1.0 / (10000.0 ** (jnp.arange(0, dim, 2, dtype=jnp.float32) / dim))
    angle = jnp.arange(seq, dtype=jnp.float32)[:, None] * freq[None, :]
    cos, sin = jnp.cos(angle), jnp.sin(angle)
    even, odd = x[:, 0::2], x[:, 1::2]
    return jnp.concatenate([even * cos - odd * sin, even * sin + odd * cos], axis=-1)


FUNCTIONS = {
    "sinh": jnp.sinh,
    "asinh": jnp.arcsinh,
    "arctan": jnp.arctan,
    "sign": lambda x: jnp.sign(x) * x * x,
    "cumsum": lambda x: jnp.cumsum(x, axis=-1) * x,
    "cummax": lambda x: jax.lax.cummax(x, axis=1) * jnp.arange(1.0, 5.0)[None, :],
    # sin and cos are commands (ewsin, ewcos); arctan keeps a generic node in it
    "rotary": lambda x: _rotary(jnp.arctan(x) * 3.0),
}


def _x() -> np.ndarray:
    return np.linspace(-1.7, 2.3, 12, dtype=np.float32).reshape(3, 4) ** 3


def _loss_graph(f, x):
    """The traced ``sum(f(x))`` with its gradient with respect to ``x`` appended."""
    forward = trace(f, x)
    b = GraphBuilder.from_graph(forward)
    y = forward.symbols[forward.outputs[0]]
    total = b.exec(ops.reduce_sum(axes=tuple(range(len(y.shape)))), y)
    graph, (dx,) = backward(b.build([total]), total, [forward.symbols[forward.inputs[0]]])
    return graph, dx


def _gradient_nodes(graph) -> list[str]:
    return [n.cmd.param("of").name for n in graph.nodes if n.cmd.name == "gradient"]


@pytest.mark.parametrize("name", list(FUNCTIONS))
def test_backward_of_a_generic_primitive_saves_and_loads(name, tmp_path):
    f, x = FUNCTIONS[name], _x()
    graph, _ = _loss_graph(f, x)
    assert "primitive" in _gradient_nodes(graph)
    save(graph, str(tmp_path / "g.json"))
    loaded = load(str(tmp_path / "g.json"))
    assert "primitive" not in _gradient_nodes(loaded)
    assert "exported" in _gradient_nodes(loaded)
    want_grad = jax.grad(lambda v: jnp.sum(f(v)))(x)
    got = compile(loaded)(x)
    assert_close(got[-1], want_grad, rtol=1e-5, atol=1e-5)
    assert_close(got[-1], interpret(graph, x)[-1], rtol=1e-6, atol=1e-6)
    assert_close(got[0], jnp.sum(f(x)).reshape(got[0].shape), rtol=1e-6, atol=1e-5)


def test_a_second_order_gradient_saves_and_loads():
    """backward of a backward graph: the module keeps the VJP of its VJP."""
    f, x = jnp.sinh, _x()
    graph, dx = _loss_graph(f, x)
    b = GraphBuilder.from_graph(graph)
    gsum = b.exec(ops.reduce_sum(axes=(0, 1)), dx)
    graph2, _ = backward(b.build([gsum]), gsum, [graph.symbols[graph.inputs[0]]])
    loaded = from_data(to_data(graph2))
    want = jax.grad(lambda v: jnp.sum(jax.grad(lambda u: jnp.sum(f(u)))(v)))(x)  # sinh(x)
    assert_close(compile(loaded)(x)[-1], want, rtol=1e-5, atol=1e-5)
    # loaded once, saved again: the module holds the orders the file had
    again = from_data(to_data(loaded))
    assert_close(compile(again)(x)[-1], want, rtol=1e-5, atol=1e-5)


def test_a_loaded_forward_differentiated_then_saved_again(tmp_path):
    f, x = FUNCTIONS["cumsum"], _x()
    save(trace(f, x), str(tmp_path / "f.json"))
    forward = load(str(tmp_path / "f.json"))
    b = GraphBuilder.from_graph(forward)
    total = b.exec(ops.reduce_sum(axes=(0, 1)), forward.symbols[forward.outputs[0]])
    graph, _ = backward(b.build([total]), total, [forward.symbols[forward.inputs[0]]])
    loaded = from_data(to_data(graph))
    want = jax.grad(lambda v: jnp.sum(f(v)))(x)
    assert_close(compile(loaded)(x)[-1], want, rtol=1e-5, atol=1e-5)


_UNARY = {
    "sin": jnp.sin,
    "cos": jnp.cos,
    "arctan": jnp.arctan,
    "sign*x": lambda v: jnp.sign(v) * v,
    "cumsum": lambda v: jnp.cumsum(v, axis=-1),
    "sort": lambda v: jnp.sort(v, axis=-1),
    "tanh": jnp.tanh,
    "square": lambda v: v * v,
}


@settings(max_examples=6, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(
    steps=st.lists(
        st.tuples(st.sampled_from(sorted(_UNARY)), st.sampled_from(["chain", "add", "mul"])),
        min_size=1,
        max_size=3,
    )
)
def test_random_programs_of_primitives_and_commands_round_trip(steps):
    """Random chains mixing generic primitives and commands, combined with earlier values."""

    def f(x):
        values = [x]
        for name, combine in steps:
            y = _UNARY[name](values[-1])
            if combine == "add":
                y = y + values[0]
            elif combine == "mul":
                y = y * values[len(values) // 2]
            values.append(y)
        return values[-1]

    x = _x() / 4
    graph, _ = _loss_graph(f, x)
    loaded = from_data(to_data(graph))
    assert_close(interpret(loaded, x)[-1], interpret(graph, x)[-1], rtol=1e-5, atol=1e-5)
    assert_close(
        interpret(loaded, x)[-1], jax.grad(lambda v: jnp.sum(f(v)))(x), rtol=1e-4, atol=1e-4
    )


def _second_backward(graph, dx):
    b = GraphBuilder.from_graph(graph)
    gsum = b.exec(ops.reduce_sum(axes=(0, 1)), dx)
    return backward(b.build([gsum]), gsum, [graph.symbols[graph.inputs[0]]])


@pytest.mark.parametrize("name", ["sinh", "cumsum"])
def test_a_module_without_the_vjp_orders_a_gradient_needs_is_named_at_backward(name, tmp_path):
    """A loaded forward holds one VJP order; its second-order gradient needs two. The
    backward built and then failed later: at save (for a graph loaded once) or, for one
    loaded, differentiated, saved and loaded again, at run time with jax's bare
    'No VJP is available'. backward() now says so and what to do, and doing it (the
    traced graph's backward, saved) gives jax.grad's second-order gradient."""
    f, x = FUNCTIONS[name], _x()
    save(trace(f, x), str(tmp_path / "f.json"))
    forward = load(str(tmp_path / "f.json"))
    b = GraphBuilder.from_graph(forward)
    total = b.exec(ops.reduce_sum(axes=(0, 1)), forward.symbols[forward.outputs[0]])
    graph, (dx,) = backward(b.build([total]), total, [forward.symbols[forward.inputs[0]]])
    save(graph, str(tmp_path / "g.json"))
    reloaded = load(str(tmp_path / "g.json"))
    for g, grad in ((graph, dx), (reloaded, reloaded.symbols[reloaded.outputs[-1]])):
        with pytest.raises(CommandError, match="holds 1 VJP order") as info:
            _second_backward(g, grad)
        message = str(info.value)
        assert "needs 2" in message and "take the backward of the graph as traced" in message
    traced = trace(f, x)  # what the error says to do
    b = GraphBuilder.from_graph(traced)
    total = b.exec(ops.reduce_sum(axes=(0, 1)), traced.symbols[traced.outputs[0]])
    graph, (dx,) = backward(b.build([total]), total, [traced.symbols[traced.inputs[0]]])
    graph2, _ = _second_backward(graph, dx)
    save(graph2, str(tmp_path / "g2.json"))
    want = jax.grad(lambda v: jnp.sum(jax.grad(lambda u: jnp.sum(f(u)))(v)))(x)
    assert_close(interpret(load(str(tmp_path / "g2.json")), x)[-1], want, rtol=1e-5, atol=1e-5)
