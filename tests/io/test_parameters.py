"""Model parameters under NNC's row names (ccv_cnnp_model_io.c)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fnnc.errors import ParameterError
from fnnc.io import TensorFile, internal_row, parameter_row, read_parameters, write_parameters
from tests.helpers import fetch_rows

PARAMS = {
    "t-linear-0-0": np.arange(12, dtype=np.float32).reshape(4, 3),
    "t-linear-0-1": np.ones(4, np.float32),
    "t-scale-1-0": np.float32(0.5),
}
INTERNALS = {
    "t-batch_norm-2-0": np.zeros(4, np.float32),
    "t-batch_norm-2-1": np.ones(4, np.float32),
}


def rows(path):
    return sorted(r[0] for r in fetch_rows(path, "SELECT name FROM tensors"))


def test_row_names_are_nnc_names(tmp_path):
    plain, named = str(tmp_path / "a.sqlite"), str(tmp_path / "b.sqlite")
    write_parameters(plain, PARAMS, internals=INTERNALS)
    write_parameters(named, PARAMS, name="resnet", internals=INTERNALS, device=1)
    assert rows(plain) == sorted([*PARAMS, "t-batch_norm-2-0(0)", "t-batch_norm-2-1(0)"])
    assert rows(named) == sorted(
        [f"__resnet__[{k}]" for k in PARAMS]
        + ["__resnet__[t-batch_norm-2-0(1)]", "__resnet__[t-batch_norm-2-1(1)]"]
    )
    assert parameter_row("w", name="m") == "__m__[w]" and parameter_row("w") == "w"
    assert internal_row("s", name="m", device=2) == "__m__[s(2)]" and internal_row("s") == "s(0)"


def test_round_trip_with_expected(tmp_path):
    path = str(tmp_path / "m.sqlite")
    write_parameters(path, PARAMS, name="m", internals=INTERNALS)
    expected = {k: (np.shape(v), np.float32) for k, v in PARAMS.items()}
    got = read_parameters(path, expected, name="m", internals={k: v for k, v in INTERNALS.items()})
    assert list(got) == list(PARAMS) and got.missing == () and got.mismatched == ()
    for k, v in PARAMS.items():
        assert got[k].shape == np.shape(v) and np.array_equal(got[k], v)
    assert got["t-scale-1-0"].shape == ()  # NNC's [1] comes back as the expected scalar
    assert all(np.array_equal(got.internals[k], v) for k, v in INTERNALS.items())
    specs = {k: jax.ShapeDtypeStruct(np.shape(v), jnp.float16) for k, v in PARAMS.items()}
    half = read_parameters(path, specs, name="m")
    assert half["t-linear-0-0"].dtype == np.float16  # NNC converts 32F -> 16F on read


def test_discovers_everything_without_expected(tmp_path):
    path = str(tmp_path / "m.sqlite")
    write_parameters(path, PARAMS, internals=INTERNALS)
    write_parameters(path, {"other": np.ones(1, np.float32)}, name="second")
    got = read_parameters(path)
    assert sorted(got) == sorted(PARAMS) and sorted(got.internals) == sorted(INTERNALS)
    assert list(read_parameters(path, name="second")) == ["other"]


def test_missing_and_misshaped_are_all_listed(tmp_path):
    path = str(tmp_path / "m.sqlite")
    write_parameters(path, PARAMS, name="m", internals=INTERNALS)
    expected = {
        "t-linear-0-0": ((3, 4), np.float32),  # transposed
        "t-linear-0-1": ((4,), np.int32),  # wrong kind of dtype
        "t-scale-1-0": ((), np.float32),
        "t-conv-5-0": ((8, 3, 3, 3), np.float32),
        "t-conv-5-1": ((8,), np.float32),
    }
    internals = {"t-batch_norm-2-0": ((4,), None), "t-batch_norm-9-0": ((4,), None)}
    with pytest.raises(ParameterError) as e:
        read_parameters(path, expected, name="m", internals=internals)
    text = str(e.value)
    for part in (
        "missing (3): t-conv-5-0, t-conv-5-1, t-batch_norm-9-0(0)",
        "t-linear-0-0: stored float32[4, 3], expected float32[3, 4]",
        "t-linear-0-1: stored float32[4], expected int32[4]",
        "model name 'm'",
        "strict=False",
    ):
        assert part in text, (part, text)
    loose = read_parameters(path, expected, name="m", internals=internals, strict=False)
    assert list(loose) == ["t-scale-1-0"] and list(loose.internals) == ["t-batch_norm-2-0"]
    assert loose.missing == ("t-conv-5-0", "t-conv-5-1", "t-batch_norm-9-0(0)")
    assert [m.key for m in loose.mismatched] == ["t-linear-0-0", "t-linear-0-1"]
    assert loose.mismatched[0].row == "__m__[t-linear-0-0]"


def test_one_transaction(tmp_path):
    path = str(tmp_path / "m.sqlite")
    write_parameters(path, {"a": np.ones(2, np.float32)})
    with pytest.raises(Exception, match=r"NNC has no datatype for bool"):
        write_parameters(path, {"b": np.ones(2, np.float32), "c": np.ones(2, bool)})
    assert rows(path) == ["a"]
    with TensorFile(path) as f:  # an open file is used as is, inside its own transaction
        with pytest.raises(RuntimeError), f.transaction():
            write_parameters(f, {"d": np.ones(1, np.float32)})
            raise RuntimeError
        assert f.names() == ["a"]


def test_arguments_of_the_wrong_kind_are_fnnc_errors(tmp_path):
    """A list where a dict of parameters goes was an AttributeError, a bad spec and a path
    of None were builtin TypeErrors: now ParameterError / TensorFileError saying what is
    expected (still TypeErrors, as callers caught before). Nothing is written."""
    from fnnc.errors import TensorFileError

    path = str(tmp_path / "w.sqlite")
    with pytest.raises(ParameterError, match=r"write_parameters: params is a list of 1 item"):
        write_parameters(path, [np.ones(2)])
    with pytest.raises(ParameterError, match=r"write_parameters: internals is a tuple"):
        write_parameters(path, PARAMS, internals=(np.ones(2),))
    assert not (tmp_path / "w.sqlite").exists()
    write_parameters(path, PARAMS)
    with pytest.raises(ParameterError, match=r"expected\['t-linear-0-0'\] is \(4, 3\); give"):
        read_parameters(path, {"t-linear-0-0": (4, 3)})
    with pytest.raises(ParameterError, match=r"read_parameters: expected is a list"):
        read_parameters(path, ["t-linear-0-0"])
    with pytest.raises(TensorFileError, match=r"TensorFile: the path is NoneType None"):
        TensorFile(None)
    for call in (
        lambda: write_parameters(path, [np.ones(2)]),
        lambda: read_parameters(path, {"t-linear-0-0": (4, 3)}),
        lambda: TensorFile(None),
    ):
        with pytest.raises(TypeError):
            call()
    # the same reads done right give what was written
    got = read_parameters(path, {"t-linear-0-0": ((4, 3), np.float32)})
    np.testing.assert_array_equal(got["t-linear-0-0"], PARAMS["t-linear-0-0"])
