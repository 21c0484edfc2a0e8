"""Audit 10 (err10): model-layer mistakes get a ModelError naming the layer, what it was
given and what it expects, never a raw IndexError/TypeError from inside a layer."""

from __future__ import annotations

import numpy as np
import pytest

import fnnc.models as M
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
    with pytest.raises(ModelError, match=rf"layer {kind}\('d'\): its input\(s\) float32\[\] have "):
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
