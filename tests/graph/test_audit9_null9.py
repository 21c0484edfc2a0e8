"""``compile(graph, matmul_precision=P)`` looks up the autotune table under ``P``: its
keys end in the matmul precision a winner was timed under, and the program runs at
``P``, but ``Program`` chose its backends (and its CPU library set) under the config's
precision. Oracle: which backend / library set the program reports, with a second
backend of ``ewabs`` that is chosen only through the table (priority 0)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fnnc import config, ops
from fnnc.graph import GraphBuilder, compile
from fnnc.graph import cpu_libraries as libs
from fnnc.ops import Backend

HERE = jax.default_backend()
SPEC = jax.ShapeDtypeStruct((2, 3), np.float32)


def _abs_via_sqrt(x):
    return jnp.sqrt(x * x)


@pytest.fixture(scope="module")
def graph():
    b = GraphBuilder()
    x = b.input((2, 3), name="x")
    return b.build([b.exec(ops.ewabs(), x)])


@pytest.fixture
def tuned_backend():
    """``tuned(precision)`` records the second backend as the winner timed under
    ``precision`` (the key autotune writes: the config's precision while it times)."""
    ops.register_backend("ewabs", Backend("sqrt9", _abs_via_sqrt, platforms=(HERE,), priority=0))

    def tuned(precision: str) -> None:
        with config.override(matmul_precision=precision):
            ops.autotune.TABLE[ops.autotune.key(ops.ewabs(), [SPEC], HERE)] = "sqrt9"

    yield tuned
    ops.unregister_backend("ewabs", "sqrt9")
    ops.autotune.TABLE.clear()


@pytest.mark.parametrize(("tuned_at", "other"), [("highest", "default"), ("default", "highest")])
def test_compile_looks_up_winners_under_its_own_matmul_precision(
    graph, tuned_backend, tuned_at, other
) -> None:
    tuned_backend(tuned_at)
    with config.override(matmul_precision=other):
        assert compile(graph, matmul_precision=tuned_at).backends[0][2] == "sqrt9"
        assert compile(graph).backends[0][2] == "xla"  # the config's precision: untuned
        assert ops.select_backend(ops.ewabs(), [SPEC], HERE, precision=tuned_at) == "sqrt9"
        assert ops.select_backend(ops.ewabs(), [SPEC], HERE) == "xla"
    with config.override(matmul_precision=tuned_at):
        assert compile(graph, matmul_precision=other).backends[0][2] == "xla"
    assert config.get().matmul_precision == "float32"  # compile left the config alone


@pytest.mark.skipif(HERE != "cpu", reason="CPU library sets apply on CPU only")
def test_compile_looks_up_its_cpu_library_set_under_its_own_matmul_precision(graph) -> None:
    try:
        with config.override(matmul_precision="bfloat16"):
            ops.autotune.TABLE[libs.program_key(graph, "cpu")] = "eigen"
        assert compile(graph, platform="cpu", matmul_precision="bfloat16").cpu_libraries == "eigen"
        assert compile(graph, platform="cpu").cpu_libraries == "xla"
    finally:
        ops.autotune.TABLE.clear()
