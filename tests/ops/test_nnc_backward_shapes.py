"""backward.tests.c with NNC's own shapes (liuliu/ccv ``test/unit/nnc``): the
convolution backward of an unbatched 31x21x3 input, and the gemm backward of a rank-1
input and of a batch of 2 (the earlier ports add a batch axis). Oracles: the closed
forms NNC's test computes."""

from __future__ import annotations

import numpy as np

from fnnc import ops

F32 = np.float32


def test_convolution_backward_of_an_unbatched_input():
    conv = ops.convolution(padding="SAME")
    a = np.ones((31, 21, 3), F32)
    w = np.full((32, 5, 3, 3), 2, F32)
    bias = np.zeros(32, F32)
    y = conv(a, w, bias)
    g = np.ones((31, 21, 32), F32)
    h, gw, gbias = conv.definition.backward([g], [a, w, bias], [y], **conv.kwargs)
    i, j = np.arange(31)[:, None], np.arange(21)[None, :]
    rows = 5 + np.minimum(i - 2, 0) + np.minimum(28 - i, 0)  # kernel rows inside the image
    cols = 3 + np.minimum(j - 1, 0) + np.minimum(19 - j, 0)
    np.testing.assert_allclose(np.asarray(h), np.repeat((64 * rows * cols)[..., None], 3, -1))
    taps = (31 - np.abs(np.arange(5) - 2))[:, None] * (21 - np.abs(np.arange(3) - 1))[None, :]
    np.testing.assert_allclose(np.asarray(gw), np.broadcast_to(taps[None, :, :, None], w.shape))
    np.testing.assert_allclose(np.asarray(gbias), np.full(32, 21 * 31))


def test_gemm_backward_of_a_rank_1_input_and_of_a_batch():
    m = F32([[0.5, 0.2, -0.3, 2, 4], [1, 8, 2, 8, -1], [0, 10, -1, -2, 3], [4, 7, 8, 10, 0]])
    x, bias = F32([5, -3, 10, 11, -1]), F32([1, 4, 2, -1])
    dense = ops.gemm(transpose_b=True)
    h_one = F32([0.5 + 4 - 4, 0.2 + 32 + 20 - 7, -0.3 + 8 - 2 - 8, 2 + 32 - 4 - 10, 4 - 4 + 6])
    for a, g, h_want, w_want, b_want in (
        (x, bias, h_one, np.outer(bias, x), bias),
        (np.stack([x, -x]), np.stack([-bias, bias]), np.stack([-h_one, h_one]),
         -2 * np.outer(bias, x), np.zeros(4)),
    ):  # fmt: skip
        y = dense(a, m, bias)
        h, gw, gb = dense.definition.backward([g], [a, m, bias], [y], **dense.kwargs)
        np.testing.assert_allclose(np.asarray(h), h_want, rtol=1e-6)
        np.testing.assert_allclose(np.asarray(gw), w_want, rtol=1e-6)
        np.testing.assert_allclose(np.asarray(gb), b_want, rtol=1e-6)
