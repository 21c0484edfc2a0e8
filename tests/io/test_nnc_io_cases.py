"""NNC's tensor.tests.c, palettize.tests.c, compression.tests.c, graph.io.tests.c,
tensor.bind.tests.c (liuliu/ccv test/unit/nnc) and test/int/nnc/datatype.tests.c: the
cases or parts of cases that tests/io/test_nnc_tensor_cases.py, tests/io/test_palettize.py,
tests/ops/test_nnc_op_cases.py, tests/graph/test_nnc_bind_parallel_random_cases.py and
tests/ops/test_nnc_int_misc.py leave out.

- palettize: the 7- and 8-bit cases for double and float, and their "fast path"
  (2840 values) variants (the existing port runs 7/8 bits for half with 2839 values only).
- tensor persistence, read metadata only: the metadata of every row NNC itself wrote
  (shared/nnc-files/tensors.sqlite3), with NNC's leftover ``dim`` entries after the 0.
- datatype: the conversion that takes its type from the last input
  (``ccv_cnnp_datatype_conversion(0, 1)``), as a layer reading the last input's dtype.
"""

from __future__ import annotations

import numpy as np
import pytest

from fnnc import ops
from fnnc.io import TensorFile
from fnnc.io.palettize import depalettize, encoded_size, float_to_half, palettize
from fnnc.models import Add, Input, Layer, Model
from tests.helpers import NNC_FILES, fetch_rows, needs_nnc_files

# -- palettize.tests.c ------------------------------------------------------------------

# (bits, block size, dtype, count, NNC's expected output size)
PALETTIZE_CASES = [
    (7, 512, np.float64, 2839, 2485 + 6 * 128 * 8),  # "double to 7-bit"
    (7, 512, np.float32, 2840, 2485 + 6 * 128 * 4),  # "float to 7-bit ..., fast path"
    (8, 1280, np.float64, 2840, 2840 + 3 * 256 * 8),  # "double to 8-bit ..., fast path"
    (8, 1280, np.float32, 2839, 2839 + 3 * 256 * 4),  # "float to 8-bit"
]


@pytest.mark.parametrize(
    "bits, block, dtype, count, size",
    PALETTIZE_CASES,
    ids=lambda v: getattr(v, "__name__", str(v)),
)
def test_quantize_7_and_8_bit_losslessly(bits, block, dtype, count, size):
    """NNC: quantize double to 7-bit and dequantize on CPU losslessly, "float to 7-bit
    ..., fast path", "double to 8-bit ..., fast path", "float to 8-bit ...": the values
    lut[i % 2**bits] with lut[i] = i; the output has NNC's size and decodes exactly."""
    lut = np.arange(1 << bits, dtype=np.float64)
    values = lut[np.arange(count) % lut.size].astype(dtype)
    blob = palettize(values, bits, block)
    assert len(blob) == size == encoded_size(np.dtype(dtype), count, bits, block)
    back = depalettize(blob, dtype, count, bits, block)
    assert back.dtype == dtype and back.tobytes() == values.tobytes()


def test_quantize_half_to_7_bit_fast_path_losslessly():
    """NNC: quantize half-precision to 7-bit and dequantize on CPU losslessly, fast path
    (lut converted with ccv_float_to_half_precision; 2840 values, block 512)."""
    lut = float_to_half(np.arange(128, dtype=np.float32))
    values = lut[np.arange(2840) % 128]
    blob = palettize(values, 7, 512)
    assert len(blob) == 2485 + 6 * 128 * 2
    assert depalettize(blob, np.float16, 2840, 7, 512).tobytes() == values.tobytes()


# -- tensor.tests.c: metadata of NNC's own rows -------------------------------------------


@needs_nnc_files
def test_metadata_of_rows_nnc_wrote():
    """NNC: tensor persistence and read metadata only, on the rows NNC wrote: shape and
    datatype come from ``dim`` up to its first 0 (NNC leaves the row step of a 3-d CPU
    tensor in dim[4], which is not a dimension) and from ``datatype``."""
    path = NNC_FILES / "tensors.sqlite3"
    want = {
        "f32": ((2, 3, 4), np.float32),
        "f32_nchw": ((1, 2, 3, 4), np.float32),
        "f32_any_device_macro": ((2, 2), np.float32),
        "f16": ((5,), np.float16),
        "f64": ((3, 1), np.float64),
        "i32": ((4,), np.int32),
        "i64": ((2,), np.int64),
    }
    dims = dict(fetch_rows(path, "SELECT name, dim FROM tensors"))
    leftover = np.frombuffer(dims["f32"], "<i4")
    assert leftover[3] == 0 and leftover[4:].any()  # the file really has NNC's leftovers
    with TensorFile(path, readonly=True) as f:
        for name, (shape, dtype) in want.items():
            info = f.info(name)
            assert (info.shape, info.dtype) == (shape, np.dtype(dtype)), name


# -- test/int/nnc/datatype.tests.c ---------------------------------------------------------


class ConvertToLast(Layer):
    """ccv_cnnp_datatype_conversion(0, ref_to_last=1): its first input converted to the
    datatype of its last input."""

    def build(self, ctx, *xs):
        return ctx.b.exec(ops.datatype_conversion(dtype=xs[-1].dtype), xs[0])


def test_datatype_conversion_can_reference_the_last_input_for_the_type():
    """NNC: datatype conversion model can reference to the last parameter for the type
    (a1 32F -> 16F, + a3 16F, -> the type of a2 (32F), + a2: a1 + 2 * a2 within 1e-2;
    run on the CPU here, NNC's test on the GPU)."""
    i1, i2, i3 = Input(), Input(), Input()
    out = ConvertToLast()(i1, i3)
    out = Add()(out, i3)
    out = ConvertToLast()(out, i2)
    out = Add()(out, i2)
    model = Model([i1, i2, i3], out)
    a1 = np.array([0.24, -1.4], np.float32)
    a2 = np.array([-3.23, 2.44], np.float32)
    a3 = float_to_half(a2)
    model.compile([a1, a2, a3])
    got = np.asarray(model.evaluate([a1, a2, a3]))
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, [0.24 + -3.23 * 2, -1.4 + 2.44 * 2], rtol=0, atol=1e-2)
