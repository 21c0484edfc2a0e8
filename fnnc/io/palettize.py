"""NNC's palettization: ``ccv_nnc_palettize`` / ``ccv_nnc_depalettize``, ported bit for bit.

A tensor is cut into blocks of ``block_size`` elements; each block stores a palette of
``2**bits`` values (in the tensor's own dtype) and, per element, the ``bits``-bit index
of its palette entry, packed most significant bit first (a block's last group of
indices is padded with zeros to whole bytes)::

    block i at (2**bits * itemsize + block_size * bits // 8) * i:
        palette   2**bits elements of the tensor's dtype
        indices   ceil(n_i * bits / 8) bytes (whole groups of 8 / gcd(8, bits) indices)

The palette is the optimal 1-D k-means of the block (``ccv_kmeans1d``: a sort, a
dynamic program over the sorted values whose row minima SMAWK finds, and a
backtrack). This port replays the same floating-point operations in the same order
and breaks ties as the C code does (its quicksort included), so the bytes match what
NNC writes for float64, float32 and float16 blocks. Two places where the C code has no
defined result are made definite here: palette entries a block cannot fill (fewer
distinct values than ``2**bits``: NNC leaves them uninitialised) are 0, and bfloat16
blocks are clustered as float32 values (the ``ccv_kmeans1d`` this follows reads only
16F, 32F and 64F) with centroids rounded to nearest-even.

Float16 values convert to float32 and back with NNC's tables (``ccv_util.c``): the
float-to-half direction truncates instead of rounding, as NNC's does.

Decoding is vectorised (about 0.25 s of CPU per million elements at 8 bits). Encoding
runs the k-means in Python, one block at a time: about 0.04 s per 4-bit block of 512,
5 s per 8-bit block of 4096 and some 20 s per 8-bit block of 16384 (s4nnc's ``q8p``),
so palettizing large tensors with fnnc is slow; reading them is not.

>>> import numpy as np
>>> from fnnc.io.palettize import depalettize, palettize
>>> x = np.tile(np.arange(16, dtype=np.float32), 8)
>>> blob = palettize(x, bits=4, block_size=128)
>>> len(blob), bool((depalettize(blob, np.float32, x.size, 4, 128) == x).all())
(128, True)
"""

from __future__ import annotations

import math
import numbers

import ml_dtypes
import numpy as np

BITS = (4, 5, 6, 7, 8)
"""Index widths NNC palettizes with (``q4p`` .. ``q8p``)."""

FLOATS = (
    np.dtype(np.float16),
    np.dtype(ml_dtypes.bfloat16),
    np.dtype(np.float32),
    np.dtype(np.float64),
)


# -- NNC's half-precision conversions (ccv_util.c) ---------------------------------------
def _float_to_half_tables() -> tuple[np.ndarray, np.ndarray]:
    """``_ccv_base_table`` / ``_ccv_shift_table``: float32 exponent -> half base, shift."""
    base = np.zeros(512, np.uint32)
    shift = np.zeros(512, np.uint32)
    for i in range(256):
        e = i - 127
        if e < -24:  # too small: signed zero
            b, s = 0x0000, 24
        elif e < -14:  # a half denormal
            b, s = 0x0400 >> (-e - 14), -e - 1
        elif e <= 15:  # a normal half
            b, s = (e + 15) << 10, 13
        elif e < 128:  # too large: infinity
            b, s = 0x7C00, 24
        else:  # infinity and NaN keep their mantissa's top bits
            b, s = 0x7C00, 13
        base[i], base[i | 0x100] = b, b | 0x8000
        shift[i], shift[i | 0x100] = s, s
    return base, shift


_BASE, _SHIFT = _float_to_half_tables()


def float_to_half(values: np.ndarray) -> np.ndarray:
    """``ccv_float_to_half_precision``: float32 -> float16 bits, truncating (not rounding),
    in the shape of ``values`` (a 0-d array stays 0-d)."""
    u = np.ascontiguousarray(values, np.float32).view(np.uint32)  # 0-d becomes [1] here
    e = (u >> 23) & 0x1FF
    half = (_BASE[e] + ((u & 0x007FFFFF) >> _SHIFT[e])).astype(np.uint16).view(np.float16)
    return half.reshape(np.shape(values))


def half_to_float(values: np.ndarray) -> np.ndarray:
    """``ccv_half_precision_to_float`` (exact, as NumPy's conversion is)."""
    return np.asarray(values, np.float16).astype(np.float32)


# -- ccv_kmeans1d -------------------------------------------------------------------------
def _lt(a: tuple[float, int], b: tuple[float, int]) -> bool:
    return a[0] < b[0]


def _median3(x: list, a: int, b: int, c: int) -> int:
    if _lt(x[a], x[b]):
        return b if _lt(x[b], x[c]) else (c if _lt(x[a], x[c]) else a)
    return b if _lt(x[c], x[b]) else (a if _lt(x[a], x[c]) else c)


def _insertion_sort(x: list, left: int, right: int) -> None:
    for ptr in range(left + 1, right + 1):
        ptr2 = ptr
        while ptr2 > left and _lt(x[ptr2], x[ptr2 - 1]):
            x[ptr2], x[ptr2 - 1] = x[ptr2 - 1], x[ptr2]
            ptr2 -= 1


def ccv_qsort(x: list) -> None:
    """``CCV_IMPLEMENT_QSORT`` (OpenCV's introsort-like quicksort) on ``(value, index)``
    pairs by value, in place: the order it leaves equal values in decides which of them
    share a cluster when a cluster boundary falls inside a run of equal values."""
    if len(x) <= 1:
        return
    stack = [(0, len(x) - 1)]
    while stack:
        left, right = stack.pop()
        while True:
            n = right - left + 1
            if n <= 7:
                _insertion_sort(x, left, right)
                break
            left0, right0, pivot = left, right, left + n // 2
            if n > 40:
                d = n // 8
                left = _median3(x, left, left + d, left + 2 * d)
                pivot = _median3(x, pivot - d, pivot, pivot + d)
                right = _median3(x, right - 2 * d, right - d, right)
            pivot = _median3(x, left, pivot, right)
            if pivot != left0:
                x[pivot], x[left0] = x[left0], x[pivot]
                pivot = left0
            left = left1 = left0 + 1
            right = right1 = right0
            swapped = False
            while True:
                while left <= right and not _lt(x[pivot], x[left]):
                    if not _lt(x[left], x[pivot]):
                        if left > left1:
                            x[left1], x[left] = x[left], x[left1]
                        swapped = True
                        left1 += 1
                    left += 1
                while left <= right and not _lt(x[right], x[pivot]):
                    if not _lt(x[pivot], x[right]):
                        if right < right1:
                            x[right1], x[right] = x[right], x[right1]
                        swapped = True
                        right1 -= 1
                    right -= 1
                if left > right:
                    break
                x[left], x[right] = x[right], x[left]
                swapped = True
                left += 1
                right -= 1
            if not swapped:
                _insertion_sort(x, left0, right0)
                break
            m = min(left1 - left0, left - left1)
            for i in range(m):
                x[left0 + i], x[left - m + i] = x[left - m + i], x[left0 + i]
            m = min(right0 - right1, right1 - right)
            for i in range(m):
                x[left + i], x[right0 - m + 1 + i] = x[right0 - m + 1 + i], x[left + i]
            n, m = left - left1, right1 - right
            if n > 1:
                if m > 1:
                    if n > m:
                        stack.append((left0, left0 + n - 1))
                        left, right = right0 - m + 1, right0
                    else:
                        stack.append((right0 - m + 1, right0))
                        left, right = left0, left0 + n - 1
                else:
                    left, right = left0, left0 + n - 1
            elif m > 1:
                left, right = right0 - m + 1, right0
            else:
                break


def _sorted_pairs(values: np.ndarray) -> list[tuple[float, int]]:
    """The block's ``(value, index)`` pairs in the order NNC's sort leaves them."""
    if np.unique(values).size == values.size and not np.isnan(values).any():
        order = np.argsort(values, kind="stable")  # distinct values: one possible order
        return list(zip(values[order].tolist(), order.tolist(), strict=True))
    pairs = list(zip(values.tolist(), range(values.size), strict=True))
    ccv_qsort(pairs)
    return pairs


def kmeans1d(values: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """``ccv_kmeans1d``: the optimal ``k``-clustering of 1-D ``values`` (float64).

    Returns:
        ``(clusters, centroids)``: each value's cluster (int) and each cluster's mean
        (float64; 0 for clusters a block with fewer than ``k`` values leaves empty).
    """
    n = values.size
    pairs = _sorted_pairs(np.asarray(values, np.float64))
    v = [p[0] for p in pairs]
    cs, cs2 = [0.0] * (n + 1), [0.0] * (n + 1)
    s = s2 = 0.0
    for i, x in enumerate(v):
        s += x
        s2 += x * x
        cs[i + 1], cs2[i + 1] = s, s2

    def cost(i: int, j: int) -> float:  # of the cluster v[i..j]; the C code's order of operations
        if j < i:
            return 0.0
        w = cs[j + 1] - cs[i]
        mu = w / (j - i + 1)
        r = cs2[j + 1] - cs2[i]
        r += (j - i + 1) * (mu * mu)
        r -= (2 * mu) * w
        return r

    D = [cost(0, i) for i in range(n)]
    T = [[0] * n]
    for _ in range(1, k):
        argmins = _smawk(n, D, cs, cs2)
        T.append(argmins)
        D = [
            D[i] + 0.0 if j > i else (D[j - 1] if j > 0 else 0.0) + cost(j, i)
            for i, j in enumerate(argmins)
        ]
    cols = [0] * n
    centroids = np.zeros(k, np.float64)
    t, kk, row = n, k - 1, n - 1
    while True:
        end, t = t, T[kk][row]
        centroid = 0.0
        for i in range(t, end):
            cols[i] = kk
            centroid += (v[i] - centroid) / (i - t + 1)
        centroids[kk] = centroid
        kk, row = kk - 1, t - 1
        if t <= 0:
            break
    clusters = np.zeros(n, np.int64)
    clusters[[p[1] for p in pairs]] = cols
    return clusters, centroids


def _smawk(n: int, D: list[float], cs: list[float], cs2: list[float]) -> list[int]:
    """The row minima, as NNC's ``smawk`` finds them, of ``M[i][j] = D[min(i, j - 1)] +
    cost(j, i)`` (``D[-1]`` is 0): the best start ``j`` of the last cluster ending at ``i``."""
    result = [0] * n

    def lookup(i: int, j: int) -> float:  # _kmeans1d_lookup with the cost inlined
        if j > i:
            return D[i] + 0.0
        w = cs[i + 1] - cs[j]
        mu = w / (i - j + 1)
        r = cs2[i + 1] - cs2[j]
        r += (i - j + 1) * (mu * mu)
        r -= (2 * mu) * w
        return (D[j - 1] if j > 0 else 0.0) + r

    def solve(
        row_start: int, row_stride: int, row_size: int, cols: list[int] | range, reduce: bool
    ) -> None:
        if row_size == 0:
            return
        kept: list[int] | range = cols
        if reduce:  # _smawk1 / _smawk2: drop columns that hold no row minimum
            kept = []
            for col in cols:
                while kept:
                    row = row_start + row_stride * (len(kept) - 1)
                    if lookup(row, col) >= lookup(row, kept[-1]):
                        break
                    kept.pop()
                if len(kept) < row_size:
                    kept.append(col)
        solve(row_start + row_stride, row_stride * 2, row_size // 2, kept, True)
        where = {c: i for i, c in enumerate(kept)} if reduce else None
        start = 0
        for i in range(0, row_size, 2):  # the even rows, between their neighbours' minima
            row = row_start + i * row_stride
            stop = len(kept) - 1
            if i < row_size - 1:
                above = result[row_start + (i + 1) * row_stride]
                stop = where[above] if where is not None else above
            argmin = kept[start]
            best = lookup(row, argmin)
            for c in range(start + 1, stop + 1):
                value = lookup(row, kept[c])
                if value < best:
                    argmin, best = kept[c], value
            result[row] = argmin
            start = stop

    solve(0, 1, n, range(n), False)  # _smawk0: every column, no REDUCE at the top
    return result


# -- ccv_nnc_palettize / ccv_nnc_depalettize ------------------------------------------------
def _group(bits: int) -> tuple[int, int]:
    """``(indices, bytes)`` in one packed group of ``bits``-bit indices."""
    count = 8 // math.gcd(8, bits)
    return count, count * bits // 8


def encoded_size(dtype: np.dtype, count: int, bits: int, block_size: int) -> int:
    """Bytes ``palettize`` writes for ``count`` elements (NNC's returned size)."""
    blocks = -(-count // block_size)
    group, group_bytes = _group(bits)
    return dtype.itemsize * blocks * (1 << bits) + -(-count // group) * group_bytes


def _whole(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def _check(dtype: np.dtype, bits: int, block_size: int, count: int = 0) -> None:
    if dtype not in FLOATS:
        raise ValueError(f"palettize takes float16, bfloat16, float32 or float64, not {dtype}")
    if not _whole(bits) or bits not in BITS:
        raise ValueError(f"palettize takes 4 to 8 bits (an int), not {bits!r}")
    if not _whole(count) or count < 0:
        raise ValueError(f"the element count must be an int >= 0, not {count!r}")
    group = _group(bits)[0]
    if not _whole(block_size) or block_size <= 0 or block_size % group:
        raise ValueError(
            f"block size {block_size!r} must be a positive int, a multiple of {group} for "
            f"{bits} bits"
        )


def palettize(array: np.ndarray, bits: int, block_size: int) -> bytes:
    """``ccv_nnc_palettize``: the palettized bytes of ``array`` (flattened)."""
    values = np.ascontiguousarray(array).reshape(-1)
    dtype = values.dtype
    _check(dtype, bits, block_size)
    k = 1 << bits
    if dtype == np.float16:
        wide = half_to_float(values).astype(np.float64)
    else:
        wide = values.astype(np.float64)
    stride = k * dtype.itemsize + block_size * bits // 8
    out = bytearray(encoded_size(dtype, values.size, bits, block_size))
    for b, start in enumerate(range(0, values.size, block_size)):
        clusters, centroids = kmeans1d(wide[start : start + block_size], k)
        if dtype == np.float16:
            palette = float_to_half(centroids.astype(np.float32))
        else:
            palette = (
                centroids.astype(np.float32).astype(dtype) if dtype != np.float64 else centroids
            )
        packed = _pack(clusters, bits)
        at = stride * b
        out[at : at + k * dtype.itemsize] = palette.tobytes()
        at += k * dtype.itemsize
        out[at : at + len(packed)] = packed
    return bytes(out)


def _pack(indices: np.ndarray, bits: int) -> bytes:
    group = _group(bits)[0]
    padded = np.zeros(-(-indices.size // group) * group, np.uint8)
    padded[: indices.size] = indices
    bitstream = np.unpackbits(padded[:, None], axis=1)[:, 8 - bits :]
    return np.packbits(bitstream.reshape(-1)).tobytes()


def _unpack(data: np.ndarray, bits: int, count: int) -> np.ndarray:
    bitstream = np.unpackbits(data).reshape(-1, bits)[:count]
    weights = (1 << np.arange(bits - 1, -1, -1)).astype(np.int64)
    return bitstream.astype(np.int64) @ weights


def depalettize(data: bytes, dtype: np.dtype, count: int, bits: int, block_size: int) -> np.ndarray:
    """``ccv_nnc_depalettize``: ``count`` elements of ``dtype`` from palettized bytes.

    ``data`` may stop at the last index's last bit, as NNC's writer stores a QX tensor
    (its ``ccv_nnc_tensor_data_size_without_padding``, shorter than ``palettize``'s bytes
    by the zero padding of the last group of 5-, 6- or 7-bit indices).

    Raises:
        ValueError: ``data`` is shorter than ``count`` elements need, or the parameters
            are not ones NNC palettizes with.
    """
    dtype = np.dtype(dtype)
    _check(dtype, bits, block_size, count)
    need = encoded_size(dtype, count, bits, block_size)
    # NNC stores a QX tensor's ccv_nnc_tensor_data_size_without_padding: the last group of
    # indices cut to the bytes its bits fill (5, 6, 7 bits), the zero padding left out.
    least = dtype.itemsize * -(-count // block_size) * (1 << bits) + -(-count * bits // 8)
    if len(data) < least:
        raise ValueError(
            f"{len(data)} bytes hold no {count} elements palettized to {bits} bits in blocks "
            f"of {block_size} ({least} bytes needed)"
        )
    if len(data) < need:
        data = bytes(data) + bytes(need - len(data))
    k = 1 << bits
    raw = np.frombuffer(data, np.uint8)
    stride = k * dtype.itemsize + block_size * bits // 8
    full, rest = divmod(count, block_size)
    out = np.empty(count, dtype)
    if full:
        blocks = raw[: stride * full].reshape(full, stride)
        palettes = blocks[:, : k * dtype.itemsize].copy().view(dtype)
        indices = _unpack(blocks[:, k * dtype.itemsize :].reshape(-1), bits, full * block_size)
        out[: full * block_size] = np.take_along_axis(
            palettes, indices.reshape(full, block_size), axis=1
        ).reshape(-1)
    if rest:
        at = stride * full
        palette = raw[at : at + k * dtype.itemsize].copy().view(dtype)
        tail = raw[at + k * dtype.itemsize : need]
        out[full * block_size :] = palette[_unpack(tail, bits, rest)]
    return out
