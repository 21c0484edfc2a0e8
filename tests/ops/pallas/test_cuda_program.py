"""A whole training step, with the backends a GPU would choose, lowers for CUDA here.

``test_triton_lowering.py`` lowers each kernel on its own. This lowers what a GPU user
runs: ``Model.fit``'s program of the LM in ``benchmarks/lm_step.py`` (and of a
``Repeat``'d transformer, whose blocks run as one ``scan``), every node on the backend
the dispatch rule picks for an H100 (the shipped measured defaults, else construction),
sub-graph nodes included. ``jax.export`` lowers it for ``cuda`` without a GPU, so a
kernel chosen by default that Triton's lowering refuses, or a kernel inside a loop body
built for the wrong platform, fails here rather than on the first GPU run.
"""

import collections
import contextlib

import jax
import jax.numpy as jnp
import pytest
from jax import export
from jax.sharding import AbstractDevice, AbstractMesh, use_abstract_mesh

from benchmarks import lm_step
from fnnc.core import dispatch, measured
from fnnc.core.evaluate import as_tuple, run_nodes
from fnnc.models import (
    Add,
    Dense,
    Embedding,
    Input,
    LayerNorm,
    Model,
    MultiHeadAttention,
    ReLU,
    Repeat,
    minimizers,
    programs,
)

H100 = "NVIDIA H100 80GB HBM3"
TRITON = "__gpu$xla.gpu.triton"
SIZE = lm_step.Size(batch=2, seq=64, width=64, heads=4, blocks=2, vocab=256)


class _Uncompiled:
    """What ``compile`` gives the fit step here: its graph, not compiled for this CPU."""

    def __init__(self, graph, **_):
        self.graph = graph

    def memory_plan(self):
        return None


def _fit_graph(model: Model):
    """The graph of ``model``'s fused training step on SIZE's batch (every pass run, as
    ``fit`` compiles it), built here without compiling it."""
    x, y = (jnp.asarray(a) for a in lm_step.batches(SIZE, 1)[0])
    model.compile(
        [x], loss="softmax_crossentropy", minimizer=minimizers.adam(1e-3), precision="bfloat16"
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(programs, "compile", _Uncompiled)
        model.memory_plan([x], [y])  # builds the fit program without running a step
    return model.engine._last_fit.program.graph


def _repeated_lm() -> Model:
    def block() -> Model:
        h = Input()
        a = Add()(h, MultiHeadAttention(SIZE.heads, is_causal=True)(LayerNorm()(h)))
        up = Dense(4 * SIZE.width)(LayerNorm()(a))
        return Model([h], [Add()(a, Dense(SIZE.width)(ReLU()(up)))])

    tokens = Input()
    h = Repeat(block, SIZE.blocks, name="blocks")(Embedding(SIZE.vocab, SIZE.width)(tokens))
    return Model([tokens], [Dense(SIZE.vocab)(LayerNorm()(h))])


@contextlib.contextmanager
def _on_h100():
    """fnnc chooses and builds kernels as on an H100 (JAX 0.11 lowers Pallas for a GPU
    it does not have when an abstract device names its kind). Nothing here is cached:
    the choices are made by ``select_backend`` (no cache), the kernels are traced into
    one fresh ``jax.jit`` that is exported, never run, so later tests see nothing of it
    (clearing JAX's caches instead cost every later test in the worker its compiles)."""
    h100 = AbstractDevice(device_kind=H100, num_cores=132, platform="gpu")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(jax, "default_backend", lambda: "gpu")
        patch.setattr(measured, "device_kind", lambda p: H100 if p == "gpu" else None)
        with use_abstract_mesh(AbstractMesh((1,), ("x",), abstract_device=h100)):
            yield


def _lowered_for_cuda(graph) -> tuple[collections.Counter, str]:
    """``(non-XLA choices by command, the StableHLO text)`` of ``graph`` (built on this
    CPU) lowered for CUDA, each node on its H100 choice, as :class:`fnnc.graph.Program`
    runs them."""
    with _on_h100():
        return _lowered(graph)


def _lowered(graph) -> tuple[collections.Counter, str]:
    choices = [
        dispatch.select_backend(n.cmd, [graph.spec(s) for s in n.inputs], "gpu")
        for n in graph.nodes
    ]
    forwards = [dispatch.forward_of(n.cmd, b) for n, b in zip(graph.nodes, choices)]

    def program(*args):
        with dispatch.matmul_precision_scope():
            return tuple(run_nodes(graph, args, lambda i, n, xs: as_tuple(forwards[i](*xs))))

    check = [export.DisabledSafetyCheck.custom_call(TRITON)]
    exported = export.export(jax.jit(program), platforms=["cuda"], disabled_checks=check)(
        *graph.input_specs
    )
    kernels = collections.Counter(
        (n.cmd.name, b) for n, b in zip(graph.nodes, choices) if b not in ("xla", "reference")
    )
    return kernels, exported.mlir_module()


def test_the_lm_step_lowers_for_cuda_with_flash_attention_forward_and_backward():
    graph = _fit_graph(lm_step.fnnc_model(SIZE))
    kernels, text = _lowered_for_cuda(graph)
    # By construction flash attention is the only kernel default at these sizes; the
    # gemm, norms and loss stay on XLA until measured faster (issue 24).
    assert kernels == {
        ("scaled_dot_product_attention", "pallas"): SIZE.blocks,
        ("gradient", "pallas"): SIZE.blocks,
    }
    assert text.count(TRITON) >= 2 * SIZE.blocks  # forward and backward kernels per block


def test_a_repeated_stack_runs_its_kernels_inside_the_loop_body():
    graph = _fit_graph(_repeated_lm())
    kernels, text = _lowered_for_cuda(graph)
    assert not kernels  # no attention node at the top: the blocks are one scan
    assert {n.cmd.name for n in graph.nodes} >= {"scan"}
    assert text.count(TRITON) >= 2  # the body's flash attention, forward and backward
