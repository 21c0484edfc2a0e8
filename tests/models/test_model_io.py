"""Model.write / Model.read: NNC row names, round trip, clear errors for wrong files."""

from __future__ import annotations

import numpy as np
import optax
import pytest

from fnnc.errors import CheckpointError, ModelError, ParameterError
from fnnc.io import Checkpoints
from fnnc.models import BatchNorm, Dense, Flatten, Input, Model, ReLU, Repeat, Sequential
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


# -- the CheckpointError's hint for another model, followed literally ------------------------
HINT = "model.set_parameters(Checkpoints(path).restore().state, strict=False)"


def _mlp(head):
    x = Input()
    return Model(x, Dense(head, name="head")(ReLU()(Dense(5, name="body")(x))))


def _blocks(head):
    x = Input()
    block = Repeat(lambda: Sequential([Dense(8, name="fc"), ReLU()], name="b"), 2, name="blocks")
    return Model(x, Dense(head, name="head")(block(x)))


@pytest.mark.parametrize("make, width", [(_mlp, 3), (_blocks, 8)])
def test_the_hint_for_another_model_copies_what_fits(tmp_path, make, width):
    x = rand([4, width])
    saved = make(2)
    saved.compile(x, loss="mse", minimizer=optax.adam(0.01))
    saved.fit(x, np.zeros((4, 2), np.float32))
    path = str(tmp_path / "run.ckpt")
    with Checkpoints(path) as c:
        c.save(1, saved)
    model = make(3)  # a new head
    model.compile(x, loss="mse", minimizer=optax.adam(0.01))
    before = model.parameters()
    with pytest.raises(CheckpointError) as err, Checkpoints(path) as c:
        c.restore_into(model)
    assert HINT in str(err.value)
    skipped = model.set_parameters(Checkpoints(path).restore().state, strict=False)  # HINT
    assert sorted(skipped) == ["t-head-0-0", "t-head-0-1"]
    now, want = model.parameters(), saved.parameters()
    for pid in now:  # every body/block parameter is the saved one, the head untouched
        expected = before[pid] if pid.startswith("t-head") else want[pid]
        np.testing.assert_array_equal(now[pid], expected, err_msg=pid)


def test_set_parameters_takes_per_block_ids_and_names_a_misshaped_one():
    x = rand([2, 8])
    model = _blocks(2)
    model.compile(x)
    stack = "t-blocks-0-b-[0:2]-fc-0-0"
    before = np.asarray(model.parameters()[stack])
    ones = np.ones((8, 8), np.float32)
    assert model.set_parameters({"t-blocks-0-b-1-fc-0-0": ones}) == []
    np.testing.assert_array_equal(model.parameters()[stack], np.stack([before[0], ones]))
    with pytest.raises(ModelError, match=r"t-blocks-0-b-0-fc-0-0 \(block 0 of .* is \[8, 8\]"):
        model.set_parameters({"t-blocks-0-b-0-fc-0-0": np.ones((3, 8), np.float32)})
    np.testing.assert_array_equal(model.parameters()[stack], np.stack([before[0], ones]))
