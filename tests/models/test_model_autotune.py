"""Model.autotune: the evaluate and fit programs' nodes tuned on the real shapes.

Tuning writes the table for the model's convolution shapes (forward and gradient),
changes nothing the model holds and no output beyond backend rounding, makes the next
programs compile with the winners, and a second call measures nothing.
"""

from __future__ import annotations

import jax
import numpy as np
import optax

from fnnc import ops
from fnnc.graph import cpu_libraries
from fnnc.graph.autotune import eligible
from fnnc.models import BatchNorm, Conv, Dense, Flatten, ReLU, Sequential
from fnnc.ops import autotune as op_autotune
from tests.helpers import assert_close, rand, randint

HERE = jax.default_backend()  # where the model's programs choose their backends
X = rand((16, 6, 6, 2))
Y = randint((16,), 3, seed=1)
CONV = ops.convolution(strides=1, padding="SAME", dilation=1, groups=1)


def _model():
    # SGD, not Adam: the convolution's bias feeds a BatchNorm, so its gradient is
    # rounding noise around 0, which Adam's normalised step turns into +-lr: another
    # backend's summation order would then move the bias by 1e-2, not by rounding.
    model = Sequential([Conv(4, (3, 3)), BatchNorm(), ReLU(), Flatten(), Dense(3)])
    model.compile([X], loss="softmax_crossentropy", minimizer=optax.sgd(0.1))
    return model


def _conv_key():
    spec = jax.ShapeDtypeStruct
    specs = [spec(X.shape, np.float32), spec((4, 3, 3, 2), np.float32), spec((4,), np.float32)]
    return op_autotune.key(CONV, specs, HERE)


def _with_a_choice(graph) -> dict[int, str]:
    """The nodes of ``graph`` with more than one backend here, to their table keys."""
    out = {}
    for i, node in enumerate(graph.nodes):
        specs = [graph.spec(s) for s in node.inputs]
        if len(eligible(node.cmd, specs, HERE)) > 1:
            out[i] = op_autotune.key(node.cmd, specs, HERE)
    return out


def test_autotune_tunes_the_programs_and_changes_no_output(clean_table, monkeypatch):
    untuned = _model()
    want_eval = untuned.evaluate([X])
    want_loss = untuned.fit([X], [Y])
    want_params = untuned.parameters()

    model = _model()
    before, key = model.parameters(), jax.random.key_data(model.engine.key)
    winners = model.autotune([X], [Y], repeats=1)
    assert np.array_equal(jax.random.key_data(model.engine.key), key)  # no key drawn

    assert set(winners) == {"evaluate", "fit"}
    nodes = [k for k in clean_table if not k.startswith("program|")]
    if HERE == "cpu":
        assert _conv_key() in clean_table, list(clean_table)
        assert len(nodes) == 2  # the forward and the gradient of the one convolution shape
    # ... and one XLA:CPU library set per program (fit and evaluate); none off CPU.
    assert len(clean_table) - len(nodes) == (2 if HERE == "cpu" else 0), list(clean_table)
    assert_close(model.parameters(), before, 0, 0, what="parameters after autotune")

    # The next programs compile with the winners and compute the same values.
    assert_close(model.evaluate([X]), want_eval, 1e-5, 1e-5)
    assert_close(model.fit([X], [Y]), want_loss, 1e-5, 1e-5)
    assert_close(model.parameters(), want_params, 1e-5, 1e-5)
    program = model.engine._last_fit.program
    # Tuned: exactly the nodes with more than one backend here (evaluate's are among
    # the fit program's), each timed once per table key.
    choices = _with_a_choice(program.graph)
    assert set(winners["fit"]) == set(choices), (winners, choices)
    assert set(nodes) == set(choices.values()), list(clean_table)
    assert {i: program.backends[i][2] for i in winners["fit"]} == winners["fit"]
    if HERE == "cpu":
        kinds = {program.graph.nodes[i].cmd.name for i in winners["fit"]}
        assert kinds == {"convolution", "gradient"}, winners
        library_key = cpu_libraries.program_key(program.graph, "cpu")
        assert program.cpu_libraries == clean_table[library_key]

    # Cached: a second call times nothing and reports the same winners.
    def no_timing(*args, **kwargs):
        raise AssertionError("autotune timed a node the table already holds")

    monkeypatch.setattr(op_autotune, "autotune", no_timing)
    monkeypatch.setattr(op_autotune, "median_seconds", no_timing)
    assert model.autotune([X], [Y], repeats=1) == winners
