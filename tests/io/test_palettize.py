"""NNC's palettization (ccv_nnc_palettize.c) and the pieces it is made of, against NNC's
own unit-test vectors and independent oracles (a brute-force k-means DP, hand-packed
blobs written with the C code's bit formulas, the IEEE bit layout of float16). Every
case of test/unit/nnc/palettize.tests.c ("... on CPU losslessly") and of
test/int/nnc/palettize.tests.c ("... on GPU losslessly") runs under its C name."""

import functools
import struct
from unittest import mock

import jax
import ml_dtypes
import numpy as np
import pytest

from fnnc.io import palettize as palettize_module
from fnnc.io.palettize import (
    ccv_qsort,
    depalettize,
    encoded_size,
    float_to_half,
    half_to_float,
    kmeans1d,
    palettize,
)


def _lut(bits):
    """The palettes of test/unit/nnc/palettize.tests.c (C pads short initialisers with 0)."""
    if bits == 4:
        return [float(i) for i in range(1, 16)] + [0.0]
    if bits == 5:
        return [float(i) for i in range(1, 16)] + [-float(i) for i in range(1, 16)] + [0.0] * 2
    return [float(i) for i in range(1 << bits)]


# (bits, block size, index bytes for 2839 values, blocks) from NNC's unit tests, e.g.
# "quantize float to 5-bit ...": ccv_nnc_palettize(..., 2839, 5, 128, ...) == 1775 + 23 * 32 * 4
NNC_CASES = [(4, 128, 1420, 23), (5, 128, 1775, 23), (6, 512, 2130, 6)]
NNC_SLOW = [(7, 512, 2485, 6), (8, 1280, 2839, 3)]


def _nnc_values(bits, count, dtype):
    lut = np.array(_lut(bits), np.float32)
    values = lut[np.arange(count) % lut.size]
    if dtype == np.float16:  # the test converts its float LUT with ccv_float_to_half_precision
        return float_to_half(values)
    return values.astype(dtype)


_KMEANS = {}


def _kmeans_once(values, k):
    """``kmeans1d``, computed once per distinct block: NNC's test vectors repeat their
    palette, so most blocks of a case, and the same blocks in another dtype or count,
    are the same values (the k-means itself is checked against brute force below)."""
    key = (values.tobytes(), k)
    if key not in _KMEANS:
        _KMEANS[key] = kmeans1d(values, k)
    clusters, centroids = _KMEANS[key]
    return clusters.copy(), centroids.copy()


@functools.cache
def _nnc_blob(bits, block, dtype, count):
    """NNC's test values and their palettized bytes, made once per case and shared by
    the CPU and the "on GPU" cases."""
    values = _nnc_values(bits, count, dtype)
    with mock.patch.object(palettize_module, "kmeans1d", _kmeans_once):
        return values, palettize(values, bits, block)


def _check_nnc_case(bits, block, index_bytes, blocks, dtype, count):
    values, blob = _nnc_blob(bits, block, dtype, count)
    if bits == 8:  # "fast path" cases write 2840 index bytes
        index_bytes = count
    assert len(blob) == index_bytes + blocks * (1 << bits) * np.dtype(dtype).itemsize
    assert len(blob) == encoded_size(np.dtype(dtype), count, bits, block)
    back = depalettize(blob, dtype, count, bits, block)
    assert back.tobytes() == values.tobytes()  # "should be lossless"


@pytest.mark.parametrize("count", [2839, 2840])
@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16])
@pytest.mark.parametrize("case", NNC_CASES, ids=lambda c: f"q{c[0]}")
def test_nnc_unit_test_vectors_round_trip_losslessly_with_nnc_sizes(case, dtype, count):
    """NNC TEST_CASEs covered here:
    "quantize double to 5-bit and dequantize on CPU losslessly",
    "quantize float to 5-bit and dequantize on CPU losslessly",
    "quantize half-precision to 5-bit and dequantize on CPU losslessly",
    "quantize double to 5-bit and dequantize on CPU losslessly, fast path",
    "quantize float to 5-bit and dequantize on CPU losslessly, fast path",
    "quantize half-precision to 5-bit and dequantize on CPU losslessly, fast path",
    "quantize double to 6-bit and dequantize on CPU losslessly",
    "quantize float to 6-bit and dequantize on CPU losslessly",
    "quantize half-precision to 6-bit and dequantize on CPU losslessly",
    "quantize double to 6-bit and dequantize on CPU losslessly, fast path",
    "quantize float to 6-bit and dequantize on CPU losslessly, fast path",
    "quantize half-precision to 6-bit and dequantize on CPU losslessly, fast path".
    """
    _check_nnc_case(*case, dtype, count)


@pytest.mark.slow
@pytest.mark.parametrize("case", NNC_SLOW, ids=lambda c: f"q{c[0]}")
def test_nnc_unit_test_vectors_7_and_8_bits(case):
    _check_nnc_case(*case, np.float16, 2839)


# -- the C cases by name: test/unit/nnc/palettize.tests.c ("... on CPU losslessly") and
# test/int/nnc/palettize.tests.c ("... on GPU losslessly"); ", fast path" is 2840 values

C_TYPES = {"double": np.float64, "float": np.float32, "half-precision": np.float16}
C_CASES = {case[0]: case for case in NNC_CASES + NNC_SLOW}


def _c_cases(bits_list, sides, marks=()):
    """One pytest case per C test, with the C test's name as its id."""
    return [
        pytest.param(
            bits,
            name,
            count,
            id=f"quantize {name} to {bits}-bit and dequantize on {side} losslessly"
            + (", fast path" if count == 2840 else ""),
            marks=marks,
        )
        for side in sides
        for bits in bits_list
        for name in C_TYPES
        for count in (2839, 2840)
    ]


@pytest.mark.parametrize("bits, name, count", _c_cases([7, 8], ["CPU"]))
def test_quantize_to_7_and_8_bits_and_dequantize_on_cpu_losslessly(bits, name, count):
    """NNC's "quantize double to 7-bit and dequantize on CPU losslessly", "quantize float
    to 7-bit and dequantize on CPU losslessly", "quantize half-precision to 7-bit and
    dequantize on CPU losslessly", the same "to 8-bit", and each one's ", fast path"
    (2840 values): the sizes NNC returns (e.g. 2485 + 6 * 128 * 8 for double at 7 bits,
    2840 + 3 * 256 * 2 for half-precision at 8 bits, fast path) and a lossless round trip.

    NNC TEST_CASEs covered here:
    "quantize double to 8-bit and dequantize on CPU losslessly",
    "quantize float to 8-bit and dequantize on CPU losslessly",
    "quantize half-precision to 8-bit and dequantize on CPU losslessly",
    "quantize double to 8-bit and dequantize on CPU losslessly, fast path",
    "quantize float to 8-bit and dequantize on CPU losslessly, fast path",
    "quantize half-precision to 8-bit and dequantize on CPU losslessly, fast path".
    """
    _check_nnc_case(*C_CASES[bits], C_TYPES[name], count)


def _through_device(blob: bytes) -> bytes:
    """The C tests' transfer: the bytes in a float32 tensor of ``(size + 3) / 4`` elements
    (``CPU_TENSOR_NCHW(32F, ...)``), copied to the device and read from there."""
    words = np.zeros((len(blob) + 3) // 4, np.float32)
    words.view(np.uint8)[: len(blob)] = np.frombuffer(blob, np.uint8)
    on_device = jax.device_put(words)
    assert on_device.dtype == np.float32 and on_device.shape == words.shape
    return np.asarray(on_device).tobytes()


@pytest.mark.parametrize(
    "bits, name, count",
    _c_cases([4, 5, 6], ["GPU"]) + _c_cases([7, 8], ["GPU"]),
)
def test_quantize_and_dequantize_on_gpu_losslessly(bits, name, count):
    """test/int/nnc/palettize.tests.c: "quantize double to 4-bit and dequantize on GPU
    losslessly", "quantize float to 4-bit and dequantize on GPU losslessly", "quantize
    half-precision to 4-bit and dequantize on GPU losslessly", the same to 5-, 6-, 7- and
    8-bit, and each one's ", fast path" (2840 values). NNC palettizes on the CPU into a
    float32 tensor's storage, transfers it to the GPU, depalettizes from device memory
    and transfers the values back; fnnc's depalettize reads host bytes, so the blob goes
    to the device as NNC's float32 words and back (bit for bit, padding included), is
    decoded, and the values make the same round trip: equal to NNC's inputs, with the
    size NNC returns."""
    _, block, index_bytes, blocks = C_CASES[bits]
    dtype = np.dtype(C_TYPES[name])
    values, blob = _nnc_blob(bits, block, dtype.type, count)
    index_bytes = count if bits == 8 else index_bytes
    assert len(blob) == index_bytes + blocks * (1 << bits) * dtype.itemsize
    padded = _through_device(blob)
    assert len(padded) == 4 * ((len(blob) + 3) // 4) and padded[: len(blob)] == blob
    decoded = depalettize(padded, dtype, count, bits, block)
    back = np.asarray(jax.device_put(decoded.view(np.uint8))).view(dtype)
    assert back.dtype == dtype and back.tobytes() == values.tobytes()  # "should be lossless"


def _pack_like_c(indices, bits):
    """The index bytes as ccv_nnc_palettize writes them, formula by formula."""
    i = list(indices) + [0] * 8
    out = []
    if bits == 4:
        for j in range(0, len(indices), 2):
            out.append((i[j] << 4) | i[j + 1])
    elif bits == 5:
        for j in range(0, len(indices), 8):
            a = i[j : j + 8]
            out += [
                (a[0] << 3) | (a[1] >> 2),
                (a[1] << 6) | (a[2] << 1) | (a[3] >> 4),
                (a[3] << 4) | (a[4] >> 1),
                (a[4] << 7) | (a[5] << 2) | (a[6] >> 3),
                (a[6] << 5) | a[7],
            ]
    elif bits == 6:
        for j in range(0, len(indices), 4):
            a = i[j : j + 4]
            out += [(a[0] << 2) | (a[1] >> 4), (a[1] << 4) | (a[2] >> 2), (a[2] << 6) | a[3]]
    elif bits == 7:
        for j in range(0, len(indices), 8):
            a = i[j : j + 8]
            out += [(a[m] << (m + 1)) | (a[m + 1] >> (6 - m)) for m in range(7)]
    else:
        out = list(indices)
    return bytes(b & 0xFF for b in out)


@pytest.mark.parametrize("bits", [4, 5, 6, 7, 8])
@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float32, np.float64])
def test_decodes_blobs_packed_with_the_c_formulas(bits, dtype):
    rng = np.random.default_rng(bits)
    block, count, k = 16, 37, 1 << bits  # three full blocks and a ragged one of 5
    dtype = np.dtype(dtype)
    blob, want = b"", []
    for start in range(0, count, block):
        n = min(block, count - start)
        palette = rng.standard_normal(k).astype(dtype)
        indices = rng.integers(0, k, n)
        packed = _pack_like_c(indices, bits)
        full = block * bits // 8
        blob += palette.tobytes() + packed + (b"" if n < block else bytes(full - len(packed)))
        want.append(palette[indices])
    got = depalettize(blob, dtype, count, bits, block)
    assert got.tobytes() == np.concatenate(want).tobytes()
    assert palettize(np.concatenate(want), bits, block)[: k * dtype.itemsize]  # encodes too


def _optimal_sse(values, k):
    """The least total squared error of k contiguous clusters of sorted values (O(k n^2))."""
    v = np.sort(values)
    n = v.size
    best = np.full(n + 1, np.inf)
    best[0] = 0.0
    for _ in range(k):
        nxt = np.full(n + 1, np.inf)
        nxt[0] = 0.0
        for end in range(1, n + 1):
            seg = [best[s] + ((v[s:end] - v[s:end].mean()) ** 2).sum() for s in range(end)]
            nxt[end] = min(min(seg), best[end])
        best = nxt
    return best[n]


@pytest.mark.parametrize("seed", range(4))
def test_kmeans1d_is_optimal_and_contiguous(seed):
    rng = np.random.default_rng(seed)
    values = rng.standard_normal(40) * rng.choice([1, 100])
    if seed % 2:
        values = np.round(values, 1)  # ties: equal values and equal costs
    k = 5
    clusters, centroids = kmeans1d(values, k)
    sse = sum(((values[clusters == c] - centroids[c]) ** 2).sum() for c in range(k))
    assert sse == pytest.approx(_optimal_sse(values, k), rel=1e-9, abs=1e-12)
    order = np.argsort(values, kind="stable")
    assert (np.diff(clusters[order]) >= 0).all()  # clusters follow the sorted order
    for c in range(k):
        if (clusters == c).any():
            assert centroids[c] == pytest.approx(values[clusters == c].mean(), rel=1e-12)


def test_ccv_qsort_sorts_with_many_duplicates():
    rng = np.random.default_rng(0)
    for n in (0, 1, 7, 8, 41, 300):
        values = rng.integers(0, 5, n).astype(float).tolist()
        pairs = list(zip(values, range(n)))
        ccv_qsort(pairs)
        assert [p[0] for p in pairs] == sorted(values)
        assert sorted(p[1] for p in pairs) == list(range(n))


def test_float_to_half_truncates_as_nnc_does():
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(20000) * 100).astype(np.float32)
    x = x[(np.abs(x) >= 2.0**-14) & (np.abs(x) < 65504)]  # normal halves
    u = x.view(np.uint32).astype(np.int64)
    exp = ((u >> 23) & 0xFF) - 127 + 15
    want = ((u >> 31) << 15) | (exp << 10) | ((u & 0x7FFFFF) >> 13)  # mantissa cut, not rounded
    assert (float_to_half(x).view(np.uint16) == want).all()
    assert float_to_half(np.float32([1 + 0.75 * 2**-10])).view(np.uint16)[0] == 0x3C00
    assert float_to_half(np.float32([1e6, -1e6, 1e-9])).view(np.uint16).tolist() == [
        0x7C00,
        0xFC00,
        0,
    ]
    h = np.arange(0x7C00, dtype=np.uint16).view(np.float16)
    assert (half_to_float(h) == h.astype(np.float32)).all()
    assert (float_to_half(half_to_float(h)).view(np.uint16) == np.arange(0x7C00)).all()


@pytest.mark.parametrize("bits", [4, 6])
def test_palettize_round_trip_maps_each_value_to_its_centroid(bits):
    rng = np.random.default_rng(bits)
    x = rng.standard_normal(300).astype(np.float32)
    back = depalettize(palettize(x, bits, 128), np.float32, x.size, bits, 128)
    for start in range(0, x.size, 128):
        block = x[start : start + 128].astype(np.float64)
        clusters, centroids = kmeans1d(block, 1 << bits)
        assert (back[start : start + 128] == centroids[clusters].astype(np.float32)).all()
    assert np.abs(back - x).max() < (0.3 if bits == 4 else 0.1)


def test_bad_parameters_and_short_blobs_raise():
    with pytest.raises(ValueError, match="4 to 8 bits"):
        palettize(np.zeros(8, np.float32), 3, 8)
    with pytest.raises(ValueError, match="multiple of 8"):
        depalettize(bytes(1000), np.float32, 8, 5, 12)
    with pytest.raises(ValueError, match="float16, bfloat16"):
        palettize(np.zeros(8, np.int32), 4, 8)
    need = encoded_size(np.dtype(np.float32), 100, 4, 64)
    with pytest.raises(ValueError, match=f"{need} bytes needed"):
        depalettize(bytes(need - 1), np.float32, 100, 4, 64)
    assert struct.calcsize("<I") == 4
