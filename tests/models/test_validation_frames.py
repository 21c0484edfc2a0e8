"""train(validation=...) takes a DataFrame or a Grain dataset as it takes arrays.

The oracle is the arrays case (itself checked against NumPy in test_training): the
same model trained on the same data must log the same per-epoch metrics whichever
form the validation set comes in; bitwise when the evaluation batches are the same.
"""

import grain
import numpy as np
import optax
import pytest

from fnnc.data import DataFrame
from fnnc.errors import ModelError
from fnnc.models import Dense, Input, Model

RNG = np.random.default_rng(0)
XS = RNG.standard_normal((48, 4)).astype(np.float32)
YS = np.argmax(XS[:, :3], axis=1).astype(np.int32)
VX = RNG.standard_normal((300, 4)).astype(np.float32)  # > 256: two evaluation batches
VY = np.argmax(VX[:, :3], axis=1).astype(np.int32)


def _history(validation, **kw):
    x = Input()
    model = Model(x, Dense(3, name="fc")(x))
    model.compile(XS[:16], loss="softmax_crossentropy", minimizer=optax.adam(0.05))
    metrics = {"top": lambda out, y: float(np.mean(np.max(out, -1)))}  # a user metric
    return model.train(
        (XS, YS), epochs=2, batch_size=16, validation=validation, metrics=metrics,
        verbose=False, **kw,
    )  # fmt: skip


@pytest.fixture(scope="module")
def arrays_history():
    history = _history((VX, VY))
    assert sorted(history) == ["epoch", "loss", "val_accuracy", "val_loss", "val_top"]
    want_acc = history["val_accuracy"]
    assert len(want_acc) == 2 and all(0 <= a <= 1 for a in want_acc)
    return history


def test_dataframe_validation_equals_arrays(arrays_history):
    frame = DataFrame.from_arrays(x=VX, y=VY)
    assert _history(frame) == arrays_history  # batches of 256, in order: bitwise
    named = DataFrame.from_arrays(label=VY, image=VX)  # columns named as for training
    assert _history(named, inputs="image", targets="label") == arrays_history
    batched = _history(frame.shuffle().batch(7))  # other batches, another order
    for key in ("val_loss", "val_accuracy", "val_top"):
        np.testing.assert_allclose(batched[key], arrays_history[key], rtol=1e-5, err_msg=key)


def test_grain_validation_equals_arrays(arrays_history):
    pairs = grain.MapDataset.source(list(range(0, 300, 256))).map(
        lambda s: (VX[s : s + 256], VY[s : s + 256])
    )
    assert _history(pairs) == arrays_history
    assert _history(pairs.to_iter_dataset()) == arrays_history


def test_bad_validation_data_is_named():
    with pytest.raises(ModelError, match="validation: the dataframe has columns"):
        _history(DataFrame.from_arrays(y=VY), targets="y")
    with pytest.raises(ModelError, match="validation: element 0 of the Grain dataset"):
        _history(grain.MapDataset.source([1, 2]).to_iter_dataset())
