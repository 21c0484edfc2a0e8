"""Model.write / Model.read: NNC row names, round trip, clear errors for wrong files."""

from __future__ import annotations

import numpy as np
import optax
import pytest

from fnnc.errors import ParameterError
from fnnc.models import BatchNorm, Dense, Flatten, ReLU, Sequential
from tests.helpers import fetch_rows, rand


def _model(width=4):
    return Sequential(
        [Dense(width, name="fc"), BatchNorm(name="bn"), ReLU(), Flatten(), Dense(2, name="out")]
    )


def test_round_trip_and_nnc_row_names(tmp_path):
    x = rand([4, 3])
    a = _model()
    a.compile([x], loss="softmax_crossentropy", minimizer=optax.sgd(0.1))
    a.fit([x], [np.array([0, 1, 0, 1], np.int32)])
    path = tmp_path / "model.sqlite3"
    a.write(path, name="net")
    rows = sorted(r[0] for r in fetch_rows(path, "SELECT name FROM tensors"))
    assert "__net__[t-fc-0-0]" in rows and "__net__[r-bn-0-0(0)]" in rows
    b = _model()
    b.compile([x])
    assert b.read(path, name="net") == []
    for k, v in a.parameters().items():
        assert np.array_equal(np.asarray(v), np.asarray(b.parameters()[k])), k
    np.testing.assert_array_equal(a.evaluate([x]), b.evaluate([x]))


def test_reading_a_mismatched_file_says_which_parameters(tmp_path):
    x = rand([4, 3])
    small = _model(4)
    small.compile([x])
    small.write(tmp_path / "m.sqlite3")
    wide = _model(6)
    wide.compile([x])
    with pytest.raises(ParameterError, match="t-fc-0-0"):
        wide.read(tmp_path / "m.sqlite3")
    skipped = wide.read(tmp_path / "m.sqlite3", strict=False)
    assert any("t-fc-0-0" in s for s in skipped)
    assert np.array_equal(wide.parameters()["t-out-0-1"], small.parameters()["t-out-0-1"])
