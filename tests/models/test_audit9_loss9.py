"""Audit 9 (losses): Model.fit's fused head and label checks against NumPy oracles."""

from __future__ import annotations

import numpy as np
import optax

from fnnc.graph.passes import linear_crossentropy
from fnnc.models import Dense, Input, Model


def test_fit_fuses_a_head_whose_labels_are_batch_first(monkeypatch):
    """Scores [N, 1, V] with labels [N] (NNC's batch-first rule, which softmax_crossentropy
    takes): the fuse pass made a linear_softmax_crossentropy node whose shape rule refused
    the labels, so fit raised a GraphError once the head was large enough to fuse."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((4, 1, 3)).astype(np.float32)
    y = rng.integers(0, 5, (4,)).astype(np.int32)
    losses = {}
    for min_logits in (0, 10**9):
        monkeypatch.setattr(linear_crossentropy, "MIN_LOGITS", min_logits)
        i = Input(name="x")
        model = Model([i], [Dense(5, name="fc")(i)])
        model.compile([x], loss="softmax_crossentropy", minimizer=optax.sgd(0.5), seed=1)
        w, b = (np.asarray(v, np.float64) for v in model.parameters().values())
        losses[min_logits] = [float(model.fit([x], [y])) for _ in range(2)]
        names = [n.cmd.name for n in model.engine._last_fit.program.graph.nodes]
        assert ("softmax_crossentropy" in names) == (min_logits > 0)
    z = x[:, 0].astype(np.float64) @ w.T + b
    want = np.mean(np.log(np.exp(z).sum(-1)) - z[np.arange(4), y])
    np.testing.assert_allclose(losses[0][0], want, rtol=1e-6)
    np.testing.assert_allclose(losses[0], losses[10**9], rtol=1e-6)
