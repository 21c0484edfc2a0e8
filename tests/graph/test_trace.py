"""trace: JAX functions and Flax modules become graphs that compute the same values."""

from __future__ import annotations

import collections

import flax.linen as nn
import jax
import jax.extend as jex
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax import lax

from fnnc.errors import TraceError
from fnnc.graph import compile, interpret, trace
from fnnc.graph.trace_rules import TRACE_RULES
from tests.helpers import assert_close, rand


def check(f, *args, rtol=1e-5, atol=1e-5):
    """Traces ``f``; interpret and compile must both reproduce ``f(*args)``."""
    graph = trace(f, *args)
    want = f(*args)
    assert_close(interpret(graph, *args), want, rtol, atol, what="interpret")
    assert_close(compile(graph)(*args), want, rtol, atol, what="compile")
    return graph


def commands(graph) -> collections.Counter:
    return collections.Counter(node.cmd.name for node in graph.nodes)


def generic_prims(graph) -> list[str]:
    """Primitive names carried by generic nodes."""
    return [
        str(n.cmd.param("prim"))
        for n in graph.nodes
        if n.cmd.name in ("primitive", "effectful_primitive")
    ]


# -- Flax models ---------------------------------------------------------------------------


class MLP(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.fc1 = nnx.Linear(6, 8, rngs=rngs)
        self.fc2 = nnx.Linear(8, 3, rngs=rngs)

    def __call__(self, x):
        return self.fc2(nnx.relu(self.fc1(x)))


def test_nnx_mlp_maps_to_gemm_and_relu() -> None:
    model = MLP(nnx.Rngs(0))
    graph = check(model, rand((4, 6)))
    names = commands(graph)
    assert names["gemm"] == 2 and names["relu"] == 1, names
    assert not generic_prims(graph)
    assert [graph.symbol(i).name for i in graph.inputs] == ["x"]


class CNN(nnx.Module):
    def __init__(self, rngs: nnx.Rngs, use_running_average: bool):
        self.conv1 = nnx.Conv(3, 4, (3, 3), rngs=rngs)
        self.bn = nnx.BatchNorm(4, use_running_average=use_running_average, rngs=rngs)
        self.conv2 = nnx.Conv(
            4, 6, (3, 3), strides=2, padding="VALID", feature_group_count=2, rngs=rngs
        )
        self.head = nnx.Linear(6, 2, rngs=rngs)

    def __call__(self, x):
        x = nnx.relu(self.bn(self.conv1(x)))
        x = nnx.max_pool(x, (2, 2), strides=(2, 2))
        x = nnx.avg_pool(self.conv2(x), (2, 2), strides=(1, 1), padding="SAME")
        return self.head(x.mean(axis=(1, 2)))


@pytest.mark.parametrize("use_running_average", [True, False])
def test_nnx_cnn_maps_to_convolution(use_running_average: bool) -> None:
    model = CNN(nnx.Rngs(0), use_running_average)
    if use_running_average:  # non-trivial statistics
        model.bn.mean.set_value(jnp.full((4,), 0.1))
        model.bn.var.set_value(jnp.full((4,), 2.0))
    x = rand((2, 10, 10, 3))
    graph = trace(model, x)
    want = model(x)
    assert_close(interpret(graph, x), want, what="interpret")
    assert_close(compile(graph)(x), want, what="compile")
    names = commands(graph)
    assert names["convolution"] == 2 and names["max_pool"] == 1 and names["relu"] == 1, names


class Block(nn.Module):
    @nn.compact
    def __call__(self, x):
        h = nn.LayerNorm()(x)
        x = x + nn.MultiHeadDotProductAttention(num_heads=2)(h, h)
        h = nn.LayerNorm()(x)
        return x + nn.Dense(8)(nn.gelu(nn.Dense(16)(h)))


@pytest.fixture(scope="module")
def block():
    x = rand((2, 5, 8), seed=1)
    module = Block()
    return module, module.init(jax.random.key(0), x), x


def test_linen_transformer_block(block) -> None:
    module, params, x = block
    graph = check(lambda p, x: module.apply(p, x), params, x)
    assert commands(graph)["gemm"] == 8


def test_parameters_passed_as_arguments_become_inputs(block) -> None:
    module, params, x = block
    graph = trace(lambda p, x: module.apply(p, x), params, x)
    names = [graph.symbol(i).name for i in graph.inputs]
    assert len(names) == len(jax.tree.leaves(params)) + 1
    assert "p.params.Dense_0.kernel" in names and names[-1] == "x"
    assert not any(n.cmd.name == "constant" and n.cmd.param("value").size > 1 for n in graph.nodes)


def test_closed_over_arrays_become_constants() -> None:
    w = rand((3, 4), seed=2)
    graph = check(lambda x: x @ w, rand((2, 3)))
    assert [graph.symbol(i).name for i in graph.inputs] == ["x"]
    (const,) = [n for n in graph.nodes if n.cmd.name == "constant"]
    np.testing.assert_array_equal(const.cmd.param("value").numpy(), w)


def test_equal_literals_share_one_constant() -> None:
    graph = check(lambda x, y: x * 2.0 + y * 2.0, rand((3,)), rand((3,), seed=1))
    assert commands(graph)["constant"] == 1


# -- control flow, indexing, jax.nn ---------------------------------------------------------


def test_cond_is_one_generic_node() -> None:
    def f(x, y):
        return lax.cond(x.sum() > 0, lambda a, b: a * b, lambda a, b: a - b, x, y)

    for seed in (0, 3):
        graph = check(f, rand((3, 4), seed=seed), rand((3, 4), seed=seed + 1))
    assert generic_prims(graph).count("cond") == 1


def test_scan_is_one_generic_node() -> None:
    def f(xs):
        return lax.scan(lambda c, r: (c * 0.5 + r, jnp.tanh(c)), jnp.zeros(xs.shape[1:]), xs)

    graph = check(f, rand((5, 3)))
    assert generic_prims(graph) == ["scan"]


def test_while_loop_is_one_generic_node() -> None:
    def f(x):
        return lax.while_loop(lambda s: s[0] < 4, lambda s: (s[0] + 1, s[1] * 1.5), (0, x))

    graph = check(f, rand((2, 3)))
    assert generic_prims(graph) == ["while"]


def test_softmax() -> None:
    graph = check(lambda x: jax.nn.softmax(x, axis=-1), rand((3, 5)))
    assert {"reduce_max", "ewexp", "ewdiv", "reduce_sum"} <= set(commands(graph))


def test_where() -> None:
    graph = check(lambda x, y: jnp.where(x > 0, x, y * 2), rand((3, 4)), rand((3, 4), seed=1))
    assert commands(graph)["select"] == 1


def test_integer_indexing() -> None:
    x = rand((4, 5))
    for i in (1, -1):
        check(lambda x, i: (x[i], x[:, 1:3], x[i, ::2]), x, np.int32(i))


def test_random_values_inside_the_function() -> None:
    def f(x):
        k1, k2 = jax.random.split(jax.random.key(0))
        return x + jax.random.normal(k1, x.shape) * jax.random.uniform(k2, ())

    graph = check(f, rand((3, 4)))
    # the key equations fold into one call node: closed_call before jax 0.11, whose
    # closed_call_p is an alias of eval_jaxpr_p
    assert jex.core.primitives.closed_call_p.name in generic_prims(graph)


def test_pytree_output_round_trips_structure() -> None:
    def f(x, y):
        return {"sum": x + y, "parts": (x, [y * 2, jnp.float32(1.0)]), "none": None}

    x, y = rand((2,)), rand((2,), seed=1)
    graph = check(f, x, y)
    assert jax.tree.structure(interpret(graph, x, y)) == jax.tree.structure(f(x, y))
    assert jax.tree.structure(compile(graph)(x, y)) == jax.tree.structure(f(x, y))


def test_trace_error_names_the_bad_argument() -> None:
    with pytest.raises(TraceError, match=r"argument opts\.mode is a str"):
        trace(lambda x, opts: x, rand((2,)), {"mode": "train"})


def test_key_array_argument_is_an_input_of_its_key_data() -> None:
    graph = trace(lambda x, key: x, rand((2,)), jax.random.key(0))  # see test_trace_rngs
    key = graph.symbol(graph.inputs[1])
    assert (key.name, key.shape, np.dtype(key.dtype)) == ("key", (2,), np.dtype(np.uint32))


# -- every rule fires ------------------------------------------------------------------------

X = rand((3, 4), seed=4)
Y = rand((3, 4), seed=5)
POS = rand((3, 4), seed=6, lo=0.5, hi=2.0)
IMG = rand((2, 6, 6, 3), seed=7)
NCHW = rand((2, 4, 7, 7), seed=8)
OIHW = rand((6, 2, 3, 3), seed=9)
Q = rand((2, 5, 2, 4), seed=10)

RULE_CASES = {
    "add": (lambda x, y: x + y, X, Y),
    "sub": (lambda x, y: x - y, X, Y),
    "mul": (lambda x, y: x * y, X, Y),
    "div": (lambda x, y: x / y, X, POS),
    "max": (jnp.maximum, X, Y),
    "min": (jnp.minimum, X, Y),
    "neg": (lambda x: -x, X),
    "exp": (jnp.exp, X),
    "log": (jnp.log, POS),
    "sqrt": (jnp.sqrt, POS),
    "rsqrt": (jax.lax.rsqrt, POS),
    "expm1": (jnp.expm1, X),
    "log1p": (jnp.log1p, POS),
    "abs": (jnp.abs, X),
    "erf": (jax.lax.erf, X),
    "erfc": (jax.lax.erfc, X),
    "is_finite": (lambda x: jnp.where(jnp.isfinite(jnp.log(x)), x, 0.0), X),
    "stop_gradient": (lambda x: x * lax.stop_gradient(x), X),
    "square": (jnp.square, X),
    "integer_pow": (lambda x: x**2 + x**3 * 0.5 - x**6, X),
    "select_n": (lambda x, y: jnp.where(x > y, x, y + 1), X, Y),
    "lt": (lambda x, y: jnp.where(x < y, x, y), X, Y),
    "le": (lambda x, y: jnp.where(x <= y, x, y), X, Y),
    "gt": (lambda x, y: jnp.where(x > y, x, y), X, Y),
    "ge": (lambda x, y: jnp.where(x >= y, x, y), X, Y),
    "eq": (lambda x, y: jnp.where(x == jnp.round(x), x, y), X, Y),
    "ne": (lambda x, y: jnp.where(x != y, x, y), X, Y),
    "tanh": (jnp.tanh, X),
    "logistic": (jax.nn.sigmoid, X),
    "custom_jvp_call": (jax.nn.relu, X),
    "dot_general": (lambda q, k: jnp.einsum("bqhd,bkhd->bhqk", q, k), Q, Q * 2),
    "conv_general_dilated": (
        lambda x, w: lax.conv_general_dilated(
            x,
            w,
            (2, 1),
            ((1, 0), (2, 2)),
            rhs_dilation=(1, 2),
            feature_group_count=2,
            dimension_numbers=("NCHW", "OIHW", "NCHW"),
        ),
        NCHW,
        OIHW,
    ),
    "reduce_window_sum": (lambda x: nnx.avg_pool(x, (2, 3), strides=(2, 1), padding="SAME"), IMG),
    "reduce_window_max": (lambda x: nnx.max_pool(x, (3, 2), strides=(2, 1), padding="SAME"), IMG),
    "reduce_sum": (lambda x: jnp.sum(x, axis=1), X),
    "reduce_max": (lambda x: jnp.max(x, axis=0), X),
    "reduce_min": (lambda x: jnp.min(x, axis=(0, 1)), X),
    "argmax": (lambda x: jnp.argmax(x, axis=1), X),
    "argmin": (lambda x: jnp.argmin(x, axis=0), X),
    "reshape": (lambda x: x.reshape(2, 6), X),
    "squeeze": (lambda x: jnp.squeeze(x[:, :1], 1), X),
    "transpose": (lambda x: x.T, X),
    "broadcast_in_dim": (lambda x: jnp.broadcast_to(x[0], (2, 3, 4)), X),
    "convert_element_type": (lambda x: (x * 3).astype(jnp.int32), X),
    "concatenate": (lambda x, y: jnp.concatenate([x, y], axis=1), X, Y),
    "slice": (lambda x: x[1:, ::2], X),
    "pad": (lambda x: jnp.pad(x, ((1, 2), (0, 1)), constant_values=3.0), X),
    "copy": (lambda x: jnp.copy(x) * 2.0, X),
    "gather": (lambda x, i: jnp.take(x, i, axis=0), X, np.array([[2, -1], [0, 7]], np.int32)),
    "iota": (lambda x: x + jnp.arange(4, dtype=x.dtype).reshape(1, 4), X),
    "jit": (jax.jit(lambda x: jnp.tanh(x) * 2), X),
    "ragged_dot_general": (
        lambda a, w: lax.ragged_dot(a, w, jnp.array([2, 0, 1], jnp.int32)),
        X,
        rand((3, 4, 2), seed=11),
    ),
    # fnnc.graph.trace_llm_rules
    "sin": (jnp.sin, X),
    "cos": (jnp.cos, X),
    "pow": (lambda x, y: x**y, POS, Y),
    "split": (lambda x: jnp.split(x, [1, 3], axis=1)[1] * 2, X),
    "sort": (lambda x: (jnp.sort(x, axis=0), jnp.argsort(x, axis=1)), X),
    "rev": (lambda x: lax.rev(x, (0, 1)) * 2.0, X),
    "stack": (lambda x: jnp.stack([x, x * 2.0], axis=1), X),
    "top_k": (lambda x: lax.top_k(x, 3), X),
    "scatter-add": (lambda x, y: jnp.asarray(x).at[jnp.array([2, 0, 2])].add(y * 2), X, Y),
}


def _primitive_names(jaxpr) -> set[str]:
    names = set()
    for eqn in jaxpr.eqns:
        names.add(eqn.primitive.name)
        for value in eqn.params.values():
            for sub in value if isinstance(value, tuple) else (value,):
                inner = getattr(sub, "jaxpr", None)
                if inner is not None:
                    names |= _primitive_names(getattr(inner, "jaxpr", inner))
    return names


def test_every_rule_has_a_case() -> None:
    assert sorted(TRACE_RULES) == sorted(RULE_CASES)


@pytest.mark.parametrize("name", sorted(RULE_CASES))
def test_rule_maps_and_preserves_values(name: str) -> None:
    f, *args = RULE_CASES[name]
    assert name in _primitive_names(jax.make_jaxpr(f)(*args).jaxpr)
    graph = check(f, *args)
    assert name not in generic_prims(graph), f"{name} was not mapped:\n{graph}"


@pytest.mark.parametrize("width", [1, ((1, 2), (0, 3))])
def test_jnp_pad_is_the_pad_command(width):
    """``jnp.pad`` (its fill a converted int literal) traces to one ``pad`` node, not a
    generic primitive, and computes what JAX computes."""
    f = lambda x: jnp.pad(x, width) * 2.0
    x = rand([2, 3])
    graph = trace(f, x)
    names = [n.cmd.name for n in graph.nodes]
    assert "pad" in names and "primitive" not in names, str(graph)
    assert_close(interpret(graph, x), f(x))
