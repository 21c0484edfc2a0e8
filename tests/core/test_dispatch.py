"""Every cache of a backend choice follows the dispatch state: registering a backend,
writing the autotune table or overriding backend settings takes effect everywhere
(eager, compile, the dynamic graph, models) and undoing it goes back."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fnnc import config, ops
from fnnc.core import dispatch
from fnnc.errors import BackendError, ConfigError
from fnnc.graph import DynamicGraph, GraphBuilder, compile
from fnnc.models import Dense, Input, Model, ReLU
from tests.helpers import assert_close

HERE = jax.default_backend()  # where compile, eager calls and models choose
X = np.array([[-1.0, 2.0], [3.0, -4.0]], np.float32)
RELU = np.maximum(X, 0)


def _fake_relu(x):
    return jnp.abs(x)  # visibly not relu


@pytest.fixture
def fake():
    backend = ops.Backend("fake", _fake_relu, ("cpu", "gpu", "tpu"), priority=5)
    ops.register_backend("relu", backend)
    yield backend
    ops.unregister_backend("relu", "fake")


def _graph():
    b = GraphBuilder()
    x = b.input((2, 2), name="x")
    return b.build([b.exec(ops.relu(), x)])


def _dg_relu() -> np.ndarray:
    dg = DynamicGraph()
    return np.asarray(dg.exec(ops.relu(), dg.variable(X)).numpy())


def _model():
    x = Input()
    model = Model([x], [Dense(2, name="fc")(ReLU()(x))])
    model.compile([X], loss="mse", minimizer=optax.sgd(0.0))
    model.set_parameters({"t-fc-0-0": np.eye(2, dtype=np.float32), "t-fc-0-1": np.zeros(2)})
    return model


def _model_out(model) -> np.ndarray:
    out = model.evaluate([X])
    return np.asarray(out[0] if isinstance(out, (list, tuple)) else out)


def test_registration_reaches_eager_compile_dynamic_graph_and_models():
    graph = _graph()
    p1 = compile(graph)
    model = _model()
    assert_close(ops.relu()(X), RELU)
    assert_close(p1(X), RELU)
    assert_close(_dg_relu(), RELU)
    assert_close(_model_out(model), RELU)
    before = dispatch.state()

    ops.register_backend("relu", ops.Backend("fake", _fake_relu, ("cpu", "gpu", "tpu"), priority=5))
    try:
        assert dispatch.state() != before
        p2 = compile(graph)
        assert p2 is not p1 and p2.backends[0][2] == "fake"
        assert_close(ops.relu()(X), np.abs(X))
        assert_close(p2(X), np.abs(X))
        assert_close(_dg_relu(), np.abs(X))
        assert_close(_model_out(model), np.abs(X))
    finally:
        ops.unregister_backend("relu", "fake")

    p3 = compile(graph)
    assert p3.backends[0][2] == "xla"
    assert_close(ops.relu()(X), RELU)
    assert_close(p3(X), RELU)
    assert_close(_dg_relu(), RELU)
    assert_close(_model_out(model), RELU)


def test_autotune_table_writes_and_overrides_move_the_state(fake):
    spec = [jax.ShapeDtypeStruct((2, 2), np.float32)]
    assert ops.select_backend(ops.relu(), spec, HERE) == "fake"
    graph = _graph()
    with config.override(backend_per_command={"relu": "xla"}):
        assert compile(graph).backends[0][2] == "xla"
        assert_close(_dg_relu(), RELU)
    assert compile(graph).backends[0][2] == "fake"
    key = ops.autotune.key(ops.relu(), spec, HERE)
    ops.autotune.TABLE[key] = "xla"
    try:
        assert compile(graph).backends[0][2] == "xla"
        assert_close(ops.relu()(X), RELU)
    finally:
        del ops.autotune.TABLE[key]
    assert compile(graph).backends[0][2] == "fake"


def test_overrides_that_do_not_touch_backends_keep_compiled_programs():
    graph = _graph()
    p1 = compile(graph)
    with config.override(checks=False):
        assert compile(graph) is p1


def test_gradient_nodes_choose_the_forward_backends_backward():
    calls = []

    def backward(grads, inputs, outputs, wants):
        calls.append(wants)
        (g,) = grads
        return (g * 10.0,)

    ops.register_backend(
        "relu", ops.Backend("fake", _fake_relu, (HERE,), priority=5, backward=backward)
    )
    try:
        from fnnc.graph import backward as backward_pass

        b = GraphBuilder()
        x = b.input((2, 2), name="x")
        y = b.exec(ops.reduce_sum(axes=(0, 1)), b.exec(ops.relu(), x))
        g, _ = backward_pass(b.build([y]), y, [x])
        program = compile(g)
        labels = dict((label, name) for _, label, name in program.backends)
        assert labels["relu.backward[wants=(0,)]"] == "fake"
        out = program(X)
        assert_close(out[-1] if isinstance(out, tuple) else out, np.full((2, 2), 10.0))
        assert calls
    finally:
        ops.unregister_backend("relu", "fake")
    assert "fake" not in ops.backends_of("gradient")


def _called() -> tuple:
    """A graph whose one node is ``call`` of the relu graph."""
    b = GraphBuilder()
    x = b.input((2, 2), name="x")
    return b.build([b.exec(ops.call(graph=_graph()), x)])


def test_sub_graph_nodes_choose_backends_but_the_oracle_runs_references(fake):
    """A registered backend reaches the nodes inside a ``call`` in compile and eager
    calls, while ``interpret`` (the oracle) keeps every nested node on its reference."""
    from fnnc.graph import interpret

    graph = _called()
    cmd = graph.nodes[0].cmd
    assert_close(compile(graph)(X), np.abs(X), 0, 0)
    assert_close(interpret(graph, X), RELU, 0, 0)
    assert_close(cmd(X), np.abs(X), 0, 0)  # eager: not the oracle's cached trace
    assert_close(interpret(graph, X), RELU, 0, 0)


def test_sub_graph_nodes_follow_a_configuration_override():
    """``config.override`` forcing a backend reaches a sub-graph's nodes in an eager call,
    and the call outside the block is not served the trace made inside it."""
    cmd = _called().nodes[0].cmd
    backend = ops.Backend("fake", _fake_relu, ("cpu", "gpu", "tpu"), priority=0)
    ops.register_backend("relu", backend)
    try:
        assert_close(cmd(X), RELU, 0, 0)  # priority 0: xla stays the choice
        with config.override(backend_per_command={"relu": "fake"}):
            assert_close(cmd(X), np.abs(X), 0, 0)
        assert_close(cmd(X), RELU, 0, 0)
    finally:
        ops.unregister_backend("relu", "fake")


def test_scan_bodies_choose_backends_forward_and_backward():
    """A ``scan`` (what ``Repeat`` lowers to) runs its body's nodes on the chosen backend,
    forward and gradient (the backend's own ``backward``), as unrolled nodes do; the
    oracle keeps the references."""
    from fnnc.graph import backward, interpret, scan

    b = GraphBuilder()
    h = b.input((2, 2), name="h")
    body = b.build([b.exec(ops.relu(), h)])
    b = GraphBuilder()
    x = b.input((2, 2), name="x")
    (y,) = scan(b, body, [x], length=3, name="blocks")
    loss = b.exec(ops.reduce_sum(axes=(0, 1)), y)
    graph, _ = backward(b.build([loss]), loss, [x])
    twice = lambda grads, ins, outs, wants: (2.0 * grads[0],)
    backend = ops.Backend("fake", _fake_relu, ("cpu", "gpu", "tpu"), priority=5, backward=twice)
    ops.register_backend("relu", backend)
    try:
        value, grad = compile(graph)(X)
        assert float(np.ravel(value)[0]) == pytest.approx(np.abs(X).sum())  # |.| thrice: |.|
        assert_close(grad, np.full_like(X, 8.0), 0, 0)  # the fake backward, 2 per block
        value, grad = interpret(graph, X)
        assert float(np.ravel(value)[0]) == pytest.approx(RELU.sum())
        assert_close(grad, (X > 0).astype(np.float32), 0, 0)
    finally:
        ops.unregister_backend("relu", "fake")


CONV = ops.convolution(padding="SAME")
CONV_SPECS = [
    jax.ShapeDtypeStruct((1, 4, 4, 2), np.float32),
    jax.ShapeDtypeStruct((3, 3, 3, 2), np.float32),
]


def _backend_names():
    return {n for c in ops.registry() for n in ops.backends_of(c)}


def test_a_misspelt_forced_command_or_backend_is_an_error_naming_close_matches(monkeypatch):
    import difflib

    commands, backends = list(ops.registry()), _backend_names()
    with config.override(backend_per_command={"convolutoin": "im2col"}):
        close = difflib.get_close_matches("convolutoin", commands)[0]
        assert close == "convolution"  # the oracle's suggestion
        with pytest.raises(ConfigError, match=rf"unknown command 'convolutoin'.*'{close}'"):
            ops.select_backend(CONV, CONV_SPECS, "cpu")
    assert difflib.get_close_matches("im2colx", backends)[0] == "im2col"
    with (
        config.override(backend="im2colx"),
        pytest.raises(ConfigError, match=r"backend 'im2colx'\. Did you mean 'im2col'"),
    ):
        ops.relu()(jnp.ones(2))
    monkeypatch.setenv("FNNC_BACKEND", "im2colx")
    monkeypatch.setattr(config, "_current", config._from_env())
    with pytest.raises(ConfigError, match=r"FNNC_BACKEND.*'im2colx'\. Did you mean 'im2col'"):
        ops.relu()(jnp.ones(2))
    monkeypatch.undo()
    with (
        config.override(backend_per_command={"convolution": "im2colx"}),
        pytest.raises(BackendError, match=r"'im2colx'.*Did you mean 'im2col'"),
    ):
        ops.select_backend(CONV, CONV_SPECS, "cpu")


def test_backend_per_command_must_be_a_mapping_of_names():
    for wrong in ("im2col", ["convolution"], {"convolution": 3}):
        with (
            pytest.raises(ConfigError, match=r"backend_per_command: expected a mapping"),
            config.override(backend_per_command=wrong),
        ):
            pass
    with (
        pytest.raises(ConfigError, match=r"backend: expected a backend name"),
        config.override(backend=None),
    ):
        pass


def test_forced_names_are_checked_once_per_setting(monkeypatch):
    calls = []
    check = config.check_forcing
    monkeypatch.setattr(config, "check_forcing", lambda *a: calls.append(1) or check(*a))
    with config.override(backend_per_command={"convolution": "im2col"}):
        for _ in range(3):
            assert ops.select_backend(CONV, CONV_SPECS, "cpu") == "im2col"
        assert len(calls) == 1
    with config.override(backend="xla"):
        ops.select_backend(CONV, CONV_SPECS, "cpu")
        ops.select_backend(ops.relu(), CONV_SPECS[:1], "cpu")
    assert len(calls) == 2
