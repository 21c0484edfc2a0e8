"""Graphs traced from ordinary Flax models save and load. Their layers trace to commands
only; a primitive without a command (cumsum, sort, ``relu6``'s custom derivative, ...)
goes to the file as StableHLO through jax.export."""

from __future__ import annotations

import base64
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from fnnc import ops
from fnnc.errors import GraphFormatError
from fnnc.graph import GraphBuilder, backward, compile, interpret, load, save, trace
from tests.graph.test_trace import CNN, Block
from tests.helpers import assert_close, rand


class GeluMLP(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.fc1 = nnx.Linear(6, 8, rngs=rngs)
        self.fc2 = nnx.Linear(8, 3, rngs=rngs)

    def __call__(self, x):
        return self.fc2(nnx.gelu(self.fc1(x), approximate=False))


class CumsumMLP(GeluMLP):
    """An MLP with a primitive no command stands for (cumsum: a generic node)."""

    def __call__(self, x):
        return self.fc2(jnp.cumsum(nnx.relu6(self.fc1(x)), axis=-1))


def _generic(graph) -> list[str]:
    return [n.cmd.name for n in graph.nodes if n.cmd.name in ("primitive", "exported")]


def _roundtrip(graph, tmp_path, *args):
    path = tmp_path / "g.json"
    save(graph, str(path))
    loaded = load(str(path))
    assert len(_generic(loaded)) == len(_generic(graph))
    assert all(name == "exported" for name in _generic(loaded))
    want = compile(graph)(*args)
    assert_close(compile(loaded)(*args), want, rtol=0, atol=0)
    assert_close(interpret(loaded, *args), interpret(graph, *args), rtol=1e-6, atol=1e-6)
    return path, loaded


def test_nnx_mlp_with_exact_gelu(tmp_path):
    x = rand((4, 6))
    graph = trace(GeluMLP(nnx.Rngs(0)), x)
    assert not _generic(graph)  # erfc is a command now
    _roundtrip(graph, tmp_path, x)


def test_generic_primitives_save_through_export(tmp_path):
    x = rand((4, 6))
    graph = trace(CumsumMLP(nnx.Rngs(0)), x)
    assert len(_generic(graph)) == 2  # cumsum and relu6's custom_jvp_call
    _roundtrip(graph, tmp_path, x)


def test_nnx_cnn_with_batch_norm(tmp_path):
    x = rand((2, 10, 10, 3))
    graph = trace(CNN(nnx.Rngs(0), True), x)
    _roundtrip(graph, tmp_path, x)


def test_transformer_block_and_its_gradient(tmp_path):
    x = rand((2, 5, 8), seed=1)
    module = Block()
    params = module.init(jax.random.key(0), x)
    graph = trace(lambda p, x: module.apply(p, x), params, x)
    _, loaded = _roundtrip(graph, tmp_path, params, x)
    grads = []
    for g in (graph, loaded):  # a loaded exported node is differentiable too
        b = GraphBuilder.from_graph(g)
        total = b.exec(ops.reduce_sum(axes=(0, 1, 2)), g.symbols[g.outputs[0]])
        gg, _ = backward(b.build([total]), total, [g.symbols[g.inputs[-1]]])
        grads.append(compile(gg)(params, x)[-1])
    assert_close(grads[1], grads[0], rtol=1e-6, atol=1e-6)


def test_a_tampered_module_is_a_format_error(tmp_path):
    x = rand((4, 6))
    path = tmp_path / "g.json"
    save(trace(CumsumMLP(nnx.Rngs(0)), x), str(path))
    data = json.loads(path.read_text())
    for node in data["nodes"]:
        for key, value in node["cmd"]["params"]:
            if key == "module":
                blob = bytearray(base64.b64decode(value["$stablehlo"]))
                blob[len(blob) // 2] ^= 0xFF
                value["$stablehlo"] = base64.b64encode(bytes(blob)).decode()
    path.write_text(json.dumps(data))
    with pytest.raises(GraphFormatError, match="sha256"):
        load(str(path))


def test_a_primitive_that_cannot_be_exported_names_the_node(tmp_path):
    def f(x):
        jax.debug.callback(lambda v: None, x)
        return x * 2

    graph = trace(f, np.ones(3, np.float32))
    with pytest.raises(GraphFormatError, match=r"node \d+ .*cannot be exported"):
        save(graph, str(tmp_path / "g.json"))
