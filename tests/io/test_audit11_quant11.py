"""Audit 11 (quant11): palettized rows as NNC stores them, NNC's codecs.

Oracles: NNC's ``ccv_nnc_tensor_data_size_without_padding`` (the bytes
``ccv_nnc_tensor_write`` stores for a QX tensor) and ``depalettize`` of the whole
``palettize`` output.
"""

from __future__ import annotations

import contextlib
import sqlite3

import numpy as np
import pytest

from fnnc.io import TensorFile
from fnnc.io import format as fmt
from fnnc.io.palettize import depalettize, encoded_size, palettize


def _nnc_qx_size(count: int, bits: int, block: int, itemsize: int) -> int:
    """ccv_nnc_tensor_data_size_without_padding of ccv_nnc_tensor_palettize(32F, bits, block)."""
    return (1 << bits) * itemsize * -(-count // block) + (count * bits + 7) // 8


@pytest.mark.parametrize("bits", [5, 6, 7])
def test_a_qx_row_nnc_wrote_without_its_last_groups_padding_reads(tmp_path, bits):
    """ccv_nnc_tensor_write stores a QX tensor's data size without padding: for 9 or 13
    elements at 5, 6 or 7 bits that stops at the last index's last bit, short of the
    zero padding ``palettize`` writes to close the group. fnnc refused such rows ('262
    bytes hold no 9 elements'); they hold every index and decode as the whole blob does."""
    path = tmp_path / "qx.sqlite3"
    with TensorFile(path) as f:
        f.write("plain", np.zeros(2, np.float32))
    want = {}
    for count in (9, 13, 16):
        x = np.linspace(-1, 1, count, dtype=np.float32) ** 3
        blob = palettize(x, bits, 8)
        stored = _nnc_qx_size(count, bits, 8, 4)
        assert stored <= len(blob) == encoded_size(np.dtype(np.float32), count, bits, 8)
        datatype = (8 << 32) | fmt.QX | bits << 8 | 0x04
        row = (f"q{count}", 0x1, 2, datatype, fmt.pack_dim(x.shape), blob[:stored])
        with contextlib.closing(sqlite3.connect(path)) as conn, conn:
            conn.execute("REPLACE INTO tensors VALUES (?, ?, ?, ?, ?, ?)", row)
        want[f"q{count}"] = depalettize(blob, np.float32, count, bits, 8)
        short = depalettize(blob[:stored], np.float32, count, bits, 8)
        np.testing.assert_array_equal(short, want[f"q{count}"])
        with pytest.raises(ValueError, match=f"{stored} bytes needed"):
            depalettize(blob[: stored - 1], np.float32, count, bits, 8)
    with TensorFile(path, readonly=True) as f:
        for name, expected in want.items():
            np.testing.assert_array_equal(f.read(name), expected)


@pytest.mark.parametrize(
    "args, match",
    [
        ((4, 8.0, 16), "block size 8.0 must be a positive int"),
        ((4.0, 8, 16), "4 to 8 bits \\(an int\\), not 4.0"),
        ((True, 8, 16), "4 to 8 bits \\(an int\\), not True"),
        ((4, 8, 16.0), "element count must be an int >= 0, not 16.0"),
        ((4, 8, -1), "element count must be an int >= 0, not -1"),
    ],
)
def test_palettize_parameters_that_are_no_ints_are_clear_value_errors(args, match):
    """A float block size, a float or bool bit width and a float or negative count raised
    raw TypeErrors from slicing or np.empty ('slice indices must be integers'); NumPy
    integers still work (the blob equals the one from Python ints)."""
    bits, block, count = args
    x = np.arange(16, dtype=np.float32)
    blob = palettize(x, 4, 8)
    assert palettize(x, np.int64(4), np.int32(8)) == blob
    np.testing.assert_array_equal(depalettize(blob, np.float32, np.int64(16), 4, 8), x)
    with pytest.raises(ValueError, match=match):
        depalettize(blob, np.float32, count, bits, block)
    if count == 16 and isinstance(count, int):  # palettize takes no count
        with pytest.raises(ValueError, match=match):
            palettize(x, bits, block)
