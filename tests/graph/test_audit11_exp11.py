"""Audit 11 (exported and serialized computations): graph files and jax.export
modules, checked against NumPy and jax.grad."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fnnc.errors import GraphFormatError
from fnnc.graph import interpret, load, save, trace


def test_loading_a_jax_export_artifact_as_a_graph_says_what_it_is(tmp_path):
    """load('model.jax') said only "not JSON: 'utf-8' codec can't decode byte"; the
    file is a jax.export artifact, and the message now says so and how to run it."""
    spec = jax.ShapeDtypeStruct((3,), jnp.float32)
    exported = jax.export.export(jax.jit(lambda x: 2 * x + 1))(spec)
    artifact = tmp_path / "model.jax"
    artifact.write_bytes(exported.serialize())
    with pytest.raises(GraphFormatError, match=r"not JSON.*It is a jax\.export artifact"):
        load(artifact)
    run = jax.export.deserialize(bytearray(artifact.read_bytes()))
    x = np.array([1.0, -2.0, 0.5], np.float32)
    np.testing.assert_array_equal(run.call(x), 2 * x + 1)
    other = tmp_path / "other.bin"
    other.write_bytes(b"\x10\0\0\0" + b"\xff" * 60)  # a flatbuffer's head, not a module
    with pytest.raises(GraphFormatError, match="not JSON") as caught:
        load(other)
    assert "jax.export" not in str(caught.value)


def _sorted_twice(x):
    values, order = jax.lax.sort((x, jax.lax.broadcasted_iota(jnp.int32, x.shape, 0)), num_keys=1)
    return jnp.cumsum(values, axis=0) ** 2, order


def test_a_loaded_graph_maps_under_vmap_as_the_traced_one_did(tmp_path):
    """A traced graph's generic nodes (cumsum, sort with an int output) map under
    jax.vmap; saved and loaded they are jax.export modules, for which JAX has no
    batching rule: vmap of the loaded graph failed ('Batching rule for call_exported
    not implemented'), and so did vmap of its gradient. The oracle is the JAX function
    itself, under vmap and grad."""
    x = np.array([3.0, -1.0, 2.0], np.float32)
    graph = trace(_sorted_twice, x)
    save(graph, tmp_path / "g.json")
    loaded = load(tmp_path / "g.json")
    assert "exported" in {n.cmd.name for n in loaded.nodes}
    xs = np.stack([x, -2 * x, x[::-1]])
    got = jax.vmap(lambda a: interpret(loaded, a))(xs)
    want = jax.vmap(_sorted_twice)(xs)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6)
    np.testing.assert_array_equal(got[1], want[1])
    weights = np.array([1.0, -2.0, 0.5], np.float32)

    def loss(run):
        return jax.grad(lambda a: (run(a)[0] * weights).sum())

    grads = jax.jit(jax.vmap(loss(lambda a: interpret(loaded, a))))(xs)
    np.testing.assert_allclose(grads, jax.vmap(loss(_sorted_twice))(xs), rtol=1e-5)


def test_load_exported_of_a_missing_file_or_a_folder_says_so(tmp_path):
    """load_exported of a missing path said '...: not a jax.export artifact
    (FileNotFoundError ...)', as if the file were of another kind."""
    from fnnc.errors import TensorFileError
    from fnnc.io.exported import load_exported

    for path in (tmp_path / "missing.jax", tmp_path):
        with pytest.raises(TensorFileError, match=r"cannot read it .*check the path") as caught:
            load_exported(path)
        assert "not a jax.export artifact" not in str(caught.value)
    exported = jax.export.export(jax.jit(jnp.negative))(jax.ShapeDtypeStruct((2,), jnp.float32))
    (tmp_path / "neg.jax").write_bytes(exported.serialize())
    x = np.array([1.5, -2.0], np.float32)
    np.testing.assert_array_equal(load_exported(tmp_path / "neg.jax").call(x), -x)


def test_a_graph_file_whose_version_is_not_the_integer_1_is_refused():
    """ "version": true (or 1.0) was read as version 1, since True == 1 in Python."""
    from fnnc import ops
    from fnnc.graph import GraphBuilder, from_data, to_data

    b = GraphBuilder()
    x = b.input((3,), name="x")
    data = to_data(b.build([b.exec(ops.relu(), x)]))
    for version in (True, 1.0, "1"):
        with pytest.raises(GraphFormatError, match=rf"version {version!r}; this fnnc reads"):
            from_data({**data, "version": version})
    v = np.array([-1.0, 0.5, 2.0], np.float32)
    np.testing.assert_array_equal(interpret(from_data(data), v), np.maximum(v, 0))
