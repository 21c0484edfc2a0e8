"""XLA:CPU library sets per program: same values under every set, forcing, keys, autotune.

The oracle for values is the reference interpreter; which library XLA used is read
from the compiled HLO (YNNPACK fusions are named ``ynn_fusion``).
"""

from __future__ import annotations

import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from fnnc import config, ops
from fnnc.errors import BackendError, ConfigError
from fnnc.graph import GraphBuilder, autotune, autotune_graph, compile, cpu_libraries, interpret
from fnnc.ops import autotune as op_autotune
from tests.helpers import assert_close, rand

pytestmark = pytest.mark.skipif(jax.default_backend() != "cpu", reason="XLA:CPU options")


def _graph(n=2, channels=32):
    """conv (32 -> 32 channels: YNNPACK takes it by default) -> relu -> channel sums."""
    b = GraphBuilder()
    x = b.input((n, 8, 8, channels), name="x")
    w = b.input((channels, 3, 3, channels), name="w")
    h = b.exec(ops.relu(), b.exec(ops.convolution(padding="SAME"), x, w, name="conv"))
    return b.build([b.exec(ops.reduce_sum(axes=(0, 1, 2)), h)])


ARGS = (rand((2, 8, 8, 32)), rand((32, 3, 3, 32), seed=1))


def test_every_library_set_computes_the_interpreters_values():
    graph = _graph()
    want = interpret(graph, *ARGS)
    assert cpu_libraries.available("cpu")[0] == "xla"
    assert len(cpu_libraries.available("cpu")) > 1  # this jaxlib takes the options
    for name in cpu_libraries.available("cpu"):
        with config.override(cpu_libraries=name):
            program = compile(graph, platform="cpu")
        assert program.cpu_libraries == name
        assert_close(program(*ARGS), want, 1e-4, 1e-4, what=name)


def test_a_forced_set_changes_the_compiled_program():
    graph = _graph()
    assert compile(graph).cpu_libraries == "xla"
    # A conv with 32 channels goes to YNNPACK under XLA's defaults, never under "eigen".
    assert "ynn_fusion" in compile(graph).compiled_text()
    with config.override(cpu_libraries="eigen"):
        eigen = compile(graph)
    assert "ynn_fusion" not in eigen.compiled_text()
    assert compile(graph) is not eigen  # leaving the override restores the cached program


def test_an_unknown_set_is_a_clear_error():
    with config.override(cpu_libraries="mkl"), pytest.raises(BackendError) as e:
        compile(_graph(channels=4))
    assert "cpu_libraries='mkl'" in str(e.value) and "eigen" in str(e.value)
    # an unknown configuration value, as the errors guide says of every setting
    assert isinstance(e.value, ConfigError)


def test_off_cpu_only_xla_defaults():
    assert cpu_libraries.available("gpu") == ("xla",)
    with config.override(cpu_libraries="eigen"):
        assert cpu_libraries.chosen(_graph(), "gpu") == "xla"


def test_program_key_names_the_graph_not_the_process():
    key = cpu_libraries.program_key(_graph(), "cpu")
    assert key == cpu_libraries.program_key(_graph(), "cpu")
    assert key != cpu_libraries.program_key(_graph(n=3), "cpu")
    assert key != cpu_libraries.program_key(_graph(), "gpu")
    code = (
        "from tests.graph.test_cpu_libraries import _graph;"
        "from fnnc.graph import cpu_libraries;"
        "print(cpu_libraries.program_key(_graph(), 'cpu'))"
    )
    env = {**os.environ, "PYTHONHASHSEED": "123", "JAX_PLATFORMS": "cpu"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.stdout.strip() == key, out.stderr[-2000:]


def _dense_graph():
    b = GraphBuilder()
    x, w = b.input((16, 32), name="x"), b.input((32, 32), name="w")
    return b.build([b.exec(ops.relu(), b.exec(ops.gemm(), x, w))])


ARGS_SMALL = (rand((16, 32), seed=2), rand((32, 32), seed=3))


def test_autotune_graph_records_the_fastest_set(clean_table, monkeypatch):
    graph = _dense_graph()  # no node with a choice: only the library set is tuned

    def rigged(fns, *args, repeats=5):
        for fn in fns.values():
            np.asarray(fn(*args)[0])  # each one compiled and runs
        return {name: (0.5 if name == "ynn-dot" else 1.0) for name in fns}

    monkeypatch.setattr(op_autotune, "median_seconds", rigged)
    assert autotune_graph(graph, *ARGS_SMALL) == {}
    key = cpu_libraries.program_key(graph, "cpu")
    assert dict(clean_table) == {key: "ynn-dot"}
    program = compile(graph)
    assert program.cpu_libraries == "ynn-dot"
    assert_close(program(*ARGS_SMALL), interpret(graph, *ARGS_SMALL), 1e-4, 1e-4)

    def no_timing(*args, **kwargs):
        raise AssertionError("timed a graph whose library set the table holds")

    monkeypatch.setattr(op_autotune, "median_seconds", no_timing)
    autotune_graph(graph, *ARGS_SMALL)  # measured once
    clean_table.clear()
    autotune_graph(graph, *ARGS_SMALL, libraries=False)
    assert dict(clean_table) == {}


def test_a_saved_table_carries_the_set(clean_table, tmp_path):
    graph = _dense_graph()
    clean_table[cpu_libraries.program_key(graph, "cpu")] = "eigen"
    op_autotune.save(tmp_path / "table.json")
    clean_table.clear()
    assert compile(graph).cpu_libraries == "xla"
    op_autotune.load(tmp_path / "table.json")
    assert compile(graph).cpu_libraries == "eigen"


def _norm_graph(is_test):
    b = GraphBuilder()
    x = b.input((8, 4, 4, 3), name="x")
    stats = [b.input((3,), name=n) for n in ("scale", "bias", "mean", "var")]
    out = b.exec(ops.batch_norm(is_test=is_test), x, *stats)
    return b.build([out[0]])


def test_training_batch_norm_programs_default_to_ynn_gemm(clean_table):
    args = (rand((8, 4, 4, 3)), rand((3,), seed=1), rand((3,), seed=2), rand((3,), seed=3),
            abs(rand((3,), seed=4)) + 1)  # fmt: skip
    training = compile(_norm_graph(is_test=False))
    assert training.cpu_libraries == cpu_libraries.REDUCTION_HEAVY == "ynn-gemm"
    assert compile(_norm_graph(is_test=True)).cpu_libraries == "xla"
    graph = _norm_graph(is_test=False)
    assert_close(training(*args), interpret(graph, *args), 1e-5, 1e-5)
    clean_table[cpu_libraries.program_key(graph, "cpu")] = "xla"  # a tuned choice wins
    assert compile(graph).cpu_libraries == "xla"


@pytest.mark.parametrize("alternative", [0.99, 0.9])
def test_a_set_must_beat_the_default_by_the_margin(clean_table, monkeypatch, alternative):
    graph = _dense_graph()

    def rigged(fns, *args, repeats=5):
        return {name: (alternative if name == "eigen" else 1.0) for name in fns}

    monkeypatch.setattr(op_autotune, "median_seconds", rigged)
    autotune_graph(graph, *ARGS_SMALL)
    won = "eigen" if alternative < autotune.MARGIN else "xla"
    assert clean_table[cpu_libraries.program_key(graph, "cpu")] == won
