"""NNC's tensor and graph persistence tests (test/unit/nnc/tensor.tests.c and
graph.io.tests.c) on fnnc: TensorFile rows, codecs, partial and converting reads,
views written and zeroed, a convolution's shape rule, a saved graph run again.

Oracles: the file NNC itself wrote (shared/nnc-files/tensors.sqlite3, see its README),
NumPy, and NNC's float-to-half table rule re-derived bit by bit below.

Not ported: "tensor swap", "resize tensor" and "tensor mapped from file" (C buffer
ownership, realloc and mmap of a raw file: fnnc arrays are immutable JAX/NumPy values;
``np.memmap`` is the counterpart of the last). The four "format ... tensor into string"
cases (NNC's debug printer) are in test_nnc_tensor_format.py, on ``fnnc.io.format_tensor``.
"""

from __future__ import annotations

import contextlib
import sqlite3
import warnings

import numpy as np
import pytest

from fnnc import ops
from fnnc.errors import ParameterError, TensorFileError
from fnnc.graph import GraphBuilder, compile, interpret, load, save
from fnnc.io import TensorFile, read_parameters
from fnnc.io import format as fmt
from fnnc.io.palettize import depalettize, encoded_size, palettize
from tests.helpers import NNC_FILES, fetch_rows, needs_nnc_files

NNC_TENSORS = NNC_FILES / "tensors.sqlite3"


def _uniform(shape, seed):
    """NNC's tests fill with dsfmt_genrand_open_close * 2 - 1: uniform in (-1, 1]."""
    return np.random.default_rng(seed).uniform(-1, 1, shape).astype(np.float32)


def _nnc_half(x: np.ndarray) -> np.ndarray:
    """float32 -> float16 bits as ccv_float_to_half_precision's tables give them: the
    mantissa is cut, never rounded; |x| >= 2**16 is infinity; below 2**-24 is zero."""
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.int64)
    sign, e, m = (u >> 16) & 0x8000, (u >> 23) & 0xFF, u & 0x7FFFFF
    normal = ((e - 112) << 10) | (m >> 13)
    subnormal = ((1 << 23) | m) >> np.clip(126 - e, 0, 63)
    bits = np.where(e >= 143, 0x7C00, np.where(e >= 113, normal, np.where(e >= 103, subnormal, 0)))
    return (sign | bits).astype(np.uint16).view(np.float16)


# -- rows NNC wrote ---------------------------------------------------------------------


@needs_nnc_files
def test_every_row_nnc_wrote_reads_with_its_values():
    """Case "tensor persistence": ccv_nnc_tensor_write's rows, one per datatype, read back
    with NNC's values, shape, layout tag and device (values from the file's README)."""
    f32 = np.arange(24, dtype=np.float32) * 0.5 - 3
    want = {
        "f32": (f32.reshape(2, 3, 4), "NHWC", "CPU:0"),
        "f32_nchw": (f32.reshape(1, 2, 3, 4), "NCHW", "CPU:0"),
        "f32_any_device_macro": (
            np.arange(4, dtype=np.float32).reshape(2, 2) + 0.25,
            "NHWC",
            "CPU",
        ),
        "f16": (
            np.array([0, 0x3E00, 0xC080, 0x7BFF, 0x068D], np.uint16).view(np.float16),
            "NHWC",
            "CPU:0",
        ),
        "f64": (np.array([[1e-300], [3.25], [-7]]), "NHWC", "CPU:0"),
        "i32": (np.array([1, -2, 3, 2**31 - 1], np.int32), "NHWC", "CPU:0"),
        "i64": (np.array([-1, 2**40], np.int64), "NHWC", "CPU:0"),
    }
    with TensorFile(NNC_TENSORS, readonly=True) as f:
        assert f.names() == sorted(want)
        for name, (value, layout, device) in want.items():
            got, info = f.read(name), f.info(name)
            assert got.dtype == value.dtype and got.shape == value.shape, name
            assert got.tobytes() == value.tobytes(), name
            assert (info.format, info.device, info.encoder) == (layout, device, 0), name


@needs_nnc_files
def test_nnc_rows_read_in_part_and_converted():
    """Case "tensor persistence" and "... with type coercion" on NNC's own rows: a smaller
    shape takes the first values in order; 16F widens to 32F exactly (the f16 row holds
    65504 and NNC's cut 0.0001)."""
    with TensorFile(NNC_TENSORS, readonly=True) as f:
        first = f.read("f32", shape=(10,))
        np.testing.assert_array_equal(first, np.arange(10, dtype=np.float32) * 0.5 - 3)
        np.testing.assert_array_equal(f.read("f32", shape=(4, 6))[3], np.arange(18, 24) * 0.5 - 3)
        wide = f.read("f16", shape=(4,), dtype=np.float32)
        np.testing.assert_array_equal(wide, [0, 1.5, -2.25, 65504])
        assert f.read("f16", dtype=np.float32)[4] == np.float32(0x68D * 2.0**-24)


def test_a_palettized_row_as_nnc_writes_it_is_listed_and_not_damaged(tmp_path):
    """Case "allocate palettize tensor with quantization to 5-bit", written: NNC stores a
    ccv_nnc_tensor_palettize tensor with datatype 0x40504 (QX | 5 << 8 | 32F >> 12) and
    its block size 512 in the high 32 bits; NNC reads its metadata back. fnnc lists it
    (a QX row: dtype None), does not call it damaged, and reads it depalettized, as NNC's
    ccv_nnc_depalettize of the row read back gives it (the palettized bytes decoded)."""
    path = tmp_path / "qx.sqlite3"
    x = _uniform((10, 20, 30), 6)
    with TensorFile(path) as f:
        f.write("plain", x)
    row = ("q", 0x1, 2, (512 << 32) | 0x40504, fmt.pack_dim(x.shape), palettize(x, 5, 512))
    with contextlib.closing(sqlite3.connect(path)) as conn, conn:
        conn.execute("REPLACE INTO tensors VALUES (?, ?, ?, ?, ?, ?)", row)
    with TensorFile(path, readonly=True) as f:
        info = f.info("q")
        assert (info.shape, info.dtype, info.nbytes) == ((10, 20, 30), None, 5286)
        assert [i.name for i in f.infos()] == ["plain", "q"]
        assert f.verify().ok
        got = f.read("q")
    assert got.dtype == np.float32 and got.shape == (10, 20, 30)
    expected = depalettize(palettize(x, 5, 512), np.dtype(np.float32), x.size, 5, 512)
    np.testing.assert_array_equal(got.reshape(-1), expected)
    np.testing.assert_allclose(got, x, atol=np.ptp(x) / 2**5)  # 32 levels a block
    # as a model's parameter: its element type is what read_parameters (Model.read) expects
    params = read_parameters(path, {"q": ((10, 20, 30), np.float32)})
    np.testing.assert_array_equal(params["q"], got)
    with pytest.raises(ParameterError, match=r"stored float32\[10, 20, 30\], expected int32"):
        read_parameters(path, {"q": ((10, 20, 30), np.int32)})


def test_metadata_reads_without_the_data(tmp_path):
    """Case "tensor persistence and read metadata only": shape and datatype of a 16F and a 32F
    [10, 20, 30] row come back without touching ``data`` (a damaged blob is no bother)."""
    path = tmp_path / "md.sqlite3"
    with TensorFile(path) as f:
        f.write("x", _uniform((10, 20, 30), 1).astype(np.float16))
        f.write("y", _uniform((10, 20, 30), 2))
    with contextlib.closing(sqlite3.connect(path)) as conn, conn:
        conn.execute("UPDATE tensors SET data=x'00' WHERE name='y'")
    with TensorFile(path, readonly=True) as f:
        x, y = f.info("x"), f.info("y")
        assert (x.shape, x.dtype, y.shape, y.dtype) == (
            (10, 20, 30),
            np.float16,
            (10, 20, 30),
            np.float32,
        )
        with pytest.raises(TensorFileError, match="truncated"):
            f.read("y")


# -- encoders and decoders --------------------------------------------------------------


def _xor(data: bytes) -> bytes:
    return (np.frombuffer(data, np.uint8) ^ 0x13).tobytes()


def _codec(kind, seen):
    """NNC's test pair: XOR 0x13 under identifier 1 (its decoder declines any other), or
    a pair that always declines."""
    if kind == "noop":
        return (lambda data, dtype, shape: None), (lambda i, data, dtype, shape: None)

    def decode(identifier, data, dtype, shape):
        seen.append((dtype, shape))
        return _xor(data) if identifier == 1 else None

    return (lambda data, dtype, shape: (1, _xor(data))), decode


@pytest.mark.parametrize("kind", ["xor", "noop"])
def test_codec_round_trip_partial_and_converting_reads(tmp_path, kind):
    """Case "tensor persistence with encoder / decoder", "... with noop encoder / decoder",
    and both "with type coercion": a 16F and a 32F [10, 20, 30] row read whole, into
    [10] and across 16F <-> 32F; the decoder sees the row's own datatype and shape.

    NNC TEST_CASEs covered here:
    "tensor persistence with type coercion and encoder / decoder",
    "tensor persistence with type coercion and noop encoder / decoder".
    """
    seen = []
    encoder, decoder = _codec(kind, seen)
    x32 = _uniform((10, 20, 30), 1)
    x, y = x32.astype(np.float16), _uniform((10, 20, 30), 2)
    path = tmp_path / f"{kind}.sqlite3"
    with TensorFile(path) as f:
        f.write("x", x, encoder=encoder)
        f.write("y", y, encoder=encoder)
        for name, value in (("x", x), ("y", y)):
            assert f.read(name, decoder=decoder).tobytes() == value.tobytes()
            np.testing.assert_array_equal(
                f.read(name, shape=(10,), decoder=decoder), value.ravel()[:10]
            )
        x_as_32 = f.read("x", shape=(10,), dtype=np.float32, decoder=decoder)
        y_as_16 = f.read("y", shape=(10,), dtype=np.float16, decoder=decoder)
    assert x_as_32.dtype == np.float32 and y_as_16.dtype == np.float16
    np.testing.assert_array_equal(x_as_32, x.ravel()[:10].astype(np.float32))
    np.testing.assert_allclose(y_as_16.astype(np.float32), y.ravel()[:10], atol=1e-3)
    identifier = 1 if kind == "xor" else 0
    rows = dict(fetch_rows(path, "SELECT name, data FROM tensors"))
    types = dict(fetch_rows(path, "SELECT name, type FROM tensors"))
    assert types["y"] == (identifier << 32) | 0xFFF01
    assert rows["y"] == (_xor(y.tobytes()) if kind == "xor" else y.tobytes())
    if kind == "xor":
        assert set(seen) == {(np.dtype(t), (10, 20, 30)) for t in (np.float16, np.float32)}


def test_a_declining_decoder_keeps_the_stored_bytes(tmp_path):
    """NNC's read falls back to the stored bytes when decode returns 0 (the noop decoder
    of "tensor persistence with noop encoder / decoder" on an encoded row)."""
    y = _uniform((4, 5), 3)
    with TensorFile(tmp_path / "d.sqlite3") as f:
        f.write("y", y, encoder=lambda data, dtype, shape: (1, _xor(data)))
        got = f.read("y", decoder=lambda i, data, dtype, shape: None)
    assert got.tobytes() == _xor(y.tobytes())


# -- 32F read into 16F: NNC's conversion cuts the mantissa ---------------------------------


@needs_nnc_files
def test_float32_row_read_as_float16_gives_nnc_bits(tmp_path):
    """Case "tensor persistence with type coercion": a 32F row read into a 16F tensor goes
    through ccv_float_to_half_precision, which truncates: NNC's own f16 row stores
    0.0001 as 0x068D (nearest would be 0x068E), -0.3 becomes 0xB4CC (nearest 0xB4CD)."""
    values = np.array([0, 1.5, -2.25, 65504, 0.0001], np.float32)
    with TensorFile(NNC_TENSORS, readonly=True) as nnc:
        nnc_f16 = nnc.read("f16")
    assert nnc_f16.tobytes() == _nnc_half(values).tobytes()  # the oracle is NNC's rule
    more = _uniform((1000,), 4)
    with TensorFile(tmp_path / "c.sqlite3") as f:
        f.write("v", values)
        f.write("more", more)
        assert f.read("v", dtype=np.float16).tobytes() == nnc_f16.tobytes()
        got = f.read("more", dtype=np.float16)
    np.testing.assert_array_equal(got.view(np.uint16), _nnc_half(more).view(np.uint16))


def test_float32_row_read_as_float16_saturates_like_nnc(tmp_path):
    """NNC's table gives 65504 for 65504 <= |x| < 65536 and inf from 65536 on, with no
    warning; fnnc's cast overflows (a RuntimeWarning) to inf from 65520."""
    values = np.array([65519, 65520, 65535.99, -65530, 65536, 1e6], np.float32)
    with TensorFile(tmp_path / "s.sqlite3") as f:
        f.write("v", values)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            got = f.read("v", dtype=np.float16)
    np.testing.assert_array_equal(got, [65504, 65504, 65504, -65504, np.inf, np.inf])
    assert got.tobytes() == _nnc_half(values).tobytes()


# -- names, views, layout ------------------------------------------------------------------


def test_names_round_trip_and_a_rewrite_replaces(tmp_path):
    """Case "tensor persistence" writes and reads by name; NNC's REPLACE INTO makes a second
    write of a name replace the row, datatype and shape included."""
    names = ["x", "", "with space", "a'b\"c", "名前", "__mlp__[t-0-0]", "t-0-1(0)", "%;--"]
    path = tmp_path / "n.sqlite3"
    with TensorFile(path) as f:
        for i, name in enumerate(names):
            f.write(name, np.full((2,), i, np.int32))
        f.write("x", np.ones((3, 2), np.float16))
        assert f.names() == sorted(names)
        for i, name in enumerate(names[1:], 1):
            np.testing.assert_array_equal(f.read(name), [i, i])
        assert f.read("x").dtype == np.float16 and f.read("x").shape == (3, 2)
    assert fetch_rows(path, "SELECT count(*) FROM tensors")[0][0] == len(names)


def test_views_are_written_as_their_contiguous_values(tmp_path):
    """NNC writes only contiguous tensors (its write asserts it); fnnc writes a strided,
    offset, transposed or broadcast view as the row-major values the view shows."""
    base = np.arange(60, dtype=np.float32).reshape(3, 4, 5)
    views = {
        "slice": base[1:3, 1:, ::2],
        "transpose": base.T,
        "broadcast": np.broadcast_to(base[0, 0], (2, 5)),
        "reversed": base[::-1, :, 2],
    }
    path = tmp_path / "v.sqlite3"
    with TensorFile(path) as f:
        for name, view in views.items():
            f.write(name, view)
    rows = dict(fetch_rows(path, "SELECT name, data FROM tensors"))
    dims = dict(fetch_rows(path, "SELECT name, dim FROM tensors"))
    with TensorFile(path, readonly=True) as f:
        for name, view in views.items():
            want = np.ascontiguousarray(view)
            assert rows[name] == want.tobytes() and dims[name] == fmt.pack_dim(view.shape)
            np.testing.assert_array_equal(f.read(name), want)


def test_zero_a_tensor_and_a_strided_view_of_it():
    """Case "zero out a tensor" and "zero out a tensor view": a 6-d [10, 20, 30, 4, 5, 6]
    tensor of ones; the view [8, 12, 15, 2, 3, 4] at offset (1, 2, 5, 1, 1, 1) with the
    tensor's own strides is set to zero, the rest stays one."""
    shape, view, offset = (10, 20, 30, 4, 5, 6), (8, 12, 15, 2, 3, 4), (1, 2, 5, 1, 1, 1)
    stride = tuple(int(np.prod(shape[i + 1 :])) for i in range(len(shape)))
    base = sum(o * s for o, s in zip(offset, stride))  # NNC's rule for a view's start
    assert not np.asarray(ops.set(shape=shape, value=0.0)()).any()
    ones = np.ones(shape, np.float32)
    got = ops.write_view(shape=view, base=base, stride=stride)(ones, np.zeros(view, np.float32))
    want = ones.copy()
    want[tuple(slice(o, o + n) for o, n in zip(offset, view))] = 0
    np.testing.assert_array_equal(np.asarray(got), want)


# -- shapes and sizes ---------------------------------------------------------------------


def test_convolution_shape_rule_with_strides_and_uneven_border():
    """Case "hint tensor": a 234x128x3 input, 128 filters of 4x5, stride (8, 7), border begin
    (1, 1) end (1, 2) gives 30x19x128 (fnnc takes the batch axis NNC leaves implicit)."""
    b = GraphBuilder()
    x = b.input((1, 234, 128, 3))
    w = b.input((128, 4, 5, 3))
    bias = b.input((128,))
    y = b.exec(ops.convolution(strides=(8, 7), padding=((1, 1), (1, 2))), x, w, bias)
    assert y.shape == (1, 30, 19, 128)


def test_palettized_5_bit_size():
    """Case "allocate palettize tensor with quantization to 5-bit": 32F [10, 20, 30] in blocks
    of 512 takes 12 palettes of 32 floats plus 6000 5-bit indices, 5286 bytes, which NNC
    allocates padded to 64: 5312."""
    count = 10 * 20 * 30
    size = encoded_size(np.dtype(np.float32), count, 5, 512)
    assert size == 12 * 32 * 4 + (count * 5 + 7) // 8 == 5286
    assert fmt.padded(size, fmt.CPU_MEMORY) == 5312
    assert len(palettize(_uniform((count,), 5), 5, 512)) == size


# -- graph.io.tests.c -------------------------------------------------------------------


def _sum_product_graph():
    b = GraphBuilder()
    x, y = b.input((1,), name="x"), b.input((1,), name="y")
    z1 = b.exec(ops.ewsum(), x, y, name="sum1")
    z2 = b.exec(ops.ewsum(), x, y, name="sum2")
    return b.build([b.exec(ops.ewprod(), z1, z2, name="prod")])


@pytest.mark.parametrize("where", ["json", "tensor file"])
def test_graph_written_read_and_run(tmp_path, where):
    """Case "write graph (x + y) * (x + y) and read": the graph read back keeps its inputs x
    and y by name and its node names, and computes (10 + 8) * (10 + 8) = 324."""
    graph = _sum_product_graph()
    if where == "json":
        save(graph, tmp_path / "g.json")
        back = load(tmp_path / "g.json")
    else:
        path = tmp_path / "g.sqlite3"
        with TensorFile(path) as f:
            f.write("x", np.array([10], np.float32))
        save(graph, path, name="sum_product")
        back = load(path, name="sum_product")
        with TensorFile(path, readonly=True) as f:
            assert f.names() == ["x"]  # the graph sits beside the tensors
    assert back == graph
    assert [back.symbols[i].name for i in back.inputs] == ["x", "y"]
    assert [n.name for n in back.nodes] == ["sum1", "sum2", "prod"]
    x, y = np.array([10], np.float32), np.array([8], np.float32)
    np.testing.assert_allclose(np.asarray(compile(back)(x, y)), [324], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(interpret(back, x, y)), [324], rtol=1e-6)
