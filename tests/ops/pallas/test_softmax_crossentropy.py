"""Pallas softmax_crossentropy against its reference, in interpret mode."""

import jax
import numpy as np
import pytest

from fnnc import ops
from fnnc.ops.pallas import softmax_crossentropy as kernel
from tests.helpers import rand, randint
from tests.ops.pallas.checks import (
    check_forced_eager,
    check_kernel,
)


@pytest.mark.parametrize(
    ("lead", "classes", "label", "trims"),
    [
        ((6,), 64, "index", (0.0, 1.0)),
        ((2, 3), 2048 + 1024, "index", (0.01, 0.5)),  # three class blocks, smoothing
        ((5,), 8, "index1", (0.0, 1.0)),  # [..., 1] labels, a tiny power-of-two vocabulary
        ((3,), 1001, "float_index", (0.0, 1.0)),  # NNC rounds float labels; a ragged block
        ((3,), 37, "target", (0.0, 1.0)),  # dense targets in a ragged block
    ],
)
def test_matches_reference(monkeypatch, lead, classes, label, trims):
    monkeypatch.setattr(kernel, "CLASS_BLOCK", 1024)
    x = rand((*lead, classes), seed=1, lo=-4, hi=4)
    idx = randint(lead, classes, seed=2)
    labels = {
        "index": idx,
        "index1": idx[..., None],
        "float_index": idx.astype(np.float32) + 0.3,
        "target": rand((*lead, classes), seed=3, lo=0, hi=1),
    }[label]
    cmd = ops.softmax_crossentropy(trim0=trims[0], trim1=trims[1])
    check_kernel(kernel, cmd, [x, labels], diff=[0], rtol=1e-5, atol=1e-4)


def test_small_class_blocks_walk_the_vocabulary(monkeypatch):
    monkeypatch.setattr(kernel, "CLASS_BLOCK", 16)  # 4 blocks: the online logsumexp rescales
    x = rand((3, 64), seed=4, lo=-8, hi=8)
    check_kernel(kernel, ops.softmax_crossentropy(), [x, randint((3,), 64, seed=5)], diff=[0])


def test_forced_eager_call():
    check_forced_eager(ops.softmax_crossentropy(), [rand((4, 32)), randint((4,), 32)])


def test_empty_class_axis_is_declined():
    spec = jax.ShapeDtypeStruct
    why = kernel.supports(
        ops.softmax_crossentropy(), [spec((4, 0), np.float32), spec((4,), np.int32)]
    )
    assert "no classes" in why


def test_wrong_dtype_is_declined():
    spec = jax.ShapeDtypeStruct
    why = kernel.supports(
        ops.softmax_crossentropy(), [spec((4, 32), np.float64), spec((4,), np.int32)]
    )
    assert "float64" in why
