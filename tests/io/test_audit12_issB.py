"""Audit 12 (issues 5, 6, 15, 16, 29): persistence as a user writes it."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fnnc.errors import CheckpointError
from fnnc.io import Checkpoints, ShardedCheckpoints


def test_checkpoint_metadata_takes_numpy_and_jax_scalars_as_python_numbers(tmp_path):
    """``save(step, state, metadata={"loss": loss})`` with the 0-d loss ``fit`` returns
    (a JAX array) or NumPy scalars was refused as 'not JSON'; the oracle is ``.item()``."""
    loss = jnp.sum(jnp.ones(3, jnp.float32)) / 4  # what fit returns: a 0-d jax.Array
    meta = {
        "loss": loss,
        "lr": np.float32(0.25),
        "epoch": np.int64(3),
        "ok": np.bool_(True),
        "hist": [np.float16(0.5), jnp.int32(7)],
        "pair": (np.uint8(2), 1.5),
    }
    want = {
        "loss": 0.75,
        "lr": 0.25,
        "epoch": 3,
        "ok": True,
        "hist": [0.5, 7],
        "pair": [2, 1.5],
    }
    with Checkpoints(tmp_path / "run.ckpt") as ckpt:
        ckpt.save(1, {"w": np.ones(2, np.float32)}, metadata=meta)
        ckpt.save(2, {"w": np.ones(2, np.float32)}, optax.sgd(0.1).init({}), meta)
        got = ckpt.restore(1).metadata
        assert got == want and type(got["epoch"]) is int and type(got["ok"]) is bool
        assert {k: ckpt.restore(2).metadata[k] for k in want} == want
        with pytest.raises(CheckpointError, match="not JSON"):  # non-finite: still refused
            ckpt.save(3, {"w": np.ones(2, np.float32)}, metadata={"loss": np.float32("nan")})
        assert ckpt.steps() == [1, 2]


def test_sharded_checkpoint_metadata_takes_numpy_scalars(tmp_path):
    """ShardedCheckpoints follows the same rule as Checkpoints."""
    with ShardedCheckpoints(tmp_path / "run") as ckpt:
        ckpt.save(1, {"w": np.ones(2, np.float32)}, metadata={"loss": np.float32(0.5)})
        assert ckpt.restore(1).metadata == {"loss": 0.5}


def test_safetensors_read_of_a_missing_file_says_the_file_is_missing(tmp_path):
    """``SafetensorsFile(typo).read("w")`` said "no tensor 'w' ... (0 tensors: none)", a
    TensorNotFoundError, where TensorFile says the file does not exist; both now say so
    (issue 16: a missing file is an error naming the path) and create nothing."""
    from fnnc.errors import TensorFileError, TensorNotFoundError
    from fnnc.io import SafetensorsFile, TensorFile

    for cls, name in ((SafetensorsFile, "typo.safetensors"), (TensorFile, "typo.sqlite3")):
        path = tmp_path / name
        with pytest.raises(TensorFileError, match="no such file; check the path") as e:
            cls(path).read("w")
        assert not isinstance(e.value, TensorNotFoundError)
        with pytest.raises(TensorFileError, match="no such file"):
            cls(path).info("w")
    assert list(tmp_path.iterdir()) == []
    with SafetensorsFile(tmp_path / "a.safetensors") as f:  # a pending write still reads
        f.write("w", np.arange(3, dtype=np.float32))
        np.testing.assert_array_equal(f.read("w"), np.arange(3, dtype=np.float32))
        with pytest.raises(TensorNotFoundError, match="no tensor 'v'"):
            f.read("v")


def test_sibling_switches_given_as_strings_are_named(tmp_path):
    """read_parameters(strict="no") was strict and register_codec(replace="no") replaced
    the held codec: any str was True (review of the issB switch fixes)."""
    from fnnc.errors import ParameterError, TensorFileError
    from fnnc.io import read_parameters, write_parameters
    from fnnc.io.codecs import _registry, register_codec

    path = tmp_path / "p.sqlite3"
    write_parameters(path, {"w": np.ones(2, np.float32)})
    with pytest.raises(ParameterError, match=r"read_parameters\(strict=...\) takes True or False"):
        read_parameters(path, {"w": ((2,), np.float32)}, strict="no")
    held = next(iter(_registry.values()))
    with pytest.raises(TensorFileError, match=r"register_codec\(replace=...\) takes True or"):
        register_codec(held, replace="no")
    assert _registry[held.identifier] is held
    got = read_parameters(path, {"w": ((2,), np.float32), "v": ((1,), np.float32)}, strict=0)
    assert list(got.missing) == ["v"] and np.array_equal(got["w"], np.ones(2, np.float32))


def test_numpy_keys_of_checkpoint_metadata_are_plain(tmp_path):
    """metadata={np.int64(3): 0.5} was 'not JSON' (keys must be str, int...)."""
    from fnnc.io.tree import plain_metadata

    assert plain_metadata({np.int64(3): np.float32(0.5), "a": (np.bool_(True),)}) == {
        3: 0.5,
        "a": [True],
    }
