"""NNC's ``conform_data_format.tests.c``, its Walsh-Hadamard transform tests and
``histogram.tests.c``, translated (histograms on 300 x 200 values instead of 3000 x
2000: the same checks, a tenth of the time)."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from fnnc import ops
from fnnc.errors import CommandError

# -- conform_data_format: FP8 E4M3 --------------------------------------------------------


def _e4m3_value(i: int) -> float:
    exp, mant = (i >> 3) & 0xF, i & 0x7
    return mant * 0.001953125 if exp == 0 else (1.0 + mant * 0.125) * 2.0 ** (exp - 7)


E4M3 = np.array([_e4m3_value(i) for i in range(127)], np.float32)


def _dequant(x: float) -> float:
    """NNC's test reference: the nearest E4M3 value by table search, ties to even codes."""
    ax = min(abs(x), 448.0)
    diff = np.abs(ax - E4M3)
    best = int(np.flatnonzero(diff == diff.min())[0])
    ties = np.flatnonzero(diff == diff.min())
    if len(ties) > 1:
        best = int(next(i for i in ties if i % 2 == 0))
    return (-1.0 if x < 0 else 1.0) * float(E4M3[best])


def _conform_reference(a: np.ndarray, preserved_tail: int) -> np.ndarray:
    out = a.copy()
    prefix = a.shape[-1] - preserved_tail
    for row_in, row_out in zip(a.reshape(-1, a.shape[-1]), out.reshape(-1, a.shape[-1])):
        for offset in range(0, prefix, 64):
            block = row_in[offset : offset + 64]
            amax = max(1e-4, float(np.abs(block).max()))
            scale = np.float32(2.0 ** np.ceil(np.log2(np.float32(amax) / np.float32(448.0))))
            for i, v in enumerate(block):
                normal = np.clip(np.float32(v) / scale, -448.0, 448.0)
                row_out[offset + i] = np.float32(_dequant(float(normal))) * scale
    return out


def test_conform_to_e4m3_with_ties_to_even_and_a_preserved_tail():
    a = np.zeros(256, np.float32)
    expected = np.zeros(256, np.float32)
    a[:7] = [448, 1.0625, 1.1875, -1.0625, -1.1875, 0.0009765625, 0.0029296875]
    expected[:7] = [448, 1, 1.25, -1, -1.25, 0, 0.00390625]
    a[128:132] = [28, 0.06640625, 0.07421875, -0.06640625]
    expected[128:132] = [28, 0.0625, 0.078125, -0.0625]
    expected[64:128] = a[64:128] = np.arange(64) * 0.125 - 3.0
    expected[192:256] = a[192:256] = np.arange(64) * -0.25 + 5.0
    b = ops.conform_data_format(preserved_tail=64)(a.reshape(2, 128))
    np.testing.assert_array_equal(np.asarray(b).reshape(256), expected)


def test_conform_a_larger_tensor_matches_the_independent_reference():
    rows, head = 13, 512
    r, i = np.meshgrid(np.arange(rows), np.arange(head), indexing="ij")
    a = np.where(
        i < 448, (((r * 997 + i * 37) % 2001) - 1000) * 0.015625, (r * 512 + i) * -0.03125
    ).astype(np.float32)
    b = ops.conform_data_format(preserved_tail=64)(a)
    np.testing.assert_array_equal(np.asarray(b), _conform_reference(a, 64))


def test_conform_backward_is_a_straight_through_copy():
    g = (np.arange(256, dtype=np.float32) * 0.25 - 17).reshape(2, 128)
    cmd = ops.conform_data_format(preserved_tail=64)
    (h,) = cmd.definition.backward((g,), (None,), (None,), **cmd.kwargs)
    np.testing.assert_array_equal(np.asarray(h), g)


@pytest.mark.parametrize(
    "params, shape",
    [
        ({"datatype": "fp16"}, (2, 128)),
        ({"preserved_tail": -1}, (2, 128)),
        ({"preserved_tail": 65}, (2, 128)),
        ({"preserved_tail": 64}, (2, 129)),
    ],
)
def test_conform_rejects_unsupported_selectors_and_invalid_geometry(params, shape):
    with pytest.raises(CommandError):
        ops.conform_data_format(**params)(np.zeros(shape, np.float32))


# -- walsh_hadamard_transform ---------------------------------------------------------------


def test_walsh_hadamard_transform_matches_known_values():
    a = np.array([[1, 2, 3, 4], [-1, 0, 1, 2]], np.float32)
    b = ops.walsh_hadamard_transform(scale=0.5)(a)
    np.testing.assert_array_equal(np.asarray(b), [[5, -1, -2, 0], [1, -1, -2, 0]])


def test_walsh_hadamard_transform_is_self_inverse_with_normalised_scale():
    a = np.random.default_rng(1).uniform(-1, 1, (17, 128)).astype(np.float32)
    cmd = ops.walsh_hadamard_transform(scale=1 / np.sqrt(128))
    backward = jax.jit(lambda b: cmd.definition.backward((b,), (None,), (None,), **cmd.kwargs))
    (c,) = backward(cmd(a))
    np.testing.assert_allclose(np.asarray(c), a, atol=1e-5)


# -- histogram --------------------------------------------------------------------------------

FLT_MAX = float(np.finfo(np.float32).max)
SPECIALS = [np.nan, -FLT_MAX, FLT_MAX, 0, 1e-20, -1e-20, 1e20 - 1e18, -1e20 + 1e18]


def _values() -> np.ndarray:
    a = np.random.default_rng(1).uniform(-1000, 1000, 300 * 200).astype(np.float32)
    a[:8] = SPECIALS
    return a.reshape(300, 200)


def _log_bounds() -> np.ndarray:
    v, right = 1e-12, []
    while v < 1e20:
        right.append(v)
        v *= 1.1
    right = np.array(right)
    return np.concatenate([-right[::-1], right]).astype(np.float32)


def test_logarithmic_histogram_and_bins_histogram():
    a, h = _values(), _log_bounds()
    assert h.shape == (774 * 2,)
    bl, sl = ops.histogram(type="logarithmic", min=1e-12, max=1e20, rate=1.1)(a)
    bb, sb = ops.histogram(type="bins")(a, h)
    bl, bb = np.asarray(bl), np.asarray(bb)
    assert bl.shape == bb.shape == (775 * 2,)
    total = bl + bb
    tol = np.where(total > 10, np.abs(bl - bb) / np.maximum(total, 1), np.abs(bl - bb))
    assert np.all(tol < 0.1)
    for counts in (bl, bb):
        assert counts[0] == 1 and counts[774 * 2] == 1 and counts[775 * 2 - 1] == 1
        assert counts[774 * 2 - 1] == 1 and counts[1] == 1 and counts[774] == 3
    sl = np.asarray(sl)
    assert sl[0] == -FLT_MAX and sl[1] == FLT_MAX and np.isnan(sl[2]) and np.isnan(sl[3])
    np.testing.assert_array_equal(sl, np.asarray(sb))


def test_even_histogram_and_bins_histogram():
    a = _values()
    bl, sl = ops.histogram(bins=200, min=-1000.0, max=1000.0)(a)
    bb, sb = ops.histogram(type="bins")(a, (np.arange(201, dtype=np.float32) - 100) * 10)
    bl, bb = np.asarray(bl), np.asarray(bb)
    assert bl.shape == bb.shape == (203,)
    assert np.all(np.abs(bl - bb) < 5)
    for counts in (bl, bb):
        assert counts[0] == 2 and counts[201] == 2 and counts[202] == 1
    assert bl.sum() == a.size
    np.testing.assert_array_equal(np.asarray(sl), np.asarray(sb))


def test_histogram_of_a_view_skips_the_rest():
    """NNC histograms a strided view; here the slice of the tensor, the same values."""
    a = np.random.default_rng(2).uniform(-1000, 1000, (3, 10, 2, 10)).astype(np.float32)
    a.reshape(-1)[:8] = SPECIALS
    view = a[:, 1:3, :, 2:6]
    bl, sl = ops.histogram(bins=200, min=-1000.0, max=1000.0)(view)
    bl, sl = np.asarray(bl), np.asarray(sl)
    assert bl[0] == bl[201] == bl[202] == 0 and bl.sum() == view.size
    assert sl[0] < -900 and sl[1] > 900
    np.testing.assert_allclose(sl[2], view.sum(dtype=np.float64), rtol=1e-4)
