"""How a traced graph takes its arguments: the traced pytree structure is checked, and
arguments that must be static get a hint."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fnnc import ops
from fnnc.errors import GraphInputError, TraceError
from fnnc.graph import (
    GraphBuilder,
    _io,
    backward,
    cast_precision,
    compile,
    interpret,
    load,
    save,
    simplify,
    trace,
)

SCALE, SHIFT, X = np.full(3, 2.0, np.float32), np.full(3, 1.0, np.float32), np.arange(3.0)
X = X.astype(np.float32)
WANT = (X - SHIFT) * SCALE  # NumPy


def norm(p, x):
    return (x - p["shift"]) * p["scale"]


def _graph():
    return trace(norm, {"scale": SCALE, "shift": SHIFT}, X)


def _run(how, graph, *args):
    return interpret(graph, *args) if how == "interpret" else compile(graph)(*args)


@pytest.mark.parametrize("how", ["interpret", "compile"])
def test_renamed_dict_key_is_refused_not_fed_to_another_input(how) -> None:
    # 'bias' sorts before 'scale': fed by leaf order, shift would get the scale's array
    graph = _graph()
    with pytest.raises(GraphInputError) as e:
        _run(how, graph, {"scale": SCALE, "bias": SHIFT}, X)
    message = str(e.value)
    assert "[0]['bias']" in message and "[0]['scale']" in message and "p.scale" in message


@pytest.mark.parametrize("how", ["interpret", "compile"])
def test_traced_structure_and_flat_arrays_are_taken(how) -> None:
    graph = _graph()
    np.testing.assert_allclose(_run(how, graph, {"scale": SCALE, "shift": SHIFT}, X), WANT)
    np.testing.assert_allclose(_run(how, graph, SCALE, SHIFT, X), WANT)  # one per input


def test_the_structure_survives_save_and_load(tmp_path) -> None:
    graph = _graph()
    save(graph, tmp_path / "g.json")
    loaded = load(tmp_path / "g.json")
    assert loaded.in_paths == ("[0]['scale']", "[0]['shift']", "[1]") == graph.in_paths
    with pytest.raises(GraphInputError, match="bias"):
        compile(loaded)({"scale": SCALE, "bias": SHIFT}, X)


@pytest.mark.parametrize("pass_name", ["cast_precision", "backward", "simplify"])
def test_passes_keep_the_traced_structure(pass_name) -> None:
    # cast_precision and backward rebuilt the graph and dropped in_paths, so a renamed
    # key was fed by leaf order again (shift got the scale's array) after the pass
    graph = trace(lambda p, x: jnp.sum(norm(p, x)), {"scale": SCALE, "shift": SHIFT}, X)
    if pass_name == "cast_precision":
        out = cast_precision(graph, "bfloat16")
    elif pass_name == "backward":
        out, _ = backward(graph, graph.outputs[0], [graph.inputs[0]])
    else:
        out = simplify(graph)
    assert out.in_paths == graph.in_paths
    got = compile(out)({"scale": SCALE, "shift": SHIFT}, X)
    want = np.sum(WANT)  # NumPy; backward also returns d/dscale = x - shift
    np.testing.assert_allclose(got[0] if pass_name == "backward" else got, want, rtol=1e-2)
    if pass_name == "backward":
        np.testing.assert_allclose(got[1], X - SHIFT)
    with pytest.raises(GraphInputError, match="bias"):
        compile(out)({"scale": SCALE, "bias": SHIFT}, X)


def test_built_graphs_take_any_structure_in_leaf_order() -> None:
    b = GraphBuilder()
    p, q = b.input((3,), np.float32, name="p"), b.input((3,), np.float32, name="q")
    graph = b.build([b.exec(ops.add(), p, b.exec(ops.scalar_mul(a=2.0), q))])
    assert graph.in_paths is None
    got = compile(graph)({"b": SHIFT, "a": SCALE})  # leaves in key order: a, b
    np.testing.assert_allclose(got, SCALE + 2 * SHIFT)


def test_the_paths_of_a_structure_are_computed_once() -> None:
    p, x = {"scale": np.ones(5, np.float32), "shift": np.zeros(5, np.float32)}, np.ones(5)
    program = compile(trace(norm, p, x.astype(np.float32)))  # trace computed the paths
    before = _io.leaf_paths.cache_info()
    for _ in range(3):
        np.testing.assert_allclose(program(p, jnp.ones(5)), np.ones(5))
    after = _io.leaf_paths.cache_info()
    assert (after.misses, after.hits) == (before.misses, before.hits + 3)  # lookups only
    with pytest.raises(GraphInputError):
        program({"scale": p["scale"], "bias": p["shift"]}, jnp.ones(5))


@functools.partial(jax.jit, static_argnums=1)
def _tile(x, n):
    return jnp.tile(x, n)


STATIC = {
    "jit_static_argnums": lambda x, n: _tile(x, n),
    "python_if": lambda x, n: x * n if n > 1 else x,
    "shape": lambda x, n: jnp.zeros(n) + x.sum(),
}


@pytest.mark.parametrize("name", sorted(STATIC))
def test_an_argument_that_must_be_static_gets_the_partial_hint(name) -> None:
    x = np.ones((2, 3), np.float32)
    with pytest.raises(TraceError, match=r"functools\.partial\(fn, n=") as e:
        trace(STATIC[name], x, 2)
    assert "Python numbers here: n" in str(e.value) and "JAX said" in str(e.value)
    graph = trace(functools.partial(STATIC[name], n=2), x)  # what the hint says works
    np.testing.assert_allclose(interpret(graph, x), STATIC[name](x, 2))


def test_other_errors_of_the_function_pass_through() -> None:
    with pytest.raises(TypeError, match="unsupported operand"):
        trace(lambda x: x + "a", np.ones(2, np.float32))
