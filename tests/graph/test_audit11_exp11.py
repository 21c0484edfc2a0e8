"""Audit 11 (exported and serialized computations): graph files and jax.export
modules, checked against NumPy and jax.grad."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fnnc.errors import GraphFormatError
from fnnc.graph import load


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
