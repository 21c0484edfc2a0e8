"""Data-movement commands against NumPy closed forms, and their error messages."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fnnc import ops
from fnnc.errors import CommandError, DTypeError, ShapeError
from tests.helpers import assert_close, rand, randint


@pytest.mark.parametrize(
    "src, dst, perm",
    [
        ("NCHW", "NHWC", (0, 2, 3, 1)),
        ("NHWC", "NCHW", (0, 3, 1, 2)),
        ("NHWC", "CHWN", (3, 1, 2, 0)),
    ],
)
def test_format_transform_is_the_named_transpose(src, dst, perm) -> None:
    x = rand([2, 3, 4, 5])
    y = ops.format_transform(src=src, dst=dst)(x)
    assert_close(y, np.transpose(x, perm))
    assert_close(ops.format_transform(src=dst, dst=src)(y), x)


def test_rank_3_tensors_are_one_image_without_the_batch_axis() -> None:
    """NNC's 3-d tensors (CHW / HWC): format_transform and upsample treat them as one
    image, the same as with a batch axis of 1, forward and backward."""
    x = rand([3, 4, 2])
    assert_close(ops.format_transform(src="NHWC", dst="NCHW")(x), np.transpose(x, (2, 0, 1)))
    assert_close(ops.format_transform(src="NCHW", dst="NHWC")(x), np.transpose(x, (1, 2, 0)))
    for mode in ("nearest", "bilinear"):
        up = ops.upsample(scale=(2, 1.5), mode=mode)
        y = up(x)
        assert y.shape == (6, 6, 2)
        assert_close(y, up(x[None])[0])
        g = rand([6, 6, 2], seed=1)
        params = dict(scale=(2, 1.5), mode=mode, align_corners=False)
        (gx,) = ops.upsample.definition.backward((g,), (x,), (y,), **params)
        (g4,) = ops.upsample.definition.backward((g[None],), (x[None],), (y[None],), **params)
        assert_close(gx, g4[0])


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge"])
def test_pad_matches_numpy(mode) -> None:
    x = rand([3, 4])
    pads = ((1, 2), (3, 1))
    got = ops.pad(pads=pads, mode=mode)(x)
    assert_close(got, np.pad(x, pads, mode=mode))


def test_pad_constant_value() -> None:
    x = rand([2, 2])
    got = ops.pad(pads=((1, 0), (0, 1)), value=-4.0)(x)
    assert_close(got, np.pad(x, ((1, 0), (0, 1)), constant_values=-4.0))


def test_pad_reflect_backward_folds_mirrored_entries() -> None:
    x = np.arange(3, dtype=np.float32)
    (g,) = ops.pad.definition.backward(
        (jnp.ones(6),),
        (jax.ShapeDtypeStruct(x.shape, x.dtype),),
        (None,),
        pads=((2, 1),),
        mode="reflect",
        value=0.0,
    )
    # [2, 1, 0, 1, 2, 1] <- entry 0 read once, entry 1 three times, entry 2 twice
    assert_close(g, np.array([1.0, 3.0, 2.0]))


def _nnc_bilinear(x: np.ndarray, ho: int, wo: int, align: bool) -> np.ndarray:
    """A direct port of NNC's ``_ccv_nnc_upsample_bilinear_forw`` (NHWC)."""

    def coeffs(ss, sz):
        s = (
            np.float32(ss - 1) / np.float32(max(1, sz - 1))
            if align
            else np.float32(ss) / np.float32(sz)
        )
        out = []
        for i in range(sz):
            xs = np.float32(i * s if align else (i + 0.5) * s - 0.5)
            s0 = int(xs)
            s1 = min(int(xs + 1), ss - 1)
            out.append((s0, s1, 1 - (xs - s0), xs - s0))
        return out

    n, h, w, c = x.shape
    y = np.zeros((n, ho, wo, c), np.float32)
    for yd, (y0, y1, ya, yb) in enumerate(coeffs(h, ho)):
        for xd, (x0, x1, xa, xb) in enumerate(coeffs(w, wo)):
            y[:, yd, xd] = (
                x[:, y0, x0] * xa * ya
                + x[:, y0, x1] * xb * ya
                + x[:, y1, x0] * xa * yb
                + x[:, y1, x1] * xb * yb
            )
    return y


@pytest.mark.parametrize("align", [False, True])
@pytest.mark.parametrize("scale, shape", [((2, 2), (1, 3, 2, 2)), ((1.5, 3), (2, 2, 3, 1))])
def test_upsample_bilinear_matches_nnc(scale, shape, align) -> None:
    x = rand(shape)
    got = ops.upsample(scale=scale, mode="bilinear", align_corners=align)(x)
    ho, wo = int(shape[1] * scale[0] + 0.5), int(shape[2] * scale[1] + 0.5)
    assert_close(got, _nnc_bilinear(x, ho, wo, align))


def test_upsample_closed_forms() -> None:
    a, b = 1.0, 5.0
    x = np.array([a, b], np.float32).reshape(1, 1, 2, 1)
    row = lambda y: np.asarray(y).reshape(-1)
    assert_close(row(ops.upsample(scale=(1, 2))(x)), np.array([a, a, b, b]))
    assert_close(row(ops.upsample(scale=(1, 1.5))(x)), np.array([a, b, b]))
    half_pixel = np.array([a, 0.75 * a + 0.25 * b, 0.25 * a + 0.75 * b, b])
    assert_close(row(ops.upsample(scale=(1, 2), mode="bilinear")(x)), half_pixel)
    corners = np.array([a, (2 * a + b) / 3, (a + 2 * b) / 3, b])
    assert_close(row(ops.upsample(scale=(1, 2), mode="bilinear", align_corners=True)(x)), corners)


def test_upsample_nearest_backward_sums_blocks() -> None:
    x = jax.ShapeDtypeStruct((1, 2, 2, 1), jnp.float32)
    g = jnp.arange(16, dtype=jnp.float32).reshape(1, 4, 4, 1)
    (gx,) = ops.upsample.definition.backward(
        (g,), (x,), (None,), scale=(2, 2), mode="nearest", align_corners=False
    )
    want = np.asarray(g).reshape(2, 2, 2, 2).sum(axis=(1, 3)).reshape(1, 2, 2, 1)
    assert_close(gx, want)


def test_masked_fill_matches_numpy() -> None:
    x = rand([2, 3, 4])
    mask = randint([3, 1], 3, seed=2)
    got = ops.masked_fill(eq=1, fill=-7.0)(x, mask)
    assert_close(got, np.where(np.broadcast_to(mask, x.shape) == 1, -7.0, x))
    # NNC rounds eq for integer masks: (int)(0.6 + 0.5) == 1
    assert_close(ops.masked_fill(eq=0.6, fill=-7.0)(x, mask), got)


def test_index_select_and_slice_match_numpy() -> None:
    x = rand([5, 3])
    idx = np.array([4, 0, 4], np.int32)
    assert_close(ops.index_select()(x, idx), x[idx])
    assert_close(ops.slice(start=(1, 0), limit=(5, 3), strides=(2, 2))(x), x[1:5:2, 0:3:2])


def test_set_and_datatype_conversion() -> None:
    got = ops.set(shape=(2, 2), dtype="int32", value=3)()
    assert got.dtype == jnp.int32 and np.all(np.asarray(got) == 3)
    y = ops.datatype_conversion(dtype=jnp.float16)(rand([3]))
    assert y.dtype == jnp.float16


@pytest.mark.parametrize(
    "cmd, inputs, error, match",
    [
        (ops.reshape(shape=(4, 2)), (rand([2, 3]),), ShapeError, "6 elements"),
        (ops.reshape(shape=(-1, -1)), (rand([2, 3]),), ShapeError, "one -1"),
        (ops.reshape(shape=(4, -1)), (rand([2, 3]),), ShapeError, "cannot infer"),
        (ops.transpose(perm=(0, 0)), (rand([2, 3]),), ShapeError, "not a permutation"),
        (ops.transpose(perm=(1, 0, 2)), (rand([2, 3]),), ShapeError, "not a permutation"),
        (
            ops.format_transform(src="NWHC"),
            (rand([1, 2, 2, 1]),),
            CommandError,
            "src must be one of",
        ),
        (ops.format_transform(), (rand([2, 2]),), ShapeError, "rank-4"),
        (ops.format_transform(dst="CHWN"), (rand([2, 2, 2]),), ShapeError, "NCHW / NHWC"),
        (ops.concat(axis=1), (rand([2, 3]), rand([3, 3])), ShapeError, "does not fit input 0"),
        (ops.concat(), (rand([2]), randint([2], 3)), DTypeError, "share one dtype"),
        (ops.concat(axis=2), (rand([2, 3]),), ShapeError, "out of range"),
        (ops.slice(start=(0,), limit=(4,)), (rand([3]),), ShapeError, "limit <= 3"),
        (ops.slice(start=(0,), limit=(2, 2)), (rand([3]),), ShapeError, "one entry per axis"),
        (ops.index_select(), (rand([3]), rand([2, 2])), DTypeError, "integer vector"),
        (ops.pad(pads=((1, 1),), mode="wrap"), (rand([3]),), CommandError, "mode must be one of"),
        (ops.pad(pads=((1, 1),)), (rand([3, 3]),), ShapeError, "one \\(lo, hi\\) pair per axis"),
        (ops.pad(pads=((3, 0),), mode="reflect"), (rand([3]),), ShapeError, "lo, hi < 3"),
        (ops.pad(pads=((-1, 0),)), (rand([3]),), ShapeError, "use slice to crop"),
        (ops.upsample(), (rand([2, 2]),), ShapeError, "rank-4 NHWC"),
        (ops.upsample(scale=(0.5, 1)), (rand([1, 4, 4, 1]),), ShapeError, "only enlarges"),
        (ops.upsample(mode="cubic"), (rand([1, 2, 2, 1]),), CommandError, "mode must be one of"),
        (ops.masked_fill(), (rand([3]), randint([2, 3], 2)), ShapeError, "must broadcast to x"),
        (ops.broadcast_to(shape=(2, 4)), (rand([3]),), ShapeError, "does not broadcast"),
        (ops.set(shape=(-1,)), (), ShapeError, "negative size"),
    ],
)
def test_bad_inputs_raise_clear_errors(cmd, inputs, error, match) -> None:
    with pytest.raises(error, match=match):
        cmd(*inputs)


def test_missing_and_unknown_hyper_parameters() -> None:
    with pytest.raises(CommandError, match="'shape' is required"):
        ops.reshape()
    with pytest.raises(CommandError, match="unknown hyper-parameter"):
        ops.pad(pads=((0, 0),), padding="same")
