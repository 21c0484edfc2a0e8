"""NNC's dataframe.addons.tests.c translated, and the add-ons against NumPy."""

import numpy as np
import pytest

from fnnc.data import DataError, DataFrame

INTS = np.array([2, 3, 4, 5, 6, 7, 8, 9], dtype=np.int32)


def test_one_hot_from_labels():  # "derive one-hot tensor from label"
    df = DataFrame.from_arrays(y=INTS).one_hot("y", 10)
    rows = list(df.iterator("y_one_hot"))
    np.testing.assert_array_equal(np.stack(rows), np.eye(10, dtype=np.float32)[INTS])
    assert rows[0].dtype == np.float32


def test_one_hot_values_dtype_and_bad_labels():
    df = DataFrame.from_arrays(y=np.array([1, 0])).one_hot(
        "y", 3, "oh", on=5, off=-1, dtype=np.int8
    )
    np.testing.assert_array_equal(df[0]["oh"], np.array([-1, 5, -1], np.int8))
    bad = DataFrame.from_arrays(y=np.array([0, 3])).one_hot("y", 3)
    with pytest.raises(DataError, match="row 1"):
        list(bad)
    with pytest.raises(DataError, match="depth"):
        DataFrame.from_arrays(y=INTS).one_hot("y", 0)


def test_copy_scalar():  # "derive a scalar tensor from a struct"
    rows = list(DataFrame.from_arrays(y=INTS).copy_scalar("y").iterator("y_scalar"))
    np.testing.assert_array_equal(np.stack(rows), INTS.astype(np.float32)[:, None])
    assert rows[0].shape == (1,) and rows[0].dtype == np.float32


def test_batching_one_hot():  # "batching tensors"
    df = DataFrame.from_arrays(y=INTS).one_hot("y", 10).batch(3, columns=["y_one_hot"])
    batches = list(df.iterator("y_one_hot"))
    eye = np.eye(10, dtype=np.float32)
    np.testing.assert_array_equal(batches[0], eye[INTS[:3]])
    np.testing.assert_array_equal(batches[1], eye[INTS[3:6]])


def lengths_frame():
    return DataFrame.from_arrays(n=np.array([[2, 3]], dtype=np.int32))  # one row: a batch


def test_one_squared():  # "sequence mask generation"
    mask = lengths_frame().one_squared("n", 4)[0]["n_mask"]
    expected = np.zeros((2, 4, 4), np.int32)
    expected[0, :2, :2] = 1
    expected[1, :3, :3] = 1
    np.testing.assert_array_equal(mask, expected)
    assert mask.dtype == np.int32


def test_one_squared_variable_size():  # "... with variable size"
    mask = lengths_frame().one_squared("n", 4, "m", variable_size=True)[0]["m"]
    i = np.arange(3)
    oracle = (i[None, :, None] < [[[2]], [[3]]]) & (i[None, None, :] < [[[2]], [[3]]])
    np.testing.assert_array_equal(mask, oracle.astype(np.int32))
    with pytest.raises(DataError, match=r"\[0, 2\]"):
        list(lengths_frame().one_squared("n", 2))


def test_truncate():  # "truncate a sequence"
    seq = np.arange(1, 9, dtype=np.float32).reshape(1, 2, 4)
    df = DataFrame.from_arrays(x=seq, n=np.array([[2, 3]], np.int32)).truncate("x", "n")
    np.testing.assert_array_equal(df[0]["x_truncated"], [[1, 2, 3], [5, 6, 7]])


def test_truncate_rows_then_batch():
    seq = np.arange(12).reshape(3, 4)
    df = DataFrame.from_arrays(x=seq, n=np.array([1, 3, 2])).batch(3).truncate("x", "n", "t")
    np.testing.assert_array_equal(df[0]["t"], seq[:, :3])


def two_columns():
    a = np.arange(12, dtype=np.float32).reshape(1, 2, 6)  # one row: a batch of 2 sequences
    lengths = dict(la=np.array([[1, 2]], np.int32), lb=np.array([[4, 3]], np.int32))
    return DataFrame.from_arrays(a=a, b=a + 100, **lengths), a[0]


def test_truncate_columns_share_one_length():  # NNC: one max_len over all len_idxs
    df, a = two_columns()
    row = df.truncate(["a", "b"], ["la", "lb"])[0]
    np.testing.assert_array_equal(row["a_truncated"], a[:, :4])
    np.testing.assert_array_equal(row["b_truncated"], a[:, :4] + 100)
    row = df.truncate(["a", "b"], ["la", "la"], ["x", "y"])[0]  # one length column twice
    np.testing.assert_array_equal(row["y"], a[:, :2] + 100)


def test_one_squared_variable_size_columns_share_one_size():
    df, _ = two_columns()
    row = df.one_squared(["la", "lb"], 6, variable_size=True)[0]
    i = np.arange(4)  # the longest length of both columns
    for name, lengths in (("la_mask", [1, 2]), ("lb_mask", [4, 3])):
        n = np.array(lengths)[:, None, None]
        np.testing.assert_array_equal(row[name], (i[:, None] < n) & (i[None, :] < n))


IMAGE = np.random.default_rng(0).uniform(0, 255, (6, 8, 3)).astype(np.float32)
IMAGES = np.stack([IMAGE] * 16)


def jittered(seed=0, epoch=0, **options):
    df = DataFrame.from_arrays(im=IMAGES).image_random_jitter("im", **options)
    return np.stack(list(df.iterator("im_jitter", seed=seed, epoch=epoch)))


def test_jitter_all_options_like_nnc():  # "read image and add random jitter", smaller
    options = dict(
        resize=(5, 5),
        size=(4, 6),
        normalize=((123.68, 116.779, 103.939), (58.393, 57.12, 57.375)),
        offset=(1, 1),
        aspect_ratio=0.33,
        contrast=0.4,
        saturation=0.4,
        brightness=0.4,
        lighting=0.1,
        symmetric=True,
    )
    out = jittered(**options)
    assert out.shape == (16, 4, 6, 3) and out.dtype == np.float32 and np.isfinite(out).all()
    np.testing.assert_array_equal(out, jittered(**options))  # replayed from the seed
    assert not np.array_equal(out, jittered(epoch=1, **options))
    assert not np.array_equal(out[0], out[1])  # each row draws its own


def test_jitter_center_crop_is_a_slice():
    out = jittered(size=(3, 4), center_crop=True)
    y, x = (6 - 3 + 1) // 2, (8 - 4 + 1) // 2
    np.testing.assert_array_equal(out, np.broadcast_to(IMAGE[y : y + 3, x : x + 4], out.shape))


def test_jitter_random_crop_is_a_slice_at_some_place():
    out = jittered(size=(3, 4))
    places = set()
    for crop in out:
        found = [
            (y, x)
            for y in range(4)
            for x in range(5)
            if np.array_equal(crop, IMAGE[y : y + 3, x : x + 4])
        ]
        assert found
        places.add(found[0])
    assert len(places) > 1


def test_jitter_flip():
    out = jittered(symmetric=True)
    flipped = [bool(np.array_equal(o, IMAGE[:, ::-1])) for o in out]
    same = [bool(np.array_equal(o, IMAGE)) for o in out]
    assert all(f != s for f, s in zip(flipped, same)) and any(flipped) and any(same)


def test_jitter_brightness_and_contrast_factors():
    for o in jittered(brightness=0.5):
        factor = o / IMAGE
        np.testing.assert_allclose(factor, factor.flat[0], rtol=1e-5)
        assert 1 / 1.5 - 1e-6 <= factor.flat[0] <= 1.5 + 1e-6
    mean = IMAGE.mean(axis=(0, 1))
    for o in jittered(contrast=0.5):
        factor = (o - mean) / (IMAGE - mean)
        np.testing.assert_allclose(factor, np.median(factor), rtol=1e-3, atol=1e-3)


def test_jitter_saturation_keeps_grey_and_normalize():
    grey = IMAGE @ np.array([0.299, 0.587, 0.114], np.float32)
    for o in jittered(saturation=0.5):
        np.testing.assert_allclose(o @ np.array([0.299, 0.587, 0.114]), grey, rtol=1e-4)
    out = jittered(normalize=((10, 20, 30), (2, 4, 8)))
    np.testing.assert_allclose(out[0], (IMAGE - [10, 20, 30]) / [2, 4, 8], rtol=1e-6)


def test_jitter_normalize_keeps_one_and_two_channels():
    images = np.random.default_rng(1).uniform(0, 255, (2, 4, 5, 2)).astype(np.float32)
    cases = (
        (images[..., :1], (8.0, 2.0)),
        (images[..., :1], ((8.0,), (2.0,))),
        (images, ((10.0, 20.0), (2.0, 4.0))),
        (images, (10.0, (2.0, 4.0))),
    )
    for im, (mean, std) in cases:
        df = DataFrame.from_arrays(im=im).image_random_jitter("im", normalize=(mean, std))
        out = np.stack(list(df.iterator("im_jitter")))
        expected = (im - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)
        assert out.shape == im.shape
        np.testing.assert_allclose(out, expected, rtol=1e-6)
    df = DataFrame.from_arrays(im=images).image_random_jitter("im", normalize=((1, 2, 3), 1))
    with pytest.raises(DataError, match=r"3 values per mean or std.*2 channels"):
        list(df)
    with pytest.raises(DataError, match="mean has 2 values and std 3"):
        DataFrame.from_arrays(im=images).image_random_jitter("im", normalize=((1, 2), (1, 2, 3)))
    with pytest.raises(DataError, match=r"normalize must be \(mean, std\)"):
        DataFrame.from_arrays(im=images).image_random_jitter("im", normalize=(1, 2, 3))


def test_jitter_resize_of_a_ramp_is_a_ramp():
    ramp = np.broadcast_to(np.arange(8, dtype=np.float32)[None, :, None], (6, 8, 1))
    df = DataFrame.from_arrays(im=np.stack([ramp])).image_random_jitter("im", resize=(3, 3))
    out = df[0]["im_jitter"]
    assert out.shape == (3, 4, 1)  # the shorter side to 3, the aspect kept
    np.testing.assert_allclose(out[0, :, 0], (np.arange(4) + 0.5) * 2 - 0.5)


def test_jitter_errors():
    with pytest.raises(DataError, match="Jitter"):
        DataFrame.from_arrays(im=IMAGES).image_random_jitter("im", sharpness=1)
    with pytest.raises(DataError, match="3 channels"):
        df = DataFrame.from_arrays(im=IMAGES[..., :2]).image_random_jitter("im", brightness=0.1)
        list(df)
    with pytest.raises(DataError, match="resize"):
        DataFrame.from_arrays(im=IMAGES).image_random_jitter("im", resize=(4, 2))


def nnc_logexp(u, jitter):  # _ccv_cnnp_random_logexp for a uniform draw u
    limit = np.log(1 + jitter)
    return np.exp(u * 2 * limit - limit)


def test_jitter_colour_steps_see_the_crop():  # NNC slices first when the crop fits
    from fnnc.data.jitter import Jitter

    image = IMAGE.copy()
    image[:, :2] = 255.0  # bright columns outside the centre crop
    got = Jitter(size=(2, 4), center_crop=True, contrast=0.5)(image, rng=np.random.default_rng(3))
    rng = np.random.default_rng(3)
    rng.permutation(4)  # the colour steps' order, then the contrast factor
    factor = nnc_logexp(rng.random(), 0.5)
    crop = image[2:4, 2:6]  # spare (4, 4): the centre crop starts at (2, 2)
    mean = crop.mean(axis=(0, 1))
    np.testing.assert_allclose(got, mean + (crop - mean) * factor, rtol=1e-5, atol=1e-3)


def test_jitter_flip_mirrors_the_centre_crop():  # NNC crops, then flips
    from fnnc.data.jitter import Jitter

    ramp = np.broadcast_to(np.arange(7, dtype=np.float32)[None, :, None], (4, 7, 3))
    jitter = Jitter(size=(4, 4), center_crop=True, symmetric=True)
    outs = {tuple(jitter(ramp, rng=np.random.default_rng(s))[0, :, 0]) for s in range(16)}
    assert outs == {(2, 3, 4, 5), (5, 4, 3, 2)}  # spare 3: x = (3 + 1) / 2 = 2


def test_jitter_offset_of_a_fitting_crop_stays_inside():  # NNC clamps the input slice
    out = jittered(size=(6, 8), offset=(3, 2))
    np.testing.assert_array_equal(out, np.broadcast_to(IMAGE, out.shape))


def test_jitter_crop_larger_than_the_image_pads_after_normalize():
    out = jittered(size=(8, 8), center_crop=True, normalize=((10, 20, 30), (1, 1, 1)))
    expected = np.zeros((8, 8, 3), np.float32)
    expected[:6] = IMAGE - [10, 20, 30]  # spare rows -2: C's (-2 + 1) / 2 = 0
    np.testing.assert_allclose(out[0], expected, rtol=1e-6)


def test_jitter_fitting_crop_slices_the_input_then_resizes():
    ramp = np.broadcast_to(np.arange(6, dtype=np.float32)[:, None, None], (6, 6, 3))
    df = DataFrame.from_arrays(im=ramp[None]).image_random_jitter(
        "im", resize=(4, 4), size=(2, 2), center_crop=True
    )
    # NNC: resized 4 x 4, crop at 1, scale 6 / 4: input rows int(1.5 + 0.5) = 2 and
    # int(2 * 1.5 + 0.5) = 3 of them, [2, 3, 4], resized 3 -> 2 at centres 0.25, 1.75
    np.testing.assert_allclose(df[0]["im_jitter"][:, 0, 0], [2.25, 3.75], rtol=1e-6)


def test_jitter_normalize_std_zero_leaves_the_channel_unscaled():  # NNC: std ? 1 / std : 1
    out = jittered(normalize=((1, 2, 3), (1, 0, 2)))
    np.testing.assert_allclose(out[0], (IMAGE - [1, 2, 3]) * [1, 1, 0.5], rtol=1e-6)
