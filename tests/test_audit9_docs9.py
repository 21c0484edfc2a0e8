"""Prose claims of the docs (guides, README, docstrings) that their code blocks do not
print: each test checks one claim against an independent oracle."""

from __future__ import annotations

import numpy as np
import optax
import pytest

from fnnc.errors import ModelError


def _broken_loss(outputs, targets):
    return (outputs - targets) ** 2  # lists, not arrays: Python's TypeError


@pytest.fixture(scope="module")
def broken():
    """A compiled one-Dense model whose loss function raises, and a batch for it."""
    from fnnc.models import Dense, Input, Model

    x = Input()
    model = Model(x, Dense(2, name="o")(x))
    xs, ys = np.ones((4, 3), np.float32), np.ones((4, 2), np.float32)
    model.compile(xs, loss=_broken_loss, minimizer=optax.sgd(0.1))
    return model, xs, ys


def test_a_loss_function_error_in_score_is_a_model_error_caused_by_the_original(broken):
    """models guide: a loss function's error "comes back as a ModelError that restates
    this, the original as its __cause__" -- score called the function eagerly and let
    the raw TypeError out."""
    model, xs, ys = broken
    with pytest.raises(ModelError, match=r"called as fn\(outputs, targets\)") as e:
        model.score(xs, ys)
    assert isinstance(e.value.__cause__, TypeError), e.value.__cause__
    with pytest.raises(TypeError) as original:
        _broken_loss([xs], [ys])
    assert str(original.value) in str(e.value)


def test_train_keeps_the_loss_function_error_as_the_cause(broken):
    """train re-raised fit's ModelError with its batch prefix `from None`, dropping the
    original error the guide promises as __cause__."""
    model, xs, ys = broken
    with pytest.raises(ModelError, match="train: epoch 0, batch 0: the loss function") as e:
        model.train((xs, ys), batch_size=4, verbose=False)
    assert isinstance(e.value.__cause__, TypeError), e.value.__cause__
