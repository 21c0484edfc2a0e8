"""The float32 matmul policy: every dot and convolution fnnc traces carries the precision
in force (fnnc.config.matmul_precision, float32 by default), whatever JAX's ambient
setting says, in compiled programs, eager calls, interpret, generic nodes, gradients
and cnnp training steps; and results meet the tolerance of the precision really used."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import jax
import numpy as np
import optax
import pytest
from jax import lax

from fnnc import config, ops
from fnnc.core.dispatch import compiled_forward
from fnnc.errors import ConfigError
from fnnc.graph import GraphBuilder, backward, compile, trace
from fnnc.models import Conv, Dense, Flatten, Sequential
from fnnc.ops.primitive import primitive_command
from tests.helpers import matmul_rtol, rand

PRECISION = r"precision = \[(\w+),|precision_config = \[#stablehlo<precision (\w+)>"
STABLEHLO = {"float32": "HIGHEST", "tensorfloat32": "HIGH", "bfloat16": "DEFAULT"}


def _precisions(text: str) -> list[str | None]:
    """The precision of every dot_general and convolution in StableHLO ``text``."""
    found = []
    for line in text.splitlines():
        if "stablehlo.dot_general" in line or "stablehlo.convolution" in line:
            m = re.search(
                r"precision = \[(\w+),|precision_config = \[#stablehlo<precision (\w+)>", line
            )
            found.append((m.group(1) or m.group(2)) if m else None)
    return found


def _graph():
    """gemm + convolution + a generic dot_general node (a batched contraction)."""
    b = GraphBuilder()
    x = b.input((2, 4, 4, 3), name="x")
    w = b.input((5, 3, 3, 3), name="w")
    w2 = b.input((7, 80), name="w2")
    v = b.input((2, 6, 16), name="v")
    u = b.input((2, 16, 6), name="u")
    h = b.exec(ops.convolution(padding="SAME"), x, w)
    d = b.exec(ops.gemm(transpose_b=True), b.exec(ops.reshape(shape=(2, 80)), h), w2)
    dims = (((2,), (1,)), ((0,), (0,)))
    spec = (
        jax.ShapeDtypeStruct((2, 6, 16), np.float32),
        jax.ShapeDtypeStruct((2, 16, 6), np.float32),
    )
    eqn = jax.make_jaxpr(lambda p, q: lax.dot_general(p, q, dims))(*spec).eqns[0]
    params = {**eqn.params, "precision": None}  # as traced where JAX's default is unset
    generic = primitive_command(lax.dot_general_p, params, [((2, 6, 6), np.float32)])
    g = b.exec(generic, v, u)
    return b.build([d, g])


@pytest.fixture(scope="module")
def graph():
    return _graph()


def _args():
    shapes = [(2, 4, 4, 3), (5, 3, 3, 3), (7, 80), (2, 6, 16), (2, 16, 6)]
    return [rand(s, seed=i) for i, s in enumerate(shapes)]


def test_default_is_float32_and_compiled_programs_carry_it_under_any_ambient_setting(graph):
    assert config.get().matmul_precision == "float32"
    with jax.default_matmul_precision("bfloat16"):  # JAX's fastest: fnnc's policy wins
        program = compile(graph)
    assert program.matmul_precision == "float32"
    found = _precisions(program.lowered_text())
    assert len(found) == 3 and set(found) == {"HIGHEST"}, found


@pytest.mark.parametrize("precision", ["tensorfloat32", "bfloat16"])
def test_compile_takes_a_precision_and_results_meet_its_tolerance(graph, precision):
    program = compile(graph, matmul_precision=precision)
    assert program.matmul_precision == precision
    assert set(_precisions(program.lowered_text())) == {STABLEHLO[precision]}
    *_, v, u = args = _args()
    got = program(*args)
    want = np.einsum("bij,bjk->bik", v.astype(np.float64), u.astype(np.float64))
    rtol = matmul_rtol(program.matmul_precision, program.platform)
    np.testing.assert_allclose(np.asarray(got[1]), want, rtol=rtol, atol=rtol)


def test_config_override_reaches_eager_calls_interpret_and_gradients(graph):
    a, w = rand([3, 8]), rand([4, 8], seed=1)
    gemm = ops.gemm(transpose_b=True)
    with jax.default_matmul_precision("bfloat16"):
        assert _precisions(compiled_forward(gemm).lower(a, w).as_text()) == ["HIGHEST"]
        with config.override(matmul_precision="tensorfloat32"):
            assert _precisions(compiled_forward(gemm).lower(a, w).as_text()) == ["HIGH"]
            eager = gemm(a, w)
            b = GraphBuilder()
            xa, xw = b.input((3, 8), name="a"), b.input((4, 8), name="w")
            loss = b.exec(ops.reduce_sum(axes=(0, 1)), b.exec(gemm, xa, xw))
            g, _ = backward(b.build([loss]), loss, [xa, xw])
            train = compile(g)  # the loss, then the gradients of a and w
            assert train.matmul_precision == "tensorfloat32"
            assert set(_precisions(train.lowered_text())) == {"HIGH"}
    np.testing.assert_allclose(np.asarray(eager), a @ w.T, rtol=1e-5, atol=1e-6)


def test_cnnp_training_step_dots_and_convolutions_run_at_the_policy():
    model = Sequential([Conv(4, 3, name="c"), Flatten(), Dense(3, name="d")])
    x, y = rand([4, 6, 6, 2]), np.arange(4, dtype=np.int32) % 3
    with jax.default_matmul_precision("bfloat16"):
        model.compile(x, loss="softmax_crossentropy", minimizer=optax.sgd(0.1))
        model.fit(x, y)
    fits = [p for k, p in model.engine._programs.items() if k[0] == "fit"]
    assert fits
    program = getattr(fits[0].program, "program", fits[0].program)
    found = _precisions(program.lowered_text())
    # forward conv + dense, and their data and weight gradients
    assert len(found) >= 5 and set(found) == {"HIGHEST"}, found


def test_unknown_precisions_are_clear_errors(graph):
    with (
        pytest.raises(ConfigError, match=r"unknown matmul precision 'tf32'.*tensorfloat32"),
        config.override(matmul_precision="tf32"),
    ):
        pass
    with pytest.raises(ConfigError, match=r"matmul_precision: unknown matmul precision 'fp32'"):
        compile(graph, matmul_precision="fp32")
    env = {**os.environ, "FNNC_MATMUL_PRECISION": "fast", "JAX_PLATFORMS": "cpu"}
    run = subprocess.run(
        [sys.executable, "-c", "import fnnc.config"], env=env, capture_output=True, text=True
    )
    assert run.returncode != 0
    assert "FNNC_MATMUL_PRECISION: unknown matmul precision 'fast'" in run.stderr
    with config.override(matmul_precision="highest"):  # JAX's names are accepted
        assert config.get().matmul_precision == "float32"


def test_trace_maps_default_precision_dots_and_keeps_explicit_ones():
    a, w = rand([3, 8]), rand([8, 4], seed=1)
    plain = trace(lambda p, q: p @ q, a, w)  # the ambient default: fnnc's policy decides
    assert [n.cmd.name for n in plain.nodes] == ["gemm"]
    assert _precisions(compile(plain, matmul_precision="tensorfloat32").lowered_text()) == ["HIGH"]
    own = trace(lambda p, q: jax.numpy.dot(p, q, precision="bfloat16"), a, w)
    assert [n.cmd.name for n in own.nodes] == ["primitive"]  # the user's choice is kept
    assert _precisions(compile(own).lowered_text()) == ["DEFAULT"]
    np.testing.assert_allclose(np.asarray(compile(own)(a, w)), a @ w, rtol=1e-5, atol=1e-6)
