"""Model.fit runs a dense layer feeding the softmax cross-entropy loss as one fused node
(past MIN_LOGITS): linear_softmax_crossentropy_mean, which makes the gradient in the
forward, or with that pass off the blockwise linear_softmax_crossentropy; and trains
exactly as before either way."""

import textwrap

import numpy as np
import pytest

from fnnc.graph.passes import linear_crossentropy, linear_crossentropy_mean
from fnnc.models import Dense, Embedding, Input, LayerNorm, Model, minimizers
from tests.helpers import run_on_cpu_devices

VOCAB, WIDTH, LENGTH = 40, 16, 6


def _model():
    tokens = Input(name="tokens")
    h = LayerNorm(name="ln")(Embedding(VOCAB, WIDTH, name="embed")(tokens))
    return Model([tokens], [Dense(VOCAB, name="logits")(h)], name="head")


def _losses(monkeypatch, min_logits, precision, mean=True):
    monkeypatch.setattr(linear_crossentropy, "MIN_LOGITS", min_logits)
    monkeypatch.setattr(linear_crossentropy_mean, "IN_FIT", mean)
    rng = np.random.default_rng(0)
    x = rng.integers(0, VOCAB, (4, LENGTH)).astype(np.int32)
    y = rng.integers(0, VOCAB, (4, LENGTH)).astype(np.int32)
    model = _model()
    model.compile(
        [x], loss="softmax_crossentropy", minimizer=minimizers.adam(1e-2), precision=precision
    )
    losses = [float(model.fit([x], [y])) for _ in range(3)]
    names = [n.cmd.name for n in model.engine._last_fit.program.graph.nodes]
    return losses, names


@pytest.mark.parametrize("mean", [True, False], ids=["mean", "blockwise"])
@pytest.mark.parametrize("precision", [None, "bfloat16"])
def test_fit_fuses_the_head_and_trains_the_same(monkeypatch, precision, mean):
    fused, names = _losses(monkeypatch, 0, precision, mean)
    name = "linear_softmax_crossentropy" + ("_mean" if mean else "")
    assert name in names and "softmax_crossentropy" not in names and "gemm" not in names
    if mean:
        assert "linear_softmax_crossentropy" not in names  # its backward recomputes
    plain, names = _losses(monkeypatch, 10**9, precision)  # below the threshold: unfused
    assert not any(n.startswith("linear_softmax") for n in names)
    tol = 1e-5 if precision is None else 2e-2
    np.testing.assert_allclose(fused, plain, rtol=tol, atol=tol)
    assert fused[-1] < fused[0]


DATA_PARALLEL = textwrap.dedent(
    """
    import numpy as np, optax, jax
    from fnnc.graph.passes import linear_crossentropy
    from fnnc.models import Dense, Embedding, Input, LayerNorm, Model
    linear_crossentropy.MIN_LOGITS = 0
    V, W, L = 40, 16, 6
    rng = np.random.default_rng(0)
    x = rng.integers(0, V, (8, L)).astype(np.int32); y = rng.integers(0, V, (8, L)).astype(np.int32)
    def run(n=None, mode="replicated"):
        t = Input(name="tokens")
        h = LayerNorm(name="ln")(Embedding(V, W, name="embed")(t))
        m = Model([t], [Dense(V, name="logits")(h)], name="head")
        if n: m.set_data_parallel(n, parameter_sharding=mode)
        m.compile([x], loss="softmax_crossentropy", minimizer=optax.adam(1e-2))
        losses = [float(m.fit([x], [y])) for _ in range(3)]
        names = [nd.cmd.name for nd in m.engine._last_fit.program.graph.nodes]
        return losses, m.parameters(), names
    ref, pref, names = run()
    assert "linear_softmax_crossentropy_mean" in names, names
    for mode in ("replicated", "fsdp"):
        got, pgot, _ = run(4, mode)
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
        for k in pref: np.testing.assert_allclose(pgot[k], pref[k], rtol=1e-5, atol=1e-5, err_msg=k)
    print("OK", ref)
    """
)


def test_the_fused_mean_head_trains_the_same_on_four_data_parallel_devices():
    """The mean head's row blocks slice the batch axis data parallelism shards: one
    device, four replicated and four FSDP devices take the same steps."""
    run_on_cpu_devices(DATA_PARALLEL)
