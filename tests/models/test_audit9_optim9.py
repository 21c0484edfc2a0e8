"""Audit 9 of fnnc.models.minimizers: hyper-parameters float32 cannot hold, and
hyper-parameters traced by ``optax.inject_hyperparams``."""

from __future__ import annotations

import numpy as np
import pytest

from fnnc.errors import CommandError
from fnnc.models.minimizers import adam, adamw, lamb, rmsprop, sgd, with_gradient_accumulation

F32 = np.finfo(np.float32)

UNHOLDABLE = [
    (sgd, {"rate": float("inf")}, "rate"),
    (sgd, {"rate": 1e39}, "rate"),  # float32 makes it inf
    (adam, {"rate": 0.1, "epsilon": float("inf")}, "epsilon"),
    (adamw, {"rate": 0.1, "decay": 1e39}, "decay"),
    (rmsprop, {"rate": 0.1, "decay": -float("inf")}, "decay"),
    (lamb, {"rate": 0.1, "scale": float("inf")}, "scale"),
    (sgd, {"rate": 0.1, "scale": 1e-50}, "scale"),  # float32 makes it 0
    (adam, {"rate": 1e-50}, "rate"),
    (sgd, {"rate": 0.1, "momentum": "0.9"}, "momentum"),  # a string is no number
    (adam, {"rate": True}, "rate"),
]


@pytest.mark.parametrize(
    ("factory", "kwargs", "name"),
    UNHOLDABLE,
    ids=[f"{f.__name__}-{n}-{v}" for f, kw, n in UNHOLDABLE for v in [kw.get(n)]],
)
def test_hyper_parameters_float32_cannot_hold_raise_naming_them(factory, kwargs, name):
    kwargs = dict(kwargs)
    rate = kwargs.pop("rate")
    with pytest.raises(CommandError, match=rf"{factory.__name__}: {name}"):
        factory(rate, **kwargs)


def test_hyper_parameters_at_float32_limits_are_kept():
    """The oracle: NumPy's float32 range; its largest and smallest values are taken."""
    big, tiny = float(F32.max), float(F32.smallest_subnormal)
    for factory in (sgd, adam, adamw, rmsprop, lamb):
        factory(big, scale=tiny, decay=big)
        factory(tiny, scale=big, decay=tiny)
    for factory in (adam, adamw, rmsprop, lamb):
        factory(0.1, epsilon=tiny)
        factory(0.1, epsilon=big)


@pytest.mark.parametrize("k", [True, np.bool_(True)])
def test_gradient_accumulation_count_is_no_bool(k):
    with pytest.raises(CommandError, match="k must be an integer, got bool"):
        with_gradient_accumulation(sgd(0.1), k)
