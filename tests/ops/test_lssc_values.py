"""LSSC compression against a NumPy transcription of NNC's ccv_nnc_lssc_cpu_ref.c.

The transcription keeps the C loops (per plane, per 4x4 block, per element) and the C
types: ``float`` arithmetic as NumPy float32 scalars, ``double`` where C promotes (the
``1e-6`` literal in ``ccv_max``) as Python floats (float64), and ccv's table-driven
float-to-half conversion (truncating), rebuilt from the van der Zijp construction and
checked against entries of ccv's tables.
"""

from __future__ import annotations

import base64
import functools

import jax
import jax.extend
import numpy as np
import pytest

from fnnc import ops

F32 = np.float32


def _ccv_tables() -> tuple[np.ndarray, np.ndarray]:
    base = np.zeros(512, np.uint32)
    shift = np.zeros(512, np.uint32)
    for i in range(256):
        e = i - 127
        if e < -24:
            b, s = 0, 24
        elif e < -14:
            b, s = 0x0400 >> (-e - 14), -e - 1
        elif e <= 15:
            b, s = (e + 15) << 10, 13
        elif e < 128:
            b, s = 0x7C00, 24
        else:
            b, s = 0x7C00, 13
        base[i], shift[i] = b, s
        base[i | 0x100], shift[i | 0x100] = b | 0x8000, s
    return base, shift


BASE, SHIFT = _ccv_tables()


def test_tables_match_ccv() -> None:
    # entries of _ccv_base_table / _ccv_shift_table in lib/ccv_util.c
    assert (BASE[102], BASE[103], BASE[112], BASE[113], BASE[142], BASE[143]) == (
        0x0,
        0x1,
        0x200,
        0x400,
        0x7800,
        0x7C00,
    )
    assert (SHIFT[102], SHIFT[103], SHIFT[112], SHIFT[113], SHIFT[143]) == (24, 23, 14, 13, 24)


def _to_half(values: np.ndarray) -> np.ndarray:
    """ccv_float_to_half_precision: uint16 words."""
    u = np.asarray(values, F32).view(np.uint32)
    e = (u >> 23) & 0x1FF
    return (BASE[e] + ((u & 0x007FFFFF) >> SHIFT[e])).astype(np.uint16)


def _from_half(words: np.ndarray) -> np.ndarray:
    return np.asarray(words, np.uint16).view(np.float16).astype(F32)


def lssc_forward(a: np.ndarray) -> np.ndarray:
    """_ccv_nnc_lssc_forw on float16 planes [P, H, W] -> uint16 [P, ceil(H/4), 4*ceil(W/4)]."""
    p, h, w = a.shape
    bh, bw = -(-h // 4), -(-w // 4)
    b = np.zeros((p, bh, bw * 4), np.uint16)
    for k in range(p):
        for i0 in range(bh):
            for i1 in range(bw):
                hh = min(i0 * 4 + 4, h) - i0 * 4
                ww = min(i1 * 4 + 4, w) - i1 * 4
                a16 = np.full(16, a[k, i0 * 4, i1 * 4], np.float16)
                for j0 in range(hh):
                    for j1 in range(ww):
                        a16[j0 * 4 + j1] = a[k, i0 * 4 + j0, i1 * 4 + j1]
                a32 = a16.astype(F32)
                amax = amin = a32[0]
                for c in range(1, 16):
                    amax, amin = max(a32[c], amax), min(a32[c], amin)
                b[k, i0, i1 * 4 : i1 * 4 + 2] = _to_half(np.array([amin, amax], F32))
                abottom = amin * F32(7) / F32(6) - amax / F32(6)
                span = amax - amin
                ascale = F32(3 / (float(span) if float(span) > 1e-6 else 1e-6))
                for word, first in ((2, 0), (3, 8)):
                    bits = 0
                    for c in range(8):
                        q = int((a32[first + c] - abottom) * ascale)  # C truncation
                        bits |= min(max(q, 0), 3) << (c << 1)
                    b[k, i0, i1 * 4 + word] = bits
    return b


def lssc_backward(b: np.ndarray, h: int, w: int) -> np.ndarray:
    """_ccv_nnc_lssc_back: uint16 [P, Hb, 4*Wb] -> float16 planes [P, H, W]."""
    p, bh, bw4 = b.shape
    a = np.zeros((p, h, w), np.float16)
    for k in range(p):
        for i0 in range(bh):
            for i1 in range(bw4 // 4):
                z = b[k, i0, i1 * 4 : i1 * 4 + 4]
                bm = [*_from_half(z[:2]), F32(0), F32(0)]
                bm[3] = bm[1]
                bm[1] = bm[3] / F32(3) + bm[0] * F32(2) / F32(3)
                bm[2] = bm[3] * F32(2) / F32(3) + bm[0] / F32(3)
                a32 = np.array(
                    [bm[(int(z[2 + c // 8]) >> ((c % 8) << 1)) & 3] for c in range(16)], F32
                )
                a16 = _to_half(a32).view(np.float16)
                hh = min(i0 * 4 + 4, h) - i0 * 4
                ww = min(i1 * 4 + 4, w) - i1 * 4
                for j0 in range(hh):
                    for j1 in range(ww):
                        a[k, i0 * 4 + j0, i1 * 4 + j1] = a16[j0 * 4 + j1]
    return a


def _planes(x: np.ndarray) -> np.ndarray:
    """Channels-last [N, H, W, C] -> NNC's planes [N*C, H, W]."""
    n, h, w, c = x.shape
    return np.transpose(x, (0, 3, 1, 2)).reshape(n * c, h, w)


def _unplanes(p: np.ndarray, n: int, c: int) -> np.ndarray:
    return np.transpose(p.reshape(n, c, *p.shape[1:]), (0, 2, 3, 1))


INPUTS = {
    "normal-7x10": np.random.default_rng(0).normal(size=(2, 7, 10, 3)),
    "relu-8x8": np.maximum(np.random.default_rng(1).normal(size=(1, 8, 8, 4)), 0.0),
    "wide-range-5x4": np.random.default_rng(2).normal(size=(3, 5, 4, 2)) * 300.0,
    "constant-blocks": np.ones((1, 6, 6, 2)) * np.array([0.5, -2.0]),
    "tiny-1x3": np.random.default_rng(3).uniform(size=(1, 1, 3, 1)) * 1e-5,
}


@pytest.mark.parametrize("name", sorted(INPUTS))
def test_compress_matches_c_loops(name: str) -> None:
    x = INPUTS[name].astype(np.float16)
    n, _, _, c = x.shape
    want = _unplanes(lssc_forward(_planes(x)), n, c)
    got = np.asarray(ops.lssc_compress()(x))
    assert got.dtype == np.uint16 and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("name", sorted(INPUTS))
def test_decompress_matches_c_loops(name: str) -> None:
    x = INPUTS[name].astype(np.float16)
    n, h, w, c = x.shape
    words = np.asarray(ops.lssc_compress()(x))
    want = _unplanes(lssc_backward(_planes(words), h, w), n, c)
    got = np.asarray(ops.lssc_decompress(size=(h, w))(words))
    assert got.dtype == np.float16
    if jax.default_backend() == "cpu":  # bit for bit
        np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))
    else:  # XLA:GPU's float32 division and FMAs may round a middle level one ulp apart
        ulps = np.abs(got.view(np.uint16).astype(np.int32) - want.view(np.uint16))
        assert ulps.max() <= 1, ulps.max()


def test_float32_round_trip_error_is_within_a_sixth_of_the_block_range() -> None:
    x = np.random.default_rng(4).normal(size=(2, 8, 12, 3)).astype(np.float32)
    y = np.asarray(ops.lssc_decompress(size=(8, 12), dtype="float32")(ops.lssc_compress()(x)))
    blocks = x.reshape(2, 2, 4, 3, 4, 3)
    span = (blocks.max((2, 4)) - blocks.min((2, 4)))[:, :, None, :, None, :]
    err = np.abs(y - x).reshape(blocks.shape)
    assert (err <= span / 6 * 1.01 + 2e-3 * np.abs(blocks) + 1e-3).all()


def test_rank3_and_shape_errors() -> None:
    from fnnc.errors import ShapeError

    assert ops.lssc_compress()(np.zeros((5, 5, 2), np.float32)).shape == (2, 8, 2)
    with pytest.raises(ShapeError):
        ops.lssc_compress()(np.zeros((5, 5), np.float32))
    with pytest.raises(ShapeError):
        ops.lssc_decompress(size=(9, 5))(np.zeros((2, 8, 2), np.uint16))


def _half_roundings(jaxpr) -> list[list[str]]:
    """For each float32 -> float16 conversion in ``jaxpr`` (sub-jaxprs included), the
    primitives that read its result."""
    found = []
    readers: dict = {}
    for eqn in jaxpr.eqns:
        for v in eqn.invars:
            if isinstance(v, jax.extend.core.Var):  # not a literal
                readers.setdefault(v, []).append(eqn.primitive.name)
    for eqn in jaxpr.eqns:
        for param in eqn.params.values():
            for sub in param if isinstance(param, (tuple, list)) else (param,):
                sub = getattr(sub, "jaxpr", sub)  # a ClosedJaxpr's own
                if hasattr(sub, "eqns"):
                    found += _half_roundings(sub)
        if eqn.primitive.name == "convert_element_type":
            (x,), (y,) = eqn.invars, eqn.outvars
            if x.aval.dtype == np.float32 and y.aval.dtype == np.float16:
                found.append(readers.get(y, []))
    return found


@pytest.mark.parametrize(
    ("cmd", "x"),
    [
        (ops.lssc_compress(), np.zeros((1, 4, 4, 1), np.float32)),
        (ops.lssc_decompress(size=(4, 4)), np.zeros((1, 1, 4, 1), np.uint16)),
    ],
    ids=["compress", "decompress"],
)
def test_every_rounding_to_half_survives_excess_precision_rewrites(cmd, x) -> None:
    """XLA:GPU removes a float32 -> float16 -> float32 round trip as excess precision
    (``xla_allow_excess_precision``, on by default): decompression then rounded its
    levels to nearest, not toward zero as ccv does (1 ulp off the C loops on an H100).
    XLA:CPU keeps the round trip, so this checks the guard instead: no rounding to
    half is widened back directly; one that is read as float again passes an
    optimization barrier first, which no rewrite crosses."""
    forward = functools.partial(cmd.definition.forward, **cmd.kwargs)
    roundings = _half_roundings(jax.make_jaxpr(forward)(x).jaxpr)
    assert ["optimization_barrier"] in roundings, roundings
    assert not any("convert_element_type" in r for r in roundings), roundings


# -- compression.tests.c "LSSC for natural image" ------------------------------------------
# An 8 x 16 RGB crop (rows 368..375, columns 64..79, on 4 x 4 block boundaries) of ccv's
# samples/nature.png, and the same crop of NNC's data/nature.lssc.bin, both as base64 of
# the HWC uint8 bytes. LSSC is per 4 x 4 block and plane, so a crop's blocks are the full
# image's; this crop has the most varied blocks (322 of its 384 values change).
NATURE_CROP = (
    "m+TTquzgvf3tuPLkwPXryvzzwfTtwO7hyOvNvtOskpVqfHRNXlU2OjIbTEwyTlA6sP7xrvfuqvbstfr1wf39yPr7"
    "wvDwvevpuvLpw/jo0Pfazd66r6Z9gGlHSDIdKSISgNTfn/T5qfj1s/ryt/vsuvrquvfnuvTmuPDnt+/msujauebS"
    "xuDDtrygd2lPNzEbLICYY8PZgN7ok+jtsfn2w//7yPz4yfz1wPXruvTot/TstO/preDZsdXHq7qdZW9NBTJFG1t2"
    "K3+bQZ+7bcjjg9vzkOP1n+79mOjvk+Lmo+/ttPn2su7msN7Tu9vErsWpAgwWAA0aBR8uDTNGG1ZoJGh7LHGBNHeK"
    "SIWaebbLhsrXl9rgtfLrxffuyOvn1+7kDh4eDhkVERQNFBEKHB0YJCUnJyovLDQ/YHOBf5+ugK6+kMTRqtzjwu7x"
    "1/r84vbtARgQBiEaABoRBCAUEC8dGz4qOGNQcJ6RhLGqiLSzh7K4jbrAl8rOoNLRtuTawd7M"
)
NATURE_LSSC_CROP = (
    "jNTYvf7Yvf75vf7Ywfjqyv/zwfHqwevh0Pi3tMy3mKCCfHRNXWFUKSISXWESXWFUvf75vf75vf75vf75wf/9yvj9"
    "wfHzuevqtPjs0Pjs0Pjs0My3xqCWkWFUXSISKSISjNTYjP75vf75vf75ufjqufjqufjqufHqtPjstPjstPjstPjs"
    "xuDZxqCWXWFUKSISLICYXNTYjNTYjNT5sfjzwf/9yv/zyv/ztPjstPjstPjstPjsxuDZxuDZkaCWXWFUAD1FFW6A"
    "K26AQZ+7b6j9b+79n+79n+79kPn2kMz2tPn2tPn2sOjgsNbgsNbEsMWpAAwKAAwKAAxFFT1FEGJkEGJkP2JkP2Jk"
    "SHOobJ/PkMzPkMzPsPrgyfrgyejg4ujgFQwKFQwKFQwKFQwKEB0YEB0YEB0YPx1kbHOBkJ+okJ/PkMzPsNbgyej8"
    "4vr84vrgAAwKAAwKAAwKAAwKEB0YEB0YP2Jkb6iwkJ+okJ+okJ+okMzPl8XEl9bEsOjgydbE"
)


def _crop(text: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(text), np.uint8).reshape(8, 16, 3)


def test_lssc_for_natural_image() -> None:
    """NNC's "LSSC for natural image" (test/unit/nnc/compression.tests.c) on a crop of its
    image, 8 x 16 instead of 600 x 800 (the result does not depend on the size): the RGB
    values as float32, in float16, LSSC forward then backward, back to float32 and to 8-bit
    with ccv_shift's truncation, equal NNC's stored result byte for byte."""
    image = _crop(NATURE_CROP).astype(np.float32)[None]  # NNC's planes are fnnc's channels
    words = ops.lssc_compress()(image.astype(np.float16))
    back = ops.lssc_decompress(size=(8, 16))(words)
    restored = np.clip(np.asarray(back).astype(np.float32).astype(np.int32), 0, 255)
    np.testing.assert_array_equal(restored[0].astype(np.uint8), _crop(NATURE_LSSC_CROP))
