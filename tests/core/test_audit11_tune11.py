"""Audit 11 (backend selection and autotuning): the measured defaults file."""

import json

import pytest

from fnnc.core import measured
from fnnc.errors import GraphFormatError


@pytest.mark.parametrize(
    ("devices", "said"),
    [
        ({"X": {"gemm": "xla"}}, "command 'gemm' maps to a str"),
        ({"X": ["gemm"]}, "device 'X': got a list"),
        ({"X": {"gemm": {"float32:small": 3}}}, "backend 3 is no name"),
    ],
)
def test_a_measured_defaults_file_of_the_wrong_shape_is_a_clear_error(tmp_path, devices, said):
    # Only the top level was checked: on that device kind, selection later failed with a
    # bare AttributeError ('str' object has no attribute 'get') naming no file.
    path = tmp_path / "defaults.json"
    path.write_text(json.dumps({"format": 1, "devices": devices}))
    with pytest.raises(GraphFormatError, match=f"{path}.*{said}.*measure_defaults"):
        measured.read(path)


def test_the_shipped_file_and_what_write_makes_read_back(tmp_path):
    assert measured.read()["devices"]  # the package's own file passes the check
    path = tmp_path / "defaults.json"
    measured.write("Kind", {"gemm": {"bfloat16:large": "xla"}}, "here", path)
    measured.write("Kind", {"gemm": {"float32:large": "pallas"}}, "again", path)
    data = measured.read(path)
    assert data["devices"] == {
        "Kind": {"gemm": {"bfloat16:large": "xla", "float32:large": "pallas"}}
    }
    assert data["sources"] == {"Kind": "again"}
