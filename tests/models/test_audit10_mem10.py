"""Audit 10 (memory): the memory switches of a model take True/False, not any object that
``bool()`` would turn on (``"false"``, a remat policy name)."""

from __future__ import annotations

import numpy as np
import pytest

from fnnc.errors import ModelError
from fnnc.models import Dense, Input, Model

SWITCHES = ("gradient_checkpointing", "memory_compression", "memory_reduction")


def _model():
    x = Input()
    return Model([x], [Dense(3, name="out")(x)], name="net")


@pytest.mark.parametrize("switch", SWITCHES)
@pytest.mark.parametrize("given", ["false", "nothing_saveable", 2, 0.5, None])
def test_a_switch_refuses_what_is_no_bool_and_keeps_its_state(switch, given):
    model = _model()
    setter = getattr(model, f"set_{switch}")
    setter(False)
    with pytest.raises(ModelError, match=rf"net.*set_{switch}\(enabled\) takes True or False"):
        setter(given)
    assert getattr(model, switch) is False


@pytest.mark.parametrize("switch", SWITCHES)
def test_a_switch_takes_bools_and_nnc_ints(switch):
    model = _model()
    setter = getattr(model, f"set_{switch}")
    for given, want in [(True, True), (0, False), (np.True_, True), (np.int32(0), False)]:
        setter(given)
        assert getattr(model, switch) is want
    setter()
    assert getattr(model, switch) is True


def test_a_policy_name_to_checkpointing_points_to_repeat():
    with pytest.raises(ModelError, match=r"Repeat\(\.\.\., checkpoint=policy\)"):
        _model().set_gradient_checkpointing("dots_saveable")
