"""Program: memory report, donation, lowered text, caching, hoisted constants, backends."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fnnc import config, ops
from fnnc.errors import BackendError, ConfigError, FnncError
from fnnc.graph import Graph, GraphBuilder, MemoryReport, Program, compile, interpret
from fnnc.graph.compile import HOIST_ELEMENTS
from tests.helpers import assert_close


def _mul_graph(rows: int = 8) -> Graph:
    b = GraphBuilder()
    x = b.input((rows, 4), name="x")
    w = b.input((4,), name="w")
    return b.build([b.exec(ops.mul(p=2.0), x, w, name="m")])


def _scale_graph(shape: tuple[int, ...] = (16, 16)) -> Graph:
    b = GraphBuilder()
    x = b.input(shape, name="x")
    return b.build([b.exec(ops.scalar_mul(a=3.0), x, name="scale")])


def test_memory_counts_arguments_and_outputs() -> None:
    program = compile(_mul_graph())
    mem = program.memory()
    assert isinstance(mem, MemoryReport)
    assert mem.argument_bytes == (8 * 4 + 4) * 4 > 0
    assert mem.output_bytes == 8 * 4 * 4 > 0
    assert mem.alias_bytes == 0 and mem.temp_bytes >= 0
    assert mem.peak_estimate_bytes == mem.argument_bytes + mem.output_bytes + mem.temp_bytes
    text = str(mem)
    for field in (
        "argument_bytes",
        "output_bytes",
        "temp_bytes",
        "alias_bytes",
        "peak_estimate_bytes",
    ):
        assert field in text
    assert f"{mem.argument_bytes:,d}" in text


def test_memory_of_several_outputs_covers_them_all() -> None:
    b = GraphBuilder()
    x = b.input((4, 4), name="x")
    y = b.input((3,), name="y")
    graph = b.build([b.exec(ops.scalar_mul(a=2.0), x), b.exec(ops.ewexp(), y)])
    mem = compile(graph).memory()
    assert mem.argument_bytes == (16 + 3) * 4
    # XLA may add a small tuple table of buffer pointers on top of the arrays.
    assert (16 + 3) * 4 <= mem.output_bytes <= (16 + 3) * 4 + 8 * 2


def test_donation_aliases_the_input_and_keeps_the_result() -> None:
    graph = _scale_graph()
    x = np.random.default_rng(0).uniform(-1, 1, (16, 16)).astype(np.float32)
    plain = compile(graph)
    donating = compile(graph, donate=["x"])
    assert donating is not plain
    assert compile(graph, donate=[0]) is donating  # by position or by name: one program
    assert plain.memory().alias_bytes == 0
    mem = donating.memory()
    assert mem.alias_bytes == x.nbytes > 0
    assert mem.peak_estimate_bytes == plain.memory().peak_estimate_bytes - x.nbytes
    assert "tf.aliasing_output" in donating.lowered_text()
    device_x = jnp.asarray(x)
    got = donating(device_x)
    assert device_x.is_deleted(), "a donated input buffer is consumed by the program"
    assert_close(got, 3.0 * x.astype(np.float64), rtol=1e-6, atol=0)
    assert_close(donating(x), 3.0 * x.astype(np.float64), rtol=1e-6, atol=0)  # numpy: copied


def test_lowered_and_compiled_text() -> None:
    program = compile(_mul_graph())
    lowered = program.lowered_text()
    assert "stablehlo" in lowered or "func.func" in lowered
    assert "tensor<8x4xf32>" in lowered and "tensor<4xf32>" in lowered
    assert "HloModule" in program.compiled_text()


def test_equal_graphs_share_one_program() -> None:
    first, second = _mul_graph(), _mul_graph()
    assert first is not second and first == second
    program = compile(first)
    assert compile(second) is program
    assert compile(_mul_graph(rows=3)) is not program
    with config.override(backend_per_command={"mul": "xla"}):
        forced = compile(first)
    assert forced is not program, "backend settings are part of the cache key"
    x = np.arange(32, dtype=np.float32).reshape(8, 4)
    w = np.array([1.0, -1.0, 0.5, 2.0], np.float32)
    want = 2.0 * x * w
    assert_close(program(x, w), want, rtol=0, atol=0)
    assert_close(forced(x, w), want, rtol=0, atol=0)


def test_hoisted_constants_give_interpret_results() -> None:
    rng = np.random.default_rng(3)
    big = rng.uniform(-1, 1, (5, 4)).astype(np.float32)  # 20 elements: hoisted
    mask = rng.uniform(size=(5, 4)) > 0.5  # bool, hoisted too
    small = np.array([0.5, -1.0, 2.0, 3.0], np.float32)  # 4 elements: baked in
    assert big.size > HOIST_ELEMENTS >= small.size
    b = GraphBuilder()
    x = b.input((5, 4), name="x")
    y = b.exec(ops.ewprod(), x, b.constant(big, name="big"), name="scaled")
    y = b.exec(ops.add(), y, b.constant(small, name="small"), name="shift")
    y = b.exec(ops.select(), b.constant(mask, name="mask"), y, x, name="pick")
    graph = b.build([y])
    program = compile(graph)
    xs = rng.uniform(-1, 1, (5, 4)).astype(np.float32)
    want = np.where(mask, xs.astype(np.float64) * big + small, xs)
    assert_close(program(xs), want, rtol=1e-6, atol=1e-7)
    assert_close(program(xs), interpret(graph, xs), rtol=1e-6, atol=1e-7)
    # The big constants are arguments of the XLA program, the small one is not.
    signature = program.lowered_text().split("func.func public @main(", 1)[1].split(")", 1)[0]
    assert signature.count("%arg") == 3
    assert "tensor<5x4xi1>" in signature and "tensor<4xf32>" not in signature
    assert program.memory().argument_bytes == xs.nbytes + big.nbytes + mask.nbytes


def test_backends_are_xla_on_cpu() -> None:
    b = GraphBuilder()
    x = b.input((3, 2), name="x")
    h = b.exec(ops.gemm(transpose_b=True), x, x, name="gram")
    h = b.exec(ops.ewexp(), h)
    graph = b.build([b.exec(ops.clamp(max=2.0), h, name="cap")])
    program = compile(graph, platform="cpu")
    assert isinstance(program, Program) and program.platform == "cpu"
    assert program.backends == (
        (0, "gram", "xla"),
        (1, "ewexp", "xla"),
        (2, "cap", "xla"),
    )
    if jax.default_backend() == "cpu":
        assert "on cpu" in repr(program)


def test_forced_unknown_backend_is_a_backend_error() -> None:
    graph = _scale_graph((4,))
    compile(graph)  # a cached program must not hide the override
    with config.override(backend_per_command={"scalar_mul": "nope"}):
        with pytest.raises(BackendError) as info:
            compile(graph)
        assert isinstance(info.value, FnncError) and isinstance(info.value, ValueError)
        msg = str(info.value)
        assert "scalar_mul" in msg and "'nope'" in msg and "['xla']" in msg
        with pytest.raises(BackendError, match="scalar_mul"):
            ops.scalar_mul(a=3.0)(np.ones(4, np.float32))
    with config.override(backend_per_command={"relu": "nope"}):
        program = compile(graph)  # an override for a command the graph lacks is unused
    with (
        config.override(backend_per_command={"no_such_command_here": "nope"}),
        pytest.raises(ConfigError, match="unknown command 'no_such_command_here'"),
    ):
        compile(graph)  # a command nothing registers is a typo, not unused
    assert_close(program(np.ones(4, np.float32)), np.full(4, 3.0), rtol=0, atol=0)
