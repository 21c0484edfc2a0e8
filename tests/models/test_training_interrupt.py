"""Ctrl-C during training leaves a model whole and its progress true.

A SIGINT delivered while a donating step runs surfaces as soon as the compiled call
returns, inside ``Program._outputs``, before the engine has stored the new parameters
(the old buffers are deleted by then). The tests raise a real SIGINT there, as Ctrl-C
does, and check the model against an uninterrupted run of as many applied steps.
"""

from __future__ import annotations

import signal

import grain
import jax
import numpy as np
import optax
import pytest

from fnnc.graph.compile import Program
from fnnc.models import Dense, Dropout, Input, Model, ReLU
from fnnc.models.checkpoint_state import current_states
from fnnc.models.interrupts import deferred_interrupt

rng = np.random.default_rng(0)
XS = rng.standard_normal((40, 5)).astype(np.float32)
YS = (XS[:, 0] + XS[:, 1] > 0).astype(np.int32)


def _model(dropout: float = 0.0) -> Model:
    x = Input()
    h = ReLU()(Dense(8, name="h")(x))
    if dropout:
        h = Dropout(dropout)(h)
    m = Model(x, Dense(2, name="fc")(h))
    m.compile(XS[:8], loss="softmax_crossentropy", minimizer=optax.adam(1e-2))
    return m


def _assert_same(a: Model, b: Model) -> None:
    pa, pb = a.parameters(), b.parameters()
    assert pa.keys() == pb.keys()
    for k in pa:
        np.testing.assert_array_equal(pa[k], pb[k], err_msg=k)
    la, lb = jax.tree.leaves(current_states(a.engine)), jax.tree.leaves(current_states(b.engine))
    assert len(la) == len(lb)
    for x, y in zip(la, lb):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    ka, kb = (np.asarray(jax.random.key_data(m.engine.key)) for m in (a, b))
    np.testing.assert_array_equal(ka, kb)


def _adam_count(m: Model) -> int:
    return int(jax.tree.leaves(current_states(m.engine)["t-fc-0-0"])[0])


@pytest.fixture
def ctrl_c_after_donating_call(monkeypatch):
    """``arm(n)``: SIGINT (Ctrl-C) right after the ``n``-th donating program call returns."""
    original = Program._outputs
    state = {"calls": 0, "at": None}

    def outputs(self, args, values):
        if self.donate and state["at"] is not None:
            state["calls"] += 1
            if state["calls"] == state["at"]:
                state["at"] = None
                signal.raise_signal(signal.SIGINT)  # Python raises it here, unless held
        return original(self, args, values)

    monkeypatch.setattr(Program, "_outputs", outputs)

    def arm(n: int) -> None:
        state["calls"], state["at"] = 0, n

    return arm


def test_ctrl_c_as_fit_returns_keeps_the_applied_step(ctrl_c_after_donating_call):
    m, oracle = _model(), _model()
    m.fit(XS[:8], YS[:8])
    oracle.fit(XS[:8], YS[:8])
    ctrl_c_after_donating_call(1)
    with pytest.raises(KeyboardInterrupt):
        m.fit(XS[8:16], YS[8:16])
    oracle.fit(XS[8:16], YS[8:16])
    _assert_same(m, oracle)  # the interrupted step was applied and stored
    m.fit(XS[16:24], YS[16:24])
    oracle.fit(XS[16:24], YS[16:24])
    _assert_same(m, oracle)


def test_ctrl_c_as_apply_gradients_returns_keeps_the_update(ctrl_c_after_donating_call):
    def step(model):
        model.evaluate(XS[:8], is_test=False, requires_grad=True)
        model.backward([np.ones((8, 2), np.float32)])
        model.apply_gradients()

    m, oracle = _model(), _model()
    step(m)
    step(oracle)
    ctrl_c_after_donating_call(1)
    with pytest.raises(KeyboardInterrupt):
        step(m)
    step(oracle)
    _assert_same(m, oracle)


def test_ctrl_c_in_train_step_counts_it_and_continues_exactly(ctrl_c_after_donating_call):
    oracle = _model(dropout=0.3)
    oracle.train((XS, YS), epochs=2, batch_size=8, verbose=False)
    m = _model(dropout=0.3)
    ctrl_c_after_donating_call(3)
    with pytest.raises(KeyboardInterrupt):
        m.train((XS, YS), epochs=2, batch_size=8, verbose=False)
    assert m.train_progress.step == 3 == _adam_count(m)
    m.train((XS, YS), epochs=2 - m.train_progress.epoch, batch_size=8, verbose=False)
    _assert_same(m, oracle)
    assert m.train_progress.step == oracle.train_progress.step == 10


def test_ctrl_c_in_read_ahead_counts_the_applied_step():
    """A KeyboardInterrupt in the data pipeline, read while step 3 runs: step 3 was
    applied, so progress says 3 and continuing gives the uninterrupted run."""
    calls = {"n": 0, "at": None}

    def read(i):
        calls["n"] += 1
        if calls["n"] == calls["at"]:
            raise KeyboardInterrupt("Ctrl-C in the data pipeline")
        j = np.arange(i * 8, i * 8 + 8)
        return XS[j], YS[j]

    data = grain.MapDataset.range(5).map(read)
    oracle = _model()
    oracle.train(data, epochs=2, verbose=False)
    m = _model()
    calls["n"], calls["at"] = 0, 4  # reading batch 3, ahead, while step 3 runs
    with pytest.raises(KeyboardInterrupt):
        m.train(data, epochs=2, verbose=False)
    calls["at"] = None
    assert (m.train_progress.step, m.train_progress.batch) == (3, 3)
    assert _adam_count(m) == 3
    m.train(data, epochs=2 - m.train_progress.epoch, verbose=False)
    assert _adam_count(m) == _adam_count(oracle) == 10
    _assert_same(m, oracle)


def test_nested_blocks_swap_the_handler_once_and_deliver_one_interrupt(monkeypatch):
    """train's block around fit holds the signal; Engine.fit's block inside it does
    nothing, and the Ctrl-C surfaces once, after the outer block."""
    swaps = []
    real = signal.signal
    monkeypatch.setattr(signal, "signal", lambda *a: swaps.append(a[0]) or real(*a))
    done = []
    with pytest.raises(KeyboardInterrupt), deferred_interrupt():
        with deferred_interrupt():
            signal.raise_signal(signal.SIGINT)
            signal.raise_signal(signal.SIGINT)
            done.append("inner")
        done.append("outer")
    assert done == ["inner", "outer"]
    assert len(swaps) == 2  # installed and restored once, by the outer block
    with deferred_interrupt():  # the flag is down again: a new block holds anew
        done.append("again")
    assert len(swaps) == 4
