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
