"""Audit 11 (backend selection and autotuning): regressions found by probing."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fnnc import config, ops
from fnnc.core.command import Spec
from fnnc.errors import BackendError
from fnnc.graph import GraphBuilder, compile, scan
from fnnc.graph.autotune import autotune_graph


@pytest.fixture
def gpu_only_relu():
    """A relu backend that compiles on GPUs only and adds 100, so its use shows."""
    fake = ops.Backend(
        "gpu_only", lambda x: jnp.maximum(x, 0) + 100, ("gpu",), priority=5, interpret_platforms=()
    )
    ops.register_backend("relu", fake)
    yield
    ops.unregister_backend("relu", "gpu_only")


def _relu_then_scanned_relu():
    body = GraphBuilder()
    h = body.input((2,))
    body = body.build([body.exec(ops.relu(), h)])
    b = GraphBuilder()
    y = b.exec(ops.relu(), b.input((2,)))
    (z,) = scan(b, body, [y], length=1)
    return b.build([y, z])


def test_loop_bodies_choose_backends_for_the_platform_the_program_is_compiled_for(
    gpu_only_relu, monkeypatch
):
    # compile(platform=P) chose its top-level nodes for P but a scan body's nodes for JAX's
    # default backend: a GPU host's compile(platform="cpu") put GPU kernels in the loop.
    graph, x = _relu_then_scanned_relu(), np.array([-1.0, 2.0], np.float32)
    relu = lambda v: np.maximum(v, 0)
    y, z = compile(graph, platform="gpu")(x)
    np.testing.assert_array_equal(y, relu(x) + 100)
    np.testing.assert_array_equal(z, relu(relu(x) + 100) + 100)  # the body's too
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")  # as on a GPU host
    y, z = compile(graph, platform="cpu")(x)
    np.testing.assert_array_equal(y, relu(x))
    np.testing.assert_array_equal(z, relu(x))  # no GPU-only backend in the CPU program


def test_a_forced_backend_that_declines_names_the_node_top_level_and_in_a_body():
    # The error named the command and the reason but not which node of the graph.
    b = GraphBuilder()
    a, w = b.input((3,), name="a"), b.input((4, 3), name="w")
    proj = b.exec(ops.gemm(transpose_b=True), a, w, name="proj")
    body = GraphBuilder()
    h, bw = body.input((3,)), body.input((3, 3))
    body = body.build([body.exec(ops.gemm(transpose_b=True), h, bw, name="inner"), bw])
    looped = GraphBuilder()
    carry = [looped.input((3,)), looped.input((3, 3))]
    (c, _) = scan(looped, body, carry, length=1)
    with config.override(backend_per_command={"gemm": "pallas"}):
        with pytest.raises(
            BackendError, match=r"compile: node 0 \(proj\): gemm.*forced .*'pallas'.*vector"
        ):
            compile(b.build([proj]), platform="gpu")
        with pytest.raises(
            BackendError, match=r"sub-graph node 0 \(inner\): gemm.*forced .*'pallas'.*vector"
        ):
            compile(looped.build([c]), platform="gpu")


def test_a_command_calling_another_runs_it_at_the_programs_matmul_precision(restore_registries):
    # compiled_forward keyed and traced the inner gemm at the config's precision (float32,
    # HIGHEST) inside a program compiled at bfloat16, whose own gemm ran at DEFAULT.
    rule = lambda a, w: Spec((a.shape[0], w.shape[1]), a.dtype)
    nested = ops.defcommand(family="custom", shape=rule, name="audit11_nested_gemm")(
        lambda a, w: ops.gemm()(a, w)
    )
    b = GraphBuilder()
    x, w = b.input((4, 4)), b.input((4, 4))
    graph = b.build([b.exec(nested(), x, w), b.exec(ops.gemm(), x, w)])
    for precision, jax_name in (("bfloat16", "DEFAULT"), ("float32", "HIGHEST")):
        text = compile(graph, matmul_precision=precision).lowered_text()
        found = re.findall(r"stablehlo.dot_general.*precision = \[(\w+), (\w+)\]", text)
        assert found == [(jax_name, jax_name)] * 2, (precision, found)


def test_commands_called_inside_other_commands_choose_for_the_programs_platform(
    gpu_only_relu, restore_registries
):
    # outer's forward calls inner eagerly, whose jitted forward calls relu: the jitted
    # forward was keyed without the platform and chose relu's backend for JAX's default.
    same = lambda x: Spec(x.shape, x.dtype)
    inner = ops.defcommand(family="custom", shape=same, name="audit11_inner")(
        lambda x: ops.relu()(x)
    )
    outer = ops.defcommand(family="custom", shape=same, name="audit11_outer")(lambda x: inner()(x))
    b = GraphBuilder()
    graph = b.build([b.exec(outer(), b.input((2,)))])
    x = np.array([-1.0, 2.0], np.float32)
    np.testing.assert_array_equal(compile(graph, platform="gpu")(x), np.maximum(x, 0) + 100)
    np.testing.assert_array_equal(compile(graph, platform="cpu")(x), np.maximum(x, 0))


def _no_kernel_here(x):
    raise RuntimeError("a GPU kernel ran in a CPU program")


def test_autotune_graph_computes_node_inputs_with_the_tuned_platforms_backends(monkeypatch):
    # On a GPU host, autotune_graph(platform="cpu") computed each node's inputs with eager
    # calls that chose backends for the GPU (JAX's default), running GPU kernels on CPU.
    gpu = ops.Backend("gpu_kernel", _no_kernel_here, ("gpu",), priority=5, interpret_platforms=())
    rival = ops.Backend("rival", lambda x: jnp.sqrt(x * x), ("cpu",), priority=0)
    ops.register_backend("relu", gpu)
    ops.register_backend("ewabs", rival)
    try:
        b = GraphBuilder()
        graph = b.build([b.exec(ops.ewabs(), b.exec(ops.relu(), b.input((2,))))])
        monkeypatch.setattr(jax, "default_backend", lambda: "gpu")  # as on a GPU host
        x = np.array([-1.0, 2.0], np.float32)
        tuned = autotune_graph(graph, x, platform="cpu", repeats=1, check=False, libraries=False)
        assert set(tuned) == {1} and tuned[1] in ("xla", "rival")
    finally:
        ops.unregister_backend("relu", "gpu_kernel")
        ops.unregister_backend("ewabs", "rival")
        for key in [k for k in ops.autotune.TABLE if k.startswith("ewabs|")]:
            del ops.autotune.TABLE[key]
