"""Audit 10 (err10): model-layer mistakes get a ModelError naming the layer, what it was
given and what it expects, never a raw IndexError/TypeError from inside a layer."""

from __future__ import annotations

import re

import numpy as np
import pytest

import fnnc.models as M
from fnnc.errors import FnncError
from fnnc.models import ModelError

F32 = np.float32

LAYERS = {
    "Dense": lambda: M.Dense(2, name="d"),
    "Flatten": lambda: M.Flatten(name="d"),
    "BatchNorm": lambda: M.BatchNorm(name="d"),
    "Reshape": lambda: M.Reshape((1,), name="d"),
    "SwiGLU": lambda: M.SwiGLU(4, name="d"),
    "MoE": lambda: M.MoE(2, 4, name="d"),
}


@pytest.mark.parametrize("kind", sorted(LAYERS))
def test_a_layer_on_a_scalar_input_names_the_layer_and_the_rank(kind) -> None:
    """``x.shape[-1]`` of a rank-0 input was a bare ``IndexError: tuple index out of
    range`` from the layer's build (compile and summary)."""
    x = M.Input()
    model = M.Model([x], [LAYERS[kind]()(x)])
    with pytest.raises(
        ModelError, match=rf"layer {kind}\('d'\): building it on input\(s\) float32\[\] raised Ind"
    ):
        model.compile([F32(1.0)])
    with pytest.raises(ModelError, match=r"samples first .*x\.reshape\(-1, 1\)"):
        model.summary([F32(1.0)])


def test_conv_on_a_scalar_input_says_it_has_no_spatial_axis() -> None:
    x = M.Input()
    model = M.Model([x], [M.Conv(2, 1, name="c")(x)])
    with pytest.raises(ModelError, match=r"layer Conv\('c'\): its input of shape \[\] has no spat"):
        model.compile([F32(1.0)])


def test_a_layer_given_samples_first_still_builds() -> None:
    model = M.Sequential([M.Dense(2, name="d")])
    model.compile(np.ones((3, 4), F32))
    assert model.parameters()["t-d-0-0"].shape == (2, 4)


def test_a_model_without_outputs_is_refused_when_made() -> None:
    """``Model([], [])`` was made, and compile raised ``IndexError`` (``outs[0]``)."""
    with pytest.raises(ModelError, match=r"outputs is empty; a model needs at least one output"):
        M.Model([], [])
    with pytest.raises(ModelError, match=r"outputs is empty"):
        M.Model([M.Input()], [])


@pytest.mark.parametrize("shape", [None, 4, "ab", (2, -1, -1), (2.0,)])
def test_reshape_and_parameter_shapes_are_checked_when_made(shape) -> None:
    """``Reshape(None)`` / ``Parameter(None)`` were ``TypeError: 'NoneType' object is not
    iterable``; ``Reshape("ab")`` built a reshape to ``(N, 'a', 'b')``."""
    with pytest.raises(ModelError, match=r"layer Reshape: shape is .*; expected a tuple of sizes"):
        M.Reshape(shape)
    if shape in (None, 4, "ab"):  # sizes of a sequence: checked at build (test_layers)
        with pytest.raises(ModelError, match=r"layer Parameter: shape is .*; expected a tuple"):
            M.Parameter(shape)


def test_reshape_with_one_inferred_size_and_numpy_sizes_still_builds() -> None:
    x = np.arange(12, dtype=F32).reshape(2, 6)
    model = M.Sequential([M.Reshape((np.int64(3), -1))])
    model.compile(x)
    np.testing.assert_array_equal(model.predict(x), x.reshape(2, 3, 2))
    assert M.Parameter(()).shape == () and M.Parameter([2, 3]).shape == (2, 3)


@pytest.mark.parametrize("kw", [{"initial": "a"}, {"factor": None}, {"minimum": [1.0]}])
def test_loss_scale_of_no_number_names_the_argument(kw) -> None:
    """``LossScale(initial="a")`` was NumPy's ``ufunc 'isfinite' not supported``."""
    ((arg, value),) = kw.items()
    with pytest.raises(FnncError, match=re.escape(f"LossScale: expected {arg}={value!r}")):
        M.LossScale(**kw)


def test_model_function_takes_one_array_and_names_none() -> None:
    """``model_function(m, None)`` was ``TypeError: 'NoneType' object is not iterable`` and
    one array was split into its rows, one "input" each; it now takes one array as a list
    of it (as compile does) and None is the ModelError naming input 0."""
    x = np.ones((4, 3), F32)
    model = M.Sequential([M.Dense(2, name="d")])
    model.compile(x)
    with pytest.raises(ModelError, match=r"input 0 is object\[\], compiled for float32\[4, 3\]"):
        M.model_function(model, None)
    assert M.model_function(model, x).graph == M.model_function(model, [x]).graph
