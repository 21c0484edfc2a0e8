"""Model.train fed by a DataFrame read by 2 Grain worker processes.

One test on purpose: each worker process imports JAX and Grain, seconds on a small
machine. The oracle is the same training fed by the DataFrame read in the training
thread (itself checked against arrays in test_training): the stream must be the same,
so the runs are bitwise equal; and the workers start once, not once per epoch.
"""

import grain
import numpy as np
import optax

from fnnc.data import DataFrame, release_workers
from fnnc.models import Dense, Input, Model

RNG = np.random.default_rng(0)
XS = RNG.standard_normal((96, 4)).astype(np.float32)
YS = np.argmax(XS[:, :3], axis=1).astype(np.int32)


def _train(frame):
    x = Input()
    model = Model(x, Dense(3, name="fc")(x))
    model.compile(XS[:16], loss="softmax_crossentropy", minimizer=optax.adam(0.05))
    history = model.train(frame, epochs=2, batch_size=16, verbose=False)
    history.update(model.train(frame, epochs=1, batch_size=16, verbose=False))
    return history, model.parameters()


def test_two_workers_train_as_the_training_thread_and_start_once(monkeypatch):
    started = []
    mp_prefetch = grain.IterDataset.mp_prefetch

    def counted(self, *args, **kwargs):
        started.append(1)
        return mp_prefetch(self, *args, **kwargs)

    monkeypatch.setattr(grain.IterDataset, "mp_prefetch", counted)
    frame = DataFrame.from_arrays(x=XS, y=YS)
    want, want_params = _train(frame)
    assert not started
    try:
        got, got_params = _train(frame.read_with(workers=2))
    finally:
        release_workers()
    assert len(started) == 1  # 3 epochs over 2 train calls, one start of the workers
    assert got == want
    for pid, value in want_params.items():
        np.testing.assert_array_equal(got_params[pid], value, err_msg=pid)
