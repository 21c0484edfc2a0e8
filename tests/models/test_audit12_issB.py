"""Audit 12 (issues 5, 6, 15, 16, 29): cnnp models as the issues word them."""

from __future__ import annotations

import numpy as np
import optax
import pytest

from fnnc.models import Dense, ModelError, Sequential


def test_is_trainable_inherit_spelled_as_the_issue_or_nnc_inherits_a_frozen_parent():
    """Issue 5: ``is_trainable`` is "True, False, inherit". ``"inherit"`` (and NNC's -1)
    was kept as a truthy value, so such a layer inside a frozen model trained; the oracle
    is the unchanged weights (SGD would move every one of them)."""
    x = np.ones((2, 4), np.float32)
    model = Sequential(
        [Dense(3, name="a", is_trainable="inherit"), Dense(2, name="b", is_trainable=-1)],
        name="seq",
        is_trainable=False,
    )
    model.compile(x, loss="mse", minimizer=optax.sgd(0.1))
    before = {k: np.asarray(v) for k, v in model.parameters().items()}
    model.fit(x, np.full((2, 2), 5.0, np.float32))
    after = model.parameters()
    assert len(before) == 4
    assert all(np.array_equal(before[k], np.asarray(after[k])) for k in before)
    assert [
        layer.is_trainable for layer in (Dense(1, is_trainable=1), Dense(1, is_trainable=0))
    ] == [
        True,
        False,
    ]


@pytest.mark.parametrize("value", ["false", "no", 2, 0.5, [True]])
def test_is_trainable_of_another_kind_is_a_model_error_naming_the_layer(value):
    """``is_trainable="false"`` was truthy: the layer trained. Now a ModelError."""
    with pytest.raises(ModelError, match=r"Dense\('fc'\): is_trainable=.*expected True, False"):
        Dense(2, name="fc", is_trainable=value)
    layer = Dense(2, name="fc")
    with pytest.raises(ModelError, match="is_trainable="):
        layer.is_trainable = value
    assert layer.is_trainable is None
