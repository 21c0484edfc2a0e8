"""Which node the numerics check blames: the first whose output holds a NaN or an
infinity that the graph did not write itself (a ``-inf`` mask constant and what flows
from it are deliberate; the data's NaN is not). Compiled programs and ``interpret`` agree
with a NumPy restatement of that rule on random chains, hoisted constants included."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fnnc import config, ops
from fnnc.errors import NumericsError
from fnnc.graph import GraphBuilder, compile, interpret, trace
from tests.helpers import assert_close

MODES = ["interpret", "compile"]


def _run(mode, graph, *args):
    with config.override(numerics=True):
        return interpret(graph, *args) if mode == "interpret" else compile(graph)(*args)


@pytest.mark.parametrize("mode", MODES)
def test_a_hoisted_constant_does_not_shift_the_blamed_node(mode):
    """Constants over 16 elements are passed to XLA as arguments; the compiled check
    used to skip their flags, so it named the node before the bad one."""
    b = GraphBuilder()
    x = b.input((20,), name="x")
    c = b.constant(np.linspace(1, 2, 20).astype(np.float32), name="c")
    s = b.exec(ops.add(), x, c, name="sum")
    graph = b.build([b.exec(ops.ewlog(), s, name="log")])
    with pytest.raises(NumericsError, match=r"node 2 \(log, ewlog\)"):
        _run(mode, graph, -np.linspace(1, 2, 20).astype(np.float32))


@pytest.mark.parametrize("mode", MODES)
def test_a_traced_minus_inf_mask_is_not_reported(mode):
    x = np.array([[0.5, 1.0, -2.0, 4.0], [-1.0, 3.0, 2.0, -0.5]], np.float32)

    def masked(x):
        return jax.nn.softmax(jnp.where(x > 0, x, -jnp.inf))

    assert_close(_run(mode, trace(masked, x), x), masked(x))
    wide = np.tile(x, (1, 8))  # a 32-wide mask row: a hoisted constant in compile
    assert_close(_run(mode, trace(masked, wide), wide), masked(wide))
    dirty = np.array([1.0, np.nan, -2.0], np.float32)  # the data cleaned at once: fine
    assert_close(_run(mode, trace(jnp.nan_to_num, dirty), dirty), np.nan_to_num(dirty))


def _masked_then(op):
    b = GraphBuilder()
    x = b.input((3,), name="x")
    mask = b.constant(np.array([0.0, -np.inf, 0.0], np.float32), name="mask")
    y = b.exec(ops.add(), x, mask, name="masked")
    return b.build([b.exec(op, y, y, name="bad") if op.name == "add" else b.exec(op, y)])


@pytest.mark.parametrize("mode", MODES)
def test_what_a_mask_allows_is_only_its_own_kind(mode):
    x = np.array([1.0, 2.0, 3.0], np.float32)
    assert_close(_run(mode, _masked_then(ops.relu()), x), np.array([1.0, 0.0, 3.0], np.float32))
    with pytest.raises(NumericsError, match=r"node 2 \(bad, add\[q=-1.0\]\)") as err:
        _run(mode, _masked_then(ops.add(q=-1.0)), x)  # -inf - -inf is a NaN: new
    assert "nan=1" in str(err.value)
    with pytest.raises(NumericsError, match=r"node 2 \(scalar_mul"):
        _run(mode, _masked_then(ops.scalar_mul(a=-1.0)), x)  # +inf: new


# Random chains: each node reads the previous value, and maybe the input or a constant.
SPECIALS = [0.0, 1.0, -1.0, 2.0, np.inf, -np.inf, np.nan]
UNARY = [ops.ewlog(), ops.ewsqrt(), ops.ewexp(), ops.relu(), ops.tanh()]
SCALES = [0.0, -1.0, 1e30]


@st.composite
def chains(draw):
    n = draw(st.sampled_from([3, 20]))  # 20: constants are hoisted by compile
    values = st.lists(st.sampled_from(SPECIALS), min_size=n, max_size=n)
    data = np.array(draw(values), np.float32)
    b = GraphBuilder()
    x = b.input((n,), name="x")
    last = x
    for k in range(draw(st.integers(1, 5))):
        kind = draw(st.sampled_from(["unary", "scale", "const", "input", "div"]))
        if kind == "unary":
            last = b.exec(draw(st.sampled_from(UNARY)), last)
        elif kind == "scale":
            last = b.exec(ops.scalar_mul(a=draw(st.sampled_from(SCALES))), last)
        elif kind == "const":
            c = b.constant(np.array(draw(values), np.float32), name=f"c{k}")
            last = b.exec(ops.add(), last, c)
        elif kind == "input":
            last = b.exec(ops.mul(), last, x)
        else:
            last = b.exec(ops.ewdiv(), x, last)
    return b.build([last]), data


def _kinds(value):
    v = np.asarray(value, np.float64)
    return {
        k
        for k, hit in (("nan", np.isnan(v)), ("+inf", v == np.inf), ("-inf", v == -np.inf))
        if hit.any()
    }


def _expected_blame(graph, data):
    """The rule restated over the values ``interpret`` computes (check off)."""
    allowed, blamed = {}, []

    def hook(index, node, inputs, outputs):
        kinds = set().union(*map(_kinds, outputs))
        ok = (
            kinds if not node.inputs else set().union(*(allowed.get(s, set()) for s in node.inputs))
        )
        allowed.update({s: ok for s in node.outputs})
        if kinds - ok:
            blamed.append(index)

    interpret(graph, data, on_node=hook)
    return blamed[0] if blamed else None


def _blamed(mode, graph, data):
    try:
        _run(mode, graph, data)
    except NumericsError as e:
        return int(str(e).split("node ", 1)[1].split(" ", 1)[0])
    return None


@settings(max_examples=40, deadline=None)
@given(chains())
def test_compile_and_interpret_blame_the_node_the_rule_names(case):
    graph, data = case
    with np.errstate(all="ignore"):
        want = _expected_blame(graph, data)
        assert _blamed("interpret", graph, data) == want
        assert _blamed("compile", graph, data) == want
