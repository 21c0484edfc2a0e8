"""Audit of issue 11 (architecture: one ground floor, command attributes, dispatch state in
every cache key, one backward convention, one pytree codec, typed records, plain classes).

Promises checked, in the issue's own words where it has them:

* the repro: ``ops.register_backend("relu", Backend("fake", ..., priority=5))`` after a
  graph with relu was compiled is used by eager ``ops.relu()(x)``, by ``compile(g)`` (a
  new ``Program``, not ``p2 is p1``), by the *same* ``DynamicGraph`` (eager and lazy,
  forward and ``backward``) and by ``Model.fit`` on the *same* compiled model (forward
  and the backend's own backward); all go back after ``unregister_backend``;
* every cache keys on the dispatch state: a re-registration under the same name, an
  autotune-table write and a ``config.override`` of backend settings move every path;
* one backward convention: forcing the forward's backend forces its gradient node's;
* command attributes set in ``defcommand`` (elementwise, commutative, idempotent,
  random, has_effects) are what ``fuse``, ``cse``, ``dce`` and the Pallas fused kernel's
  support predicate read: a new elementwise command defined in this file is fused, merged
  and differentiated correctly, without editing a pass;
* the layout: ``import fnnc`` then ``fnnc.graph`` / ``fnnc.models`` work, and
  ``fnnc.ops.registry()`` is the same set whatever was imported first (subprocesses);
  ``call`` / ``write_view`` / control flow / fused chains are commands of ``ops``; one
  dispatch module owns the registry, the table and the selection rule;
* graph files go through ``fnnc.graph.save/load`` into ``fnnc.io`` files, and their
  output structure uses the one pytree codec of ``fnnc.io.tree``;
* typed program records in ``models``; ``DynamicGraph`` as a plain class whose ``Record``
  is documented as its own IR;
* backwards derived from ``jax.vjp`` agree with float64 finite differences.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import importlib.util
import json
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import fnnc
from fnnc import config, ops
from fnnc.core import dispatch
from fnnc.graph import (
    DynamicGraph,
    GraphBuilder,
    backward,
    compile,
    cse,
    dce,
    fuse,
    interpret,
    load,
    save,
    trace,
)
from fnnc.models import Dense, Input, Model, ReLU
from fnnc.ops._rules import same_shape
from tests.helpers import assert_close, subprocess_env

ROOT = pathlib.Path(__file__).resolve().parents[2]
FNNC = ROOT / "fnnc"
EVERYWHERE = ("cpu", "gpu", "tpu")
X = np.array([[-1.0, 2.0], [3.0, -4.0]], np.float32)


def _abs(x):
    return jnp.abs(x)  # visibly not relu on negative inputs


def _twice(grads, inputs, outputs, wants):
    """A backend backward that is visibly not relu's: every gradient doubled."""
    (g,) = grads
    return (g * 2.0,)


@pytest.fixture
def registries(restore_registries):
    """Backends, commands and the table put back after the test (conftest's fixture)."""
    yield


@functools.cache
def _parsed(path: pathlib.Path) -> ast.Module:
    return ast.parse(path.read_text())


def _relu_graph():
    b = GraphBuilder()
    x = b.input((2, 2), name="x")
    return b.build([b.exec(ops.relu(), x, name="act")])


def _chosen(program, label="act"):
    return {lab: name for _, lab, name in program.backends}[label]


# -- the repro ------------------------------------------------------------------------


def test_repro_compile_after_registration_is_a_new_program_on_the_new_backend(registries):
    """The issue's repro: ``p2 is p1`` and ``xla`` before; now a new program on ``fake``."""
    graph = _relu_graph()
    p1 = compile(graph)
    assert_close(p1(X), np.maximum(X, 0), 0, 0)
    ops.register_backend("relu", ops.Backend("fake", _abs, EVERYWHERE, priority=5))
    p2 = compile(graph)
    assert p2 is not p1
    assert _chosen(p2) == "fake"
    assert_close(p2(X), np.abs(X), 0, 0)
    assert_close(ops.relu()(X), np.abs(X), 0, 0)
    ops.unregister_backend("relu", "fake")
    p3 = compile(graph)
    assert _chosen(p3) == "xla"
    assert_close(p3(X), np.maximum(X, 0), 0, 0)
    assert_close(ops.relu()(X), np.maximum(X, 0), 0, 0)


@pytest.mark.parametrize("lazy", [False, True], ids=["eager", "lazy"])
def test_one_dynamic_graph_follows_registration_and_unregistration(registries, lazy):
    """The same graph instance and the same variable: its plans are made again."""
    dg = DynamicGraph(lazy=lazy)
    x = dg.variable(X, name="x")

    def relu_of_x():
        return np.asarray(dg.exec(ops.relu(), x).numpy())

    assert_close(relu_of_x(), np.maximum(X, 0), 0, 0)
    ops.register_backend("relu", ops.Backend("fake", _abs, EVERYWHERE, priority=5))
    assert_close(relu_of_x(), np.abs(X), 0, 0)
    ops.unregister_backend("relu", "fake")
    assert_close(relu_of_x(), np.maximum(X, 0), 0, 0)


def test_dynamic_graph_backward_runs_the_backends_own_backward_and_goes_back(registries):
    """``DynamicGraph.backward``'s compiled gradient program follows the registry too."""
    dg = DynamicGraph()
    total = ops.reduce_sum(axes=(0, 1))

    def grad_of_sum_relu():
        x = dg.variable(X, name="x")
        f = dg.exec(total, dg.exec(ops.relu(), x))
        (dx,) = dg.backward(f, [x])
        return float(np.asarray(f.numpy()).sum()), np.asarray(dx.numpy())

    f0, g0 = grad_of_sum_relu()
    assert f0 == pytest.approx(np.maximum(X, 0).sum())
    assert_close(g0, jax.grad(lambda v: jax.nn.relu(v).sum())(X), 0, 0)
    ops.register_backend("relu", ops.Backend("fake", _abs, EVERYWHERE, priority=5, backward=_twice))
    f1, g1 = grad_of_sum_relu()
    assert f1 == pytest.approx(np.abs(X).sum())
    assert_close(g1, np.full_like(X, 2.0), 0, 0)
    ops.unregister_backend("relu", "fake")
    f2, g2 = grad_of_sum_relu()
    assert f2 == pytest.approx(f0)
    assert_close(g2, g0, 0, 0)


# Model.fit: x -> Dense(3) -> ReLU -> Dense(1), mse, SGD(0.1), fixed parameters.
MX = np.array([[-1.0, 2.0], [3.0, -4.0], [0.5, 1.5]], np.float32)
MT = np.array([[1.0], [-2.0], [0.5]], np.float32)
PARAMS = {
    "t-fc-0-0": np.array([[1.0, 0.5], [-0.5, 1.0], [0.25, -1.0]], np.float32),
    "t-fc-0-1": np.array([0.1, -0.2, 0.3], np.float32),
    "t-out-0-0": np.array([[0.5, -1.0, 0.75]], np.float32),
    "t-out-0-1": np.array([0.05], np.float32),
}


@jax.custom_vjp
def _fake_act(x):
    return jnp.abs(x)


_fake_act.defvjp(lambda x: (jnp.abs(x), None), lambda _, g: (2.0 * g,))


def _oracle_step(params, act):
    """(loss, parameters after one SGD(0.1) step) with plain JAX."""

    def loss(p):
        h = act(MX @ p["t-fc-0-0"].T + p["t-fc-0-1"][None, :])
        y = h @ p["t-out-0-0"].T + p["t-out-0-1"][None, :]
        return jnp.mean((y - MT) ** 2)

    value, grads = jax.value_and_grad(loss)(params)
    return float(value), {k: np.asarray(params[k] - 0.1 * grads[k]) for k in params}


def test_model_fit_uses_the_new_backend_and_its_backward_then_goes_back(registries):
    """One compiled model, three ``fit`` steps: before, during and after registration."""
    x = Input()
    model = Model([x], [Dense(1, name="out")(ReLU()(Dense(3, name="fc")(x)))])
    model.compile([MX], loss="mse", minimizer=optax.sgd(0.1))
    model.set_parameters(PARAMS)

    want, after = _oracle_step(PARAMS, jax.nn.relu)
    assert float(model.fit([MX], [MT])) == pytest.approx(want, rel=1e-5)
    assert_close(model.parameters(), after, 1e-5, 1e-6)

    ops.register_backend("relu", ops.Backend("fake", _abs, EVERYWHERE, priority=5, backward=_twice))
    model.set_parameters(PARAMS)
    want_fake, after_fake = _oracle_step(PARAMS, _fake_act)
    assert abs(want_fake - want) > 1e-3  # the check below can tell the backends apart
    assert float(model.fit([MX], [MT])) == pytest.approx(want_fake, rel=1e-5)
    assert_close(model.parameters(), after_fake, 1e-5, 1e-6)

    ops.unregister_backend("relu", "fake")
    model.set_parameters(PARAMS)
    assert float(model.fit([MX], [MT])) == pytest.approx(want, rel=1e-5)
    assert_close(model.parameters(), after, 1e-5, 1e-6)


@pytest.mark.parametrize("what", ["graph", "program", "model"])
def test_dynamic_graph_evaluate_of_a_graph_uses_the_registered_backend(registries, what):
    """``dg.evaluate`` of a relu graph, its compiled ``Program`` or a cnnp model agrees
    with ``compile(g)`` / ``model.evaluate`` once ``fake`` is registered."""
    ops.register_backend("relu", ops.Backend("fake", _abs, EVERYWHERE, priority=5))
    graph = _relu_graph()
    assert_close(compile(graph)(X), np.abs(X), 0, 0)
    if what == "model":
        inp = Input()
        subject = Model([inp], [ReLU()(inp)])
        subject.compile([X])
        assert_close(subject.evaluate([X]), np.abs(X), 0, 0)
    else:
        subject = graph if what == "graph" else compile(graph)
    dg = DynamicGraph()
    out = dg.evaluate(subject, [dg.variable(X)])
    assert_close(np.asarray(out.numpy()), np.abs(X), 0, 0)


def test_re_registering_under_the_same_name_moves_every_cache(registries):
    """A second ``register_backend`` with the same name replaces the first everywhere."""
    graph = _relu_graph()
    dg = DynamicGraph()
    x = dg.variable(X)
    ops.register_backend("relu", ops.Backend("fake", _abs, EVERYWHERE, priority=5))
    assert_close(compile(graph)(X), np.abs(X), 0, 0)
    assert_close(dg.exec(ops.relu(), x).numpy(), np.abs(X), 0, 0)
    ops.register_backend("relu", ops.Backend("fake", lambda v: v * 3.0, EVERYWHERE, priority=5))
    assert_close(compile(graph)(X), 3.0 * X, 0, 0)
    assert_close(dg.exec(ops.relu(), x).numpy(), 3.0 * X, 0, 0)
    assert_close(ops.relu()(X), 3.0 * X, 0, 0)


def test_dispatch_state_is_hashable_and_moves_on_every_change(registries):
    """One hashable snapshot: registration, removal, table writes and overrides move it."""
    seen = [dispatch.state()]
    hash(seen[0])
    ops.register_backend("relu", ops.Backend("fake", _abs, EVERYWHERE, priority=0))
    seen.append(dispatch.state())
    key = ops.autotune.key(ops.relu(), [jax.ShapeDtypeStruct((2, 2), np.float32)], "cpu")
    ops.autotune.TABLE[key] = "fake"
    seen.append(dispatch.state())
    with config.override(backend_per_command={"relu": "fake"}):
        seen.append(dispatch.state())
    ops.unregister_backend("relu", "fake")
    seen.append(dispatch.state())
    assert len(set(seen)) == len(seen), seen


def test_a_table_winner_reaches_one_dynamic_graph_and_one_model(registries):
    """An autotune-table write is dispatch state for the dynamic graph and models too."""
    here = jax.default_backend()
    ops.register_backend("relu", ops.Backend("fake", _abs, EVERYWHERE, priority=0))
    dg = DynamicGraph()
    x = dg.variable(X)
    inp = Input()
    model = Model([inp], [ReLU()(inp)])
    model.compile([X])
    assert_close(dg.exec(ops.relu(), x).numpy(), np.maximum(X, 0), 0, 0)
    assert_close(model.evaluate([X]), np.maximum(X, 0), 0, 0)
    key = ops.autotune.key(ops.relu(), [jax.ShapeDtypeStruct((2, 2), np.float32)], here)
    ops.autotune.TABLE[key] = "fake"
    assert_close(dg.exec(ops.relu(), x).numpy(), np.abs(X), 0, 0)
    assert_close(model.evaluate([X]), np.abs(X), 0, 0)
    assert_close(ops.relu()(X), np.abs(X), 0, 0)
    del ops.autotune.TABLE[key]
    assert_close(dg.exec(ops.relu(), x).numpy(), np.maximum(X, 0), 0, 0)
    assert_close(model.evaluate([X]), np.maximum(X, 0), 0, 0)


def test_forcing_the_forward_backend_forces_its_gradient_node(registries):
    """One backward convention: the gradient node picks by the forward's selection."""
    ops.register_backend("relu", ops.Backend("fake", _abs, EVERYWHERE, priority=0, backward=_twice))
    b = GraphBuilder()
    x = b.input((2, 2), name="x")
    y = b.exec(ops.reduce_sum(axes=(0, 1)), b.exec(ops.relu(), x, name="act"))
    grad_graph, _ = backward(b.build([y]), y, [x])
    default = compile(grad_graph)
    assert set(name for _, _, name in default.backends) == {"xla"}
    assert_close(default(X)[-1], (X > 0).astype(np.float32), 0, 0)
    with config.override(backend_per_command={"relu": "fake"}):
        forced = compile(grad_graph)
        chosen = {lab: name for _, lab, name in forced.backends}
        assert chosen["act"] == "fake"
        assert [n for lab, n in chosen.items() if lab.startswith("act.backward")] == ["fake"]
        out = forced(X)
    assert_close(out[0], np.abs(X).sum(keepdims=True), 0, 0)
    assert_close(out[-1], np.full_like(X, 2.0), 0, 0)


def test_gradient_backends_come_only_from_forward_backends_with_a_backward(registries):
    """No second list of kernels: gradient nodes' backends are the forwards' backwards."""
    before = set(ops.backends_of("gradient"))
    ops.register_backend("relu", ops.Backend("plain", _abs, EVERYWHERE, priority=0))
    assert set(ops.backends_of("gradient")) == before
    ops.register_backend(
        "relu", ops.Backend("withbw", _abs, EVERYWHERE, priority=0, backward=_twice)
    )
    assert set(ops.backends_of("gradient")) == before | {"withbw"}
    ops.unregister_backend("relu", "withbw")
    assert set(ops.backends_of("gradient")) == before
    assert importlib.util.find_spec("fnnc.ops.pallas.gradient") is None


def test_one_dispatch_module_owns_registry_table_and_selection():
    """``ops`` re-exports the dispatch module's registry, table and selection rule."""
    assert ops.register_backend is dispatch.register_backend
    assert ops.unregister_backend is dispatch.unregister_backend
    assert ops.select_backend is dispatch.select_backend
    assert ops.backends_of is dispatch.backends_of
    assert ops.Backend is dispatch.Backend
    assert ops.autotune.TABLE is dispatch.TABLE
    assert fnnc.core.Command is ops.Command and fnnc.core.Graph is fnnc.graph.Graph
    assert fnnc.core.defcommand is ops.defcommand and fnnc.core.registry is ops.registry


# -- command attributes read by passes and kernels --------------------------------------


@pytest.fixture
def user_commands(registries):
    """Commands defined here, as a user would, with only ``defcommand``'s flags set."""

    @ops.defcommand(family="audit", shape=same_shape, elementwise=True)
    def audit11_cube1(x):
        """``x**3 + 1``: a new elementwise command."""
        return x * x * x + 1.0

    @ops.defcommand(family="audit", shape=same_shape)
    def audit11_opaque(x):
        """The same function, without the elementwise flag."""
        return x * x * x + 1.0

    @ops.defcommand(family="audit", shape=same_shape, elementwise=True)
    def audit11_sub(a, b):
        """``a - 2b``: elementwise, not commutative."""
        return a - 2.0 * b

    @ops.defcommand(
        family="audit",
        shape=same_shape,
        elementwise=True,
        commutative=lambda cmd: cmd.param("k") == 1.0,
    )
    def audit11_wsum(a, b, *, k=1.0):
        """``a + k b``: commutative only for ``k == 1`` (a predicate on the value)."""
        return a + k * b

    @ops.defcommand(family="audit", shape=same_shape, random=True)
    def audit11_noisy(x):
        """Flagged random: never merged."""
        return x + 1.0

    @ops.defcommand(family="audit", shape=same_shape, has_effects=True)
    def audit11_effect(x):
        """Flagged effectful: never removed."""
        return x + 1.0

    return {
        "cube1": audit11_cube1,
        "opaque": audit11_opaque,
        "sub": audit11_sub,
        "wsum": audit11_wsum,
        "noisy": audit11_noisy,
        "effect": audit11_effect,
    }


def _xs(*shape, n=2, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.uniform(-1, 1, shape).astype(np.float32) for _ in range(n)]


def test_defcommand_flags_land_in_attributes(user_commands):
    """The flags a pass needs are ``Attributes`` fields set by ``defcommand``."""
    attrs = {k: ops.lookup(f.__name__).attributes for k, f in user_commands.items()}
    assert attrs["cube1"].elementwise and not attrs["opaque"].elementwise
    assert not attrs["sub"].is_commutative(user_commands["sub"]())
    assert attrs["wsum"].is_commutative(user_commands["wsum"]())
    assert not attrs["wsum"].is_commutative(user_commands["wsum"](k=2.0))
    assert attrs["noisy"].random and attrs["effect"].has_effects
    assert ops.lookup("ewsum").attributes.is_commutative(ops.ewsum())
    assert ops.lookup("max").attributes.idempotent
    assert ops.lookup("relu").attributes.elementwise
    assert not ops.lookup("softmax").attributes.elementwise


def test_fuse_puts_a_new_elementwise_command_in_the_chain(user_commands):
    """sigmoid -> cube1 -> tanh becomes one fused node with the right values and gradient."""
    cube1 = user_commands["cube1"]
    b = GraphBuilder()
    x = b.input((3, 4), name="x")
    y = b.exec(ops.tanh(), b.exec(cube1(), b.exec(ops.sigmoid(), x)))
    graph = b.build([y])
    fused = fuse(graph)
    assert [n.cmd.name for n in fused.nodes] == ["fused_elementwise"]
    body = fused.nodes[0].cmd.param("body")
    assert [n.cmd.name for n in body.nodes] == ["sigmoid", "audit11_cube1", "tanh"]
    (xv,) = _xs(3, 4, n=1)
    want = np.tanh((1 / (1 + np.exp(-xv.astype(np.float64)))) ** 3 + 1)
    assert_close(compile(fused)(xv), want, 1e-5, 1e-6)

    fused = fuse(b.build([b.exec(ops.reduce_sum(axes=(0, 1)), y)]))
    assert [n.cmd.name for n in fused.nodes] == ["fused_elementwise", "reduce_sum"]
    grad_graph, _ = backward(fused, fused.outputs[0], [fused.inputs[0]])
    ref = jax.grad(lambda v: jnp.tanh(jax.nn.sigmoid(v) ** 3 + 1).sum())(xv)
    assert_close(compile(grad_graph)(xv)[-1], ref, 1e-5, 1e-6)


def test_fuse_stops_at_a_new_command_without_the_flag(user_commands):
    """The same function unflagged splits the chain: nothing of length 2 is left to fuse."""
    b = GraphBuilder()
    x = b.input((3, 4), name="x")
    y = b.exec(ops.tanh(), b.exec(user_commands["opaque"](), b.exec(ops.sigmoid(), x)))
    graph = b.build([y])
    assert fuse(graph) is graph


def test_fuse_joins_a_new_two_input_elementwise_command(user_commands):
    """A two-input new command joins its producers' chains, inputs kept in order."""
    sub = user_commands["sub"]
    b = GraphBuilder()
    x, y = b.input((3, 4), name="x"), b.input((3, 4), name="y")
    z = b.exec(ops.relu(), b.exec(sub(), b.exec(ops.ewexp(), x), y))
    graph = b.build([z])
    fused = fuse(graph)
    assert [n.cmd.name for n in fused.nodes] == ["fused_elementwise"]
    xv, yv = _xs(3, 4)
    assert_close(compile(fused)(xv, yv), np.maximum(np.exp(xv) - 2 * yv, 0), 1e-5, 1e-6)


def test_cse_reads_the_commutative_flag_and_its_predicate(user_commands):
    """Swapped inputs merge only where the command says it is commutative."""
    sub, wsum = user_commands["sub"], user_commands["wsum"]
    xv, yv = _xs(3, 4)

    def pair(cmd):
        b = GraphBuilder()
        x, y = b.input((3, 4), name="x"), b.input((3, 4), name="y")
        p, q = b.exec(cmd, x, y), b.exec(cmd, y, x)
        return b.build([b.exec(ops.ewprod(), p, q)])

    merged = cse(pair(wsum()))
    assert [n.cmd.name for n in merged.nodes] == ["audit11_wsum", "ewprod"]
    assert_close(compile(merged)(xv, yv), (xv + yv) ** 2, 1e-5, 1e-6)
    kept = pair(wsum(k=2.0))
    assert cse(kept) is kept
    kept = pair(sub())
    assert cse(kept) is kept
    assert_close(compile(kept)(xv, yv), (xv - 2 * yv) * (yv - 2 * xv), 1e-5, 1e-6)


def test_cse_merges_duplicates_of_a_new_command_but_never_random_ones(user_commands):
    """Equal pure nodes merge; a command flagged random never does."""
    (xv,) = _xs(3, 4, n=1)
    for name, merges in (("cube1", True), ("noisy", False)):
        b = GraphBuilder()
        x = b.input((3, 4), name="x")
        p, q = b.exec(user_commands[name](), x), b.exec(user_commands[name](), x)
        graph = b.build([b.exec(ops.ewsum(), p, q)])
        out = cse(graph)
        assert len(out.nodes) == (2 if merges else 3), (name, out)
    assert_close(compile(cse(graph))(xv), 2 * (xv + 1), 1e-6, 1e-6)


def test_dce_keeps_a_new_effectful_command_and_drops_a_pure_one(user_commands):
    """Unused outputs: the effectful node stays, the pure new command goes."""
    b = GraphBuilder()
    x = b.input((3,), name="x")
    b.exec(user_commands["effect"](), x)
    b.exec(user_commands["cube1"](), x)
    graph = b.build([b.exec(ops.relu(), x)])
    assert [n.cmd.name for n in dce(graph).nodes] == ["audit11_effect", "relu"]


def test_the_fused_kernel_support_predicate_reads_the_flag(user_commands):
    """The Pallas ``fused_elementwise`` kernel accepts a body with the new elementwise
    command and declines the same body built with the unflagged twin, naming it."""
    from fnnc.ops.pallas import fused_elementwise as kernel

    specs = [jax.ShapeDtypeStruct((4, 8), np.float32)]
    reasons = {}
    for name in ("cube1", "opaque"):
        b = GraphBuilder()
        x = b.input((4, 8))
        body = b.build([b.exec(ops.tanh(), b.exec(user_commands[name](), x))])
        reasons[name] = kernel.supports(ops.fused_elementwise(body=body), specs)
    assert reasons["cube1"] is None
    assert "audit11_opaque" in reasons["opaque"] and "elementwise" in reasons["opaque"]


def test_no_pass_or_kernel_keeps_a_list_of_elementwise_or_commutative_names():
    """No collection literal in fuse/cse/fold/the fused kernel names a command whose
    membership is a flag (elementwise, commutative, idempotent)."""
    flagged = {
        name
        for name, d in ops.registry().items()
        if d.attributes.elementwise or d.attributes.commutative or d.attributes.idempotent
    }
    files = [
        FNNC / "graph" / "passes" / "fuse.py",
        FNNC / "graph" / "passes" / "cse.py",
        FNNC / "graph" / "passes" / "fold.py",
        FNNC / "ops" / "pallas" / "fused_elementwise.py",
    ]
    found = []
    for path in files:
        for node in ast.walk(_parsed(path)):
            if isinstance(node, (ast.Set, ast.List, ast.Tuple)):
                names = [
                    e.value
                    for e in node.elts
                    if isinstance(e, ast.Constant) and isinstance(e.value, str)
                ]
                hits = [n for n in names if n in flagged]
                if len(hits) >= 2:
                    found.append(f"{path.name}:{node.lineno} {hits}")
    assert not found, found


# -- layout ---------------------------------------------------------------------------

_PROBE = (
    "{first}\n"
    "import fnnc, json\n"
    "before = sorted(fnnc.ops.registry())\n"
    "assert callable(fnnc.graph.compile) and callable(fnnc.models.Model)\n"
    "import fnnc.data, fnnc.io\n"
    "print(json.dumps([before, sorted(fnnc.ops.registry())]))\n"
)


def test_registry_is_the_same_set_whatever_was_imported_first():
    """``fnnc.ops.registry()`` right after ``import fnnc`` (then ``fnnc.graph`` and
    ``fnnc.models`` reached as attributes) and right after ``import fnnc.models``, each in
    a fresh process, equals the set once everything is loaded."""
    procs = {
        line: subprocess.Popen(
            [sys.executable, "-c", _PROBE.format(first=line)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env=subprocess_env(),
        )
        for line in ("import fnnc", "import fnnc.models")
    }
    sets = {}
    for line, proc in procs.items():
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, (line, err[-2000:])
        before, after = json.loads(out.strip().splitlines()[-1])
        assert before == after, (line, sorted(set(after) ^ set(before)))
        sets[line] = before
    assert sets["import fnnc"] == sets["import fnnc.models"]
    assert {"call", "write_view", "while_loop", "case_of", "fused_elementwise"} <= set(
        sets["import fnnc"]
    )


def test_commands_holding_graphs_and_call_write_view_are_commands_of_ops():
    """``call``, ``write_view``, control flow and fused chains are defined in ``fnnc.ops``."""
    for name in ("call", "write_view", "while_loop", "case_of", "fused_elementwise", "gradient"):
        assert ops.lookup(name).forward.__module__.startswith("fnnc.ops."), name
    assert importlib.util.find_spec("fnnc.graph.dynamic.commands") is None


def test_ops_core_and_io_never_load_graph_or_models_by_string():
    """The layering also holds for imports by name (``importlib`` / ``__import__``)."""
    found = []
    for pkg, banned in (("core", "graph models ops io"), ("ops", "graph models io"),
                        ("io", "graph models")):  # fmt: skip
        for path in sorted((FNNC / pkg).rglob("*.py")):
            for node in ast.walk(_parsed(path)):
                if not isinstance(node, ast.Call) or not node.args:
                    continue
                fn = node.func
                name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")
                arg = node.args[0]
                if name in ("import_module", "__import__") and isinstance(arg, ast.Constant):
                    parts = str(arg.value).split(".")
                    if parts[0] == "fnnc" and len(parts) > 1 and parts[1] in banned.split():
                        found.append(f"{path.relative_to(ROOT)}:{node.lineno} {arg.value}")
    assert not found, found


def test_graph_files_go_through_graph_save_load_into_io_files(tmp_path):
    """``fnnc.graph.save/load`` store a graph in a JSON file or an ``fnnc.io`` tensor file."""
    graph = _relu_graph()
    path = tmp_path / "g.json"
    save(graph, path)
    assert load(path) == graph
    db = tmp_path / "store.sqlite3"
    save(graph, db, name="relu_graph")
    assert "relu_graph" in fnnc.io.graph_names(db)
    assert load(db, name="relu_graph") == graph
    assert_close(compile(load(db, name="relu_graph"))(X), np.maximum(X, 0), 0, 0)


def test_graph_files_write_output_structure_with_the_one_pytree_codec(tmp_path):
    """A traced graph's output tree is written as ``fnnc.io.tree`` writes it."""
    from fnnc.io import tree as codec

    def fn(x):
        return {"b": (x * 2.0, x + 1.0), "a": [x - 1.0]}

    xv = np.arange(3, dtype=np.float32)
    graph = trace(fn, xv)
    path = tmp_path / "t.json"
    save(graph, path)
    stored = json.loads(path.read_text())["out_tree"]
    example = jax.tree.unflatten(graph.out_tree, list(range(len(graph.outputs))))
    assert stored == codec.encode(example, "", str)[0]
    assert "$dict" in json.dumps(stored) and "$tuple" in json.dumps(stored)
    loaded = load(path)
    got = compile(loaded)(xv)
    want = fn(xv)
    assert jax.tree.structure(got) == jax.tree.structure(want)
    assert_close(jax.tree.leaves(got), jax.tree.leaves(want), 0, 0)


def test_serialize_has_no_pytree_codec_of_its_own():
    """The graph serializer's output-tree functions call ``fnnc.io.tree``'s codec."""
    source = (FNNC / "graph" / "serialize.py").read_text()
    tree_ast = ast.parse(source)
    fns = {n.name: n for n in ast.walk(tree_ast) if isinstance(n, ast.FunctionDef)}
    for name, call in (("_enc_tree", "encode"), ("_dec_tree", "decode")):
        calls = {
            (c.func.value.id, c.func.attr)
            for c in ast.walk(fns[name])
            if isinstance(c, ast.Call)
            and isinstance(c.func, ast.Attribute)
            and isinstance(c.func.value, ast.Name)
        }
        assert ("tree", call) in calls, (name, calls)
    assert "$namedtuple" not in source  # the codec's container tags live in io/tree.py only


# -- typed records, plain classes ----------------------------------------------------


def test_model_programs_are_frozen_typed_records():
    """Every program the engine caches is a frozen dataclass (no tuples, no ``extra``)."""
    x = Input()
    model = Model([x], [Dense(1, name="out")(ReLU()(Dense(3, name="fc")(x)))])
    model.compile([MX], loss="mse", minimizer=optax.sgd(0.1))
    model.fit([MX], [MT])
    model.evaluate([MX])
    model.evaluate([MX], requires_grad=True)
    model.backward([np.ones((3, 1), np.float32)])
    model.apply_gradients()
    programs = list(model.engine._programs.values())
    assert len(programs) >= 4
    for program in programs:
        assert dataclasses.is_dataclass(program), type(program)
        assert type(program).__dataclass_params__.frozen, type(program)
        assert "extra" not in {f.name for f in dataclasses.fields(program)}
    source = (FNNC / "models" / "model.py").read_text()
    assert "ctx._layers" not in source


def test_dynamic_graph_is_a_plain_class():
    """No method attached from another module; nothing assigns onto the class."""
    foreign = []
    for key, value in vars(DynamicGraph).items():
        fn = value.fget if isinstance(value, property) else getattr(value, "__func__", value)
        if not (callable(fn) and hasattr(fn, "__qualname__")):
            continue
        own = fn.__qualname__.startswith("DynamicGraph.")
        if not own or fn.__module__ != DynamicGraph.__module__:
            foreign.append(key)
    assert not foreign, foreign
    assigned = []
    for path in sorted(FNNC.rglob("*.py")):
        for node in ast.walk(_parsed(path)):
            targets = node.targets if isinstance(node, ast.Assign) else []
            for t in targets:
                if isinstance(t, ast.Attribute) and getattr(t.value, "id", "") == "DynamicGraph":
                    assigned.append(f"{path.relative_to(ROOT)}:{node.lineno}")
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "id", "") == "setattr"
                and node.args
                and getattr(node.args[0], "id", "") == "DynamicGraph"
            ):
                assigned.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not assigned, assigned


def test_record_is_documented_as_the_dynamic_graphs_own_ir():
    """``Record``'s module says it is the dynamic graph's IR and why it is not ``Graph``."""
    from fnnc.graph.dynamic import record

    doc = record.__doc__ or ""
    assert "IR" in doc and "Record" in doc
    assert "Graph" in doc and ("why" in doc.lower())


# -- derived backwards against float64 finite differences ------------------------------

FD_CASES = {
    "swiglu": (ops.swiglu(), [(2, 3), (4, 3), (4, 3)]),
    "swish_mul": (ops.swish_mul(beta=1.5, scale=0.5), [(3, 4), (3, 4)]),
}


@pytest.mark.parametrize("name", sorted(FD_CASES))
def test_vjp_derived_backward_matches_float64_finite_differences(name):
    """Commands with a derived backward: the ``backward`` pass against central differences."""
    cmd, shapes = FD_CASES[name]
    assert ops.lookup(cmd.name).backward_fn is None  # derived from jax.vjp
    rng = np.random.default_rng(3)
    with jax.enable_x64(True):
        xs = [rng.uniform(-1.5, 1.5, s) for s in shapes]
        b = GraphBuilder()
        ins = [b.input(s, np.float64) for s in shapes]
        y = b.exec(cmd, *ins)
        (out,) = cmd.shape(*[jax.ShapeDtypeStruct(s, np.float64) for s in shapes])
        w = rng.uniform(-1, 1, out.shape)
        weights = b.constant(w)
        f = b.exec(ops.reduce_sum(axes=tuple(range(w.ndim))), b.exec(ops.ewprod(), y, weights))
        grad_graph, _ = backward(b.build([f]), f, ins)
        grads = interpret(grad_graph, *xs)[1:]

        def loss(*vs):
            return float((np.asarray(cmd(*vs)) * w).sum())

        h = 1e-6
        for i, (x, g) in enumerate(zip(xs, grads)):
            d = rng.uniform(-1, 1, x.shape)
            plus = [v + h * d if j == i else v for j, v in enumerate(xs)]
            minus = [v - h * d if j == i else v for j, v in enumerate(xs)]
            fd = (loss(*plus) - loss(*minus)) / (2 * h)
            assert float((np.asarray(g) * d).sum()) == pytest.approx(fd, rel=1e-6, abs=1e-8)
