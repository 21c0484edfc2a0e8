"""Audit 8 (tuning): the memory plan against a hand count and XLA's memory analysis."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fnnc import config, ops
from fnnc.errors import BackendError, ConfigError
from fnnc.graph import GraphBuilder, autotune_graph, compile, cpu_libraries, memory_plan

N = 256
BYTES = N * 4  # one float32[N]


def test_a_donated_input_that_is_also_returned_keeps_its_buffer():
    """y = relu(x) returned with x itself, x donated: y was planned into x's buffer
    (peak one buffer), yet x must hold its values to the end. Hand count: x and y,
    two buffers; XLA's estimate holds at least as much (it copies x to alias y)."""
    b = GraphBuilder()
    x = b.input((N,), name="x")
    graph = b.build([b.exec(ops.relu(), x, name="y"), x])
    plan = memory_plan(graph, donate=["x"])
    assert plan.donated == ()
    assert plan.peak_bytes == 2 * BYTES == memory_plan(graph).peak_bytes
    program = compile(graph, donate=["x"])
    assert program.memory().peak_estimate_bytes >= plan.peak_bytes
    value = np.linspace(-1, 1, N, dtype=np.float32)
    y, same = program(value.copy())
    np.testing.assert_array_equal(np.asarray(y), np.maximum(value, 0))
    np.testing.assert_array_equal(np.asarray(same), value)


def test_a_donated_input_returned_through_a_view_keeps_its_buffer():
    """Half of x returned as a view: x's buffer still holds it at the end, so y (of
    x's shape, paired with it) gets its own. Hand count: x and y."""
    b = GraphBuilder()
    x = b.input((N,), name="x")
    half = b.alias(x, (N // 2,))
    graph = b.build([b.exec(ops.relu(), x, name="y"), half])
    plan = memory_plan(graph, donate=[0])
    assert plan.donated == () and plan.peak_bytes == 2 * BYTES
    value = np.linspace(-1, 1, N, dtype=np.float32)
    y, kept = compile(graph, donate=[0])(value.copy())
    np.testing.assert_array_equal(np.asarray(y), np.maximum(value, 0))
    np.testing.assert_array_equal(np.asarray(kept), value[: N // 2])


@pytest.mark.parametrize("platform", ["cpu", "gpu"])
def test_a_misspelt_cpu_library_set_names_the_variable_on_every_platform(platform):
    """FNNC_CPU_LIBRARIES=Eigen said "config: cpu_libraries='Eigen' is unknown" (no
    variable, no close match) on CPU, and was silently ignored off CPU."""
    b = GraphBuilder()
    graph = b.build([b.exec(ops.relu(), b.input((2,)))])
    with config.override(cpu_libraries="Eigen"), pytest.raises(BackendError) as e:
        compile(graph, platform=platform)
    message = str(e.value)
    assert "FNNC_CPU_LIBRARIES" in message and "Did you mean 'eigen'" in message
    assert all(name in message for name in cpu_libraries.LIBRARY_SETS)
    with config.override(cpu_libraries="eigen"):  # a known set: off CPU, XLA's defaults
        assert compile(graph, platform="gpu").cpu_libraries == "xla"


def _abs_slowly(x):
    return jnp.sqrt(x * x)


def test_autotune_under_a_forced_backend_records_the_measured_winner(monkeypatch):
    """With backend 'slow' forced, the default choice checked against the per-node
    winner was the forced one, so the "tuned" and "default" programs were one program
    (both forced) and the tie wrote 'slow', measured slower, into the table."""
    from fnnc.ops import autotune as table_module

    here = jax.default_backend()
    ops.register_backend("ewabs", ops.Backend("slow", _abs_slowly, (here,), priority=0))
    times = {"slow": 2.0, "xla": 1.0}  # per node: the reference is faster

    def timed(fns, *args, repeats=5):
        return {name: times.get(name, 1.0) for name in fns}  # one program: a tie

    monkeypatch.setattr(table_module, "median_seconds", timed)
    try:
        b = GraphBuilder()
        graph = b.build([b.exec(ops.ewabs(), b.input((N,), name="x"), name="abs")])
        value = np.linspace(-1, 1, N, dtype=np.float32)
        with config.override(backend="slow"):
            tuned = autotune_graph(graph, value, repeats=1)
            assert compile(graph).backends == ((0, "abs", "slow"),)  # forcing still holds
            if len(cpu_libraries.available(here)) > 1:  # the set: for the forced program
                assert cpu_libraries.program_key(graph, here) in ops.autotune.TABLE
        assert tuned == {0: "xla"}
        assert compile(graph).backends == ((0, "abs", "xla"),)
    finally:
        ops.unregister_backend("ewabs", "slow")
        ops.autotune.TABLE.clear()


def test_an_unknown_matmul_precision_names_compile():
    b = GraphBuilder()
    graph = b.build([b.exec(ops.relu(), b.input((2,)))])
    with pytest.raises(ConfigError, match=r"^compile: matmul_precision: unknown .*'tf32'"):
        compile(graph, matmul_precision="tf32")
    assert compile(graph, matmul_precision="HIGH").matmul_precision == "tensorfloat32"


@pytest.mark.parametrize("given", ["graph", "jit", None])
def test_profile_of_something_not_compiled_says_what_to_pass(given):
    """profile(graph, ...) (the graph, not its program) raised a bare AttributeError:
    'Graph' object has no attribute 'donate'."""
    from fnnc.errors import GraphError
    from fnnc.graph import profile

    b = GraphBuilder()
    graph = b.build([b.exec(ops.relu(), b.input((4,), name="x"))])
    program = {"graph": graph, "jit": jax.jit(jnp.abs), None: None}[given]
    want = "compile it first" if given == "graph" else "jax.profiler"
    with pytest.raises(GraphError, match=rf"profile: expected a compiled Program.*{want}"):
        profile(program, np.ones(4, np.float32), runs=1)
