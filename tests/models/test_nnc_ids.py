"""Parameter ids as NNC forms them (``lib/nnc/_ccv_cnnp_model.h``, ``ccv_cnnp_model_build``).

``t-`` (``r-`` for internals), then ``<name>-<seq>`` or ``<seq>`` for every model on
NNC's id stack, then the index in the leaf. Named models are pushed for each build;
unnamed ones only when their kind owns parameters, so unnamed containers add no level
and parameter-free layers take no number. Sequence numbers count per name in the parent.
"""

from __future__ import annotations

import numpy as np
import optax
import pytest

from fnnc import ops
from fnnc.errors import ModelError
from fnnc.models import (
    Activation,
    BatchNorm,
    BuildContext,
    CommandLayer,
    Dense,
    Dropout,
    Input,
    LayerNorm,
    Model,
    ReLU,
    Sequential,
)

X = np.zeros((2, 4), np.float32)


def ids(model: Model, x: np.ndarray = X, *, training: bool = False) -> list[str]:
    """The parameter and internal ids of one build of ``model`` on ``x``."""
    ctx = BuildContext(training)
    model.build(ctx, ctx.b.input(x.shape, x.dtype, name="x"), nested=False)
    return sorted(ctx.params)


def mlp(*extra, named: bool = False) -> Model:
    """NNC's ``sequential([dense(8), relu(), dense(3)])``, optionally named mlp/fc1/act/fc2."""
    if named:
        layers = [Dense(8, name="fc1"), ReLU(name="act"), Dense(3, name="fc2")]
        return Sequential([*layers, *extra], name="mlp")
    return Sequential([Dense(8), ReLU(), Dense(3), *extra])


UNNAMED = ["t-0-0", "t-0-1", "t-1-0", "t-1-1"]
NAMED = ["t-mlp-0-fc1-0-0", "t-mlp-0-fc1-0-1", "t-mlp-0-fc2-0-0", "t-mlp-0-fc2-0-1"]


def test_unnamed_sequential_adds_no_level_and_relu_takes_no_number():
    assert ids(mlp()) == UNNAMED


def test_named_models_are_levels_of_the_id():
    assert ids(mlp(named=True)) == NAMED
    # the same ids whether "mlp" is the outermost model or inside an unnamed one
    assert ids(Sequential([mlp(named=True)])) == NAMED


def test_appending_a_parameter_free_layer_keeps_every_id():
    assert ids(mlp(Activation("softmax"))) == UNNAMED
    assert ids(mlp(Activation("softmax", name="probs"), named=True)) == NAMED
    assert ids(Sequential([ReLU(), Dense(8), Dropout(0.5), ReLU(), Dense(3)])) == UNNAMED


def test_names_and_unnamed_layers_count_separately():
    # NNC's "model to get the internal name for parameters" (cnnp.core.tests.c)
    x = Input()
    linear1 = Dense(1, no_bias=True, name="linear")
    out1 = linear1(x)
    out2 = Dense(1, no_bias=True)(out1)
    assert ids(Model([x], [out1, out2])) == ["t-0-0", "t-linear-0-0"]
    model = Sequential([Dense(2, name="d"), Dense(2), Dense(2, name="d"), Dense(2)])
    assert ids(model) == [*UNNAMED, "t-d-0-0", "t-d-0-1", "t-d-1-0", "t-d-1-1"]


def test_nested_unnamed_models_add_no_level_named_ones_do():
    inner = Sequential([Dense(4), ReLU(), Dense(4)])
    assert ids(Sequential([inner, Dense(3)])) == [*UNNAMED, "t-2-0", "t-2-1"]
    block = Sequential([Dense(4, name="fc"), Sequential([Dense(4)], name="sub")], name="block")
    assert ids(Sequential([Dense(4), block, Dense(3)])) == [
        "t-0-0",
        "t-0-1",
        "t-1-0",
        "t-1-1",
        "t-block-0-fc-0-0",
        "t-block-0-fc-0-1",
        "t-block-0-sub-0-0-0",
        "t-block-0-sub-0-0-1",
    ]


def test_a_shared_layer_keeps_its_first_ids_but_takes_a_number_per_call():
    x = Input()
    shared = Dense(4)
    y = Dense(3)(shared(shared(x)))
    # NNC pushes the shared dense twice (numbers 0 and 1); its parameters are added
    # once, so the next dense is number 2.
    assert ids(Model([x], [y])) == ["t-0-0", "t-0-1", "t-2-0", "t-2-1"]
    x = Input()
    named = Dense(4, name="d")
    y = Dense(4, name="d")(named(named(x)))
    assert ids(Model([x], [y])) == ["t-d-0-0", "t-d-0-1", "t-d-2-0", "t-d-2-1"]


def test_a_shared_named_sub_model_keeps_its_first_ids():
    x = Input()
    block = Sequential([Dense(4), ReLU()], name="block")
    y = Dense(3)(block(block(x)))
    assert ids(Model([x], [y])) == ["t-0-0", "t-0-1", "t-block-0-0-0", "t-block-0-0-1"]


def test_internals_share_their_layers_path_with_r():
    model = Sequential([Dense(8), BatchNorm(), ReLU(), Dense(3)])
    assert ids(model) == ["r-1-0", "r-1-1", "t-0-0", "t-0-1", "t-1-0", "t-1-1", "t-2-0", "t-2-1"]
    named = Sequential([Dense(8, name="fc"), BatchNorm(name="bn")], name="net")
    assert [i for i in ids(named) if i.startswith("r-")] == ["r-net-0-bn-0-0", "r-net-0-bn-0-1"]


def test_a_kind_that_owns_parameters_is_numbered_even_without_them():
    # NNC's layer norm kind adds parameters, so an unnamed one without affine
    # parameters is still pushed and takes number 1.
    model = Sequential([Dense(4), LayerNorm(elementwise_affine=False), Dense(3)])
    assert ids(model) == ["t-0-0", "t-0-1", "t-2-0", "t-2-1"]


def test_ids_do_not_depend_on_training_mode():
    model = Sequential([Dense(32), ReLU(), Dropout(0.1), Dense(10)])
    x = np.zeros((4, 8), np.float32)
    assert ids(model, x, training=False) == ids(model, x, training=True)
    assert ids(model, x) == ["t-0-0", "t-0-1", "t-1-0", "t-1-1"]
    other = Sequential([Dense(8), BatchNorm(), Dropout(0.5), Dense(3)])
    assert ids(other, training=False) == ids(other, training=True)


def test_dropout_model_compiles_and_fits():
    # The repro: an unnamed Dropout numbered only in training mode made the fit
    # program ask for t-2-0 while compile had registered t-1-0 (KeyError).
    model = Sequential([Dense(32), ReLU(), Dropout(0.1), Dense(10)])
    rng = np.random.default_rng(0)
    x = rng.normal(size=(16, 8)).astype(np.float32)
    y = rng.integers(0, 10, size=(16,)).astype(np.int32)
    model.compile([x], loss="softmax_crossentropy", minimizer=optax.sgd(0.1))
    before = model.parameters()["t-1-0"]
    loss = float(np.asarray(model.fit([x], [y])).mean())
    assert np.isfinite(loss)
    assert sorted(model.parameters()) == ["t-0-0", "t-0-1", "t-1-0", "t-1-1"]
    assert not np.allclose(model.parameters()["t-1-0"], before)
    assert model.evaluate([x]).shape == (16, 10)


def _colliding(width: int) -> Model:
    """Two Sequentials named "block" (unnamed Dense: ids t-block-0-0-*, t-block-1-0-*)
    and a distinct Dense named "block-1", whose ids are t-block-1-0-* as well."""
    x = Input()
    h = Sequential([Dense(4), ReLU()], name="block")(x)
    h = Sequential([Dense(4), ReLU()], name="block")(h)
    return Model(x, Dense(width, name="block-1")(h))


def test_two_layers_with_one_id_raise_instead_of_sharing_weights():
    # Three distinct Dense layers must never end up with two weight sets between them.
    for width in (4, 3):  # same shape (was a silent tie) and another (was "a shared layer")
        with pytest.raises(ModelError) as err:
            ids(_colliding(width))
        message = str(err.value)
        assert "t-block-1-0-0" in message and "Dense('block-1')" in message, message
        assert "Model('block')" in message and "Rename" in message, message
    x = Input()
    h = Sequential([Dense(4), ReLU()], name="block")(x)
    h = Sequential([Dense(4), ReLU()], name="block")(h)
    renamed = Model(x, Dense(4, name="head")(h))
    assert len(ids(renamed)) == 6  # three layers, three weight sets


def test_sharing_by_layer_object_and_parameter_of_still_tie():
    x = Input()
    shared = Dense(4, name="d")
    model = Model(x, shared(shared(x)))
    data = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)
    model.compile(data, loss=None)
    w, b = (np.asarray(model.parameters()[k]) for k in ("t-d-0-0", "t-d-0-1"))
    assert sorted(model.parameters()) == ["t-d-0-0", "t-d-0-1"]
    once = data @ w.T + b[None]
    np.testing.assert_allclose(model.evaluate(data), once @ w.T + b[None], rtol=1e-5, atol=1e-5)
    x = Input()
    emb = Dense(4, name="emb")
    y = CommandLayer(ops.gemm(transpose_b=True))(emb(x), emb.parameter(0))
    tied = Model(x, y)
    tied.compile(X, loss=None)
    assert sorted(tied.parameters()) == ["t-emb-0-0", "t-emb-0-1"]
