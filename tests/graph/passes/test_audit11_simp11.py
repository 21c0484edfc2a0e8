"""Audit 11 of the simplifying passes and the rewrite toolkit (fuse, Rewriter, ...)."""

from __future__ import annotations

import numpy as np

from fnnc import ops
from fnnc.graph import GraphBuilder, fuse, interpret, simplify

X = np.array([[0.1, -1.0, 2.0], [0.3, 0.5, -0.2]], np.float32)


def _entropy(x):
    """The binary entropy of sigmoid(x), summed over the last axis (float64)."""
    p = 1.0 / (1.0 + np.exp(-np.asarray(x, np.float64)))
    return -(p * np.log(p) + (1 - p) * np.log1p(-p)).sum(-1, keepdims=True)


def _sigmoid_entropy():
    b = GraphBuilder()
    x = b.input((2, 3), name="x")
    p = b.exec(ops.sigmoid(), x, name="p")
    return b, b.exec(ops.binary_crossentropy(), p, p, name="entropy")


def test_fuse_keeps_binary_crossentropy_of_a_sigmoid_with_itself() -> None:
    # binary_crossentropy(sigmoid(x), sigmoid(x)) (an entropy term) was fused into
    # sigmoid_binary_crossentropy(x, p) writing p: a node reading its own output.
    b, h = _sigmoid_entropy()
    graph = b.build([h])
    assert fuse(graph) is graph
    np.testing.assert_allclose(interpret(simplify(graph), X), _entropy(X), rtol=1e-5)
