"""memory_compression: LSSC keeps values in float16's range, as NNC's half commands do;
beyond it the numerics check names the decompression."""

from __future__ import annotations

import numpy as np
import pytest

from fnnc import config, ops
from fnnc.errors import NumericsError
from fnnc.graph import GraphBuilder, backward, compile, interpret, memory_compression


def _two_convolutions():
    """x -> c1 = x * w1 -> c2 = c1 * w2 -> sum: d sum / d w2 = sum(c1) (1x1 kernels)."""
    b = GraphBuilder()
    x = b.input((1, 4, 4, 1), name="x")
    w1, w2 = b.input((1, 1, 1, 1), name="w1"), b.input((1, 1, 1, 1), name="w2")
    c1 = b.exec(ops.convolution(padding="SAME"), x, w1, name="c1")
    c2 = b.exec(ops.convolution(padding="SAME"), c1, w2, name="c2")
    loss = b.exec(ops.reduce_sum(axes=(0, 1, 2, 3)), c2, name="loss")
    return backward(b.build([loss]), loss, [w2])[0]


@pytest.mark.parametrize("top", [6e4, 1e5])
def test_activations_beyond_float16_range_decompress_to_inf_and_the_check_names_it(top):
    xs = np.linspace(0.5, 1.0, 16, dtype=np.float32).reshape(1, 4, 4, 1) * np.float32(top)
    ones = np.ones((1, 1, 1, 1), np.float32)
    squeezed = memory_compression(_two_convolutions())
    assert [n.name for n in squeezed.nodes if n.cmd.name.startswith("lssc")] == [
        "c1.lssc",
        "c1.unlssc",
    ]
    exact = xs.astype(np.float64).sum()  # NumPy: the gradient of w2 without compression
    grads = [interpret(squeezed, xs, ones, ones)[1], compile(squeezed)(xs, ones, ones)[1]]
    if top <= float(np.finfo(np.float16).max):  # in float16's range: four levels per block
        error = 16 * (xs.max() - xs.min()) / 6 + 16 * top * 2.0**-10  # levels, half's ulp
        for g in grads:
            assert abs(float(np.asarray(g).ravel()[0]) - exact) <= error
        with config.override(numerics=True):
            interpret(squeezed, xs, ones, ones)
        return
    for g in grads:  # NNC's format: min and max are halves, 65504 at most
        assert np.isinf(np.asarray(g)).all()
    blamed = pytest.raises(NumericsError, match=r"c1\.unlssc, lssc_decompress")
    with config.override(numerics=True), blamed as caught:
        compile(squeezed)(xs, ones, ones)
    assert "overflow in float16" in str(caught.value)
