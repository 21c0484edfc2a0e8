"""Model.train resumed with another batch_size: no sample of the stopped epoch is
skipped or repeated (arrays), or a clear error (dataframes, batched in the old size)."""

from __future__ import annotations

import numpy as np
import optax
import pytest

from fnnc.data import DataFrame
from fnnc.errors import ModelError
from fnnc.models import CheckpointEvery, Dense, Input, Model

N = 48
X = np.random.default_rng(1).standard_normal((N, 3)).astype(np.float32)
X[:, 0] = np.arange(N)  # the sample's id, read back from each batch fit sees
Y = (np.arange(N) % 2).astype(np.int32)


def recording_model(seen):
    x = Input()
    model = Model(x, Dense(2, name="fc")(x))
    model.compile(X[:8], loss="softmax_crossentropy", minimizer=optax.sgd(0.0))
    fit = model.fit

    def recorded(inputs, targets):
        seen.append(np.asarray(inputs[0])[:, 0].astype(int).tolist())
        return fit(inputs, targets)

    model.fit = recorded
    return model


def flat(batches):
    return [i for batch in batches for i in batch]


class StopAt:
    def __init__(self, step):
        self.step = step

    def on_train_begin(self, loop): ...
    def on_step_end(self, loop, step, loss):
        loop.stop = step == self.step

    def on_epoch_end(self, loop, epoch, logs): ...
    def on_train_end(self, loop): ...


def run(path, data, batch_size, stop=None, epochs=1):
    """Batches fit saw in one resumed call (a checkpoint each step); ``stop``: the
    step (counted over every call) after which it stops."""
    seen = []
    callbacks = [CheckpointEvery(path, steps=1)] + ([StopAt(stop)] if stop else [])
    model = recording_model(seen)
    model.train(data, epochs=epochs, batch_size=batch_size, resume=path,
                callbacks=callbacks, verbose=False)  # fmt: skip
    return seen, model.train_progress


def test_arrays_continue_the_stopped_epoch_at_its_sample_in_the_new_batch_size(tmp_path):
    path = str(tmp_path / "run.ckpt")
    order = np.random.default_rng((0, 0)).permutation(N).tolist()  # epoch 0's order
    first, _ = run(path, (X, Y), 8, stop=2)  # samples 0..16 of the order
    second, _ = run(path, (X, Y), 16)
    assert [len(b) for b in first + second] == [8, 8, 16, 16]
    assert flat(first + second) == order


def test_arrays_shifted_positions_survive_checkpoints_and_more_batch_sizes(tmp_path):
    path = str(tmp_path / "run.ckpt")
    order = np.random.default_rng((0, 0)).permutation(N).tolist()
    a, _ = run(path, (X, Y), 8, stop=1)  # 8 samples
    b, _ = run(path, (X, Y), 16, stop=2)  # 16 more: the batches start at sample 8
    c, prog = run(path, (X, Y), 4)  # from sample 24 to the end
    assert [len(x) for x in (a, b, c)] == [1, 1, 6]
    assert flat(a + b + c) == order
    assert (prog.epoch, prog.batch, prog.step) == (1, 0, 8)
    # not a multiple of the new size: the samples after the last full batch are dropped
    # as at any epoch's end (40..47 of 48 do not fill a batch of 16)
    path2 = str(tmp_path / "odd.ckpt")
    a, _ = run(path2, (X, Y), 8, stop=3)
    b, _ = run(path2, (X, Y), 16)
    assert flat(a + b) == order[:40]
    # 40 samples left fill 3 batches of 13: the shifted epoch starts at its batch 0
    path3 = str(tmp_path / "zero.ckpt")
    a, _ = run(path3, (X, Y), 8, stop=1)
    b, prog = run(path3, (X, Y), 13, stop=2)  # steps count on: one batch of 13
    assert prog.batch == 1 and flat(a + b) == order[:21]
    c, _ = run(path3, (X, Y), 13)
    assert flat(a + b + c) == order[:47]


def test_a_dataframe_stopped_mid_epoch_says_to_finish_it_in_its_batch_size(tmp_path):
    path = str(tmp_path / "run.ckpt")
    frame = DataFrame.from_arrays(x=X, y=Y)
    first, _ = run(path, frame, 8, stop=2)
    with pytest.raises(ModelError, match=r"after 2 batches of 8 .*got batch_size=16.* "
                       r"Finish the epoch with batch_size=8 \(epochs=1"):  # fmt: skip
        run(path, frame, 16)
    second, _ = run(path, frame, 8)  # finishes epoch 0 as the error says
    assert sorted(flat(first + second)) == list(range(N))
    third, prog = run(path, frame, 16, epochs=2)  # saved after the last batch: goes on
    assert [len(b) for b in third] == [16] * 3 and prog.epoch == 2
