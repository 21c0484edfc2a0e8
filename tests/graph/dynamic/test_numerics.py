"""The numerics check in the dynamic graph: the first exec making a NaN or infinity."""

import re

import numpy as np
import pytest

from fnnc import config, ops
from fnnc.errors import NumericsError
from fnnc.graph import DynamicGraph


def test_off_by_default_and_on_for_a_graph_made_before() -> None:
    dg = DynamicGraph()  # planned while the check is off ...
    x = dg.variable(np.float32([1.0, -1.0]), name="x")
    y = dg.exec(ops.ewlog(), x, name="log")
    np.testing.assert_array_equal(np.isnan(y.numpy()), [False, True])  # no error while off
    with config.override(numerics=True):  # ... re-planned when it turns on
        x2 = dg.variable(np.float32([2.0, -2.0]), name="x2")
        with pytest.raises(NumericsError) as e:
            dg.exec(ops.ewlog(), x2, name="log2")
    text = str(e.value)
    assert text.startswith(
        "exec ewlog ('log2') produced a NaN or an infinity (the first command to do so)"
    )
    assert "  output 0: f32[2] min=0.693147 max=0.693147 mean=0.693147 std=0 nan=1 inf=0" in text
    assert "  input  'x2': f32[2] min=-2 max=2 mean=0 std=2 nan=0 inf=0" in text
    assert "ewlog made it from finite inputs: a log or division of zero" in text


def test_first_command_is_blamed_not_its_readers() -> None:
    with config.override(numerics=True):
        dg = DynamicGraph()
        x = dg.variable(np.float32([0.0, 4.0]), name="x")
        y = dg.exec(ops.ewsqrt(), x, name="root")  # finite: 0 and 2
        with pytest.raises(NumericsError, match=r"^exec ewdiv \('ratio'\)"):
            dg.exec(ops.ewdiv(), x, y, name="ratio")  # 0 / 0 is NaN, 4 / 2 is not
        nan = dg.constant(np.float32([np.nan, 1.0]), name="data")
        with pytest.raises(NumericsError) as e:
            dg.exec(ops.relu(), nan, name="r")
    assert "Input 'data' already held a NaN or an infinity" in str(e.value)


def test_a_gradient_node_making_infinity_is_named() -> None:
    with config.override(numerics=True):
        dg = DynamicGraph()
        x = dg.variable(np.float32([0.0, 4.0]), name="x")
        f = dg.exec(ops.reduce_sum(axes=(0,)), dg.exec(ops.ewsqrt(), x, name="root"), name="f")
        with pytest.raises(NumericsError) as e:
            dg.backward(f, [x])  # d sqrt(x)/dx = 1 / (2 sqrt(x)): infinite at 0
    text = str(e.value)
    assert re.search(r"^Program: node \d+ \(gradient, ewsqrt\.backward", text)
    assert "min=0.25 max=0.25 mean=0.25 std=0 nan=0 inf=1" in text  # 1/4 at x=4, inf at 0


def test_an_evaluated_model_names_the_node_inside() -> None:
    import optax

    from fnnc.models import CommandLayer, Dense, Input, Model

    x = Input(name="x")
    net = Model(x, CommandLayer(ops.ewlog(), name="log")(Dense(3, name="fc")(x)), name="net")
    net.compile(np.ones((4, 2), np.float32), loss="mse", minimizer=optax.sgd(0.1))
    net.set_parameters({"t-net-0-fc-0-0": -np.ones((3, 2), np.float32)})  # fc gives -2
    with config.override(numerics=True):
        dg = DynamicGraph()
        inputs = dg.constant(np.ones((4, 2), np.float32), name="batch")
        with pytest.raises(NumericsError) as e:
            dg.evaluate(net, [inputs])
    text = str(e.value)
    assert text.startswith("exec call[3 inputs, 2 nodes, 1 outputs] (\"Model('net')\")")
    assert "Inside it: interpret: node 1 (net-0-log-0, ewlog) produced a NaN" in text
    assert "input  %3 (net-0-fc-0): f32[4,3] min=-2 max=-2 mean=-2 std=0 nan=0 inf=0" in text


def test_lazy_flush_compiled_before_the_check_is_checked_after() -> None:
    """The dynamic graph's program cache keys on the dispatch state, numerics included."""

    def run(dg: DynamicGraph):
        x = dg.variable(np.float32([1.0, -1.0]), name="x")
        return dg.exec(ops.ewlog(), dg.exec(ops.scalar_mul(a=2.0), x), name="log").numpy()

    dg = DynamicGraph(lazy=True)
    assert np.isnan(run(dg)[1])  # compiled and cached while the check is off
    with config.override(numerics=True), pytest.raises(NumericsError, match="ewlog"):
        run(dg)  # the same structure, compiled again with the check
