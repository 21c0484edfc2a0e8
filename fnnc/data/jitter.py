"""NNC's image augmentation (``ccv_cnnp_random_jitter_t``) on NumPy ``[H, W, C]`` images.

The steps, in NNC's order (``_ccv_cnnp_random_jitter``), each drawing from the row's
generator:

1. resize: the shorter side to a size drawn from ``resize=(min, max)``, keeping the
   aspect ratio, then stretched by ``sqrt`` of a log-uniform factor in
   ``[1 / (1 + aspect_ratio), 1 + aspect_ratio]`` and rounded to ``roundup``;
2. crop to ``size=(rows, cols)``: centred (``center_crop``) or at a random place, then
   moved by up to ``offset=(x, y)`` pixels. When the crop fits inside the resized
   image, NNC cuts the matching part of the input (its place scaled to the input and
   kept inside it) and resizes only that to ``size``, so the steps below see the crop;
3. flip left-right with probability 1/2 (``symmetric``);
4. brightness, saturation, contrast and lighting, in a random order: brightness scales
   by a log-uniform factor in ``[1 / (1 + b), 1 + b]``; saturation and contrast blend
   with the grey image (0.299 R + 0.587 G + 0.114 B) and with the per-channel mean by
   such a factor; lighting adds ImageNet's PCA colour noise (AlexNet's, NNC's
   constants) with weights uniform in ``[0, lighting)``, clamped to ``[0, 255]``;
5. normalize: ``(x - mean) / std`` per channel (a ``std`` of 0 leaves that channel
   unscaled, as NNC stores ``1 / std``, or 1 for 0); ``mean`` and ``std`` are each one
   number for every channel or one per channel (NNC's take 3, for RGB only);
6. a crop larger than the resized image is cut only now, after normalization, so the
   part outside the image is 0 (NNC's order).

Resizing is bilinear with half-pixel centres (NNC uses area averaging to shrink and
bicubic to enlarge, so resized pixels differ slightly; geometry and randomness do
not depend on it). NNC draws from SFMT; here the row's ``np.random.Generator`` does,
so a seed gives the same images in fnnc every time, not NNC's.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from fnnc.core.params import flag_value
from fnnc.data.errors import as_int

# ImageNet RGB eigenvalues times eigenvectors (AlexNet; NNC copies MXNet's).
_PCA = np.array(
    [
        [55.46 * -0.5675, 4.794 * 0.7192, 1.148 * 0.4009],
        [55.46 * -0.5808, 4.794 * -0.0045, 1.148 * -0.8140],
        [55.46 * -0.5836, 4.794 * -0.6948, 1.148 * 0.4203],
    ],
    dtype=np.float32,
)
_GREY = np.array([0.299, 0.587, 0.114], dtype=np.float32)


def logexp(rng: np.random.Generator, jitter: float) -> float:
    """A factor log-uniform in ``[1 / (1 + jitter), 1 + jitter]`` (NNC's ``random_logexp``)."""
    limit = math.log1p(jitter)
    return math.exp(rng.random() * 2 * limit - limit)


def resize_bilinear(image: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """``image`` ``[H, W, C]`` resized to ``[rows, cols, C]``, bilinear, half-pixel centres."""
    for axis, size in ((0, rows), (1, cols)):
        n = image.shape[axis]
        if n == size:
            continue
        where = np.clip((np.arange(size) + 0.5) * n / size - 0.5, 0, n - 1)
        low = np.floor(where).astype(np.int64)
        high = np.minimum(low + 1, n - 1)
        shape = [1] * image.ndim
        shape[axis] = size
        weight = (where - low).astype(np.float32).reshape(shape)
        image = np.take(image, low, axis) * (1 - weight) + np.take(image, high, axis) * weight
    return image


def _pair(value: Any, what: str) -> tuple[int, int] | None:
    """``value`` (``None``, one integer, or a pair of them) as a pair of Python ints; NNC's
    ``ccv_cnnp_random_jitter_t`` holds these sizes in pixels as ``int``."""
    if value is None:
        return None
    pair = (value, value) if np.ndim(value) == 0 else tuple(value)
    whole = [as_int(v) for v in pair]
    if len(pair) != 2 or None in whole:
        raise ValueError(f"{what} must be an integer or a pair of integers, got {value!r}")
    return whole[0], whole[1]  # type: ignore[return-value]


def _amount(value: Any, what: str) -> float:
    """A jitter amount: a finite number >= 0 (0 turns the step off)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.number)):
        raise ValueError(f"{what} must be a number >= 0, got {value!r}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{what} must be a finite number >= 0 (0 turns it off), got {value!r}")
    return float(value)


def _mean_std(normalize: Any) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """``normalize=(mean, std)`` as two tuples of floats, each one number (for every
    channel) or one per channel; a ValueError saying what is wrong otherwise."""
    try:
        mean, std = (np.asarray(v, np.float64) for v in normalize)
    except (TypeError, ValueError):
        mean = std = None
    if mean is None or std is None or mean.ndim > 1 or std.ndim > 1 or not mean.size * std.size:
        raise ValueError(
            "normalize must be (mean, std), each a number or one number per channel, "
            f"got {normalize!r}"
        )
    if min(mean.size, std.size) > 1 and mean.size != std.size:
        raise ValueError(
            f"normalize: mean has {mean.size} values and std {std.size}; give one number "
            "or one per channel for each"
        )
    return tuple(mean.reshape(-1).tolist()), tuple(std.reshape(-1).tolist())


@dataclasses.dataclass(frozen=True)
class Jitter:
    """NNC's ``ccv_cnnp_random_jitter_t``; called as ``jitter(image, rng=generator)``
    (a :meth:`~fnnc.data.DataFrame.map` with ``random=True``). All off by default.

    ``resize``, ``size``, ``offset`` and ``roundup`` are pixels, integers as NNC's
    (``resize``/``size``/``offset`` one or a pair); ``aspect_ratio``, ``brightness``,
    ``contrast``, ``saturation`` and ``lighting`` are numbers >= 0. Anything else is a
    ``ValueError`` when the jitter is made, not when the first image is read."""

    resize: Any = None
    size: Any = None
    offset: Any = (0, 0)
    aspect_ratio: float = 0.0
    center_crop: bool = False
    symmetric: bool = False
    brightness: float = 0.0
    contrast: float = 0.0
    saturation: float = 0.0
    lighting: float = 0.0
    normalize: Any = None
    roundup: int = 0

    def __post_init__(self) -> None:
        resize, size = _pair(self.resize, "resize"), _pair(self.size, "size")
        if resize is not None and not 0 < resize[0] <= resize[1]:
            raise ValueError(f"resize must be (min, max) with 0 < min <= max, got {self.resize!r}")
        if size is not None and min(size) <= 0:
            raise ValueError(f"size must be positive (rows, cols), got {self.size!r}")
        for name in ("center_crop", "symmetric"):  # bool("no") would be True
            meant = flag_value(getattr(self, name))
            if meant is None:
                raise ValueError(
                    f"{name} must be True or False (or NNC's 1 / 0), got {getattr(self, name)!r}"
                )
            object.__setattr__(self, name, meant)
        for name in ("aspect_ratio", "brightness", "contrast", "saturation", "lighting"):
            object.__setattr__(self, name, _amount(getattr(self, name), name))
        roundup = as_int(self.roundup)
        if roundup is None or roundup < 0:
            raise ValueError(f"roundup must be an integer >= 0 (0: off), got {self.roundup!r}")
        object.__setattr__(self, "roundup", roundup)
        normalize = self.normalize
        if normalize is not None:
            normalize = _mean_std(normalize)
        object.__setattr__(self, "resize", resize)
        object.__setattr__(self, "size", size)
        object.__setattr__(self, "offset", _pair(self.offset, "offset") or (0, 0))
        object.__setattr__(self, "normalize", normalize)

    def __call__(self, image: Any, *, rng: np.random.Generator) -> np.ndarray:
        image = np.asarray(image, dtype=np.float32)
        if image.ndim == 4:  # a batch: one draw after another from the batch's generator
            return np.stack([self(one, rng=rng) for one in image])
        if image.ndim != 3:
            raise ValueError(f"expected an image [H, W, C], got shape {list(image.shape)}")
        height, width = image.shape[:2]
        rows, cols = height, width
        if self.resize is not None:
            low, high = self.resize
            r = min(max(int(rng.random() * (high - low) + 0.5) + low, low), high)
            rows, cols = (
                max(r, int(height * r / width + 0.5)),
                max(r, int(width * r / height + 0.5)),
            )
        if self.aspect_ratio > 0:
            ratio = math.sqrt(logexp(rng, self.aspect_ratio))
            rows, cols = int(rows * ratio + 0.5), int(cols / ratio + 0.5)
        if self.roundup > 0:
            up = self.roundup
            rows, cols = (rows + up // 2) // up * up, (cols + up // 2) // up * up
        crop = self._crop_origin(rows, cols, rng)
        if crop is not None and rows >= self.size[0] and cols >= self.size[1]:
            image = _slice_input(image, crop, (rows, cols), self.size)
            (rows, cols), crop = self.size, None
        image = resize_bilinear(image, rows, cols)
        if self.symmetric and rng.integers(2) == 0:
            image = image[:, ::-1]
        image = self._colour(image, rng)
        if self.normalize is not None:
            mean, std = (np.asarray(v, np.float32) for v in self.normalize)
            channels = image.shape[2]
            if max(mean.size, std.size) not in (1, channels):
                raise ValueError(
                    f"normalize gives {max(mean.size, std.size)} values per mean or std, but "
                    f"the image has {channels} channel{'s' if channels != 1 else ''}; give "
                    f"mean and std as one number each or {channels} each"
                )
            inv_std = np.divide(1, std, out=np.ones_like(std), where=std != 0)  # NNC's
            image = (image - mean) * inv_std
        if crop is not None:
            image = _crop(image, crop, self.size)
        return np.ascontiguousarray(image, dtype=np.float32)

    def _crop_origin(self, rows: int, cols: int, rng: np.random.Generator) -> Any:
        if self.size is None:
            return None
        size_rows, size_cols = self.size
        ox, oy = self.offset
        if (rows, cols) == (size_rows, size_cols) and ox == 0 and oy == 0:
            return None
        origin = []
        for extent, want, jitter in ((cols, size_cols, ox), (rows, size_rows, oy)):
            spare = extent - want
            # int() truncates toward 0, as C's / and (int) do for a negative spare
            at = int((spare + 1) / 2) if self.center_crop else int(rng.random() * (spare + 1))
            at = min(max(at, min(0, spare)), max(0, spare))
            if jitter:
                at = int(at + rng.random() * jitter * 2 - jitter)
            origin.append(at)
        return origin[1], origin[0]  # (y, x)

    def _colour(self, image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        if not (self.brightness or self.saturation or self.contrast or self.lighting):
            return image
        if image.shape[2] != 3:
            raise ValueError(f"colour jitter needs 3 channels (RGB), got {image.shape[2]}")
        for step in rng.permutation(4):
            if step == 0 and self.brightness:
                image = image * logexp(rng, self.brightness)
            elif step == 1 and self.saturation:
                grey = (image @ _GREY)[..., None]
                image = grey + (image - grey) * logexp(rng, self.saturation)
            elif step == 2 and self.contrast:
                mean = image.mean(axis=(0, 1))
                image = mean + (image - mean) * logexp(rng, self.contrast)
            elif step == 3 and self.lighting:
                alpha = rng.random(3).astype(np.float32) * self.lighting
                image = np.clip(image + _PCA @ alpha, 0, 255)
        return image


def _slice_input(
    image: np.ndarray, origin: tuple[int, int], resized: tuple[int, int], size: tuple[int, int]
) -> np.ndarray:
    """The part of the input that the crop ``origin`` + ``size`` of the image resized to
    ``resized`` shows, rounded to input pixels and kept inside the input (NNC's slice
    before its resample, ``_ccv_cnnp_random_jitter``)."""
    cut = []
    for at, extent, want, n in zip(origin, resized, size, image.shape[:2]):
        scale = n / extent
        length = min(max(int(want * scale + 0.5), 1), n)
        start = min(max(int(at * scale + 0.5), 0), n - length)
        cut.append(slice(start, start + length))
    return image[cut[0], cut[1]]


def _crop(image: np.ndarray, origin: tuple[int, int], size: tuple[int, int]) -> np.ndarray:
    """``image[y:y+rows, x:x+cols]``, zero where that leaves the image."""
    (y, x), (rows, cols) = origin, size
    out = np.zeros((rows, cols, image.shape[2]), np.float32)
    top, left = max(y, 0), max(x, 0)
    bottom, right = min(y + rows, image.shape[0]), min(x + cols, image.shape[1])
    if bottom > top and right > left:
        out[top - y : bottom - y, left - x : right - x] = image[top:bottom, left:right]
    return out
