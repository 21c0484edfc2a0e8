"""Audit (round 12) of fnnc.models against NNC's cnnp.core.tests.c as NNC writes it:
``ccv_cnnp_model_parameters(model, ALL_PARAMETERS, ALL_PARAMETERS)`` with NNC's
``ALL_PARAMETERS`` (-1, ccv_nnc_easy.h; ccv_cnnp_model.c takes every ``< 0`` as all)."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from fnnc import ops
from fnnc.errors import ModelError
from fnnc.models import (
    Add,
    CommandLayer,
    Dense,
    Input,
    Model,
    Mul,
    Parameter,
    Sequential,
    minimizers,
)
from tests.helpers import assert_close

ALL_PARAMETERS = -1  # NNC's ccv_nnc_easy.h


@pytest.fixture(scope="module")
def two_dense():
    x = Input()
    first, second = Dense(2, name="a"), Dense(1, name="b")
    model = Model([x], [second(first(x))])
    model.compile([np.ones((2, 3), np.float32)])
    return model, first


def test_all_parameters_minus_one_selects_all(two_dense):
    """select / index -1 was compared as the id suffix '-1' (select) and refused (index):
    ``parameter_ids(a, -1)`` gave [] silently. NNC's ids are the oracle."""
    model, first = two_dense
    both = ["t-a-0-0", "t-a-0-1"]
    assert model.parameter_ids(first, ALL_PARAMETERS, ALL_PARAMETERS) == both
    assert model.parameter_ids(first, ALL_PARAMETERS) == both
    assert model.parameter_ids(first, 0, ALL_PARAMETERS) == ["t-a-0-0"]
    assert model.parameter_ids(first, ALL_PARAMETERS, 1) == ["t-a-0-1"]
    assert model.parameter_ids(None, np.int64(-1), np.int32(2)) == ["t-b-0-0"]
    assert model.parameter_ids(None, ALL_PARAMETERS, ALL_PARAMETERS) == model.parameter_ids()


@pytest.mark.parametrize("select", [True, "weight", 0.0])
def test_a_select_that_is_no_int_is_refused(two_dense, select):
    """str(select) matched no id, so a bool, a name or a float selected nothing."""
    model, first = two_dense
    with pytest.raises(ModelError, match=rf"select={select!r}, but select takes an int"):
        model.parameter_ids(first, select)


def test_learn_x_with_y_frozen_by_all_parameters():
    """NNC's "learn 2 * x + y = 12, first learn x, and then learn y": set_minimizer(NOOP,
    ccv_cnnp_model_parameters(mul, ALL_PARAMETERS, ALL_PARAMETERS)) freezes mul. One
    SGD(0.1) step from x = 1, y = 2 moves y by -0.1 * d/dy and leaves x (jax.grad)."""
    xi, yi = Input(), Input()
    mul = Model([xi], [Mul()(xi, Parameter((1,), init=1.0)())], name="mul")
    add = Model([yi], [Add()(yi, Parameter((1,), init=2.0)())], name="add")
    a, f = Input(), Input()
    diff = CommandLayer(ops.add(q=-1.0))(Sequential([mul, add], name="seq")(a), f)
    model = Model([a, f], [Mul()(diff, diff)])
    data = [np.float32([2.0]), np.float32([12.0])]
    model.compile(data, minimizer=minimizers.sgd(0.1))
    frozen = model.parameter_ids(mul, ALL_PARAMETERS, ALL_PARAMETERS)
    assert frozen == ["t-seq-0-mul-0-0-0"]
    model.set_minimizer(minimizers.noop(), params=frozen)
    model.fit(data)
    dy = jax.grad(lambda x, y: (2.0 * x + y - 12.0) ** 2, argnums=1)(1.0, 2.0)
    got = model.parameters()
    assert float(got["t-seq-0-mul-0-0-0"][0]) == 1.0
    assert_close(got["t-seq-0-add-0-0-0"], np.float32([2.0 - 0.1 * float(dy)]), rtol=1e-6)


def test_set_minimizer_given_a_layer_names_parameter_ids(two_dense):
    """NNC passes MODEL_IO_LIST(ccv_cnnp_model_parameters(layer, ...)); a porter passing
    the layer was told only to pass ids; the message names parameter_ids(layer), whose
    ids set_minimizer then takes (the layer's weight and bias, NNC's ids)."""
    model, first = two_dense
    with pytest.raises(ModelError, match=r"pass model.parameter_ids\(layer\)"):
        model.set_minimizer(minimizers.noop(), params=[first])
    assert model.parameter_ids(first) == ["t-a-0-0", "t-a-0-1"]


def test_parameter_ids_of_a_layers_output_says_to_pass_the_layer(two_dense):
    """A ModelIO (what calling a layer returns) printed its whole repr and said 'a layer
    of another model'; it now names the layer that made it, whose ids (NNC's) follow."""
    model, first = two_dense
    x = Input()
    with pytest.raises(ModelError, match=r"ModelIO has no .*output of Dense\('a'\); pass the"):
        model.parameter_ids(first(x))
    with pytest.raises(ModelError, match=r"'a' has no .*layer object itself, not its name"):
        model.parameter_ids("a")
    assert model.parameter_ids(first) == ["t-a-0-0", "t-a-0-1"]
