"""Audit 12 (nnccmd12): NNC's command unit tests and CPU reference kernels
(liuliu/ccv ``test/unit/nnc/*.tests.c``, ``lib/nnc/cmd/*/*_cpu_ref.c``) against fnnc's
commands, for the cases earlier ports left out."""

from __future__ import annotations

import numpy as np
import pytest

from fnnc import ops
from fnnc.errors import CommandError

f32 = np.float32


def _nnc_even_histogram(x: np.ndarray, bins: int, lo: float, hi: float) -> np.ndarray:
    """``_ccv_nnc_tensor_histogram_even`` of histogram_cpu_ref.c: ``range = bins / (max -
    min)`` and ``(int)((av - min) * range) + 1``, every step a C float."""
    mn, mx = f32(lo), f32(hi)
    scale = f32(f32(bins) / f32(mx - mn))
    counts = np.zeros(bins + 3, np.int64)
    for av in x.astype(f32).ravel():
        if np.isnan(av):
            counts[bins + 2] += 1
        elif av < mn:
            counts[0] += 1
        elif av >= mx:
            counts[bins + 1] += 1
        else:
            idx = int(f32(f32(av - mn) * scale)) + 1
            counts[min(max(idx, 1), bins)] += 1
    return counts


@pytest.mark.parametrize(
    "bins, lo, hi",
    [(8, 0.8972988942744877, 1.8396749357858393), (21, 0.09918737534611899, 0.1915891239428934)],
)
def test_even_histogram_bins_edge_values_as_nncs_float_range(bins, lo, hi):
    """Values at and one ulp around each float32 bin edge land in NNC's bins: the scale was
    the double ``bins / (max - min)`` rounded once, which moved some of them a bin over."""
    edges = f32(lo) + np.arange(bins + 1, dtype=f32) * f32((f32(hi) - f32(lo)) / bins)
    x = np.concatenate([edges, np.nextafter(edges, f32(np.inf)), np.nextafter(edges, -f32(np.inf))])
    counts, _ = ops.histogram(bins=bins, min=lo, max=hi)(x.astype(f32))
    np.testing.assert_array_equal(np.asarray(counts), _nnc_even_histogram(x, bins, lo, hi))


def test_even_histogram_refuses_a_range_empty_in_float32():
    """NNC stores min and max as floats and asserts max > min: 1 and 1 + 1e-9 are one float."""
    with pytest.raises(CommandError, match="float32"):
        ops.histogram(bins=4, min=1.0, max=1.0 + 1e-9)(np.ones(3, f32))


def _nnc_log_counts(x: np.ndarray, lo: float, hi: float, rate: float) -> np.ndarray:
    """histogram_cpu_ref.c's logarithmic layout and binning, every step a C float:
    ``upper_range = ceilf(logf(max / min) * log_base)``, ``log_base = 1.0 / logf(rate)``,
    and ``idx = ceilf(logf(|v| * min_inv) * log_base)`` from the middle count."""
    mn, mx, r = f32(lo), f32(hi), f32(rate)
    log_base = f32(1.0 / float(np.log(r)))
    side = int(np.ceil(np.log(mx / mn) * log_base))
    min_inv = f32(1.0 / float(mn))
    counts = np.zeros(2 * side + 2, np.int64)
    for v in x.astype(f32).ravel():
        if np.isnan(v):
            counts[2 * side + 1] += 1
        elif v >= mx:
            counts[2 * side] += 1
        elif v <= -mx:
            counts[0] += 1
        elif -mn < v < mn:
            counts[side] += 1
        else:
            idx = int(np.ceil(np.log(f32(abs(v) * min_inv)) * log_base))
            idx = side + idx if v > 0 else side - idx
            counts[min(max(idx, 0), 2 * side)] += 1
    return counts


def test_logarithmic_histogram_has_nncs_float_count_and_bins():
    """rate=1.001 over [1e-12, 1e20]: NNC's float layout has 2 * 73717 + 2 counts, the
    double ceil(log(max / min) / log(rate)) gave 73720 a side; values away from the
    bin edges (mid-bin in log space) land in NNC's bins."""
    lo, hi, rate = 1e-12, 1e20, 1.001
    side = 73717
    rng = np.random.default_rng(0)
    mid = f32(lo) * f32(rate) ** (rng.integers(1, side, 40) - 0.5)
    x = np.concatenate([mid, -mid[:20], [0.0, 5e-13, 2e20, -3e20, np.nan]]).astype(f32)
    counts, _ = ops.histogram(type="logarithmic", min=lo, max=hi, rate=rate)(x)
    want = _nnc_log_counts(x, lo, hi, rate)
    assert want.shape == (2 * side + 2,)
    np.testing.assert_array_equal(np.asarray(counts), want)


@pytest.mark.parametrize(
    "lo, hi, rate, values",
    [
        (1.0, 100.0, 10.0, [1, 10, -1, -10, 0.5, 50]),
        (2.0**-3, 8.0, 2.0, [2.0**k for k in range(-3, 3)] + [-(2.0**k) for k in range(-3, 3)]),
    ],
)
def test_logarithmic_histogram_puts_exact_boundaries_where_nnc_does(lo, hi, rate, values):
    """NNC's positive bins are right-closed (ceilf of the log): min goes with (-min, min)
    and min * rate**k to bin k; fnnc's left-closed search put each one bin higher."""
    x = np.asarray(values, f32)
    counts, _ = ops.histogram(type="logarithmic", min=lo, max=hi, rate=rate)(x)
    np.testing.assert_array_equal(np.asarray(counts), _nnc_log_counts(x, lo, hi, rate))


# forward.tests.c: "convolution transpose of 3x3 on 2x2 with given weights ...". Each case:
# (groups, filters, stride, NCHW, NNC's expected output). The input is ones [2, 2, 2], the
# weight 0..17 in NNC's layout ([in, kh, kw, F/G] NHWC, [in, F/G, kh, kw] NCHW), the bias
# ones, the hint border 0.
_CONVT = {
    "group of 2": (
        2,
        2,
        1,
        False,
        [
            [1, 10, 2, 20, 4, 22, 3, 12],
            [4, 22, 9, 45, 13, 49, 8, 26],
            [10, 28, 21, 57, 25, 61, 14, 32],
            [7, 16, 14, 32, 16, 34, 9, 18],
        ],
    ),
    "group of 2, stride of 2": (
        2,
        2,
        2,
        False,
        [
            [1, 10, 2, 11, 3, 21, 2, 11, 3, 12],
            [4, 13, 5, 14, 9, 27, 5, 14, 6, 15],
            [7, 25, 9, 27, 17, 53, 9, 27, 11, 29],
            [4, 13, 5, 14, 9, 27, 5, 14, 6, 15],
            [7, 16, 8, 17, 15, 33, 8, 17, 9, 18],
        ],
    ),
    "NCHW": (
        1,
        1,
        1,
        True,
        [[10, 21, 25, 14], [25, 53, 61, 33], [37, 77, 85, 45], [22, 45, 49, 26]],
    ),
    "group of 2, NCHW": (
        2,
        2,
        1,
        True,
        [
            [1, 2, 4, 3],
            [4, 9, 13, 8],
            [10, 21, 25, 14],
            [7, 14, 16, 9],
            [10, 20, 22, 12],
            [22, 45, 49, 26],
            [28, 57, 61, 32],
            [16, 32, 34, 18],
        ],
    ),
    "group of 2, stride of 2, NCHW": (
        2,
        2,
        2,
        True,
        [
            [1, 2, 3, 2, 3],
            [4, 5, 9, 5, 6],
            [7, 9, 17, 9, 11],
            [4, 5, 9, 5, 6],
            [7, 8, 15, 8, 9],
            [10, 11, 21, 11, 12],
            [13, 14, 27, 14, 15],
            [25, 27, 53, 27, 29],
            [13, 14, 27, 14, 15],
            [16, 17, 33, 17, 18],
        ],
    ),
}


@pytest.mark.parametrize("case", _CONVT)
def test_convolution_transpose_with_given_weights(case):
    """NNC's expected outputs, bit for bit. The command is channels-last; an NCHW case runs
    on transposed input, weight ([in, F/G, kh, kw] -> [in, kh, kw, F/G]) and output."""
    groups, filters, stride, nchw, want = _CONVT[case]
    a = np.ones((2, 2, 2), f32)
    w = np.arange(18, dtype=f32)
    w = (
        w.reshape(2, filters // groups, 3, 3).transpose(0, 2, 3, 1)
        if nchw
        else w.reshape(2, 3, 3, -1)
    )
    cmd = ops.convolution_transpose(strides=stride, padding=0, groups=groups)
    y = np.asarray(cmd(a, w, np.ones(filters, f32)))
    side = (2 - 1) * stride + 3  # NNC's output size, border 0
    want = np.asarray(want, f32)
    want = (
        want.reshape(filters, side, side).transpose(1, 2, 0)
        if nchw
        else want.reshape(side, side, filters)
    )
    np.testing.assert_array_equal(y, want)


def test_logarithmic_range_empty_in_float32_is_refused_as_even_bins_are():
    with pytest.raises(CommandError, match=r"0 < min < max \(as float32 values"):
        ops.histogram(type="logarithmic", min=1.0, max=1.0000000001)(np.ones(2, f32))
