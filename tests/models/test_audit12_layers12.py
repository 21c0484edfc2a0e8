"""Audit 12 (cnnp layers against NNC's ccv_cnnp_model_addons.c): regression tests."""

from __future__ import annotations

import numpy as np
import pytest

from fnnc.models import (
    Concat,
    GroupNorm,
    Input,
    LayerNorm,
    Model,
    ModelError,
    MoE,
    RMSNorm,
    Sequential,
)


def _numpy_norm(x, axes, scale, bias, eps, centred):
    x = x.astype(np.float64)
    mu = x.mean(axis=axes, keepdims=True) if centred else 0.0
    var = ((x - mu) ** 2).mean(axis=axes, keepdims=True)
    keep = [n if d in axes else 1 for d, n in enumerate(x.shape)]
    y = (x - mu) / np.sqrt(var + eps) * scale.reshape(keep)
    return y + bias.reshape(keep) if bias is not None else y


@pytest.mark.parametrize("kind", ["layer", "rms"])
def test_norm_axes_listed_out_of_order_shape_the_scale_in_axis_order(kind):
    # axes=(-1, 1) made a [C, T] scale the command refused ('must have shape [T, C]')
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 3, 4)).astype(np.float32)
    layer = LayerNorm(axes=(-1, 1), name="n") if kind == "layer" else RMSNorm(axes=(2, 1), name="n")
    model = Sequential([layer])
    model.compile([x])
    ids = sorted(model.parameters())
    params = {k: rng.normal(size=(3, 4)).astype(np.float32) for k in ids}
    assert {k: np.shape(v) for k, v in model.parameters().items()} == dict.fromkeys(ids, (3, 4))
    model.set_parameters(params)
    bias = params.get("t-n-0-1")
    eps = 1e-5 if kind == "layer" else 1e-6
    want = _numpy_norm(x, (1, 2), params["t-n-0-0"], bias, eps, kind == "layer")
    np.testing.assert_allclose(np.asarray(model.evaluate([x])), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "make",
    [
        lambda: LayerNorm(axes=None, name="n"),
        lambda: RMSNorm(axes=3.5, name="n"),
        lambda: GroupNorm(2, reduce_axes="ab", name="n"),
        lambda: LayerNorm(epsilon=float("inf"), name="n"),
        lambda: RMSNorm(epsilon=float("inf"), name="n"),
    ],
)
def test_norm_axes_that_are_no_axes_and_an_infinite_epsilon_name_the_layer(make):
    # axes=None / 3.5 were tuple()'s bare TypeError; epsilon=inf made every output the bias
    with pytest.raises(ModelError, match=r"Norm\('n'\): (axes|reduce_axes|epsilon) is"):
        make()


def test_norm_axes_given_as_an_array_or_one_int_still_work():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(2, 3, 4)).astype(np.float32)
    model = Sequential([LayerNorm(axes=np.array([1, 2]), elementwise_affine=False)])
    model.compile([x])
    want = _numpy_norm(x, (1, 2), np.ones((3, 4)), None, 1e-5, True)
    np.testing.assert_allclose(np.asarray(model.evaluate([x])), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("axis", ["a", 1.5])
def test_concat_with_an_axis_that_is_no_int_is_a_model_error(axis):
    # was the command's CommandError, naming concat and no layer
    with pytest.raises(ModelError, match=r"layer Concat: concat: hyper-parameter 'axis'"):
        Concat(axis=axis)


def test_concat_layer_still_joins_along_its_axis():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = -np.arange(4, dtype=np.float32).reshape(2, 2)
    x, y = Input(), Input()
    model = Model([x, y], [Concat(axis=np.int64(-1))(x, y)])
    model.compile([a, b])
    np.testing.assert_array_equal(np.asarray(model.evaluate([a, b])), np.concatenate([a, b], 1))


def test_nnc_x_ranked_norm_parameters_read_into_the_layers(tmp_path):
    # NNC's ccv_cnnp_layer_norm / group_norm / rmsnorm make scale and bias x-ranked with 1
    # off the axes ([1, 1, 4] for a [N, 3, 4] input); Model.read refused them as
    # 'stored float32[1, 1, 4], expected float32[4]'
    from fnnc.io import TensorFile

    rng = np.random.default_rng(2)
    x = rng.normal(size=(2, 3, 4)).astype(np.float32)

    def make():
        layers = [LayerNorm(name="ln"), GroupNorm(2, name="gn"), RMSNorm(axes=(1, 2), name="rn")]
        model = Sequential(layers, name="m")
        model.compile([x])
        return model

    model = make()
    path = str(tmp_path / "nnc.sqlite3")
    model.write(path)
    values = {
        k: rng.normal(size=np.shape(v)).astype(np.float32) for k, v in model.parameters().items()
    }
    nnc = {"ln": (1, 1, 4), "gn": (1, 1, 4), "rn": (1, 3, 4)}
    with TensorFile(path) as f:
        for k, v in values.items():
            f.write(k, v.reshape(nnc[k.split("-")[3]]))
    other = make()
    assert other.read(path) == []
    got = {k: np.asarray(v) for k, v in other.parameters().items()}
    assert all(np.array_equal(got[k], values[k]) for k in values)
    # the oracle: the three norms in float64 NumPy on the values as set
    p = values
    h = _numpy_norm(x, (2,), p["t-m-0-ln-0-0"], p["t-m-0-ln-0-1"], 1e-5, True)
    hg = h.reshape(2, 3, 2, 2)  # [N, T, groups, C / groups], normalised over T and C / groups
    mu = hg.mean(axis=(1, 3), keepdims=True)
    var = ((hg - mu) ** 2).mean(axis=(1, 3), keepdims=True)
    g = ((hg - mu) / np.sqrt(var + 1e-5)).reshape(2, 3, 4)
    g = g * p["t-m-0-gn-0-0"] + p["t-m-0-gn-0-1"]
    want = _numpy_norm(g, (1, 2), p["t-m-0-rn-0-0"], None, 1e-6, False)
    np.testing.assert_allclose(np.asarray(other.evaluate([x])), want, rtol=1e-4, atol=1e-4)


def test_read_parameters_takes_size_1_axes_only_where_the_order_is_kept(tmp_path):
    from fnnc.io import TensorFile, read_parameters

    path = str(tmp_path / "t.sqlite3")
    a = np.arange(4, dtype=np.float32)
    with TensorFile(path) as f:
        f.write("w", a.reshape(1, 4))
        f.write("s", np.ones((1, 1, 1), np.float32))
    found = read_parameters(path, {"w": ((4,), None), "s": ((1,), None)})
    np.testing.assert_array_equal(found["w"], a)
    assert found["s"].shape == (1,)
    # [1, 4] stored for an expected [4, 1] (a transposed weight) stays a mismatch
    found = read_parameters(path, {"w": ((4, 1), None)}, strict=False)
    assert [m.key for m in found.mismatched] == ["w"]


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"weight_scale": float("nan")}, "weight_scale is nan"),
        ({"weight_scale": "x"}, "weight_scale is 'x'"),
        ({"weight_scale": True}, "weight_scale is True"),
        ({"k": 3}, "k=3 must be in 1..2"),
    ],
)
def test_moe_weight_scale_and_k_are_checked_naming_the_layer(kw, match):
    # weight_scale=nan built and gave NaN outputs silently; k's error named no layer
    with pytest.raises(ModelError, match=rf"layer MoE\('moe'\): {match}"):
        MoE(2, 4, name="moe", **kw)


def test_moe_takes_a_numpy_weight_scale_as_its_float():
    # the numbers themselves: test_llm_layers' dense oracle runs weight_scale=1.5
    layer = MoE(2, 4, weight_scale=np.float32(2.5), name="moe")
    assert type(layer.weight_scale) is float and layer.weight_scale == 2.5
